"""The plan prices the setting megatron-core would run: what the checker finds switched off
(a silent no-op's `disables`) saves nothing and costs nothing in the plan either."""

from __future__ import annotations

from mbridge_recompute import memory
from mbridge_recompute.facts import releases
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan.labels import label_effects
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.rules import check_workload
from mbridge_recompute.setting import RecomputeSetting

from conftest import EXAMPLES


def _moonlight_with_router_graph():
    """Moonlight (MLA + MoE, layernorm matters for the attention norm and the pre-MLP norm)
    with TE CUDA graphs capturing attn and moe_router but not moe_preprocess."""
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    version = releases.target_version()
    graphs = {"cuda_graph_impl": "transformer_engine"}
    if releases.in_range(version, "0.18-main"):
        graphs["cuda_graph_modules"] = ["attn", "moe_router"]
    else:
        graphs["cuda_graph_scope"] = ["attn", "moe_router"]
    return w, w.replace(**graphs, attention_dropout=0.0)


def test_check_and_plan_agree_the_pre_mlp_norm_recompute_is_off_under_a_moe_router_graph():
    plain, graphed = _moonlight_with_router_graph()
    ln = RecomputeSetting.selective("layernorm")
    findings = check_workload(ln.apply(graphed), validator="builtin")["findings"]
    hit = [f for f in findings if f["id"] == "pre-mlp-layernorm-with-moe-router-graph"]
    assert hit and hit[0]["disables"] == [["layernorm", "moe"]]

    saving = {e.label: e for e in label_effects(graphed)}["layernorm"]
    full_saving = {e.label: e for e in label_effects(plain)}["layernorm"]
    assert saving.applicable and "partly switched off" in saving.reason
    # what is left is the MLA attention norm's saving: the pre-MLP norm output stays
    est_off = memory.estimate(ln.apply(graphed), disabled=(("layernorm", "moe"),))
    est_on = memory.estimate(ln.apply(graphed))
    assert est_off.hottest.peak_bytes > est_on.hottest.peak_bytes
    assert 0 < saving.saving_bytes < full_saving.saving_bytes


def test_a_partly_switched_off_label_costs_only_what_still_runs():
    _, graphed = _moonlight_with_router_graph()
    ln = RecomputeSetting.selective("layernorm").apply(graphed)
    off = memory.replay_cost_pct(ln, disabled=(("layernorm", "moe"),))
    on = memory.replay_cost_pct(ln)
    assert 0 < off < on


def test_plan_json_names_what_the_checker_switched_off():
    _, graphed = _moonlight_with_router_graph()
    report = plan(graphed).to_dict()
    cand = next(c for c in report["candidates"] if c["name"] == "layernorm")
    assert cand["switched_off"] == ["layernorm in moe layers"]
    assert all(c["switched_off"] == [] for c in report["candidates"]
               if "layernorm" not in (c.get("recompute_modules") or []))


def test_full_recompute_on_a_hybrid_stack_is_priced_as_no_recompute():
    """full-recompute-on-hybrid-stack (0.16, 0.17): MambaStack runs its layers without a
    checkpoint; the plan must not credit full recompute with a saving there."""
    version = "0.17"           # the rule holds for 0.16-0.17: checked on the release, not the install
    assert releases.in_range(version, "0.16-0.17")
    w = load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"), mcore_version="0.17.1")
    full = RecomputeSetting.parse("uniform:1").apply(w.replace(cuda_graph_impl="none",
                                                               cuda_graph_scope=None))
    findings = check_workload(full, validator="builtin", version=version)["findings"]
    off = tuple(tuple(d) for f in findings for d in f.get("disables", ()))
    assert ("full", "all") in off
    none = memory.estimate(RecomputeSetting.off().apply(full))
    assert memory.estimate(full, disabled=off).hottest.activation_bytes == none.hottest.activation_bytes
    assert memory.replay_cost_pct(full, disabled=off) == 0.0
