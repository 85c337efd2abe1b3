"""Printing a report: one JSON object on stdout with --json, readable text otherwise.

Reports are plain dicts built by the logic modules; this module only renders.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable, Sequence


def emit(report: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """Print `report` as one JSON object (a dict, or a typed report's `to_dict()`) or as text."""
    if as_json:
        data = report.to_dict() if hasattr(report, "to_dict") else report
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    else:
        out = text(report)
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
    sys.stderr.write(message.rstrip("\n") + "\n")
