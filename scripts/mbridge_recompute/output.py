"""Printing a report: one JSON object on stdout with --json, readable text otherwise.

Reports are plain dicts built by the logic modules; this module only renders. Two rules hold
for every text report:

* nothing from a log reaches the terminal as a control sequence: escape characters and other
  C0 controls (ANSI colours, cursor moves, a bell) are shown as `\\x1b`-style text;
* a Hydra override or an argv token a person may paste is shell-quoted when it holds a
  character the shell would act on (`[ ] { } * ? $` spaces, quotes, ...): `shell_token`,
  `shell_line` and `quote_overrides`.

Text fits `WIDTH` (100) columns unless the command line says `--wide` (cli.py sets the width for
the whole invocation): prose goes through `wrap`, a command a person pastes through
`shell_lines` (backslash-continued), and a table through `table`, which stacks long headers and
wraps its free-text column in place, or moves it under the row when the numbers leave it too
little room. `--wide` gives every sentence and every table row one line, however long.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

WIDTH = 100                   # columns of every text report (--wide: no limit)
MIN_WRAP = 24                 # narrowest a table's free-text column is wrapped to in place
UNDER_INDENT = "    "         # a free-text cell moved under its row starts here
_WIDTH: ContextVar[Optional[int]] = ContextVar("text_width", default=WIDTH)

# C0 and C1 controls (newline and tab stay), lone UTF-16 surrogates (no terminal can encode one:
# printed raw they end the tool with UnicodeEncodeError), and the Unicode format characters that
# reorder or hide text on a terminal (U+202E right-to-left override, U+200B zero width space,
# U+2066 isolates, U+FEFF, ...: category Cf)
_CONTROL = re.compile("[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\ud800-\\udfff\\u00ad\\u0600-\\u0605\\u061c\\u06dd"
                      "\\u070f\\u0890\\u0891\\u08e2\\u180e\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2064"
                      "\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb\\U000110bd\\U000110cd\\U00013430-\\U0001343f"
                      "\\U0001bca0-\\U0001bca3\\U0001d173-\\U0001d17a\\U000e0001\\U000e0020-\\U000e007f]")
# a dotted Hydra key=value (model.recompute_modules=[], ++train.x=1) as one word of prose
_OVERRIDE_WORD = re.compile(r"(?<!\S)((?:\+\+|\+|~)?[A-Za-z_]\w*(?:\.\w+)+=\S*)")


def safe_text(text: str) -> str:
    """`text` without terminal control sequences (newlines and tabs stay)."""
    return _CONTROL.sub(_escape, text)


def _escape(m: re.Match) -> str:
    code = ord(m.group(0))
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shell_token(token: str) -> str:
    """One argv token as a shell reads it back unchanged (plain tokens stay bare)."""
    return shlex.quote(str(token))


def shell_line(argv: Iterable[str]) -> str:
    return shlex.join(str(t) for t in argv)


def text_width() -> Optional[int]:
    """The columns text may take in this invocation (None: --wide, no limit)."""
    return _WIDTH.get()


@contextmanager
def width(columns: Optional[int]) -> Iterator[None]:
    """Render everything inside at `columns` (None: one line per sentence and per table row)."""
    token = _WIDTH.set(columns)
    try:
        yield
    finally:
        _WIDTH.reset(token)


def wrap(text: str, indent: str = "", hang: Optional[str] = None) -> list[str]:
    """One sentence or paragraph as lines of the current width: the first line starts with
    `indent`, the rest with `hang` (default: `indent` and two more spaces). Words are never
    split (a path or a flag longer than the line stays whole), nor broken at hyphens."""
    hang = indent + "  " if hang is None else hang
    cols = text_width()
    if cols is None or len(indent) + len(text) <= cols:
        return [indent + text]
    out: list[str] = []
    for i, part in enumerate(text.split("\n")):
        out += _pack(part, cols, indent if i == 0 else hang, hang)
    return out


def wrap_all(lines: Iterable[str], more: str = "    ") -> list[str]:
    """Lines of prose, each wrapped at the current width; a continuation is indented as its line
    plus `more` (so `  fix: ...` continues under its own text). Not for commands or code."""
    out: list[str] = []
    for line in lines:
        for part in line.split("\n"):
            lead = part[:len(part) - len(part.lstrip(" "))]
            out += wrap(part[len(lead):], lead, lead + more)
    return out


def _pack(text: str, cols: int, first: str, hang: str, breaks: str | tuple = "@") -> list[str]:
    """Words of `text` greedily in lines of `cols`, the first starting with `first`, the rest
    with `hang`. A word too long for any line is cut before a character of `breaks` (a candidate
    before its `@` changes); what cannot be cut overflows whole."""
    lines, cur, fresh = [], first + text[:len(text) - len(text.lstrip(" "))], True
    for m in re.finditer(r"(\s*)(\S+)", text.strip(" ")):
        space, word = m.group(1).replace("\t", " ") or " ", m.group(2)   # inner spacing is kept
        pieces = [word] if len(hang) + len(word) <= cols else _pieces(word, breaks)
        for k, piece in enumerate(pieces):
            sep = "" if fresh or k else space
            if not fresh and len(cur) + len(sep) + len(piece) > cols:
                lines.append(cur)
                cur, fresh, sep = hang, True, ""
            cur += sep + piece
            fresh = False
    return [line.rstrip() for line in lines + [cur]]


def shell_lines(argv: Iterable[str], indent: str = "", hang: Optional[str] = None,
                head: Sequence[str] | str = ()) -> list[str]:
    """A command a person pastes, shell-quoted, continued with ` \\` at the current width; `head`
    (`cd`, a quoted DIR, `&&`, `ENV=1`, as words or as one already-quoted string) goes before the
    first token as it is."""
    # one string: its shell words, a single-quoted part kept whole
    words = re.findall(r"(?:[^\s']+|'[^']*')+", head) if isinstance(head, str) else list(head)
    tokens = [w for w in words if w] + [shell_token(t) for t in argv]
    cols = text_width()
    line = indent + " ".join(tokens)
    if cols is None or len(line) <= cols:
        return [line]
    hang = indent + "  " if hang is None else hang
    units: list[str] = []                # a flag stays on the line of its short value: `-mr NAME`
    for tok in tokens:
        if units and units[-1].startswith("-") and " " not in units[-1] and not tok.startswith("-") \
                and len(units[-1]) + len(tok) < 40:
            units[-1] += " " + tok
        else:
            units.append(tok)
    out, cur, on_line = [], indent, 0
    for tok in units:
        if on_line and len(cur) + 1 + len(tok) + 2 > cols:
            out.append(cur + " \\")
            cur, on_line = hang, 0
        cur += (" " if on_line else "") + tok
        on_line += 1
    return out + [cur]


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


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None,
          free: Optional[int] = None, breaks: str | tuple = "") -> str:
    """A plain fixed-width table. `align` is one char per column: l or r.

    At the current width, a table too wide for it is laid out in steps until it fits: headers
    stack at spaces; the widest cells wrap at spaces or break before any character of `breaks`
    (a candidate name before its `@` changes, the continuation starting with it); `free`, the index of the
    free-text column (a reason, a term), wraps in place, or, when the other columns leave it
    under MIN_WRAP columns, is written under each row as `    HEADER: TEXT`."""
    headers = [str(h) for h in headers]
    body = [["" if c is None else str(c) for c in r] for r in rows]
    align = align or "l" * len(headers)
    col = None if free is None else free % len(headers)
    cols = text_width()
    natural = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    if cols is None or _span(natural) <= cols:
        return _grid([[h] for h in headers], [[[c] for c in r] for r in body], natural, align)
    whole, whole_widths = [list(r) for r in body], list(natural)    # for column blocks
    # a breakable key (a candidate name) longer than a third of the line goes on a line of its
    # own above its row, so no row carries a broken key beside its figures
    above = [[] for _ in body]
    if breaks and body:
        inline = [len(r[0]) for r in body if len(r[0]) <= cols // 3]
        key = max(inline + [len(w) for w in headers[0].split()] + [1])
        for k, r in enumerate(body):
            if len(r[0]) > key:
                above[k] = _pack(r[0], cols, "", "", breaks)
                body[k] = [""] + r[1:]
        natural[0] = max(len(headers[0]), key)
    cells = [max([len(r[i]) for r in body] + [1]) for i in range(len(headers))]
    stacked = [max([cells[i]] + [len(w) for w in h.split()]) for i, h in enumerate(headers)]
    # the narrowest a column can be: its header's longest word, its cells' longest piece
    least = [max([len(p) for r in body for w in r[i].split() for p in _pieces(w, breaks)]
                 + [len(w) for w in h.split()] + [1]) for i, h in enumerate(headers)]

    def fit(idx: list, budget: int) -> dict:
        """Widths of columns `idx` within `budget`: natural, else stacked headers, else the
        widest breakable cells broken."""
        w = {i: natural[i] for i in idx}
        if _span(list(w.values())) > budget:
            w = {i: stacked[i] for i in idx}
        for i in sorted(idx, key=lambda i: -w[i]):
            excess = _span(list(w.values())) - budget
            if excess <= 0:
                break
            w[i] = max(least[i], w[i] - excess)
        return w

    under = False
    if col is None:
        widths = fit(list(range(len(headers))), cols)
    else:
        others = [i for i in range(len(headers)) if i != col]
        longest = max([len(w) for r in body for w in r[col].split()] + [1])
        need = min(natural[col], max(MIN_WRAP, min(longest, cols // 2)))
        widths = fit(others, cols - need - 2)
        room = cols - _span(list(widths.values())) - 2
        if room >= need:
            widths[col] = min(room, natural[col])
        else:
            under = True
            widths = fit(others, cols)
    keep = [i for i in range(len(headers)) if not (under and i == col)]
    if _span([widths[i] for i in keep]) > cols and len(keep) > 2:
        return _blocks(headers, whole, align, col, whole_widths, breaks)
    head = [_fill(headers[i], widths[i]) for i in keep]
    grid = [[_fill(r[i], widths[i], "" if i == col else breaks) for i in keep] for r in body]
    notes = None
    if under:
        notes = [wrap(f"{headers[col]}: {r[col]}", UNDER_INDENT) if r[col] else []
                 for r in body]
    return _grid(head, grid, [widths[i] for i in keep], "".join(align[i] for i in keep), notes, above)


def _blocks(headers: list, body: list, align: str, col: Optional[int], natural: list,
            breaks: str | tuple) -> str:
    """A table too wide even with stacked headers and broken cells: its columns in consecutive
    blocks, each a table of its own led by the first (key) column; the free-text column goes
    under the rows of the first block."""
    cols = text_width() or 0
    rest = [i for i in range(1, len(headers)) if i != col]
    blocks: list[list[int]] = [[]]
    for i in rest:
        if blocks[-1] and _span([natural[0]] + [natural[k] for k in blocks[-1] + [i]]) > cols:
            blocks.append([])
        blocks[-1].append(i)
    parts = []
    for n, block in enumerate(blocks):
        idx = [0] + block + ([col] if n == 0 and col is not None else [])
        with width(cols):
            parts.append(table([headers[i] for i in idx], [[r[i] for i in idx] for r in body],
                               "".join(align[i] for i in idx),
                               free=len(idx) - 1 if n == 0 and col is not None else None,
                               breaks=breaks))
    return "\n\n".join(parts)


def _pieces(text: str, breaks) -> list[str]:
    """`text` cut before every occurrence of a break (each character of a string, or each string
    of a tuple: `("::", "/")`), the parts a cell may be broken into."""
    if not breaks:
        return [text]
    seps = list(breaks) if isinstance(breaks, str) else list(breaks)
    return [p for p in re.split("(?=" + "|".join(map(re.escape, seps)) + ")", text) if p] or [""]


def _span(widths: Sequence[int]) -> int:
    """Columns a row of these widths takes (two spaces between cells)."""
    return sum(widths) + 2 * max(0, len(widths) - 1)


def _fill(text: str, columns: int, breaks: str | tuple = "") -> list[str]:
    """`text` as lines of at most `columns`: at spaces, or before a character of `breaks`
    (words and pieces whole, so a longer one overflows)."""
    if len(text) <= columns:
        return [text]
    return _pack(text, columns, "", "", breaks)


def _grid(head: list, body: list, widths: list, align: str, notes: Optional[list] = None,
          above: Optional[list] = None) -> str:
    """Lines of a table whose cells are lists of lines: headers bottom-aligned, cells top-aligned."""
    def fmt(cells: list) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()

    def block(cells: list, bottom: bool) -> list[str]:
        height = max(len(c) for c in cells)
        padded = [([""] * (height - len(c)) + c) if bottom else (c + [""] * (height - len(c)))
                  for c in cells]
        return [fmt([c[k] for c in padded]) for k in range(height)]

    lines = block(head, True) + ["  ".join("-" * w for w in widths)]
    for k, row in enumerate(body):
        if above:
            lines += above[k]
        lines += block(row, False)
        if notes:
            lines += notes[k]
    return "\n".join(lines)


def warn(message: str) -> None:
    text = safe_text(message.rstrip("\n"))
    sys.stderr.write("\n".join(line for part in text.split("\n") for line in wrap(part)) + "\n")
