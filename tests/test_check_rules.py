"""One test per rule family of the checker, named after the claim it proves.

The built-in table is exercised directly (pure Python); where the claim is about
what megatron-core's TransformerConfig does, the live validator runs the real,
installed megatron-core 0.16.1.
"""

from __future__ import annotations

import pytest

from mbridge_recompute.facts import card, releases
from mbridge_recompute.rules import builtin, check_workload, errors_only, live
from mbridge_recompute.workload import Workload

BASE = {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4}
MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32}
EPO = {"bf16": True, "expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall",
       "overlap_moe_expert_parallel_comm": True}


def wl(**kw) -> Workload:
    return Workload(**{**BASE, **kw})


def sel(*mods) -> dict:
    return {"recompute_granularity": "selective", "recompute_modules": list(mods)}


def full(method="uniform", n=1) -> dict:
    return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": n}


def check(w, version="0.16.1", **kw) -> dict:
    return builtin.check(w, version=version, **kw)


def ids(report, severity=None) -> set:
    return {f["id"] for f in report["findings"] if severity is None or f["severity"] == severity}


def one(report, cid) -> dict:
    (f,) = [f for f in report["findings"] if f["id"] == cid]
    return f


@pytest.fixture(scope="module")
def live_check():
    """The live validator against the installed megatron-core (imported once)."""
    return lambda w, **kw: live.check(w, **kw)


# ------------------------------------------------------------------ the card and the API
def test_builtin_rule_ids_are_exactly_the_card_constraint_ids():
    assert builtin.rule_ids() == {c["id"] for c in card.constraints()}


def test_findings_carry_message_fix_and_citation_from_the_card():
    report = check(wl(**sel("mlp"), recompute_num_layers=2))
    f = one(report, "selective-with-num-layers")
    c = card.constraint_at("selective-with-num-layers", report["version"])
    assert set(f) >= {"id", "severity", "message", "fix", "source", "upstream_message", "citation"}
    assert (f["fix"], f["citation"], f["upstream_message"]) == (c["fix"], c["citation"], c["message"])
    assert f["citation"].endswith("@ " + releases.meta(report["version"])["tag"])
    assert f["source"] == "builtin" and f["severity"] == "error"


def test_ok_is_false_iff_an_error_finding_exists():
    bad = check(wl(**sel("mlp"), recompute_num_layers=2))
    good = check(wl(**sel("mlp")))
    assert bad["ok"] is False and errors_only(bad)
    assert good["ok"] is True and errors_only(good) == []


# ------------------------------------------------------------------ recompute core (config)
def test_selective_with_num_layers_is_rejected(live_check):
    w = wl(**sel("mlp"), recompute_num_layers=1)
    assert "selective-with-num-layers" in ids(check(w), "error")
    f = one(live_check(w), "selective-with-num-layers")
    assert f["source"] == "live" and f["raises"] == "ValueError"
    assert f["upstream_message"] == ("When using recompute_granularity: selective "
                                     "recompute_num_layers must be None.")


def test_full_recompute_needs_method_and_num_layers():
    assert "full-needs-method" in ids(check(wl(recompute_granularity="full")), "error")
    assert "full-needs-num-layers" in ids(check(wl(recompute_granularity="full", recompute_method="block")),
                                          "error")
    assert check(wl(**full()))["ok"]


def test_empty_module_list_is_a_valid_control(live_check):
    w = wl(**sel())
    for report in (check(w), live_check(w)):
        assert report["ok"], report
        assert "core-attn-fused-attention" not in ids(report)
    # while null means the default [core_attn], which warns
    assert "core-attn-fused-attention" in ids(check(wl(recompute_granularity="selective")), "warning")


def test_core_attn_under_te_fused_attention_saves_nothing_but_is_real_with_local_attention():
    te = one(check(wl(**sel("core_attn"))), "core-attn-fused-attention")
    local = one(check(wl(**sel("core_attn"), transformer_impl="local")), "core-attn-fused-attention")
    assert te["severity"] == "warning" and "saves nothing" in te["message"]
    assert local["severity"] == "info" and "softmax" in local["message"]


def test_unknown_label_is_rejected_with_the_versions_label_list():
    f = one(check(wl(**sel("gdn_norm_out"))), "modules-invalid-label")
    assert f["raises"] == "AssertionError" and "gdn_norm_out" in f["message"]
    # main knows gdn_norm_out, but wants a GatedDeltaNet variant
    assert "gdn-norm-out-needs-gdn" in ids(check(wl(**sel("gdn_norm_out")), version="main"), "error")


def test_moe_act_needs_grouped_gemm_and_mla_up_proj_needs_mla():
    assert "moe-act-needs-grouped-gemm" in ids(check(wl(**sel("moe_act"), **MOE)), "error")
    assert check(wl(**sel("moe_act"), **MOE, moe_grouped_gemm=True))["ok"]
    assert "mla-up-proj-needs-mla" in ids(check(wl(**sel("mla_up_proj"))), "error")
    assert check(wl(**sel("mla_up_proj"), multi_latent_attention=True))["ok"]


def test_distribute_saved_activations_is_rejected_with_sequence_parallel():
    w = wl(**full(), tensor_model_parallel_size=2, sequence_parallel=True, distribute_saved_activations=True)
    assert "distribute-saved-activations-with-sp" in ids(check(w), "error")


def test_first_failing_config_rule_is_the_one_megatron_core_raises():
    w = wl(**sel("layernorm"), fp8="e4m3", fp8_recipe="delayed", cpu_offloading=True,
           cpu_offloading_num_layers=1)
    ev = builtin.evaluate(w, "0.16.1")
    assert ev.verdict() == ("reject", "cpu-offloading-with-recompute", "ValueError")
    errors = [f["id"] for f in ev.findings if f["severity"] == "error"]
    assert errors[:2] == ["cpu-offloading-with-recompute", "fp8-delayed-moe-act-layernorm"]


def test_live_reports_config_errors_masked_by_the_first_one(live_check):
    w = wl(**sel("layernorm"), fp8="e4m3", fp8_recipe="delayed", cpu_offloading=True,
           cpu_offloading_num_layers=1)
    report = live_check(w)
    first = one(report, "cpu-offloading-with-recompute")
    masked = one(report, "fp8-delayed-moe-act-layernorm")
    assert first["source"] == "live" and first.get("first") is True
    assert masked["source"] == "builtin" and "stopped before" in masked["message"]


# ------------------------------------------------------------------ training arguments
def test_selective_with_method_passes_the_config_but_not_the_training_arguments(live_check):
    w = wl(**sel("mlp"), recompute_method="uniform")
    assert builtin.evaluate(w, "0.16.1").verdict()[0] == "accept"
    report = live_check(w)
    f = one(report, "selective-with-method")
    assert f["kind"] == "training-args" and f["severity"] == "error" and report["ok"] is False


def test_distribute_saved_activations_needs_tp_full_and_method():
    report = check(wl(**sel("mlp"), distribute_saved_activations=True))
    assert {"distribute-needs-tp", "distribute-needs-full", "distribute-needs-method"} <= ids(report, "error")
    ok = check(wl(**full(), tensor_model_parallel_size=2, distribute_saved_activations=True))
    assert not ids(ok) & {"distribute-needs-tp", "distribute-needs-full", "distribute-needs-method"}


# ------------------------------------------------------------------ runtime-only
def test_uniform_non_dividing_num_layers_fails_at_runtime_in_0_16_1(live_check):
    w = wl(**full("uniform", 3))   # 8 layers, groups of 3
    assert builtin.evaluate(w, "0.16.1").verdict()[0] == "accept"   # the config accepts it
    f = one(check(w), "uniform-num-layers-not-dividing-chunk")
    assert f["severity"] == "error" and f["kind"] == "runtime" and "IndexError" in f["message"]
    assert "uniform-num-layers-not-dividing-chunk" in ids(live_check(w), "error")
    assert "uniform-num-layers-not-dividing-chunk" not in ids(check(w, version="main"))   # main clamps
    assert "uniform-num-layers-not-dividing-chunk" not in ids(check(wl(**full("uniform", 2))))


def test_recompute_num_layers_is_counted_per_model_chunk():
    # 80 layers, PP 4, VPP 5: chunks of 4 layers. uniform 5 divides the 20 layers of a
    # pipeline rank but not the 4 of a chunk; uniform 2 divides both.
    shape = dict(num_layers=80, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=5)
    bad = check(Workload(**shape, **full("uniform", 5)))
    assert "uniform-num-layers-not-dividing-chunk" in ids(bad, "error")
    ok = check(Workload(**shape, **full("uniform", 2)))
    assert ok["ok"] and "each model chunk of 4 layers" in one(ok, "num-layers-per-model-chunk")["message"]


def test_block_num_layers_beyond_the_chunk_recomputes_every_layer():
    w = wl(**full("block", 5), pipeline_model_parallel_size=2)   # 4 layers per chunk
    f = one(check(w), "block-num-layers-covers-chunk")
    assert f["severity"] == "info" and "every layer" in f["message"] and "change nothing" in f["message"]
    w = wl(**full("block", 3), pipeline_model_parallel_size=2)
    assert "block-num-layers-covers-chunk" not in ids(check(w))


def test_num_layers_below_one_hangs_uniform_and_recomputes_nothing_with_block():
    assert "uniform-num-layers-below-one" in ids(check(wl(**full("uniform", 0))), "error")
    f = one(check(wl(**full("block", -1))), "block-num-layers-below-one")
    assert f["severity"] == "warning" and f["kind"] == "silent-no-op"


def test_mtp_needs_uniform_one_and_block_skips_mtp_recompute():
    assert "mtp-uniform-needs-one" in ids(check(wl(mtp_num_layers=1, **full("uniform", 2))), "error")
    assert "mtp-uniform-needs-one" not in ids(check(wl(mtp_num_layers=1, **full("uniform", 1))))
    assert "mtp-block-skips-recompute" in ids(check(wl(mtp_num_layers=1, **full("block", 2))), "warning")


def test_moe_with_tensor_parallel_and_no_sequence_parallel_fails_at_runtime():
    f = one(check(wl(**MOE, tensor_model_parallel_size=2)), "moe-tp-without-sp")
    assert f["severity"] == "error" and f["kind"] == "runtime"
    w = wl(**MOE, tensor_model_parallel_size=2, sequence_parallel=True)
    assert "moe-tp-without-sp" not in ids(check(w))


def test_layernorm_and_moe_act_need_transformer_engine_at_runtime():
    w = wl(**sel("layernorm", "moe_act"), **MOE, moe_grouped_gemm=True)
    f = one(check(w, te_version="none"), "label-needs-te")
    assert f["severity"] == "warning" and "needs Transformer Engine at runtime" in f["message"]
    assert "label-needs-te" not in ids(check(w))              # unknown TE: no claim
    assert "label-needs-te" not in ids(check(w, te_version="2.8"))
    assert "label-needs-te" not in ids(check(wl(**sel("mlp")), te_version="none"))


# ------------------------------------------------------------------ silent no-ops
def test_mlp_on_pure_moe_is_a_silent_no_op():
    f = one(check(wl(**sel("mlp"), **MOE)), "mlp-on-moe-layers")
    assert f["severity"] == "warning" and f["kind"] == "silent-no-op"
    mixed = one(check(wl(**sel("mlp"), **MOE, moe_layer_freq=2)), "mlp-on-moe-layers")
    assert mixed["severity"] == "info" and "4 dense layers" in mixed["message"]
    assert "mlp-on-moe-layers" not in ids(check(wl(**sel("mlp"))))


def test_layernorm_on_the_te_dense_spec_is_a_silent_no_op():
    assert "layernorm-on-te-dense-spec" in ids(check(wl(**sel("layernorm"))), "warning")
    for other in (dict(transformer_impl="local"), dict(multi_latent_attention=True), MOE):
        assert "layernorm-on-te-dense-spec" not in ids(check(wl(**sel("layernorm"), **other)))


def test_moe_labels_on_a_dense_model_are_silent_no_ops():
    f = one(check(wl(**sel("moe", "shared_experts"))), "moe-labels-on-dense-model")
    assert "moe" in f["message"] and "shared_experts" in f["message"]


def test_shared_experts_without_shared_experts_is_a_silent_no_op():
    assert "shared-experts-without-shared-experts" in ids(check(wl(**sel("shared_experts"), **MOE)))
    assert "shared-experts-without-shared-experts" not in ids(
        check(wl(**sel("shared_experts"), **MOE, moe_shared_expert_intermediate_size=32)))


def test_moe_with_local_cuda_graphs_is_a_silent_no_op():
    w = wl(**sel("moe"), **MOE, cuda_graph_impl="local", cuda_graph_scope=["attn"], hidden_dropout=0.0)
    assert "moe-with-local-cuda-graph" in ids(check(w), "warning")


def test_moe_under_ep_overlap_is_a_no_op_in_0_16_1_and_rejected_in_main():
    w = wl(**sel("moe"), **MOE, **EPO)
    assert check(w)["ok"] and "moe-under-ep-overlap" in ids(check(w), "warning")
    main = check(w, version="main")
    assert "ep-overlap-with-moe-recompute" in ids(main, "error") and "moe-under-ep-overlap" not in ids(main)


def test_recompute_modules_are_ignored_unless_granularity_is_selective():
    ignored = one(check(wl(**full(), recompute_modules=["mlp"])), "modules-ignored-without-selective")
    assert ignored["severity"] == "info"
    # a label list without a granularity recomputes nothing at all
    assert one(check(wl(recompute_modules=["mlp"])), "modules-ignored-without-selective")["severity"] \
        == "warning"
    assert "modules-ignored-without-selective" not in ids(check(wl(**full())))


def test_moe_layer_recompute_turns_on_core_attn_and_moe():
    f = one(check(wl(moe_layer_recompute=True, **MOE)), "moe-layer-recompute-deprecated")
    assert "core_attn, moe" in f["message"]
    # and later checks see the added moe: TE moe_router graphs reject it
    w = wl(moe_layer_recompute=True, **MOE, cuda_graph_impl="transformer_engine",
           cuda_graph_scope=["moe_router"])
    assert "moe-recompute-with-te-moe-router-graph" in ids(check(w), "error")


# ------------------------------------------------------------------ offloading, graphs, fp8, EP overlap
def test_cpu_offloading_conflicts_with_pipeline_parallel_and_recompute():
    off = dict(cpu_offloading=True, cpu_offloading_num_layers=1)
    assert "cpu-offloading-with-pp" in ids(check(wl(**off, pipeline_model_parallel_size=2)), "error")
    assert "cpu-offloading-with-recompute" in ids(check(wl(**off, **sel())), "error")
    assert check(wl(**off))["ok"]


def test_full_recompute_needs_full_iteration_cuda_graphs():
    for impl in ("local", "transformer_engine"):
        assert "full-recompute-needs-full-iteration-graph" in ids(check(wl(**full(), cuda_graph_impl=impl)))
    assert check(wl(**full(), cuda_graph_impl="local", cuda_graph_scope=["full_iteration"]))["ok"]
    main = check(wl(**full(), cuda_graph_impl="full_iteration"), version="main")
    old = check(wl(**full(), cuda_graph_impl="full_iteration"))
    assert main["ok"] and "cuda-graph-impl-invalid" in ids(old)


def test_dropout_is_rejected_with_graphed_recompute():
    w = wl(**sel("core_attn"), cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])
    assert "attention-dropout-with-graphed-core-attn" in ids(check(w), "error")
    assert check(wl(**sel("core_attn"), cuda_graph_impl="transformer_engine", cuda_graph_scope=["mlp"]))["ok"]
    w = wl(**sel("mlp"), cuda_graph_impl="transformer_engine", cuda_graph_scope=["mlp"])
    assert "hidden-dropout-with-graphed-mlp-moe" in ids(check(w), "error")


def test_moe_recompute_cannot_straddle_a_te_moe_router_graph():
    w = wl(**sel("moe"), **MOE, cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router"])
    assert "moe-recompute-with-te-moe-router-graph" in ids(check(w), "error")
    # moe_act lies wholly outside the router graph: accepted
    w = wl(**sel("moe_act"), **MOE, moe_grouped_gemm=True, cuda_graph_impl="transformer_engine",
           cuda_graph_scope=["moe_router"])
    assert check(w)["ok"]


def test_pre_mlp_layernorm_recompute_is_switched_off_under_a_moe_router_graph():
    base = dict(**sel("layernorm"), **MOE, cuda_graph_impl="transformer_engine")
    router = check(wl(**base, cuda_graph_scope=["moe_router"]))
    assert "pre-mlp-layernorm-with-moe-router-graph" in ids(router)
    ok = wl(**base, cuda_graph_scope=["moe_router", "moe_preprocess"], moe_token_dispatcher_type="alltoall")
    assert "pre-mlp-layernorm-with-moe-router-graph" not in ids(check(ok))


def test_fp8_delayed_scaling_rejects_moe_act_and_layernorm():
    for label in ("layernorm", "moe_act"):
        w = wl(**sel(label), **MOE, moe_grouped_gemm=True, fp8="e4m3", fp8_recipe="delayed")
        assert "fp8-delayed-moe-act-layernorm" in ids(check(w), "error")


def test_transformer_engine_version_decides_the_te_gated_fp8_rules():
    w = wl(**sel("layernorm"), fp8="e4m3", fp8_recipe="tensorwise")
    cid = "fp8-moe-act-layernorm-needs-te-2-6"
    assert one(check(w), cid)["severity"] == "warning"                      # unknown: the intended rule
    assert one(check(w, te_version="2.5.0"), cid)["severity"] == "error"
    assert cid not in ids(check(w, te_version="2.8.0"))
    ev = builtin.evaluate(w, "0.16.1", assume_te_absent=True)              # this machine, no TE
    assert ev.verdict() == ("reject", cid, "TypeError")
    main = builtin.evaluate(w, "main", assume_te_absent=True)
    assert main.verdict() == ("reject", cid, "ValueError") and "0.0.0" in main.first_error["message"]


def test_live_is_told_the_te_version_and_decides_like_the_training_nodes(live_check):
    w = wl(**sel("layernorm"), fp8="e4m3", fp8_recipe="tensorwise")
    cid = "fp8-moe-act-layernorm-needs-te-2-6"
    old = live_check(w, te_version="2.5.0")
    assert one(old, cid)["severity"] == "error" and "2.5.0" in one(old, cid)["upstream_message"]
    assert cid not in ids(live_check(w, te_version="2.8.0"))
    unknown = one(live_check(w), cid)                                      # no TE here, none stated
    assert unknown["severity"] == "warning" and unknown["raises"] == "TypeError"
    assert "could not evaluate" in unknown["message"]
    absent = one(live_check(w, te_version="none"), cid)                    # stated absent: 0.16.1 fails
    assert absent["severity"] == "error" and absent["raises"] == "TypeError"
    assert one(check(w, te_version="none"), cid)["raises"] == "TypeError"


def test_ep_overlap_rejects_full_recompute_method_and_num_layers():
    assert "ep-overlap-with-full" in ids(check(wl(**MOE, **EPO, **full())), "error")
    assert "ep-overlap-with-method" in ids(check(wl(**MOE, **EPO, **sel(), recompute_method="uniform")))
    assert "ep-overlap-with-num-layers" in ids(check(wl(**MOE, **EPO, recompute_num_layers=2)))
    assert check(wl(**MOE, **EPO, **sel("moe_act", "shared_experts"), moe_grouped_gemm=True,
                    moe_shared_expert_intermediate_size=32))["ok"]


def test_shared_expert_overlap_rejects_shared_experts_recompute():
    w = wl(**sel("shared_experts"), **MOE, moe_shared_expert_intermediate_size=32,
           moe_shared_expert_overlap=True, moe_token_dispatcher_type="alltoall")
    assert "shared-experts-with-shared-expert-overlap" in ids(check(w), "error")


# ------------------------------------------------------------------ validators
def test_live_is_a_superset_of_builtin(live_check):
    workloads = [wl(**sel("mlp"), **MOE), wl(**full("uniform", 3)), wl(**sel("layernorm")),
                 wl(**sel("moe"), **MOE, **EPO), wl(**sel("mlp"), recompute_method="block")]
    for w in workloads:
        assert ids(check(w)) <= ids(live_check(w)), w


def test_a_megatron_core_error_outside_the_card_is_still_an_error(live_check):
    # MoE with megatron-core's default add_bias_linear=True and ETP = TP = 2 (tc:1588-1591 @ core_v0.16.1)
    report = live_check(wl(**MOE, tensor_model_parallel_size=2, sequence_parallel=True))
    f = one(report, "mcore-config-error")
    assert report["ok"] is False and f["severity"] == "error" and f["source"] == "live"
    assert "Bias in Moe is only supported when ETP==1" in f["upstream_message"]
    assert "transformer_config.py:" in f["citation"]


def test_auto_prefers_live_when_megatron_core_is_installed():
    report = check_workload(wl(**sel()), validator="auto")
    assert report["validator"] == "live" and report["version"] == "0.16.1"
    assert check_workload(wl(**sel()), validator="builtin")["validator"] == "builtin"
    # auto falls back to the table for a version other than the installed one
    assert check_workload(wl(**sel()), validator="auto", version="main")["validator"] == "builtin"


def test_bridge_validation_degrades_to_an_info_finding_when_bridge_is_not_importable(live_check):
    """Megatron Bridge cannot import on this machine (it needs Transformer Engine)."""
    from mbridge_recompute.rules import bridge_live

    assert bridge_live.available() is False
    report = live_check(wl(**sel()))
    f = one(report, "bridge-validation-unavailable")
    assert f["severity"] == "info" and report["ok"] is True


# ------------------------------------------------------------------ main (Megatron-LM d98e8a6)
OFFLOAD_MOE = dict(fine_grained_activation_offloading=True, offload_modules=["moe_act"])
EPO_FULL = {**EPO, **MOE}


@pytest.mark.parametrize("case, overrides, expected", [
    ("#28 gdn_norm_out without GDN", sel("gdn_norm_out"), ("reject", "gdn-norm-out-needs-gdn", "ValueError")),
    ("#29 gdp_in_proj", sel("gdp_in_proj"), ("accept", None, None)),
    ("#30 gdp_qkv", sel("gdp_qkv"), ("accept", None, None)),
    ("#31 mhc without mHC", sel("mhc"), ("reject", "mhc-needs-mhc-connections", "ValueError")),
    ("#56 offload moe_act + moe", {**sel("moe"), **MOE, "moe_grouped_gemm": True, **OFFLOAD_MOE},
     ("reject", "moe-recompute-with-offloaded-moe-internals", "AssertionError")),
    ("#61 fp8 tensorwise layernorm, no TE", {**sel("layernorm"), "fp8": "hybrid", "fp8_recipe": "tensorwise"},
     ("reject", "fp8-moe-act-layernorm-needs-te-2-6", "ValueError")),
    ("#65 fp8 MoE, no TE", {"fp8": "e4m3", **MOE}, ("reject", "moe-fp8-needs-te-1-7", "ValueError")),
    ("#68 local full_iteration scope + full",
     {**full(), "cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}, ("accept", None, None)),
    ("#69 impl full_iteration + full", {**full(), "cuda_graph_impl": "full_iteration"},
     ("accept", None, None)),
    ("#81 EP overlap + moe", {**sel("moe"), **EPO_FULL},
     ("reject", "ep-overlap-with-moe-recompute", "AssertionError")),
])
def test_builtin_predicts_the_reference_main_column(case, overrides, expected):
    """The reference matrix's main (d98e8a6) column, checked on CPU without TE upstream."""
    ev = builtin.evaluate(wl(**overrides), "main", assume_te_absent=True)
    assert ev.verdict() == expected, case


def test_mhc_rules_apply_to_main_only():
    mixed = wl(**sel("mhc", "mlp"), extra_model={"enable_mhc_connections": True})
    assert "mhc-with-mlp" in ids(check(mixed, version="main"), "error")
    assert check(wl(**sel("mhc"), extra_model={"enable_mhc_connections": True}), version="main")["ok"]
    assert "modules-invalid-label" in ids(check(wl(**sel("mhc"))), "error")   # not a 0.16.1 label


def test_moe_router_needs_transformer_engine_in_0_16_1():
    """0.16.1's router gating reads te_general_gemm, undefined without TE (moe_utils.py:1192)."""
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.rules import check_workload

    moe = ["model.num_moe_experts=8", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1024",
           "cluster.te_version=none", "model.recompute_modules=[]"]
    ids = {f["id"] for f in check_workload(load_workload(default=True, sets=moe))["findings"]}
    assert "moe-router-needs-te" in ids
    fp64 = moe + ["model.moe_router_dtype=fp64"]   # the name is read before the dtype
    ids = {f["id"] for f in check_workload(load_workload(default=True, sets=fp64))["findings"]}
    assert "moe-router-needs-te" in ids
    dense = {f["id"] for f in check_workload(load_workload(
        default=True, sets=["cluster.te_version=none"]))["findings"]}
    assert "moe-router-needs-te" not in dense
