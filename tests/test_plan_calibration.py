"""Calibration on the setting that was measured: `plan --measured-peak-gb GB` anchors the current
setting (or `--measured-setting`, or a compare record's own setting), on the hottest rank or
`--rank`, like for like on peak allocated; the offset is one printed term kept constant across
settings; an anchor that would make a term negative is refused (exit 1)."""

from __future__ import annotations

import json

import pytest

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB

from conftest import EXAMPLES, run_script

MOONLIGHT = str(EXAMPLES / "moonlight_16b.yaml")
FULL = ["--set", "model.recompute_granularity=full", "--set", "model.recompute_method=uniform",
        "--set", "model.recompute_num_layers=1"]
INTERFACE_KEYS = {"setting", "rank", "iteration", "measured_allocated_bytes",
                  "predicted_allocated_bytes", "offset_bytes"}


def _json(proc):
    return json.loads(proc.stdout)


def test_a_full_recompute_run_measured_at_70_gb_is_anchored_on_full_recompute():
    """The run's current setting is full uniform 1; the 70 GB it measured are full recompute's,
    not the [] control's (which printed 'current setting full uniform 1: predicted peak -4.02 GB'
    and recommended no recompute at 70.00 GB, 'fits', exit 0)."""
    proc = run_script("plan", *FULL, "--measured-peak-gb", "70", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    r = _json(proc)
    cal = r["calibration"]
    assert INTERFACE_KEYS <= set(cal) and cal["setting"] == "uniform:1"
    assert cal["measured_allocated_bytes"] == 70 * GB
    assert cal["offset_bytes"] == cal["measured_allocated_bytes"] - cal["predicted_allocated_bytes"]
    residual = r["ranks"][cal["rank"]]["static"]["residual"]
    current = r["current"]
    assert current["rank_peak_bytes"][cal["rank"]] == 70 * GB + residual
    assert all(p > s for c in r["candidates"] if c["peak_bytes"] is not None
               for p, s in zip(c["rank_peak_bytes"], c["rank_static_bytes"]))
    none = next(c for c in r["candidates"] if c["name"] == "none")
    assert none["peak_bytes"] > 70 * GB and r["recommendation"]["name"] != "none"
    text = run_script("plan", *FULL, "--measured-peak-gb", "70").stdout
    assert "unexplained offset: +" in text and "kept constant across settings" in text
    assert "predicted peak -" not in text


def test_measured_setting_anchors_the_control_instead_of_the_current_setting():
    w = load_workload(default=True)                             # current: selective [core_attn]
    base = plan(w).to_dict()
    control = next(c for c in base["candidates"] if c["name"] == "[]")
    residual = base["ranks"][0]["static"]["residual"]
    hot = control["hottest_pp_rank"]
    measured = (control["rank_peak_bytes"][hot] - residual) / GB + 0.5
    r = plan(w, measured_peak_gb=measured, measured_setting=RecomputeSetting.selective()).to_dict()
    cal = r["calibration"]
    assert cal["setting"] == "[]" and cal["rank"] == hot
    assert abs(cal["offset_bytes"] - 0.5 * GB) < 2
    mine = plan(w, measured_peak_gb=measured).to_dict()["calibration"]
    assert mine["setting"] == "core_attn" and mine["offset_bytes"] != cal["offset_bytes"]


def test_rank_names_the_pipeline_rank_the_peak_was_measured_on():
    w = load_workload(default=True)
    r = plan(w, measured_peak_gb=60.0, rank=2).to_dict()
    cal = r["calibration"]
    assert cal["rank"] == 2 and cal["measured_pp_ranks"] == [2]
    residual = r["ranks"][2]["static"]["residual"]
    assert r["current"]["rank_peak_bytes"][2] == 60 * GB + residual


def _compare_file(tmp_path, runs, control="empty"):
    p = tmp_path / "compare.json"
    p.write_text(json.dumps({"control": control, "runs": runs}))
    return str(p)


def test_a_compare_report_anchors_each_run_on_its_own_recorded_setting(tmp_path):
    path = _compare_file(tmp_path, [
        {"name": "empty", "setting": "[]", "status": "pass", "peak_allocated_gb": 36.618},
        {"name": "moe_act", "setting": "moe_act", "status": "pass", "peak_allocated_gb": 35.941}])
    by_control = _json(run_script("plan", MOONLIGHT, "--measured", path, "--json"))["calibration"]
    by_moe_act = _json(run_script("plan", MOONLIGHT, "--measured", path, "--measured-setting",
                                  "moe_act", "--json"))["calibration"]
    assert by_control["setting"] == "[]" and by_moe_act["setting"] == "moe_act"
    assert by_moe_act["measured_allocated_bytes"] == int(35.941 * GB)
    assert by_moe_act["predicted_allocated_bytes"] < by_control["predicted_allocated_bytes"]
    missing = run_script("plan", MOONLIGHT, "--measured", path, "--measured-setting", "mlp")
    assert missing.returncode == 2 and missing.stderr.startswith("error: --measured-setting:")


def test_measured_setting_without_a_measurement_is_bad_input():
    p = run_script("plan", MOONLIGHT, "--measured-setting", "moe_act")
    assert p.returncode == 2 and p.stderr.startswith("error: --measured-setting:")
    p = run_script("plan", MOONLIGHT, "--measured-peak-gb", "36", "--measured-setting", "uniform:x")
    assert p.returncode == 2 and p.stderr.startswith("error: --measured-setting:")


@pytest.mark.parametrize("peak", ["0.001", "10"])
def test_hostile_20_a_measured_peak_below_static_is_refused_not_planned(peak):
    """`--measured-peak-gb 0.001` printed 'block:3 -14.78 GB' and 'predicted peak 0.00 GB ...
    fits', exit 0 (the default workload's static memory is 47 GB)."""
    p = run_script("plan", "--measured-peak-gb", peak, "--json")
    assert p.returncode == 1, p.stdout
    err = _json(p)["error"]
    assert err["field"] == "--measured-peak-gb" and err["exit"] == 1
    assert "activations would be negative" in err["message"] and "static" in err["message"]
    assert p.stderr.startswith("error: --measured-peak-gb:") and "Traceback" not in p.stderr


def _moonlight_compare(tmp_path, **control_changes):
    sweep = EXAMPLES / "logs" / "moonlight16b"
    p = run_script("compare", *[sweep / n / "log.txt" for n in ("empty", "moe_act")], "--json")
    data = json.loads(p.stdout)
    for r in data["runs"]:
        if r["control"]:
            r.update(control_changes)
    out = tmp_path / "compare.json"
    out.write_text(json.dumps(data))
    return str(out)


@pytest.mark.parametrize("ranks, field", [([1], "--measured: runs[0].ranks"),
                                          ({"0": "x"}, "--measured: runs[0].ranks.0"),
                                          ({"zero": {"max_allocated_gb": 3}}, "--measured: runs[0].ranks")])
def test_hostile_6_a_compare_report_with_non_mapping_ranks_is_bad_input(tmp_path, ranks, field):
    path = _moonlight_compare(tmp_path, ranks=ranks)
    p = run_script("plan", MOONLIGHT, "--measured", path, "--json")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert _json(p)["error"]["field"] == field


@pytest.mark.parametrize("change", [{"peak_allocated_gb": 1e300},
                                    {"ranks": {"0": {"max_allocated_gb": 1e300}}},
                                    {"peak_allocated_gb": float("inf")}])
def test_hostile_7_a_huge_measured_peak_is_bad_input(tmp_path, change):
    path = _moonlight_compare(tmp_path, **change)
    p = run_script("plan", MOONLIGHT, "--measured", path, "--json")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert _json(p)["error"]["field"].startswith("--measured: runs[0]")


def test_hostile_8_a_negative_oom_rank_in_a_diagnosis_is_bad_input(tmp_path):
    d = tmp_path / "d.json"
    d.write_text('{"findings":[{"oom":{"rank":-9}}]}')
    p = run_script("plan", MOONLIGHT, "--measured", str(d), "--free-gb", "1", "--json")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert _json(p)["error"]["field"] == "--measured: findings[0].oom.rank"


@pytest.mark.parametrize("change, field", [
    ({"status": "oom", "ooms": [{"rank": -5}]}, "--measured: runs[0].ooms[].rank"),
    ({"status": "oom", "ooms": [], "hottest_rank": -3}, "--measured: runs[0].hottest_rank"),
    ({"status": "oom", "ooms": [{"rank": 99}]}, "--measured: runs[0].ooms[].rank"),
])
def test_hostile_8_a_negative_or_outside_rank_in_a_compare_report_is_bad_input(tmp_path, change, field):
    """Python's negative indexing gave 'to free 1.00 GB on pp_rank -1' with exit 0."""
    path = _moonlight_compare(tmp_path, **change)
    p = run_script("plan", MOONLIGHT, "--measured", path, "--free-gb", "1", "--json")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert _json(p)["error"]["field"] == field


@pytest.mark.parametrize("setting, field", [("cluster.gpu_memory_gb=1", "cluster.gpu_memory_gb"),
                                            ("cluster.gpu_memory_gib=0.5", "cluster.gpu_memory_gib")])
def test_hostile_22_capacity_minus_headroom_not_positive_is_bad_input(setting, field):
    """A 1 GB GPU printed 'budget: -1.00 GB per GPU'."""
    p = run_script("plan", "--set", setting, "--json")
    assert p.returncode == 2 and _json(p)["error"]["field"] == field
    assert "headroom" in p.stderr
    assert run_script("plan", "--set", setting, "--budget-gb", "3").returncode == 1


def test_an_offset_that_takes_a_static_part_below_zero_is_refused():
    """A small model with long sequences: activations far above static memory. A measurement
    just above the static memory is accepted by the anchor's own check, but the offset it
    implies would leave candidates a negative static part: refused (exit 1), not planned."""
    from mbridge_recompute.errors import Rejected
    from mbridge_recompute.workload import Workload

    w = Workload(num_layers=4, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                 seq_length=32768, vocab_size=8192, bf16=True, num_gpus=1,
                 recompute_granularity="selective", recompute_modules=[], gpu_memory_gb=1000.0)
    base = plan(w).to_dict()
    rank = base["ranks"][0]
    assert rank["activation_bytes"] > rank["static_bytes"]
    just_above = (rank["static_bytes"] - rank["static"]["residual"]) / GB + 0.01
    with pytest.raises(Rejected) as exc:
        plan(w, measured_peak_gb=just_above)
    assert exc.value.field == "--measured-peak-gb" and "static part" in exc.value.reason


def test_the_calibrated_moonlight_example_asks_for_half_a_gigabyte_below_the_control():
    """README and SKILL.md's example, `--measured-peak-gb 36.618 --budget-gb 37.7` on Moonlight:
    the control is anchored at the measured figure plus the model's residual (the budget is
    device memory), about 0.5 GB over the budget. What the plan then recommends is
    tests/test_skill_claims.py's claim."""
    p = run_script("plan", MOONLIGHT, "--measured-peak-gb", "36.618", "--budget-gb", "37.7", "--json")
    assert p.returncode == 0, p.stderr
    r = _json(p)
    residual = r["ranks"][0]["static"]["residual"]
    control = next(c for c in r["candidates"] if c["name"] == "[]")
    assert control["peak_bytes"] == int(36.618 * GB) + residual
    assert control["peak_bytes"] - 37.7 * GB == pytest.approx(0.5 * GB, abs=0.05 * GB)
