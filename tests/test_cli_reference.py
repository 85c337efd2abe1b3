"""references/cli-reference.md's list of plan's JSON keys against real `plan --json` reports.

The list is prose: `key` names, `{...}` for the keys of an object (or of each item of a `[]`
list), `(...)` for what a key means. Every top-level key a report holds is named outside any
brackets; every key named directly inside an object's braces is a key that object has; and the
keys that carry the error band and the verdict are all named.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import EXAMPLES, ROOT, run_script

TOKEN = re.compile(r"`([^`]*)`|([{}()])")
KEY = re.compile(r"[a-z_][a-z0-9_]*(?:\[\])?")
# the keys whose absence from the page would hide how a plan decides what fits
VERDICT_KEYS = re.compile(r"band|verdict|fits|peak_bytes")


def documented(paragraph: str) -> tuple[set, dict]:
    """(the keys named outside any brackets, {owner key: the keys named directly inside its
    braces}); an owner is the last key named before its `{`."""
    top, groups, stack, last = set(), {}, [], None
    for m in TOKEN.finditer(" ".join(paragraph.split())):
        code, bracket = m.groups()
        if bracket in ("{", "("):
            stack.append((bracket, last))
            if bracket == "{":
                groups.setdefault(last, set())
        elif bracket in ("}", ")"):
            last = stack.pop()[1]        # what follows belongs to the key before the bracket
        elif KEY.fullmatch(code):
            name = code.removesuffix("[]")
            last = code
            if not stack:
                top.add(name)
            elif stack[-1][0] == "{":
                groups[stack[-1][1]].add(name)
    assert not stack, "unbalanced brackets in the JSON keys paragraph"
    return top, groups


def plan_paragraph() -> str:
    text = (ROOT / "references" / "cli-reference.md").read_text()
    section = text.split("\n## plan.py\n", 1)[1].split("\n## ", 1)[0]
    start = section.index("JSON keys: ")
    end = "`assumptions[]`."             # the list's last key
    return section[start:section.index(end, start) + len(end)]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    """Plain, calibrated, with alternatives and --free-gb, from a catalog model with a plot."""
    plot = tmp_path_factory.mktemp("plot") / "plan.png"
    runs = [(str(EXAMPLES / "moonlight_16b.yaml"), "--measured-peak-gb", "36.618", "--budget-gb", "37.7"),
            ("--alternatives", "--free-gb", "3", "--rank", "0"),
            ("--model", "llama3-8b", "--plot", str(plot))]
    out = []
    for args in runs:
        r = run_script("plan", *args, "--json", timeout=300)
        assert r.returncode in (0, 1), r.stderr
        out.append(json.loads(r.stdout))
    return out


def _union(objects) -> set:
    return set().union(*(set(o) for o in objects))


def test_the_parser_reads_owners_nesting_and_descriptions():
    top, groups = documented("JSON keys: `a` {`b`, `c` (`not_a_key`), `d` (x: {`e`})}, `f` "
                             "(`g`, `h`), `i[]` {`j`}.")
    assert top == {"a", "f", "i"}
    assert groups == {"a": {"b", "c", "d"}, "d": {"e"}, "i[]": {"j"}}


def test_every_top_level_key_of_plan_json_is_documented(reports):
    top, _groups = documented(plan_paragraph())
    real = _union(reports)
    assert real - top == set(), "plan --json keys missing from cli-reference.md"
    assert top - real == set(), "cli-reference.md names top-level keys plan --json lacks"


def test_every_documented_object_key_is_a_key_of_that_object(reports):
    _top, groups = documented(plan_paragraph())
    ranks = [r for d in reports for r in d["ranks"]]
    cands = [c for d in reports for c in d["candidates"]]
    recs = [d["recommendation"] for d in reports if d["recommendation"]]
    real = {"release": _union(d["release"] for d in reports),
            "ranks[]": _union(ranks),
            "band": _union(r["band"] for r in ranks if r["band"]),
            "terms[]": _union(t for r in ranks if r["band"] for t in r["band"]["terms"]),
            "labels[]": _union(e for d in reports for e in d["labels"]),
            "candidates[]": _union(cands),
            "recommendation": _union(recs)}
    assert set(groups) == set(real)
    for owner, keys in groups.items():
        assert keys - real[owner] == set(), owner
    # the recommendation is a candidate: the keys it adds are the ones its braces name
    assert _union(recs) - _union(cands) <= groups["recommendation"]


def test_the_band_and_verdict_keys_are_documented(reports):
    """ranks[].band, allocated and device peaks, each candidate's verdict, band edges and
    point fit, the report's verdict: named, so a reader of the page finds how fit is decided."""
    top, groups = documented(plan_paragraph())
    assert {"verdict", "fits", "cheaper_if_calibrated", "calibrate_first"} <= top
    ranks = _union(r for d in reports for r in d["ranks"])
    cands = _union(c for d in reports for c in d["candidates"])
    assert {k for k in ranks if VERDICT_KEYS.search(k)} <= groups["ranks[]"]
    assert {k for k in cands if VERDICT_KEYS.search(k)} <= groups["candidates[]"]
    assert {"allocated_peak_bytes", "device_peak_bytes", "band"} <= groups["ranks[]"]
    assert {"verdict", "band_lower_bytes", "band_upper_bytes", "point_fits"} <= groups["candidates[]"]
