"""The differential matrix itself, and what the built-in table decides on it in-process.

The per-release comparison with each release's real TransformerConfig is tests/test_releases.py;
this file checks the matrix's shape and the ordering logic on the installed release.
"""

from __future__ import annotations

import pytest

from mbridge_recompute.facts import releases
from mbridge_recompute.rules import builtin, differential


@pytest.fixture(scope="module")
def results():
    return differential.run_matrix()


def test_matrix_holds_the_84_reference_cases_and_at_least_80_in_all():
    assert len(differential.REFERENCE_CASES) == 84
    assert [int(n.split()[0]) for n, _, _ in differential.REFERENCE_CASES] == list(range(1, 85))
    assert len(differential.CASES) >= 80
    assert len({n for n, _, _ in differential.CASES}) == len(differential.CASES)


def test_matrix_has_accepted_rejected_and_te_typeerror_cases(results):
    kinds = {r.live[0] for r in results}
    assert kinds == {"accept", "reject"}
    if releases.target_version() == "0.16":
        assert any(r.live[2] == "TypeError" for r in results), "0.16 without TE raises TypeError"
    assert any(r.live[2] == "AssertionError" for r in results)
    assert any(r.live[2] == "ValueError" for r in results)


def test_first_failing_config_rule_decides_when_several_fail(results):
    by_name = {r.name: r for r in results}
    r = by_name["v fp8 delayed + cpu offload + sel (order)"]
    assert r.live[1] == "cpu-offloading-with-recompute" == r.builtin[1]
    overrides = {n: o for n, o, _ in differential.CASES}[r.name]
    w = differential.workload(overrides)
    ids = [f["id"] for f in builtin.evaluate(w, "0.16.1").findings if f["severity"] == "error"]
    assert "cpu-offloading-with-recompute" in ids and "fp8-delayed-moe-act-layernorm" in ids
