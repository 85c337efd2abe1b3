"""The planner's candidate search, frontier, recommendation and calibration."""

from __future__ import annotations

import json

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.placement import place
from mbridge_recompute.plan import budget, measured, planner, search
from mbridge_recompute.plan.labels import label_effects
from mbridge_recompute.setting import RecomputeSetting

from conftest import EXAMPLES

GB = 1e9


@pytest.fixture(scope="module")
def moonlight():
    return load_workload(str(EXAMPLES / "moonlight_16b.yaml"))


@pytest.fixture(scope="module")
def moonlight_plan(moonlight):
    return planner.plan(moonlight).to_dict()


def test_moe_is_never_combined_with_the_labels_it_contains():
    settings = search.selective_settings(["moe", "moe_act", "shared_experts", "layernorm"])
    mods = [set(s.modules) for s in settings]
    assert not [m for m in mods if "moe" in m and m & {"moe_act", "shared_experts"}]
    # 2^3 subsets without moe (incl. the [] control) + {moe} and {moe, layernorm}
    assert len(settings) == 10
    assert RecomputeSetting.selective() in settings


def test_uniform_counts_divide_every_model_chunk_and_block_spans_the_chunk():
    w = load_workload(default=True)                     # 80 layers, PP 4 x VPP 5: chunks of 4
    assert set(place(w).chunk_sizes) == {4}
    names = [s.candidate() for s in search.full_settings(w)]
    assert names == ["uniform:1", "uniform:2", "uniform:4", "block:1", "block:2", "block:3", "block:4"]
    m = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))   # PP 1: one chunk of 27
    assert [s.num_layers for s in search.full_settings(m) if s.method == "uniform"] == [1, 3, 9, 27]


def test_uneven_pipeline_chunks_allow_only_common_divisors():
    w = load_workload(model="deepseek-v3")              # 4 + 14 x 4 + 1 layers over PP 16
    chunks = place(w).chunk_sizes
    assert chunks[0] == 4 and chunks[-1] == 1 and sum(chunks) == 61
    full = search.full_settings(w)
    assert [s.num_layers for s in full if s.method == "uniform"] == [1]
    assert max(s.num_layers for s in full if s.method == "block") == 4


def test_default_budget_keeps_five_percent_or_two_gb_of_headroom():
    """Of the GPU's capacity as PyTorch reports it: an 80 GB GPU is the table's H100 80GB
    (79.11 GiB = 84.94 GB), 24 GB matches no GPU of the table and stays decimal GB."""
    w = load_workload(default=True)
    cap = int(79.11 * 2**30)
    assert budget.default_budget_bytes(w) == int(cap - 0.05 * cap)
    assert budget.default_budget_bytes(w.replace(gpu_memory_gb=24.0)) == int(22 * GB)
    _, text = budget.budget_statement(w, None)
    assert "headroom" in text and "--budget-gb" in text and "79.11 GiB" in text
    with pytest.raises(InputError):
        budget.budget_statement(w, -1.0)


def test_searched_labels_are_applicable_ones(moonlight_plan):
    """Allowed sets hold only applicable labels; a label the checker rejects on its own appears
    once, as a rejected single that names the rule (its effect says the same)."""
    effects = {e["label"]: e for e in moonlight_plan["labels"]}
    applicable = {lb for lb, e in effects.items() if e["applicable"]}
    for c in moonlight_plan["candidates"]:
        if c["recompute_granularity"] != "selective":
            continue
        if c["allowed"]:
            assert set(c["recompute_modules"]) <= applicable, c["name"]
        else:
            (label,) = c["recompute_modules"]
            assert c["rejected_by"] and c["rejected_by"][0] in effects[label]["reason"]


def test_a_label_saving_only_on_a_cooler_rank_is_still_searched():
    """DeepSeek-V3's three dense layers sit on pp_rank 0 (4 + 14 x 4 + 1 layers over PP 16): `mlp`
    saves nothing on a MoE-only rank, yet must stay in the search, because once other labels lower
    the MoE ranks, rank 0 can become the hottest."""

    w = load_workload(model="deepseek-v3")
    r = planner.plan(w).to_dict()
    mlp_effect = next(e for e in label_effects(w) if e.label == "mlp")
    cands = {c["name"]: c for c in r["candidates"]}
    assert r["hottest_pp_rank"] != 0 and mlp_effect.applicable
    assert mlp_effect.saving_bytes <= planner.NEGLIGIBLE_FRACTION * cands["[]"]["model_peak_bytes"]
    assert "mlp" in cands and any("mlp" in (c["recompute_modules"] or []) and len(c["recompute_modules"]) > 1
                                  for c in r["candidates"])


def test_dominated_candidates_are_marked_and_the_frontier_is_undominated(moonlight_plan):
    cands = {c["name"]: c for c in moonlight_plan["candidates"]}
    allowed = [c for c in cands.values() if c["allowed"]]
    marked = [c for c in allowed if c["dominated"]]
    assert marked, "a search with full recompute always has dominated points"
    for c in marked:
        o = cands[c["dominated_by"]]
        assert o["peak_bytes"] <= c["peak_bytes"] and o["cost_pct"] <= c["cost_pct"]
        assert o["peak_bytes"] < c["peak_bytes"] or o["cost_pct"] < c["cost_pct"]
    for f in moonlight_plan["frontier"]:
        assert not any(o["peak_bytes"] <= f["peak_bytes"] and o["cost_pct"] <= f["cost_pct"]
                       and (o["peak_bytes"] < f["peak_bytes"] or o["cost_pct"] < f["cost_pct"])
                       for o in allowed)
    undominated = {c["name"] for c in allowed if not c["dominated"]}
    assert {f["name"] for f in moonlight_plan["frontier"]} == undominated


def test_recommendation_is_the_cheapest_candidate_that_fits(moonlight, moonlight_plan):
    tops = sorted(c["band_upper_bytes"] for c in moonlight_plan["candidates"] if c["allowed"])
    budget = (tops[0] + tops[-1]) / 2 / GB                   # some fit at their band's top, some not
    r = planner.plan(moonlight, budget_gb=budget).to_dict()
    rec = r["recommendation"]
    assert rec["fits"] and rec["band_upper_bytes"] <= budget * GB
    fitting = [c for c in r["candidates"] if c["fits"]]
    assert all(c["cost_pct"] >= rec["cost_pct"] for c in fitting)
    assert any(not c["fits"] and c["allowed"] for c in r["candidates"])


def test_nothing_fits_a_tiny_budget_and_the_lowest_peak_is_reported(moonlight, moonlight_plan):
    r = planner.plan(moonlight, budget_gb=1.0).to_dict()
    assert r["fits"] is False and r["recommendation"]["fits"] is False
    lowest = min(c["peak_bytes"] for c in r["candidates"] if c["allowed"])
    assert r["recommendation"]["peak_bytes"] == lowest


def test_calibration_shifts_every_prediction_by_the_measured_offset(moonlight, moonlight_plan):
    """Moonlight's current setting is the [] control: its measured peak allocated is compared
    with the model's peak less the residual (the allocator does not count the CUDA context and
    workspaces), and every candidate moves by that one offset."""
    control = next(c for c in moonlight_plan["candidates"] if c["name"] == "[]")
    residual = moonlight_plan["ranks"][0]["static"]["residual"]
    measured = (control["model_peak_bytes"] - residual) / GB + 1.75
    r = planner.plan(moonlight, measured_peak_gb=measured).to_dict()
    offset = int(measured * GB) - (control["model_peak_bytes"] - residual)
    cal = r["calibration"]
    assert cal["offset_bytes"] == offset and abs(offset - 1.75 * GB) < 2
    assert cal["setting"] == "[]" and cal["measured_allocated_bytes"] == int(measured * GB)
    assert cal["predicted_allocated_bytes"] == control["model_peak_bytes"] - residual
    before = {c["name"]: c["peak_bytes"] for c in moonlight_plan["candidates"]}
    for c in r["candidates"]:
        assert c["peak_bytes"] - before[c["name"]] == offset
        assert c["model_peak_bytes"] == before[c["name"]]
    assert next(c for c in r["candidates"] if c["name"] == "[]")["peak_bytes"] == \
        int(measured * GB) + residual
    assert any("calibrated" in a for a in r["assumptions"])


def test_candidates_the_checker_rejects_are_never_recommended():
    """Nemotron 3 Nano runs TE CUDA graphs (attn, mamba): full recompute needs full-iteration capture."""
    w = load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"))
    r = planner.plan(w, budget_gb=1.0).to_dict()
    full = [c for c in r["candidates"] if c["recompute_granularity"] == "full"]
    assert full and all(not c["allowed"] for c in full)
    assert all("full-recompute-needs-full-iteration-graph" in c["rejected_by"] for c in full)
    assert r["recommendation"]["recompute_granularity"] != "full"
    assert all(c["allowed"] for c in r["frontier"])


def test_harness_candidates_start_with_the_control_and_include_the_recommendation(moonlight_plan):
    hc = moonlight_plan["harness_candidates"]
    assert hc[0] == "[]"
    rec = moonlight_plan["recommendation"]
    if rec["recompute_granularity"] is not None:
        assert rec["name"] in hc
    for text in hc:
        RecomputeSetting.parse(text)                      # every entry is valid candidate syntax


def test_measured_peak_comes_from_the_compare_reports_control_run(tmp_path, moonlight):
    p = tmp_path / "compare.json"
    p.write_text(json.dumps({"control": "empty", "runs": [
        {"name": "moe_act", "status": "pass", "peak_allocated_gb": 35.941},
        {"name": "empty", "status": "pass", "peak_allocated_gb": 36.618}]}))
    assert measured.read(str(p), moonlight).hottest_bytes == int(36.618 * GB)
    p.write_text(json.dumps({"control": "empty", "runs": [{"name": "empty", "status": "oom",
                                                          "peak_allocated_gb": None}]}))
    with pytest.raises(InputError) as exc:
        measured.read(str(p), moonlight)
    assert exc.value.field == "--measured" and "no peak_allocated_gb" in exc.value.reason


def test_uniform_counts_need_not_divide_the_chunk_on_main():
    """main clamps the last recompute group (recompute.py:157-166 @ d98e8a6); 0.16.1 raises IndexError."""
    m = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    on_main = [s.num_layers for s in search.full_settings(m, "main") if s.method == "uniform"]
    assert on_main == list(range(1, 28))
    on_0161 = [s.num_layers for s in search.full_settings(m, "0.16.1") if s.method == "uniform"]
    assert on_0161 == [1, 3, 9, 27]


def test_plan_for_main_searches_non_divisor_uniform_counts(moonlight):
    r = planner.plan(moonlight, version="main").to_dict()
    uniform = {c["recompute_num_layers"] for c in r["candidates"] if c["recompute_method"] == "uniform"}
    assert uniform == set(range(1, 28))


def test_when_nothing_needs_recompute_the_sweep_is_the_control_alone(moonlight):
    r = planner.plan(moonlight, budget_gb=1000.0).to_dict()
    assert r["recommendation"]["recompute_granularity"] is None and r["recommendation"]["fits"]
    assert r["harness_candidates"] == ["[]"]


def test_a_label_rejected_on_its_own_is_not_combined(moonlight):
    """A TE CUDA graph of the MoE router forbids whole-`moe` recompute (tc:2613-2680 @ core_v0.16.1):
    the memory model still counts `moe`'s saving, the checker rejects it, and no set holds it."""
    w = moonlight.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router"])
    r = planner.plan(w).to_dict()
    single = next(c for c in r["candidates"] if c["recompute_modules"] == ["moe"])
    assert not single["allowed"] and "moe-recompute-with-te-moe-router-graph" in single["rejected_by"]
    combos = [c for c in r["candidates"] if c["recompute_granularity"] == "selective"
              and "moe" in c["recompute_modules"] and len(c["recompute_modules"]) > 1]
    assert combos == []
    assert any("moe: rejected on its own" in a for a in r["assumptions"])
    assert "moe" not in (r["recommendation"]["recompute_modules"] or [])


def test_static_memory_over_budget_is_diagnosed_as_not_a_recompute_problem():
    """Llama3 8B with Adam on one GPU holds ~16 bytes per parameter (~128 GB) before any activation."""
    r = planner.plan(load_workload(model="llama3-8b")).to_dict()
    assert r["fits"] is False
    assert r["diagnosis"].startswith("static memory alone")
    r = planner.plan(load_workload(model="llama3-8b"), budget_gb=1000.0).to_dict()
    assert r["fits"] is True and r["diagnosis"] is None
