"""What upstream accepts and then skips without an error, where recompute, fine-grained offloading,
layer-level CPU offloading and CUDA graphs meet: each skip is a check warning citing the line of
the release, and plan prices what really runs.

One test per skip, named after it; the upstream lines are in the card (and rendered per release
in references/constraints.md). The pricing tests compare the plan's figure with the same workload
written the way it really runs (the skipped offload left out), so the effective setting is
checked against the memory model itself, not against a number copied here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_recompute import memory
from mbridge_recompute.facts import card
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.plan.pricing import Pricer
from mbridge_recompute.rules import builtin
from mbridge_recompute.rules.findings import disabled_by
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.workload import Workload

RELEASES = list(card.load()["releases"])
BASE = {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "bf16": True,
        "seq_length": 4096}
MOE = {"num_moe_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 512, "moe_grouped_gemm": True}
MLA = {"multi_latent_attention": True, "q_lora_rank": 256, "kv_lora_rank": 128,
       "qk_head_dim": 64, "qk_pos_emb_head_dim": 32, "v_head_dim": 64}


def wl(offload=(), mods=None, **kw) -> Workload:
    off = {"fine_grained_activation_offloading": True, "offload_modules": list(offload)} if offload else {}
    rec = {"recompute_granularity": "selective", "recompute_modules": list(mods)} if mods is not None else {}
    return Workload(**{**BASE, **off, **rec, **kw})


def found(w, version="0.19") -> dict:
    return {f["id"]: f for f in builtin.check(w, version=version)["findings"]}


def effective_peak(w, version="0.19") -> int:
    off = disabled_by(builtin.check(w, version=version)["findings"])
    return memory.estimate(w, disabled=off).hottest.peak_bytes


def peak(w) -> int:
    return memory.estimate(w).hottest.peak_bytes


@pytest.mark.parametrize("version", RELEASES)
def test_core_attn_recomputed_and_offloaded_is_only_recomputed(version):
    w = wl(["core_attn", "attn_proj"], ["core_attn"])
    f = found(w, version)["offload-core-attn-skipped-under-recompute"]
    assert f["severity"] == "warning" and f["disables"] == [["offload:core_attn", "all"]]
    assert f["citation"].startswith("attention.py:")
    # priced as megatron-core runs it: core attention's tensors stay, attn_proj still offloads
    assert effective_peak(w, version) == peak(w.replace(offload_modules=["attn_proj"]))
    assert effective_peak(w, version) > peak(w)


def test_core_attn_offloaded_but_not_recomputed_is_no_skip():
    assert "offload-core-attn-skipped-under-recompute" not in found(wl(["core_attn"], []))
    assert "offload-core-attn-skipped-under-recompute" not in found(wl(["attn_proj", "core_attn"]))


def test_plan_prices_the_core_attn_label_with_its_offload_skipped():
    w = wl(["core_attn"], [])
    cand = Pricer(w, "0.19").price(RecomputeSetting.selective("core_attn"))
    assert cand.disabled == (("offload:core_attn", "all"),)
    ran = RecomputeSetting.selective("core_attn").apply(w).replace(
        fine_grained_activation_offloading=False, offload_modules=[])
    assert max(cand.rank_peaks) == memory.estimate(ran).hottest.peak_bytes


def test_plan_json_names_the_offload_full_recompute_leaves_with_nothing_to_move():
    report = plan(wl(["core_attn"], [])).to_dict()
    by_name = {c["name"]: c for c in report["candidates"]}
    assert by_name["uniform:1"]["switched_off"] == ["core_attn offloading"]
    assert by_name["[]"]["switched_off"] == [] and by_name["block:1"]["switched_off"] == []


@pytest.mark.parametrize("version", RELEASES)
def test_offloading_a_norm_fused_into_the_next_gemm_moves_nothing(version):
    f = found(wl(["attn_norm", "mlp_norm"]), version)["offload-fused-norm-moves-nothing"]
    assert f["disables"] == [["offload:attn_norm", "all"], ["offload:mlp_norm", "all"]]
    # MLA keeps a separate input norm, a MoE layer a separate pre-MLP norm, the local spec both
    assert "offload-fused-norm-moves-nothing" not in found(wl(["attn_norm"], **MLA), version)
    assert "offload-fused-norm-moves-nothing" not in found(wl(["mlp_norm"], **MOE), version)
    assert "offload-fused-norm-moves-nothing" not in found(
        wl(["attn_norm", "mlp_norm"], transformer_impl="local"), version)


@pytest.mark.parametrize("version", ["0.16", "0.17", "0.18"])
def test_moe_internals_offloaded_inside_a_recomputed_moe_layer_move_nothing_before_0_19(version):
    w = wl(["moe_act", "expert_fc1"], ["moe"], **MOE)
    f = found(w, version)["offload-inside-moe-recompute"]
    assert f["severity"] == "warning"
    assert effective_peak(w, version) == peak(w.replace(fine_grained_activation_offloading=False,
                                                        offload_modules=[]))


def test_from_0_19_moe_recompute_with_offloaded_moe_internals_is_rejected_instead():
    f = found(wl(["moe_act"], ["moe"], **MOE), "0.19")
    assert "offload-inside-moe-recompute" not in f
    assert f["moe-recompute-with-offloaded-moe-internals"]["severity"] == "error"


@pytest.mark.parametrize("version", RELEASES)
def test_offloading_under_full_recompute_of_every_layer_moves_nothing(version):
    full = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    w = wl(["core_attn", "attn_proj"], **full)
    f = found(w, version)["offload-under-full-recompute"]
    assert f["severity"] == "warning"
    assert effective_peak(w, version) == peak(w.replace(fine_grained_activation_offloading=False,
                                                        offload_modules=[]))
    # block 2 of 8 layers: the other six still offload
    partial = found(w.replace(recompute_method="block", recompute_num_layers=2), version)
    assert partial["offload-under-full-recompute"]["severity"] == "info"
    assert "disables" not in partial["offload-under-full-recompute"]


@pytest.mark.parametrize("version", ["0.16", "0.17"])
def test_fine_grained_offloading_on_a_hybrid_stack_moves_nothing_before_0_18(version):
    w = wl(["core_attn", "attn_proj"], hybrid_override_pattern="M*M*M*M*")
    f = found(w, version)["fine-grained-offloading-on-hybrid-stack"]
    assert f["disables"] == [["offload:attn_proj", "all"], ["offload:core_attn", "all"]]
    assert effective_peak(w, version) == peak(w.replace(fine_grained_activation_offloading=False,
                                                        offload_modules=[]))
    assert "fine-grained-offloading-on-hybrid-stack" not in found(w, "0.18")


def _graphs(modules, version="0.19") -> dict:
    return {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": list(modules),
            "attention_dropout": 0.0}


def test_attn_norm_offload_is_switched_off_with_attention_in_the_graph_from_0_19():
    w = wl(["attn_norm"], **MLA, **_graphs(["attn"]))
    f = found(w, "0.19")["attn-norm-offload-with-attn-graph"]
    assert f["upstream_message"] == ("attn_norm offloading is not supported with attn cudagraph. "
                                     "Disabling attn_norm offloading.")
    assert "attn-norm-offload-with-attn-graph" not in found(w.replace(cuda_graph_modules=["mlp"]), "0.19")
    assert "attn-norm-offload-with-attn-graph" not in found(
        w.replace(cuda_graph_modules=None, cuda_graph_scope=["attn"]), "0.18")


def test_mlp_norm_offload_is_switched_off_on_a_graph_boundary_from_0_19():
    local = {"transformer_impl": "local"}          # a separate pre-MLP norm in dense layers
    dense = wl(["mlp_norm"], **local, **_graphs(["attn"]))
    assert found(dense, "0.19")["mlp-norm-offload-with-graph-boundary"]["disables"] == \
        [["offload:mlp_norm", "all"]]
    whole = dense.replace(cuda_graph_modules=["attn", "mlp"])
    assert "mlp-norm-offload-with-graph-boundary" not in found(whole, "0.19")
    moe = wl(["mlp_norm"], **MOE, **_graphs(["moe_router"]))
    assert "mlp-norm-offload-with-graph-boundary" in found(moe, "main")


def test_cpu_offloading_weights_are_ignored_by_transformer_engine_2_4_and_later():
    off = {"cpu_offloading": True, "cpu_offloading_num_layers": 2,
           "extra_model": {"cpu_offloading_weights": True, "cpu_offloading_activations": False}}
    f = found(wl(**off))["cpu-offloading-weights-ignored"]
    assert "nothing is offloaded at all" in f["message"]
    assert "transformer_engine/pytorch/cpu_offload.py:826-838 @ v2.17.1" in f["citation"]
    assert "cpu-offloading-weights-ignored" in found(wl(**off, te_version="2.4.0"))
    assert "cpu-offloading-weights-ignored" not in found(wl(**off, te_version="2.3.0"))


_MODULES = ["core_attn", "attn_proj", "attn_norm", "mlp_norm", "qkv_linear", "moe_act", "expert_fc1"]


@settings(max_examples=40, deadline=None)
@given(offload=st.sets(st.sampled_from(_MODULES), min_size=1),
       mods=st.sets(st.sampled_from(["core_attn", "layernorm", "moe", "moe_act", "mlp"])),
       moe=st.booleans(), mla=st.booleans(), version=st.sampled_from(RELEASES))
def test_a_skipped_offload_is_priced_as_the_same_workload_without_it(offload, mods, moe, mla, version):
    """Invariant: the effective peak equals the peak of the workload written without the offload
    modules the checker finds skipped, and never falls below the peak with every offload kept."""
    offload = {m for m in offload if moe or m not in ("moe_act", "expert_fc1")}
    if "attn_proj" in offload:
        offload.add("core_attn")                  # megatron-core rejects attn_proj alone
    w = wl(sorted(offload), sorted(mods), **(MOE if moe else {}), **(MLA if mla else {}))
    findings = builtin.check(w, version=version)["findings"]
    if any(f["severity"] == "error" for f in findings):
        return
    off = disabled_by(findings)
    skipped = {d[0].split(":", 1)[1] for d in off if d[0].startswith("offload:")}
    label_off = tuple(d for d in off if not d[0].startswith("offload:"))
    kept = sorted(offload - skipped)
    written = w.replace(offload_modules=kept, fine_grained_activation_offloading=bool(kept))
    assert memory.estimate(w, disabled=off).hottest.peak_bytes == \
        memory.estimate(written, disabled=label_off).hottest.peak_bytes
    assert memory.estimate(w, disabled=off).hottest.peak_bytes >= \
        memory.estimate(w, disabled=label_off).hottest.peak_bytes


def test_offloading_a_module_inside_a_captured_cuda_graph_needs_transformer_engine_2_14():
    w = wl(["core_attn"], **_graphs(["attn"]), te_version="2.13.0")
    f = found(w, "0.19")["offload-captured-in-cuda-graph-needs-te-2-14"]
    assert f["severity"] == "error" and f["kind"] == "runtime"
    assert f["upstream_message"] == "Offloading modules captured in cuda graph requires TE>=2.14.0."
    assert "offload-captured-in-cuda-graph-needs-te-2-14" not in found(w.replace(te_version="2.14.0"), "0.19")
    assert found(w.replace(te_version=None), "0.19")["offload-captured-in-cuda-graph-needs-te-2-14"][
        "severity"] == "warning"
    # a module outside the capture, and releases before the check, say nothing
    outside = w.replace(cuda_graph_modules=["mlp"])
    assert "offload-captured-in-cuda-graph-needs-te-2-14" not in found(outside, "0.19")
    assert "offload-captured-in-cuda-graph-needs-te-2-14" not in found(
        w.replace(cuda_graph_modules=None, cuda_graph_scope=["attn"]), "0.18")
