"""compare reproduces the published Moonlight 16B matched sweep (evidence: NVIDIA/skills, 2026-08-12).

The example logs (examples/logs/moonlight16b/, written by tests/fixtures/logs/make_fixtures.py
from Bridge's print formats) carry the published per-run values; the deltas below are
computed by compare_runs.py, not written anywhere in the logs.
"""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, run_script

SWEEP = EXAMPLES / "logs" / "moonlight16b"
ORDER = ["empty", "core_attn", "mla_up_proj", "mla_up_proj+mlp", "moe_act", "layernorm+moe_act"]
# published: selective modules -> (peak GB, step ms, TFLOP/s/GPU, Δ peak %, Δ time %)
PUBLISHED = {
    "core_attn": (36.614, 474.80, 74.44, -0.01, 3.85),
    "mla_up_proj": (35.902, 480.89, 73.72, -1.96, 5.19),
    "mla_up_proj+mlp": (35.917, 496.73, 71.50, -1.91, 8.65),
    "moe_act": (35.941, 466.26, 75.50, -1.85, 1.99),
    "layernorm+moe_act": (35.949, 506.53, 70.27, -1.83, 10.79),
}


@pytest.fixture(scope="module")
def report():
    # the control is given last on purpose: it must be found by its manifest, not its position
    logs = [SWEEP / n / "log.txt" for n in ORDER[1:] + ORDER[:1]]
    proc = run_script("compare", *logs, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_control_is_the_empty_module_list_run(report):
    assert report["control"] == "empty"
    row = next(r for r in report["runs"] if r["name"] == "empty")
    assert row["control"] and row["status"] == "pass"
    assert row["peak_allocated_gb"] == 36.618
    assert row["step_time_ms"] == pytest.approx(457.18, abs=1e-9)
    assert row["tflops_per_gpu"] == pytest.approx(77.50, abs=1e-9)
    assert row["steady_window"] == [11, 20]


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_deltas_are_reproduced(report, name):
    peak, ms, tflops, dpeak, dtime = PUBLISHED[name]
    row = next(r for r in report["runs"] if r["name"] == name)
    assert row["status"] == "pass" and row["matched"], row["reasons"]
    assert row["peak_allocated_gb"] == peak
    assert row["step_time_ms"] == pytest.approx(ms, abs=1e-9)
    assert row["tflops_per_gpu"] == pytest.approx(tflops, abs=1e-9)
    assert round(row["delta_peak_pct"], 2) == dpeak
    assert round(row["delta_time_pct"], 2) == dtime
    assert row["delta_at"] == 2


def test_moe_act_saves_1_85_percent_for_1_99_percent_time(report):
    row = next(r for r in report["runs"] if r["name"] == "moe_act")
    assert f"{row['delta_peak_pct']:+.2f}" == "-1.85"
    assert f"{row['delta_time_pct']:+.2f}" == "+1.99"
    assert row["delta_peak_gb"] == pytest.approx(-0.677, abs=1e-9)


def test_narrowest_passing_candidate_is_moe_act(report):
    # core_attn is faster than three others but does not lower the peak (-0.01%)
    assert report["narrowest"] == "moe_act"


def test_core_attn_under_fused_attention_is_not_a_candidate(report):
    row = next(r for r in report["runs"] if r["name"] == "core_attn")
    assert row["delta_peak_pct"] > -report["min_saving_pct"]


def test_markdown_table_has_one_row_per_run():
    proc = run_script("compare", *[SWEEP / n / "log.txt" for n in ORDER], "--markdown")
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(rows) == 1 + len(ORDER)
    assert any(ln.startswith("| moe_act |") and "+1.99%" in ln and "-1.85%" in ln for ln in rows)


def test_text_table_names_the_narrowest_candidate():
    proc = run_script("compare", *[SWEEP / n for n in ORDER])     # run directories work too
    assert proc.returncode == 0, proc.stderr
    assert "narrowest passing candidate: moe_act" in proc.stdout
    assert "empty (control)" in proc.stdout
