"""Printing a report: one JSON object on stdout with --json, readable text otherwise.

Reports are plain dicts built by the logic modules; this module only renders. Two rules hold
for every text report:

* nothing from a log reaches the terminal as a control sequence: escape characters and other
  C0 controls (ANSI colours, cursor moves, a bell) are shown as `\\x1b`-style text;
* a Hydra override or an argv token a person may paste is shell-quoted when it holds a
  character the shell would act on (`[ ] { } * ? $` spaces, quotes, ...): `shell_token`,
  `shell_line` and `quote_overrides`.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any, Callable, Iterable, Sequence

# C0 controls but newline and tab, DEL, the C1 CSI, and lone UTF-16 surrogates (no terminal can
# encode one: printed raw they end the tool with UnicodeEncodeError)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x9b\ud800-\udfff]")
# a dotted Hydra key=value (model.recompute_modules=[], ++train.x=1) as one word of prose
_OVERRIDE_WORD = re.compile(r"(?<!\S)((?:\+\+|\+|~)?[A-Za-z_]\w*(?:\.\w+)+=\S*)")


def safe_text(text: str) -> str:
    """`text` without terminal control sequences (newlines and tabs stay)."""
    return _CONTROL.sub(_escape, text)


def _escape(m: re.Match) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shell_token(token: str) -> str:
    """One argv token as a shell reads it back unchanged (plain tokens stay bare)."""
    return shlex.quote(str(token))


def shell_line(argv: Iterable[str]) -> str:
    return shlex.join(str(t) for t in argv)


def quote_overrides(text: str) -> str:
    """Shell-quote every Hydra override in prose that the shell would otherwise expand."""
    def repl(m: re.Match) -> str:
        tok, trail = m.group(1), ""
        # sentence punctuation after the override is not part of it (a bracket of the value is)
        while tok and (tok[-1] in ".,;:" or (tok[-1] == ")" and tok.count("(") < tok.count(")"))):
            trail = tok[-1] + trail
            tok = tok[:-1]
        return shell_token(tok) + trail
    return _OVERRIDE_WORD.sub(repl, text)


def emit(report: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """Print `report` as one JSON object (a dict, or a typed report's `to_dict()`) or as text."""
    if as_json:
        data = report.to_dict() if hasattr(report, "to_dict") else report
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    else:
        out = safe_text(text(report))
        sys.stdout.write(out if out.endswith("\n") else out + "\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A plain fixed-width table. `align` is one char per column: l or r."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" * len(headers)

    def fmt(r: list[str]) -> str:
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)]
        return "  ".join(parts).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def warn(message: str) -> None:
    sys.stderr.write(safe_text(message.rstrip("\n")) + "\n")
