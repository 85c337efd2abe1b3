"""Per-label effects (saving vs the selective [] control, applicability, reasons) and replay cost."""

from __future__ import annotations

import pytest

from mbridge_recompute.facts import releases
from mbridge_recompute.memory import estimate, replay_cost_pct
from mbridge_recompute.plan.labels import label_effects
from mbridge_recompute.workload import Workload


def dense(**kw) -> Workload:
    base = dict(num_layers=8, hidden_size=2048, num_attention_heads=16, num_query_groups=4,
                kv_channels=128, ffn_hidden_size=8192, gated_linear_unit=True,
                activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                seq_length=4096, vocab_size=32000, attention_dropout=0.0, hidden_dropout=0.0,
                tensor_model_parallel_size=2, sequence_parallel=True, bf16=True,
                pipeline_model_parallel_size=2, global_batch_size=16,
                extra_model={"bias_activation_fusion": True})
    base.update(kw)
    return Workload(**base)


def moe(**kw) -> Workload:
    base = dict(num_moe_experts=32, moe_router_topk=4, moe_ffn_hidden_size=1024,
                moe_shared_expert_intermediate_size=2048, moe_grouped_gemm=True,
                moe_token_dispatcher_type="alltoall", expert_model_parallel_size=4,
                expert_tensor_parallel_size=1, num_gpus=16)
    base.update(kw)
    return dense(**base)


def by_label(effects) -> dict:
    return {e.label: e for e in effects}


@pytest.mark.parametrize("version", ["0.16.1", "main"])
def test_one_effect_per_label_of_the_target_version(version):
    effects = label_effects(dense(), version)
    assert [e.label for e in effects] == releases.labels_for(version)


def test_saving_is_the_control_peak_minus_the_label_peak_on_the_hottest_rank():
    w = dense()
    control = estimate(w.replace(recompute_granularity="selective", recompute_modules=[]))
    with_mlp = estimate(w.replace(recompute_granularity="selective", recompute_modules=["mlp"]))
    eff = by_label(label_effects(w, "0.16.1"))["mlp"]
    assert eff.applicable and eff.saving_bytes > 0
    assert eff.saving_bytes == control.hottest.peak_bytes - with_mlp.hottest.peak_bytes


def test_core_attn_under_te_is_applicable_but_adds_memory():
    eff = by_label(label_effects(dense(), "0.16.1"))["core_attn"]
    assert eff.applicable and eff.saving_bytes < 0 and eff.cost_pct > 0
    assert "adds memory" in eff.reason


def test_core_attn_under_local_attention_saves_the_probabilities():
    w = dense(transformer_impl="local", masked_softmax_fusion=True)
    eff = by_label(label_effects(w, "0.16.1"))["core_attn"]
    assert eff.applicable and eff.saving_bytes > 0


def test_silent_no_ops_on_a_te_dense_model_report_zero_and_why():
    effects = by_label(label_effects(dense(), "0.16.1"))
    for label in ("layernorm", "moe", "moe_act", "shared_experts"):
        assert not effects[label].applicable
        assert effects[label].saving_bytes == 0 and effects[label].cost_pct == 0
        assert "no-op" in effects[label].reason
    assert "IdentityOp" in effects["layernorm"].reason
    assert not effects["mla_up_proj"].applicable
    assert "multi_latent_attention" in effects["mla_up_proj"].reason


def test_mlp_is_a_no_op_on_moe_layers_only_models():
    w = moe(hybrid_override_pattern="*E*E*E*E", num_layers=8)
    eff = by_label(label_effects(w, "0.16.1"))["mlp"]
    assert not eff.applicable and "dense" in eff.reason


def test_moe_nesting_whole_moe_saves_at_least_moe_act_and_shared_experts():
    effects = by_label(label_effects(moe(), "0.16.1"))
    assert all(effects[x].applicable for x in ("moe", "moe_act", "shared_experts", "layernorm"))
    assert effects["moe"].saving_bytes > effects["moe_act"].saving_bytes > 0
    assert effects["moe"].saving_bytes > effects["shared_experts"].saving_bytes > 0
    assert effects["moe"].cost_pct > effects["shared_experts"].cost_pct
    assert effects["moe"].cost_pct > effects["moe_act"].cost_pct > 0


def test_config_rejections_are_not_applicable():
    effects = by_label(label_effects(moe(moe_grouped_gemm=False), "0.16.1"))
    assert not effects["moe_act"].applicable and "moe_grouped_gemm" in effects["moe_act"].reason
    delayed = by_label(label_effects(moe(fp8="hybrid", fp8_recipe="delayed"), "0.16.1"))
    assert not delayed["moe_act"].applicable and not delayed["layernorm"].applicable
    assert "Delayed" in delayed["layernorm"].reason or "delayed" in delayed["layernorm"].reason
    overlap = by_label(label_effects(moe(moe_shared_expert_overlap=True), "0.16.1"))
    assert not overlap["shared_experts"].applicable


def test_moe_under_local_cuda_graphs_or_ep_overlap_does_nothing():
    assert not by_label(label_effects(moe(cuda_graph_impl="local"), "0.16.1"))["moe"].applicable
    ov = moe(overlap_moe_expert_parallel_comm=True)
    old = by_label(label_effects(ov, "0.16.1"))["moe"]
    new = by_label(label_effects(ov, "main"))["moe"]
    assert not old.applicable and "no-op" in old.reason
    assert not new.applicable and "rejects" in new.reason


# --- replay cost --------------------------------------------------------------------------

def _flops_layer(w) -> float:
    """Forward FLOPs of one dense layer (TP 1): 2 FLOPs per weight per token plus causal
    attention scores 0.5 * 2 * s * a * (d + d) per token."""
    h, a, g, d, f, s = 2048, 16, 4, 128, 8192, 4096
    weights = h * (a + 2 * g) * d + a * d * h + 3 * h * f
    return 2 * weights * s + 0.5 * 2 * s * a * (d + d) * s


def test_no_recompute_costs_nothing():
    assert replay_cost_pct(dense()) == 0
    assert replay_cost_pct(dense(recompute_granularity="selective", recompute_modules=[])) == 0


def test_full_recompute_of_every_layer_replays_the_whole_forward():
    """Full block over every layer (TP 1, no communication): replay / step =
    L * F_layer / (3 * (L * F_layer + 2 V h s))."""
    w = dense(tensor_model_parallel_size=1, sequence_parallel=False, pipeline_model_parallel_size=1,
              recompute_granularity="full", recompute_method="block", recompute_num_layers=8)
    L, F = 8, _flops_layer(w)
    logits = 2 * 32000 * 2048 * 4096
    assert replay_cost_pct(w) == pytest.approx(100 * L * F / (3 * (L * F + logits)), rel=1e-9)


def test_core_attn_replays_the_attention_scores():
    w = dense(tensor_model_parallel_size=1, sequence_parallel=False, pipeline_model_parallel_size=1,
              recompute_granularity="selective", recompute_modules=["core_attn"])
    L, F = 8, _flops_layer(w)
    scores = 0.5 * 2 * 4096 * 16 * 256 * 4096
    logits = 2 * 32000 * 2048 * 4096
    assert replay_cost_pct(w) == pytest.approx(100 * L * scores / (3 * (L * F + logits)), rel=1e-9)


def test_full_recompute_costs_more_than_any_selective_label():
    w = moe()
    full = replay_cost_pct(w.replace(recompute_granularity="full", recompute_method="uniform",
                                     recompute_num_layers=1))
    for e in label_effects(w, "0.16.1"):
        assert e.cost_pct < full


def test_replayed_communication_is_charged():
    """mlp under TP+SP replays an all-gather and a reduce-scatter; without TP it does not."""
    sel = dict(recompute_granularity="selective", recompute_modules=["mlp"])
    tp = dense(**sel)
    from mbridge_recompute.memory import Knobs
    assert replay_cost_pct(tp, Knobs(comm_flops_per_byte=1e4)) > replay_cost_pct(tp)
    no_tp = dense(tensor_model_parallel_size=1, sequence_parallel=False, **sel)
    assert replay_cost_pct(no_tp, Knobs(comm_flops_per_byte=1e4)) == pytest.approx(
        replay_cost_pct(no_tp))


def test_check_and_plan_agree_on_layernorm_for_a_hybrid_stack_without_moe():
    """Hybrid M*-M under TE: the attention and MLP norms are fused (IdentityOp), Mamba layers have
    no layernorm recompute; the checker reports the no-op and the plan takes it from there."""
    from mbridge_recompute.rules import check_workload

    w = dense(hybrid_override_pattern="M*-M", num_layers=4, pipeline_model_parallel_size=1)
    ws = w.replace(recompute_granularity="selective", recompute_modules=["layernorm"])
    ids = {f["id"] for f in check_workload(ws, "builtin", "0.16.1")["findings"]}
    assert "layernorm-on-te-dense-spec" in ids
    eff = by_label(label_effects(w, "0.16.1"))["layernorm"]
    assert not eff.applicable and "layernorm-on-te-dense-spec" in eff.reason


@pytest.mark.parametrize("model", __import__("mbridge_recompute.inputs.catalog", fromlist=["x"]).names())
def test_check_and_plan_agree_on_applicability_for_every_catalog_model_and_label(model):
    """One source of applicability: what `check` reports for the single-label setting is what
    `plan` says of the label (rejected, silent no-op, or applicable)."""
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.rules import check_workload

    w = load_workload(model=model, mcore_version="0.16.1")
    control = w.replace(recompute_granularity="selective", recompute_modules=[])
    base = {f["id"] for f in check_workload(control, "builtin", "0.16.1")["findings"]}
    for eff in label_effects(w, "0.16.1"):
        ws = w.replace(recompute_granularity="selective", recompute_modules=[eff.label])
        new = [f for f in check_workload(ws, "builtin", "0.16.1")["findings"] if f["id"] not in base]
        blocking = [f for f in new if f["severity"] == "error"
                    or (f["kind"] == "silent-no-op" and f["severity"] != "info")]
        if blocking:
            assert not eff.applicable and any(f["id"] in eff.reason for f in blocking), (model, eff)
        elif eff.applicable is False:
            # only the memory model's own reasons remain: a label it does not cover here
            assert "not modelled" in eff.reason or eff.reason.startswith("no "), (model, eff)
