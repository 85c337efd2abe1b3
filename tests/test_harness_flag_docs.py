"""The flag table of references/harness-and-logs.md says what the release data says.

Every flag the table names must exist in `data/bridge_harness_flags.json` for each release whose
column gives a line (and at that line), and must be absent where the column says "–"."""

from __future__ import annotations

import re

from mbridge_recompute.facts import bridge_flags
from mbridge_recompute.runs import bridge

from conftest import ROOT

DOC = ROOT / "references" / "harness-and-logs.md"


def table_rows() -> list:
    text = DOC.read_text()
    section = text.split("## Harness flags by release", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert len(rows) >= 30
    return rows


def _lines(cell: str) -> list:
    cell = cell.strip()
    if cell == "–":
        return []
    if re.fullmatch(r"\d+-\d+", cell):          # a range covers several flags in one row
        lo, hi = map(int, cell.split("-"))
        return [range(lo, hi + 1)]
    return [int(x) for x in re.split(r",\s*", cell)]


def test_every_documented_flag_is_a_flag_of_the_releases_it_claims():
    for row in table_rows():
        cells = [c for c in row.split("|")[1:-1]]
        flags = re.findall(r"`(-[-\w]+)`", cells[0])
        for col, keys in ((cells[1], ("0.5",)), (cells[2], ("0.6", "main"))):
            lines = _lines(col)
            for key in keys:
                known = {sp: e for e in bridge_flags.flags(key) for sp in e["flags"]}
                if not lines:
                    assert not any(f in known for f in flags), (row, key)
                    continue
                for f in flags:
                    assert f in known, (f, key)
                if len(lines) == 1 and isinstance(lines[0], range):
                    assert all(known[f]["line"] in lines[0] for f in flags), (row, key)
                elif len(lines) == len(flags):
                    assert [known[f]["line"] for f in flags] == lines, (row, key)
                else:
                    assert known[flags[0]]["line"] == lines[0], (row, key)


def test_the_task_choices_the_doc_states_are_the_data():
    for key, choices in (("0.5", ["pretrain", "sft", "lora"]), ("0.6", ["pretrain", "sft", "peft"]),
                         ("main", ["pretrain", "sft", "peft"])):
        task = next(e for e in bridge_flags.flags(key) if "--task" in e["flags"])
        assert task["choices"] == choices
        assert list(bridge.release(key).task_choices) == choices
