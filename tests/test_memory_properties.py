"""Properties of the memory model over generated workloads (hypothesis), and its speed."""

from __future__ import annotations

import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mbridge_recompute.memory import estimate
from mbridge_recompute.plan.labels import label_effects
from mbridge_recompute.workload import Workload

LABELS_0161 = ["core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe", "shared_experts"]


@st.composite
def workloads(draw, moe=None, impl=None):
    t = draw(st.sampled_from([1, 2, 4]))
    heads = draw(st.sampled_from([8, 16, 32]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, heads) if heads % g == 0]))
    p = draw(st.sampled_from([1, 2, 4]))
    v = draw(st.sampled_from([1, 2])) if p > 1 else 1
    layers = p * v * draw(st.integers(1, 3))
    is_moe = draw(st.booleans()) if moe is None else moe
    kw = dict(
        num_layers=layers, hidden_size=heads * 64, num_attention_heads=heads,
        num_query_groups=groups, kv_channels=64, ffn_hidden_size=heads * 64 * draw(st.sampled_from([2, 4])),
        gated_linear_unit=draw(st.booleans()), activation_func="silu",
        normalization=draw(st.sampled_from(["RMSNorm", "LayerNorm"])), add_bias_linear=False,
        seq_length=draw(st.sampled_from([512, 1024, 2048, 4096])), vocab_size=8192,
        attention_dropout=draw(st.sampled_from([0.0, 0.1])),
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])),
        transformer_impl=impl or draw(st.sampled_from(["transformer_engine", "local"])),
        tensor_model_parallel_size=t, sequence_parallel=t > 1 and draw(st.booleans()),
        pipeline_model_parallel_size=p,
        virtual_pipeline_model_parallel_size=v if v > 1 else None, bf16=True,
        micro_batch_size=draw(st.sampled_from([1, 2])),
        extra_model={"bias_activation_fusion": draw(st.booleans())},
    )
    kw["global_batch_size"] = kw["micro_batch_size"] * p * draw(st.integers(1, 4))
    if is_moe:
        kw.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=heads * 32,
                  moe_shared_expert_intermediate_size=draw(st.sampled_from([None, heads * 64])),
                  moe_grouped_gemm=True, expert_model_parallel_size=draw(st.sampled_from([1, 2])),
                  moe_layer_freq=draw(st.sampled_from([1, 2])), sequence_parallel=t > 1)
    if draw(st.booleans()):
        kw.update(fp8="hybrid", fp8_recipe=draw(st.sampled_from(["tensorwise", "mxfp8"])))
    return Workload(**kw)


def _acts(w) -> list:
    return [r.activation_bytes for r in estimate(w).ranks]


@settings(max_examples=60, deadline=None)
@given(workloads(), st.sets(st.sampled_from(LABELS_0161)), st.sampled_from(LABELS_0161))
def test_adding_a_label_never_adds_saved_activations_except_core_attn(w, have, add):
    """Every label except core_attn only discards tensors. core_attn is the documented quirk:
    under TE it pins the fused QKV buffer, and under local GQA attention at short sequences
    the pinned buffer can outweigh the probabilities it drops."""
    if add == "core_attn":
        return
    before = w.replace(recompute_granularity="selective", recompute_modules=sorted(have))
    after = w.replace(recompute_granularity="selective", recompute_modules=sorted(have | {add}))
    for x, y in zip(_acts(before), _acts(after)):
        assert y <= x


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sets(st.sampled_from(LABELS_0161)))
def test_full_recompute_of_every_layer_keeps_less_than_any_selective_setting(w, have):
    sel = w.replace(recompute_granularity="selective", recompute_modules=sorted(have))
    full = w.replace(recompute_granularity="full", recompute_method="block",
                     recompute_num_layers=w.num_layers)
    for x, y in zip(_acts(sel), _acts(full)):
        assert y <= x


@settings(max_examples=40, deadline=None)
@given(workloads(impl="transformer_engine"), st.sampled_from([(512, 1024), (1024, 4096), (2048, 8192)]))
def test_peak_is_monotone_in_sequence_length(w, pair):
    short, long_ = (estimate(w.replace(seq_length=s)) for s in pair)
    for a, b in zip(short.ranks, long_.ranks):
        assert b.peak_bytes >= a.peak_bytes


@settings(max_examples=40, deadline=None)
@given(workloads(impl="transformer_engine"))
def test_peak_is_monotone_in_micro_batch_size(w):
    """Same number of micro-batches, larger micro-batch: no rank gets smaller."""
    M = w.num_microbatches
    small = w.replace(micro_batch_size=1, global_batch_size=M)
    big = w.replace(micro_batch_size=2, global_batch_size=2 * M)
    for a, b in zip(estimate(small).ranks, estimate(big).ranks):
        assert b.peak_bytes >= a.peak_bytes


def _uniform_dense(p, per_stage, s, **kw) -> Workload:
    return Workload(num_layers=p * per_stage * 2, hidden_size=4096, num_attention_heads=32,
                    num_query_groups=8, ffn_hidden_size=14336, gated_linear_unit=True,
                    activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                    seq_length=s, vocab_size=32000, attention_dropout=0.0, hidden_dropout=0.0,
                    tensor_model_parallel_size=2, sequence_parallel=True,
                    pipeline_model_parallel_size=p, bf16=True, global_batch_size=4 * p, **kw)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(1, 4), st.sampled_from([1024, 2048, 4096]),
       st.sampled_from([None, [], ["mlp"], ["core_attn"]]))
def test_first_stage_is_hottest_under_1f1b_for_a_uniform_dense_model(p, per_stage, s, mods):
    """Uniform dense layers, no full recompute, vocabulary not huge (one layer keeps at least
    as much as the fp32 cross-entropy softmax 4*V/t*T): stage 0 holds p in-flight
    micro-batches and the embedding, the last stage one micro-batch plus the logits."""
    w = _uniform_dense(p, per_stage, s)
    if mods is not None:
        w = w.replace(recompute_granularity="selective", recompute_modules=mods)
    est = estimate(w)
    assume(est.per_layer["attn+mlp"]["total"] >= 4 * 32000 / 2 * s)
    assert est.hottest.pp_rank == 0


def test_with_full_recompute_the_logits_can_make_the_last_stage_hottest():
    """Full recompute leaves 2hTr per layer, so the last stage's fp32 cross-entropy softmax
    and logits transient (one micro-batch) outweigh stage 0's p micro-batches of checkpoints."""
    w = _uniform_dense(2, 1, 1024, recompute_granularity="full", recompute_method="uniform",
                       recompute_num_layers=1)
    est = estimate(w)
    assert est.hottest.pp_rank == 1
    assert est.ranks[1].activations["logits"] > est.ranks[0].activations["checkpoints"]


def deepseek_v3() -> Workload:
    return Workload(
        num_layers=61, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
        gated_linear_unit=True, activation_func="silu", normalization="RMSNorm",
        add_bias_linear=False, seq_length=4096, vocab_size=129280,
        share_embeddings_and_output_weights=False, attention_dropout=0.0, hidden_dropout=0.0,
        bf16=True, multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512,
        qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, num_moe_experts=256,
        moe_router_topk=8, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
        moe_grouped_gemm=True, moe_layer_freq=[0] * 3 + [1] * 58,
        moe_token_dispatcher_type="alltoall", tensor_model_parallel_size=2, sequence_parallel=True,
        pipeline_model_parallel_size=16, num_layers_in_first_pipeline_stage=4,
        num_layers_in_last_pipeline_stage=1, expert_model_parallel_size=64,
        expert_tensor_parallel_size=1, num_gpus=2048, global_batch_size=8192,
        fp8="hybrid", fp8_recipe="blockwise")


def test_estimate_on_a_deepseek_v3_sized_workload_is_fast():
    """The selector calls estimate() for ~100 candidates of one workload: per-layer results
    are cached, so a candidate costs milliseconds (the bound here is loose for slow CI
    machines; benchmarks report the figure)."""
    w = deepseek_v3()
    settings_ = [dict(recompute_granularity="selective", recompute_modules=m)
                 for m in ([], ["moe_act"], ["moe"], ["mla_up_proj", "moe_act"], ["layernorm", "moe"])]
    settings_ += [dict(recompute_granularity="full", recompute_method=m, recompute_num_layers=n)
                  for m in ("uniform", "block") for n in (1, 2, 4)]
    candidates = [w.replace(**s) for s in settings_] * 10
    estimate(w)                                   # first call builds the schedule tables
    start = time.perf_counter()
    for c in candidates:
        estimate(c)
    per_call = (time.perf_counter() - start) / len(candidates)
    assert per_call < 0.02
    effects = label_effects(w, "0.16.1")
    assert {e.label for e in effects if e.applicable} >= {"moe", "moe_act", "mla_up_proj"}
