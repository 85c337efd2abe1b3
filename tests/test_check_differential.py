"""The built-in rule table agrees with the installed megatron-core's TransformerConfig.

Every case of the differential matrix (the reference's 84 empirical cases plus
variations) is constructed as a real `TransformerConfig` and evaluated by the
built-in table; the verdicts (accept, or reject with the same card constraint
and exception type) and the config warnings must agree on every case.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mbridge_recompute.facts import card
from mbridge_recompute.facts import releases
from mbridge_recompute.rules import builtin, differential, live


@pytest.fixture(scope="module")
def results():
    return differential.run_matrix()


def test_matrix_holds_the_84_reference_cases_and_at_least_80_in_all():
    assert len(differential.REFERENCE_CASES) == 84
    assert [int(n.split()[0]) for n, _, _ in differential.REFERENCE_CASES] == list(range(1, 85))
    assert len(differential.CASES) >= 80
    assert len({n for n, _, _ in differential.CASES}) == len(differential.CASES)


def test_builtin_verdict_agrees_with_transformer_config_on_every_case(results):
    wrong = [f"{r.name}: live={r.live} builtin={r.builtin}" for r in results if not r.verdict_agrees]
    assert not wrong, differential.summary(results) + "\n" + "\n".join(wrong)
    print(differential.summary(results))


def test_builtin_predicts_the_config_warnings_emitted_before_the_decision(results):
    wrong = [f"{r.name}: live={sorted(r.live_warnings)} builtin={sorted(r.builtin_warnings)}"
             for r in results if r.live_warnings != r.builtin_warnings]
    assert not wrong, "\n".join(wrong)


def test_every_rejection_maps_to_a_card_constraint(results):
    unmapped = [f"{r.name}: {r.live_message}" for r in results if r.live[0] == "reject" and r.live[1] is None]
    assert not unmapped, unmapped


def test_matrix_exercises_every_0_16_1_config_constraint(results):
    """Each config rule of the installed version is decided by megatron-core in at least one case."""
    version = releases.target_version()
    config_ids = {c["id"] for c in card.constraints()
                  if c["kind"] == "config" and version in [str(v) for v in c["versions"]]}
    seen = {r.live[1] for r in results} | set().union(*(r.live_warnings for r in results))
    seen.add("cuda-graph-full-scope-deprecated")   # emitted by every default config; filtered as noise
    assert config_ids - seen == set()


def test_matrix_has_accepted_rejected_and_te_typeerror_cases(results):
    kinds = {r.live[0] for r in results}
    assert kinds == {"accept", "reject"}
    assert any(r.live[2] == "TypeError" for r in results), "0.16.1 without TE raises TypeError"
    assert any(r.live[2] == "AssertionError" for r in results)
    assert any(r.live[2] == "ValueError" for r in results)


def test_first_failing_config_rule_decides_when_several_fail(results):
    by_name = {r.name: r for r in results}
    r = by_name["v fp8 delayed + cpu offload + sel (order)"]
    assert r.live[1] == "cpu-offloading-with-recompute"
    overrides = {n: o for n, o, _ in differential.CASES}[r.name]
    w = differential.workload(overrides)
    ids = [f["id"] for f in builtin.evaluate(w, "0.16.1").findings if f["severity"] == "error"]
    assert "cpu-offloading-with-recompute" in ids and "fp8-delayed-moe-act-layernorm" in ids


def _literals(lines: list[str]) -> str:
    """The string literals of a source range, concatenated; f-string fields become {}."""
    parts = []
    for line in lines:
        for m in re.finditer(r"""[fr]?(['"])(.*?)(?<!\\)\1""", line):
            parts.append(m.group(2))
    text = "".join(parts)
    return re.sub(r"\{[^}]*\}", "{}", text)


def test_card_messages_appear_in_the_installed_source_at_the_cited_lines():
    """Each 0.16.1 config constraint's message is the string literal at its cited lines."""
    import megatron.core as mc

    if releases.installed_mcore_version() != "0.16.1":
        pytest.fail("this check reads megatron-core 0.16.1 line numbers")
    root = Path(mc.__file__).parent
    files = {"transformer_config.py": root / "transformer" / "transformer_config.py",
             "model_parallel_config.py": root / "model_parallel_config.py"}
    checked = 0
    for c in card.constraints():
        if c["kind"] != "config" or "0.16.1" not in [str(v) for v in c["versions"]] or not c["message"]:
            continue
        ranges = live._source_ranges(c["source"], "core_v0.16.1")
        assert ranges, f"{c['id']}: no core_v0.16.1 citation"
        file, start, end = ranges[0]
        lines = files[file].read_text().splitlines()[start - 1:end]
        want = re.sub(r"\{[^}]*\}", "{}", c["message"])
        assert want in _literals(lines), f"{c['id']}: {want!r} not at {file}:{start}-{end}"
        checked += 1
    assert checked >= 40
