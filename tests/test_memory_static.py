"""Parameter counts and static memory (weights, gradients, optimizer, fp8 copies, residual)."""

from __future__ import annotations

import pytest

from mbridge_recompute.memory import DEFAULT_KNOBS, Knobs, estimate, moments
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.static import rank_params
from mbridge_recompute.workload import Workload


def llama70b(**kw) -> Workload:
    base = dict(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                kv_channels=128, ffn_hidden_size=28672, gated_linear_unit=True,
                activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                seq_length=4096, vocab_size=128256, share_embeddings_and_output_weights=False,
                attention_dropout=0.0, hidden_dropout=0.0, bf16=True)
    base.update(kw)
    return Workload(**base)


def deepseek_v3(**kw) -> Workload:
    base = dict(num_layers=61, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
                gated_linear_unit=True, activation_func="silu", normalization="RMSNorm",
                add_bias_linear=False, seq_length=4096, vocab_size=129280,
                share_embeddings_and_output_weights=False, attention_dropout=0.0,
                hidden_dropout=0.0, bf16=True, multi_latent_attention=True, q_lora_rank=1536,
                kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                num_moe_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                moe_shared_expert_intermediate_size=2048, moe_grouped_gemm=True,
                moe_layer_freq=[0] * 3 + [1] * 58, moe_token_dispatcher_type="alltoall")
    base.update(kw)
    return Workload(**base)


def total_params(w) -> float:
    sh = shape_of(w, DEFAULT_KNOBS)
    return rank_params(sh, w.layer_kinds(), True, True,
                       w.share_embeddings_and_output_weights, 1).total


def test_llama3_70b_parameter_count_is_exact():
    """80 x (attention 8192*(64+16)*128 + 64*128*8192 + MLP 3*8192*28672 + 2 norms 8192)
    + embedding and output 2*128256*8192 + final norm 8192 = 70,553,706,496 (the published
    checkpoint's count)."""
    assert total_params(llama70b()) == 70_553_706_496


def test_deepseek_v3_parameter_count_is_671b():
    """DeepSeek-V3's main model (without the MTP module) has 671B parameters."""
    assert total_params(deepseek_v3()) == pytest.approx(671e9, rel=0.003)


def test_tp_and_pp_split_layers_and_put_embedding_first_and_output_last():
    """The vocabulary is padded to a multiple of 128 * TP: 128256 -> 128512 at TP 4."""
    w = llama70b(tensor_model_parallel_size=4, pipeline_model_parallel_size=4, num_gpus=16)
    ranks = estimate(w).ranks
    emb = 128512 * 8192 / 4
    assert ranks[0].params - ranks[1].params == pytest.approx(emb, abs=1)
    assert ranks[3].params - ranks[1].params == pytest.approx(emb + 8192, abs=1)
    assert sum(r.params for r in ranks) * 4 == pytest.approx(70_553_706_496, rel=1e-3)


def test_tied_embeddings_share_one_matrix_only_without_pipeline():
    tied = llama70b(share_embeddings_and_output_weights=True)
    assert total_params(llama70b()) - total_params(tied) == 128256 * 8192
    # with PP > 1 the last stage keeps its own copy of the tied matrix
    w = tied.replace(pipeline_model_parallel_size=4)
    ranks = estimate(w).ranks
    assert ranks[3].params - ranks[1].params == pytest.approx(128256 * 8192 + 8192, abs=1)


def _static(w):
    return estimate(w).ranks[0].static


def test_distributed_optimizer_shards_12_bytes_over_dp_times_cp():
    """Bytes/param: 2 weights + 4 fp32 grads + 12/(DP*CP) optimizer."""
    w = llama70b(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, num_gpus=512,
                 context_parallel_size=2)
    n = estimate(w).ranks[1].params
    st = estimate(w).ranks[1].static
    dp = 512 // (8 * 8 * 2)
    assert st["weights"] == round(2 * n)
    assert st["grads"] == round(4 * n)
    assert st["optimizer"] == round(12 * n / (dp * 2))
    no_dist = estimate(w.replace(use_distributed_optimizer=False)).ranks[1].static
    assert no_dist["optimizer"] == round(12 * n)


def test_bf16_gradient_reduction_halves_gradient_buffers():
    w = llama70b(pipeline_model_parallel_size=8, tensor_model_parallel_size=8)
    assert _static(w)["grads"] == 2 * _static(w.replace(grad_reduce_in_fp32=False))["grads"]


def test_expert_parameters_shard_over_expert_data_parallel():
    """Routed experts shard the optimizer over DP*TP*CP/(EP*ETP), dense params over DP*CP."""
    w = deepseek_v3(tensor_model_parallel_size=2, pipeline_model_parallel_size=1,
                    expert_model_parallel_size=8, expert_tensor_parallel_size=1, num_gpus=64,
                    num_layers=4, moe_layer_freq=[0, 1, 1, 1], sequence_parallel=True)
    sh = shape_of(w, DEFAULT_KNOBS)
    p = rank_params(sh, w.layer_kinds(), True, True, False, 1)
    dp = 64 // 2
    edp = dp * 2 // 8
    assert _static(w)["optimizer"] == round(12 * (p.dense / dp + p.expert / edp))
    assert p.expert == pytest.approx(3 * 256 * 3 * 7168 * 2048 / 8)


def test_fp8_keeps_rowwise_and_columnwise_weight_copies():
    """FP8: 2 bytes per linear weight (row-wise + transposed copy); fp8_param stores the
    weight itself in fp8, so weights drop by 1 byte and one copy remains."""
    base = llama70b(tensor_model_parallel_size=8, pipeline_model_parallel_size=8)
    fp8 = base.replace(fp8="hybrid", fp8_recipe="tensorwise")
    sh = shape_of(fp8, DEFAULT_KNOBS)
    linear = rank_params(sh, fp8.layer_kinds()[:10], False, False, False, 8).linear
    assert _static(base)["fp8_weight_copies"] == 0
    assert _static(fp8)["fp8_weight_copies"] == round(2 * linear)
    fp8p = fp8.replace(fp8_param=True)
    assert _static(fp8p)["fp8_weight_copies"] == round(linear)
    assert _static(fp8)["weights"] - _static(fp8p)["weights"] == round(linear)


def test_residual_is_a_stated_constant():
    w = llama70b(pipeline_model_parallel_size=8, tensor_model_parallel_size=8)
    assert _static(w)["residual"] == int(1.5 * 2**30)
    est = estimate(w, Knobs(residual_bytes=10))
    assert est.ranks[0].static["residual"] == 10
    assert any("1.50 GiB" in a for a in estimate(w).assumptions)


def test_peak_is_static_plus_the_larger_of_activations_with_transient_and_the_step():
    w = llama70b(pipeline_model_parallel_size=8, tensor_model_parallel_size=8,
                 sequence_parallel=True, global_batch_size=64)
    for r in estimate(w).ranks:
        assert r.peak_bytes == r.static_bytes + max(r.activation_bytes + r.transient_bytes,
                                                    r.step_bytes)
        assert r.static_bytes == sum(r.static.values())
        assert r.activation_bytes == pytest.approx(sum(r.activations.values()), abs=len(r.activations))
        assert r.transient_bytes == max(r.transients.values())
        assert r.peak_term in r.transients or r.peak_term == moments.STEP


def test_optimizer_bytes_per_param_knob_replaces_adam_fp32_states():
    """A precision-aware optimizer with bf16 moments keeps 4 + 2 + 2 = 8 bytes per parameter."""
    w = llama70b(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, num_gpus=64)
    adam = estimate(w).ranks[1].static["optimizer"]
    bf16_moments = estimate(w, Knobs(optimizer_bytes_per_param=8)).ranks[1].static["optimizer"]
    assert bf16_moments * 12 == pytest.approx(adam * 8, abs=12)
    assert any("8 bytes per parameter" in a
               for a in estimate(w, Knobs(optimizer_bytes_per_param=8)).assumptions)


def test_estimate_is_plain_data_with_sentences_for_assumptions():
    import json
    w = deepseek_v3(tensor_model_parallel_size=2, sequence_parallel=True,
                    pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=13,
                    expert_model_parallel_size=8, num_gpus=256,
                    fp8="hybrid", fp8_recipe="blockwise")
    est = estimate(w)
    data = json.loads(json.dumps(est.as_dict()))
    assert [r["pp_rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["hottest_pp_rank"] == est.hottest.pp_rank
    assert {"attn+mlp", "attn+moe"} == set(data["per_layer"])
    assert all(isinstance(a, str) and a.endswith(".") for a in est.assumptions)
    assert any("load-imbalance" in a for a in est.assumptions)
    assert any("FP8" in a for a in est.assumptions)


def _dummies(w, rank=-1):
    return estimate(w).ranks[rank].static["dummy_wgrads"]


def test_every_rank_keeps_one_dummy_wgrad_per_weight_shape_and_the_last_stage_the_output_layers():
    """Under gradient_accumulation_fusion one 16-bit [rows, cols] per distinct local weight shape
    (qkv, proj, fc1, fc2 of the dense layer at TP 8), however many layers share it; the last
    stage adds the output layer's [V/t, h] (128256 padded to 129024, / 8)."""
    w = llama70b(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, num_gpus=64)
    layer = 1280 * 8192 + 8192 * 1024 + 7168 * 8192 + 8192 * 3584
    assert _dummies(w, 1) == 2 * layer
    assert _dummies(w, 0) == 2 * layer                       # the embedding is not a GEMM
    assert _dummies(w, -1) == 2 * (layer + 16128 * 8192)
    r = estimate(w).ranks[-1]
    assert r.static_bytes == sum(r.static.values())


def test_no_dummy_wgrads_without_gradient_accumulation_fusion_or_before_te_2_2_1():
    """get_dummy_wgrad and its cache arrived in TE 2.2.1 (module/base.py:46,82 @ v2.2.1; absent
    at v2.2): before it, the fused backward's placeholder died with each backward."""
    w = llama70b(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, num_gpus=64)
    off = w.replace(extra_model={"gradient_accumulation_fusion": False})
    assert _dummies(w) > 0
    assert _dummies(off) == 0
    assert estimate(w).ranks[-1].static_bytes - estimate(off).ranks[-1].static_bytes == _dummies(w)
    assert _dummies(w.replace(te_version="2.2.0")) == 0
    assert _dummies(w.replace(te_version="2.2.1")) == _dummies(w)
    for absent in ("0.0.0", "none"):                         # no TE: megatron-core's fresh tensors
        assert _dummies(w.replace(te_version=absent)) == 0


def test_the_mtp_stage_counts_eh_projs_dummy_wgrad_and_its_moe_layer_shares_the_decoders():
    """MTP on the last stage adds eh_proj's [h/t, 2h]; its MoE decoder layer has the shapes the
    stage's MoE layers already keep."""
    base = deepseek_v3(num_layers=8, moe_layer_freq=[0] * 3 + [1] * 5,
                       tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                       expert_model_parallel_size=8, num_gpus=32, sequence_parallel=True)
    mtp = base.replace(mtp_num_layers=1)
    assert _dummies(mtp) - _dummies(base) == 2 * (7168 // 2) * (2 * 7168)
    assert _dummies(mtp, 0) == _dummies(base, 0)


def test_grouped_gemm_experts_keep_dummy_wgrads_only_from_te_2_10():
    """TE's GroupedLinear took get_dummy_wgrad in 2.10; before, each backward made fresh
    per-expert tensors that die with it. Experts [2*2048, 7168] and [7168, 2048] at ETP 1."""
    w = deepseek_v3(num_layers=4, moe_layer_freq=[0, 1, 1, 1], tensor_model_parallel_size=2,
                    expert_model_parallel_size=8, expert_tensor_parallel_size=1, num_gpus=16,
                    sequence_parallel=True)
    experts = 2 * (4096 * 7168 + 7168 * 2048)
    new, old = w.replace(te_version="2.10.0"), w.replace(te_version="2.9.0")
    assert _dummies(new) - _dummies(old) == experts
    # sequential experts are TE Linears: their dummies exist on every TE from 2.2.1
    assert _dummies(old.replace(moe_grouped_gemm=False)) - _dummies(old) == experts
