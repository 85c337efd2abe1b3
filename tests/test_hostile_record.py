"""Every problem of the hostile-input record (round 3) has a test named after it.

tests/fixtures/hostile_r3_problems.txt lists the record's problems by number with a short title;
a problem #N is covered by the pytest tests named test_hostile_N_<what it checks> anywhere under
tests/. A renamed or deleted test, or a problem added without one, fails here by number.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict

from conftest import ROOT

TESTS = ROOT / "tests"
PROBLEMS = TESTS / "fixtures" / "hostile_r3_problems.txt"
NAMED = re.compile(r"test_hostile_(\d+)_\w")


def problems() -> dict[int, str]:
    out: dict[int, str] = {}
    for line in PROBLEMS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"(\d+)\. (\S.*)", line)
        assert m, f"{PROBLEMS.name}: not 'N. title': {line!r}"
        n = int(m.group(1))
        assert n not in out, f"{PROBLEMS.name}: #{n} listed twice"
        out[n] = m.group(2)
    return out


def named_tests() -> dict[int, list[str]]:
    """Problem number -> the module-level test functions pytest collects under that name."""
    found: dict[int, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("test_*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and (m := NAMED.match(node.name)):
                found[int(m.group(1))].append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def test_the_problem_list_is_numbered_1_to_40_without_a_gap():
    assert sorted(problems()) == list(range(1, 41))


def test_every_problem_has_a_test_named_after_it():
    tests = named_tests()
    missing = [f"#{n} {title}" for n, title in problems().items() if not tests.get(n)]
    assert not missing, "no test_hostile_N_ test for:\n" + "\n".join(missing)


def test_every_numbered_test_names_a_listed_problem():
    listed = problems()
    stray = [name for n, names in named_tests().items() if n not in listed for name in names]
    assert not stray, stray
