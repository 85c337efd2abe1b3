"""Per-rank questions: `plan --free-gb X --rank R`, per-rank numbers, and calibration that anchors
each pipeline rank to its own measured peak, like for like at iteration 1."""

from __future__ import annotations

import json

import pytest

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan import measured
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.units import GB

from conftest import EXAMPLES, run_script


@pytest.fixture(scope="module")
def dsv3_free():
    res = run_script("plan", "--model", "deepseek-v3", "--free-gb", "4", "--rank", "0", "--json")
    return res.returncode, json.loads(res.stdout)


def test_free_gb_answers_the_stage_0_question_on_deepseek_v3(dsv3_free):
    """'Stage 0 needs 4 GB more headroom': the cheapest allowed setting that frees >= 4 GB on
    pipeline rank 0 against the current one, with nothing cheaper doing it."""
    rc, r = dsv3_free
    assert rc == 0
    free = r["free"]
    assert free["pp_rank"] == 0 and free["free_bytes"] == int(4 * GB)
    assert free["freed_bytes"] >= 4 * GB
    cands = {c["name"]: c for c in r["candidates"]}
    answer = cands[free["answer"]]
    assert r["recommendation"]["name"] == free["answer"]
    base = free["from_peak_bytes"]
    assert base - answer["rank_peak_bytes"][0] == free["freed_bytes"]
    cheaper = [c for c in r["candidates"] if c["allowed"] and c["cost_pct"] < answer["cost_pct"]]
    assert all(base - c["rank_peak_bytes"][0] < 4 * GB for c in cheaper)


def test_every_label_saving_and_candidate_peak_is_given_per_pipeline_rank(dsv3_free):
    _, r = dsv3_free
    pp = r["workload"]["pp"]
    assert pp > 1
    assert all(len(e["rank_saving_bytes"]) == pp for e in r["labels"])
    assert all(len(c["rank_peak_bytes"]) == pp for c in r["candidates"])


def test_nothing_frees_enough_exits_1_and_names_the_most(run_tool):
    res = run_tool("plan", "--model", "deepseek-v3", "--free-gb", "5000", "--rank", "0", "--json")
    assert res.returncode == 1
    r = json.loads(res.stdout)
    assert r["free"]["answer"] is None and r["free"]["most_freed_bytes"] > 0
    assert "no allowed setting frees" in r["diagnosis"]


@pytest.mark.parametrize("args, field", [(["--free-gb", "4", "--rank", "99"], "--rank"),
                                         (["--free-gb", "-1"], "--free-gb"),
                                         (["--rank", "0"], "--rank")])
def test_bad_per_rank_arguments_exit_2_naming_the_option(run_tool, args, field):
    res = run_tool("plan", "--model", "deepseek-v3", *args)
    assert res.returncode == 2 and field in res.stderr and "Traceback" not in res.stderr


def test_per_rank_text_shows_each_ranks_numbers(run_tool):
    res = run_tool("plan", "--model", "deepseek-v3", "--per-rank", "--top", "3")
    assert res.returncode in (0, 1)
    assert "rank 0" in res.stdout and "rank 15" in res.stdout


def _compare(tmp_path, ranks: dict, status="pass", after=3, peak=None):
    p = tmp_path / "compare.json"
    peak = peak or max(ranks.values())
    p.write_text(json.dumps({"control": "empty", "runs": [
        {"name": "empty", "status": status, "peak_allocated_gb": peak, "peak_after": after,
         "hottest_rank": max(ranks, key=ranks.get),
         "ranks": {str(k): {"after": after, "max_allocated_gb": v} for k, v in ranks.items()}}]}))
    return str(p)


def _pp2_workload():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    return w.replace(pipeline_model_parallel_size=2, num_layers=26, moe_layer_freq=[0] + [1] * 25,
                     num_gpus=16)


def test_each_pipeline_rank_is_anchored_to_its_own_measured_peak(tmp_path):
    w = _pp2_workload()
    base = plan(w).to_dict()
    control = next(c for c in base["candidates"] if c["name"] == "[]")
    residual = base["ranks"][0]["static"]["residual"]
    model = [p - residual for p in control["rank_peak_bytes"]]      # allocated, like for like
    # global ranks 0-7 are pipeline rank 0, 8-15 pipeline rank 1 (world 16, PP 2)
    m0, m1 = model[0] / GB + 1.0, model[1] / GB - 0.5
    path = _compare(tmp_path, {0: m0, 3: m0 - 0.2, 8: m1})
    r = plan(w, measured=measured.read(path, w)).to_dict()
    cal = r["calibration"]
    assert cal["measured_pp_ranks"] == [0, 1]
    offsets = cal["rank_offset_bytes"]
    assert abs(offsets[0] - GB) < 2 and abs(offsets[1] + 0.5 * GB) < 2
    c = next(c for c in r["candidates"] if c["name"] == "[]")
    assert abs(c["rank_peak_bytes"][0] - m0 * GB - residual) < 2
    assert abs(c["rank_peak_bytes"][1] - m1 * GB - residual) < 2


def test_a_control_that_died_in_iteration_2_is_matched_at_iteration_1(tmp_path):
    """Its only peak is after iteration 1, before Adam's moments exist: the offset is taken
    against the model's first-iteration peak and the steady state predicted from it, so the
    control is predicted above what was measured."""
    from mbridge_recompute import memory

    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    control_w = w.replace(recompute_granularity="selective", recompute_modules=[])
    est = memory.estimate(control_w)
    it1 = max(r.first_iteration_allocated_bytes for r in est.ranks)
    path = _compare(tmp_path, {0: it1 / GB + 0.3}, status="oom", after=1)
    m = measured.read(path, w)
    assert m.first_iteration
    r = plan(w, measured=m).to_dict()
    assert r["calibration"]["iteration"] == 1
    c = next(c for c in r["candidates"] if c["name"] == "[]")
    # measured = the allocated first-iteration peak + 0.3 GB  =>  offset = 0.3 GB, on both peaks
    assert abs(c["peak_bytes"] - (est.hottest.peak_bytes + 0.3 * GB)) < 2 * GB / 1000
    assert abs(c["allocated_peak_bytes"] - (est.hottest.allocated_peak_bytes + 0.3 * GB)) < 2 * GB / 1000
    assert c["allocated_peak_bytes"] > it1 + 0.3 * GB
    assert any("before the first optimizer step" in a for a in r["assumptions"])


def test_measured_peak_gb_after_iteration_1_is_matched_at_iteration_1():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    steady = plan(w, measured_peak_gb=30.0).to_dict()["calibration"]
    first = plan(w, measured_peak_gb=30.0, measured_iteration=1).to_dict()["calibration"]
    assert first["predicted_allocated_bytes"] < steady["predicted_allocated_bytes"]
    assert first["iteration"] == 1 and steady["iteration"] is None


def test_a_diagnosis_names_the_rank_for_free_gb(tmp_path):
    w = _pp2_workload()
    p = tmp_path / "diagnose.json"
    p.write_text(json.dumps({"findings": [{"kind": "activations", "oom": {"rank": 9, "stage": "backward"}}]}))
    m = measured.read(str(p), w)
    assert m.failed_rank == 1 and m.hottest_bytes is None
    r = plan(w, measured=m, free_gb=1.0).to_dict()
    assert r["free"]["pp_rank"] == 1 and r["calibration"] is None


def test_free_gb_picks_by_the_plans_own_order(dsv3_free):
    """The answer is the first, in the frontier's order (cost, then peak), that frees enough."""
    _, r = dsv3_free
    frees = [c for c in r["candidates"] if c["allowed"]
             and r["free"]["from_peak_bytes"] - c["rank_peak_bytes"][0] >= r["free"]["free_bytes"]]
    assert min(frees, key=lambda c: (round(c["cost_pct"], 9), c["peak_bytes"]))["name"] == r["free"]["answer"]
