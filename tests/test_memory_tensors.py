"""Per-tensor and per-label activation bytes against hand-derived values.

Notation (per rank, one micro-batch): T = s*b/c tokens, Tr = T/t under sequence
parallelism, a' = a/t, g' = max(g/t, 1), f' = ffn/t, d = kv_channels. bf16 = 2 bytes.
Each test's docstring gives the derivation; the expected value is computed from it,
never copied from the model's output.
"""

from __future__ import annotations

import pytest

from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_bytes, layer_tensors
from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs
from mbridge_recompute.workload import Workload

# GQA dense shape: h 4096, a 32, g 8, d 128, ffn 14336, s 4096, b 1, TP 4 + SP.
S, H, A, G, D, F, TP = 4096, 4096, 32, 8, 128, 14336, 4
T, TR, A_, G_, F_ = S, S // TP, A // TP, G // TP, F // TP


def gqa(**kw) -> Workload:
    base = dict(num_layers=4, hidden_size=H, num_attention_heads=A, num_query_groups=G,
                kv_channels=D, ffn_hidden_size=F, gated_linear_unit=True, activation_func="silu",
                normalization="RMSNorm", add_bias_linear=False, seq_length=S, vocab_size=32000,
                attention_dropout=0.0, hidden_dropout=0.0, tensor_model_parallel_size=TP,
                sequence_parallel=True, bf16=True, micro_batch_size=1,
                extra_model={"bias_activation_fusion": True, "apply_rope_fusion": True})
    base.update(kw)
    return Workload(**base)


def moe_model(**kw) -> Workload:
    base = dict(num_layers=4, hidden_size=2048, num_attention_heads=16, num_query_groups=4,
                kv_channels=128, ffn_hidden_size=8192, gated_linear_unit=True,
                activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                seq_length=4096, vocab_size=32000, attention_dropout=0.0, hidden_dropout=0.0,
                tensor_model_parallel_size=2, sequence_parallel=True, bf16=True,
                num_moe_experts=64, moe_router_topk=6, moe_ffn_hidden_size=1408,
                moe_shared_expert_intermediate_size=2816, moe_grouped_gemm=True,
                moe_token_dispatcher_type="alltoall", expert_model_parallel_size=8,
                expert_tensor_parallel_size=1, extra_model={"bias_activation_fusion": True})
    base.update(kw)
    return Workload(**base)


def nbytes(w, kind="attn+mlp", mods=(), knobs: Knobs = DEFAULT_KNOBS) -> int:
    return layer_bytes(shape_of(w, knobs), kind, frozenset(mods))


def tensor(w, name_prefix, kind="attn+mlp", mods=()) -> float:
    found = [x.nbytes for x in layer_tensors(shape_of(w, DEFAULT_KNOBS), kind, frozenset(mods))
             if x.name.startswith(name_prefix)]
    assert found, f"no tensor named {name_prefix!r}"
    return sum(found)


# --- dense layer, TE spec ------------------------------------------------------------

def test_te_dense_layer_total_matches_the_per_tensor_table():
    """A1+M1 norm inputs 2hTr each, A3+M3 GEMM inputs 2hTr each (8hTr), RMSNorm rsigma
    4Tr x 2 (8Tr), q 2a'dT, k+v 4g'dT, O 2a'dT, LSE 4a'T, fused SwiGLU input 4f'T,
    fc2 input 2f'T:  8hTr + 8Tr + (4a'd + 4g'd + 4a' + 6f')T."""
    expected = 8 * H * TR + 8 * TR + (4 * A_ * D + 4 * G_ * D + 4 * A_ + 6 * F_) * T
    assert nbytes(gqa()) == expected


def test_layernorm_statistics_are_mu_and_rsigma_for_layernorm():
    """LayerNorm keeps mu and rsigma (8 bytes per row) where RMSNorm keeps rsigma (4)."""
    assert nbytes(gqa(normalization="LayerNorm")) - nbytes(gqa()) == 2 * 4 * TR


def test_unfused_swiglu_keeps_the_whole_fc1_output_act_x0_and_the_offset_sum():
    """Without bias_activation_fusion, glu() = silu(x0) * (x1 + glu_linear_offset) keeps the
    chunk views (they pin the whole [T, 2f'] fc1 output, 4f'T), silu's output (2f'T) and the
    fresh sum x1 + offset (2f'T): 8f'T, +4f'T over the fused 4f'T. (Measured on an H200 with
    megatron-core 0.16.1: see memory/measure.py.)"""
    fused = gqa()
    unfused = gqa(extra_model={"apply_rope_fusion": True})
    assert nbytes(unfused) - nbytes(fused) == 4 * F_ * T


def test_unfused_rope_keeps_cos_and_sin_for_q_and_k():
    """apply_rope_fusion off (MCore default): each rotary multiply keeps cos and sin
    [s, 1, 1, d] in bf16, for q and for k: 4 * 2 * d * s bytes per layer (measured)."""
    unfused = gqa(extra_model={"bias_activation_fusion": True})
    assert nbytes(unfused) - nbytes(gqa()) == 4 * 2 * D * S
    learned = gqa(position_embedding_type="learned_absolute", extra_model={"bias_activation_fusion": True})
    assert not any("RoPE" in x.name for x in layer_tensors(shape_of(learned, DEFAULT_KNOBS),
                                                            "attn+mlp", frozenset()))


def test_activation_fp8_input_store_halves_the_swiglu_input():
    """activation_func_fp8_input_store keeps the SwiGLU input in fp8: 2f'T instead of 4f'T."""
    assert nbytes(gqa()) - nbytes(gqa(activation_func_fp8_input_store=True)) == 2 * F_ * T


def test_dropout_adds_one_byte_masks_on_the_residual_stream():
    """A9 and M6: bias-dropout-add keeps a bool mask [Tr, h] after attention and MLP; TE fused
    attention handles attention dropout inside the kernel (RNG state only)."""
    assert nbytes(gqa(hidden_dropout=0.1, attention_dropout=0.1)) - nbytes(gqa()) == 2 * H * TR


def test_qk_layernorm_keeps_q_and_k_inputs_and_statistics():
    """QK-norm: + 2(a'+g')dT inputs + 4(a'+g')T rsigma."""
    assert nbytes(gqa(qk_layernorm=True)) - nbytes(gqa()) == 2 * (A_ + G_) * D * T + 4 * (A_ + G_) * T


def test_context_parallel_divides_token_terms():
    """CP 2 halves T (and Tr): every term is linear in tokens, so the layer halves."""
    assert nbytes(gqa(context_parallel_size=2)) * 2 == nbytes(gqa())


def test_without_sequence_parallel_residual_terms_are_replicated():
    """No SP: Tr = T, so the 8hTr + 8Tr part grows by t while the rest is unchanged."""
    diff = nbytes(gqa(sequence_parallel=False)) - nbytes(gqa())
    assert diff == (8 * H + 8) * (T - TR)


# --- FP8 -------------------------------------------------------------------------------

def test_fp8_keeps_quantized_gemm_inputs():
    """fp8 tensorwise (TE >= 2.6): A3 and M3 become 1 byte (hTr each instead of 2hTr), fc2
    input 1f'T instead of 2f'T; linear_proj saves the original O (no A8 copy)."""
    diff = nbytes(gqa()) - nbytes(gqa(fp8="hybrid", fp8_recipe="tensorwise"))
    assert diff == 2 * H * TR + F_ * T


def test_fp8_delayed_keeps_linear_proj_quantized_copy_of_o():
    """A8: set_save_original_input(linear_proj) only for recipes other than delayed
    (attention.py:363-378 @ core_v0.16.1), so delayed scaling keeps 1 byte x a'dT more."""
    delayed = nbytes(gqa(fp8="hybrid", fp8_recipe="delayed"))
    tensorwise = nbytes(gqa(fp8="hybrid", fp8_recipe="tensorwise"))
    assert delayed - tensorwise == A_ * D * T


def test_fp8_on_old_transformer_engine_keeps_the_copy():
    """TE 2.5 is below the 2.6.0dev0 bound: A8 is kept even for tensorwise."""
    old = nbytes(gqa(fp8="hybrid", fp8_recipe="tensorwise", te_version="2.5.0"))
    new = nbytes(gqa(fp8="hybrid", fp8_recipe="tensorwise", te_version="2.8.0"))
    assert old - new == A_ * D * T


def test_mxfp8_adds_one_scale_byte_per_32_elements():
    """MXFP8 quantized inputs cost 1 + 1/32 bytes per element (A3, M3, fc2 input)."""
    mx = nbytes(gqa(fp8="hybrid", fp8_recipe="mxfp8"))
    tw = nbytes(gqa(fp8="hybrid", fp8_recipe="tensorwise"))
    assert mx - tw == round((2 * H * TR + F_ * T) / 32)


# --- core_attn ------------------------------------------------------------------------

def test_core_attn_under_te_adds_memory_by_pinning_the_fused_qkv_buffer():
    """TE: the checkpoint keeps fresh q (a'd) and k (g'd) and the v view that pins the
    whole [T, (a'+2g')d] QKV output, instead of TE's q, k, v copies and LSE:
    delta = 2(a'+2g')dT + 2a'dT + 2g'dT - (2a'dT + 4g'dT) - 4a'T = +2(a'+g')dT - 4a'T,
    plus the checkpoint's 4-byte int32 attn_mask_type."""
    delta = nbytes(gqa(), mods=["core_attn"]) - nbytes(gqa())
    assert delta == 2 * (A_ + G_) * D * T - 4 * A_ * T + 4
    assert delta > 0


def test_core_attn_with_fused_single_qkv_rope_saves_only_the_lse():
    """fused_single_qkv_rope makes v a fresh tensor: delta = -4a'T (+4 bytes of mask type)."""
    w = gqa(fused_single_qkv_rope=True)
    assert nbytes(w, mods=["core_attn"]) - nbytes(w) == -4 * A_ * T + 4


def test_core_attn_with_fewer_kv_groups_than_tp_pins_the_gathered_buffer():
    """g = 2 < t = 4: the QKV output is all-gathered before slicing, so the pinned buffer is
    [T, (a+2g)d] (not per rank); g' = 1."""
    w = gqa(num_query_groups=2)
    delta = nbytes(w, mods=["core_attn"]) - nbytes(w)
    pinned = 2 * (A + 2 * 2) * D * T
    assert delta == pinned + 2 * A_ * D * T + 2 * 1 * D * T - (2 * A_ * D * T + 4 * D * T) - 4 * A_ * T + 4


def test_local_core_attn_for_gqa_is_6g_minus_2a_minus_probs():
    """Local spec, s = 4096 with the fused softmax kernel (masked_softmax_fusion, b*a' % 4 == 0):
    P = 2a's T. Without recompute: q + repeated k + repeated v (3 x 2a'dT) + P; the checkpoint
    keeps q, k (2g'dT) and the pinned QKV buffer 2(a'+2g')dT:
    delta = (6g' - 2a')dT - 2a'sT (+4 bytes of mask type)."""
    w = gqa(transformer_impl="local", masked_softmax_fusion=True)
    delta = nbytes(w, mods=["core_attn"]) - nbytes(w)
    assert delta == (6 * G_ - 2 * A_) * D * T - 2 * A_ * S * T + 4


def test_local_softmax_above_4096_takes_the_fp32_path():
    """s > 4096 is not eligible for the fused kernel (fused_softmax.py:256): the fp32 softmax
    output (4) plus its bf16 copy for the bmm (2) = 6a'sT; at s = 4096 the kernel keeps 2a'sT."""
    def probs(s):
        w = gqa(transformer_impl="local", masked_softmax_fusion=True, seq_length=s)
        return tensor(w, "softmax output") + sum(
            x.nbytes for x in layer_tensors(shape_of(w, DEFAULT_KNOBS), "attn+mlp", frozenset())
            if x.name.startswith("16-bit copy"))
    assert probs(4096) == 2 * A_ * 4096 * 4096
    assert probs(8192) == 6 * A_ * 8192 * 8192


def test_local_fp32_softmax_with_attention_dropout_keeps_mask_and_dropped_probs():
    """fp32 softmax output (4) + bool mask (1) + dropped 16-bit probs (2) = 7a'sT: the bmm
    keeps the dropout output instead of the cast copy."""
    w = gqa(transformer_impl="local", seq_length=8192, attention_dropout=0.1)
    no_drop = gqa(transformer_impl="local", seq_length=8192)
    p_drop = nbytes(w, mods=["core_attn"]) - nbytes(w)
    p_none = nbytes(no_drop, mods=["core_attn"]) - nbytes(no_drop)
    assert p_none - p_drop == (7 - 6) * A_ * 8192 * 8192


# --- mlp / layernorm ------------------------------------------------------------------

def test_mlp_recompute_under_te_drops_ln_out_rsigma_and_the_mlp_internals():
    """TE: the checkpoint keeps only the residual (fc1's inputmat):
    delta = -(2hTr + 4Tr + 4f'T + 2f'T)."""
    assert nbytes(gqa()) - nbytes(gqa(), mods=["mlp"]) == 2 * H * TR + 4 * TR + 6 * F_ * T


def test_mlp_recompute_under_fp8_drops_the_quantized_copies():
    """fp8: -(1hTr + 4Tr + 4f'T + 1f'T)."""
    w = gqa(fp8="hybrid", fp8_recipe="tensorwise")
    assert nbytes(w) - nbytes(w, mods=["mlp"]) == H * TR + 4 * TR + 4 * F_ * T + F_ * T


def test_mlp_recompute_under_local_spec_keeps_the_norm_output():
    """Local: the checkpoint input is the pre-MLP norm output, so only 6f'T goes."""
    w = gqa(transformer_impl="local", masked_softmax_fusion=True)
    assert nbytes(w) - nbytes(w, mods=["mlp"]) == 6 * F_ * T


def test_layernorm_is_a_no_op_on_the_te_dense_spec():
    """Both norms are fused into TE LayerNormLinear (IdentityOp): nothing changes."""
    assert nbytes(gqa(), mods=["layernorm"]) == nbytes(gqa())


def test_layernorm_on_the_local_spec_drops_both_norm_outputs():
    """Local: -2(2hTr + 4Tr) (both norm outputs and their rsigma)."""
    w = gqa(transformer_impl="local", masked_softmax_fusion=True)
    assert nbytes(w) - nbytes(w, mods=["layernorm"]) == 2 * (2 * H * TR + 4 * TR)


# --- MoE -------------------------------------------------------------------------------
# MoE shape: h 2048, t 2 (SP), Tr 2048, E 64, k 6, f_e 1408 (ETP 1), shared 2816 -> f_s' 1408.
MH, MTR, MT, E, K, FE, FS_ = 2048, 2048, 4096, 64, 6, 1408, 1408
N = K * MTR * 1                                           # k * Tr * etp


def test_moe_layer_tensors_match_the_moe_table():
    """Pre-MLP norm input + output 4hTr + rsigma 4Tr, router 9E Tr, dispatched tokens 2hN,
    fused weighted SwiGLU input 4f_eN, probs 4N, fc2 input 2f_eN, shared experts 6f_s'T."""
    moe_part = nbytes(moe_model(), "moe")
    expected = (4 * MH * MTR + 4 * MTR + 9 * E * MTR + 2 * MH * N + 4 * FE * N + 4 * N
                + 2 * FE * N + 6 * FS_ * MT)
    assert moe_part == expected


def test_load_imbalance_scales_routed_tokens_and_capacity_caps_it():
    """Imbalance 1.5 -> N = 1.5 k Tr etp; a capacity factor 1.2 caps it at 1.2 k Tr etp."""
    def routed(w, knobs):
        return layer_bytes(shape_of(w, knobs), "moe", frozenset()) - (
            4 * MH * MTR + 4 * MTR + 9 * E * MTR + 6 * FS_ * MT)
    per_token = 2 * MH + 6 * FE + 4
    assert routed(moe_model(), Knobs(moe_load_imbalance=1.5)) == 1.5 * N * per_token
    capped = routed(moe_model(moe_expert_capacity_factor=1.2), Knobs(moe_load_imbalance=1.5))
    assert capped == pytest.approx(1.2 * N * per_token, abs=1)


def test_moe_act_drops_the_expert_activation_output():
    """moe_act discards the fc2 input: -2f_eN (bf16)."""
    assert nbytes(moe_model(), "moe") - nbytes(moe_model(), "moe", ["moe_act"]) == 2 * FE * N


def test_moe_act_under_fp8_drops_fc2s_quantized_copy():
    """fp8 (tensorwise): fc2 keeps a 1-byte copy, set_save_original_input + discard: -1f_eN."""
    w = moe_model(fp8="hybrid", fp8_recipe="tensorwise")
    assert nbytes(w, "moe") - nbytes(w, "moe", ["moe_act"]) == FE * N


def test_moe_act_is_ignored_by_sequential_experts():
    """moe_grouped_gemm off: SequentialMLP ignores the label."""
    w = moe_model(moe_grouped_gemm=False)
    assert nbytes(w, "moe", ["moe_act"]) == nbytes(w, "moe")


def test_shared_experts_recompute_drops_6_fs_t():
    """shared_experts: -(4f_s' + 2f_s')T."""
    assert nbytes(moe_model(), "moe") - nbytes(moe_model(), "moe", ["shared_experts"]) == 6 * FS_ * MT


def test_moe_keeps_only_the_norm_and_its_output():
    """moe: everything inside MoELayer goes; the norm input, rsigma and output remain."""
    assert nbytes(moe_model(), "moe", ["moe"]) == 4 * MH * MTR + 4 * MTR


def test_moe_contains_moe_act_and_shared_experts():
    """Nesting: adding moe_act / shared_experts to moe changes nothing."""
    w = moe_model()
    assert nbytes(w, "moe", ["moe", "moe_act", "shared_experts"]) == nbytes(w, "moe", ["moe"])


def test_moe_plus_layernorm_also_drops_the_moe_input():
    """moe + layernorm: the norm output (the MoE checkpoint input) and rsigma go too:
    only the residual 2hTr remains."""
    assert nbytes(moe_model(), "moe", ["moe", "layernorm"]) == 2 * MH * MTR


def test_layernorm_on_a_moe_layer_drops_the_pre_mlp_norm_output():
    """TE MoE: the pre-MLP norm is a separate TENorm: -(2hTr + 4Tr)."""
    w = moe_model()
    assert nbytes(w, "moe") - nbytes(w, "moe", ["layernorm"]) == 2 * MH * MTR + 4 * MTR


def test_expert_tensor_parallel_gathers_tokens_and_shards_ffn():
    """ETP 2: N doubles (tokens of both ETP ranks) while f_e halves; routed tensors scale
    as 2hN (x2) + 8f_eN (unchanged)."""
    w1, w2 = moe_model(), moe_model(expert_tensor_parallel_size=2)
    diff = nbytes(w2, "moe") - nbytes(w1, "moe")
    assert diff == 2 * MH * N + 4 * N


# --- MLA ------------------------------------------------------------------------------

def mla(**kw) -> Workload:
    base = dict(multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512,
                qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                num_attention_heads=32, num_query_groups=32, hidden_size=4096)
    base.update(kw)
    return gqa(**base)


def test_mla_up_proj_drops_query_key_value_and_keeps_k_pos_emb():
    """mla_up_proj: -2a'T(2(d_qk + d_rope) + d_v); the checkpoint keeps k_pos_emb
    [T, d_rope] (+2 d_rope T)."""
    w = mla()
    delta = nbytes(w) - nbytes(w, mods=["mla_up_proj"])
    assert delta == 2 * (32 // TP) * T * (2 * (128 + 64) + 128) - 2 * 64 * T


def test_mla_core_attn_under_te_saves_only_the_lse():
    """MLA makes q, k, v contiguous (multi_latent_attention.py:832-834): -4a'T (+4 bytes of
    mask type)."""
    w = mla()
    assert nbytes(w) - nbytes(w, mods=["core_attn"]) == 4 * (32 // TP) * T - 4


def test_mla_layernorm_drops_the_input_norm_output():
    """The MLA input norm is a separate TENorm: -(2hTr + 4Tr)."""
    w = mla()
    assert nbytes(w) - nbytes(w, mods=["layernorm"]) == 2 * 4096 * TR + 4 * TR


# --- hybrid -----------------------------------------------------------------------------

def test_hybrid_pattern_mixes_block_types():
    """A hybrid pattern 'M*-E' gives one layer of each kind; each kind has its own tensors and
    the attention-only layer equals the attention part of a dense layer."""
    w = moe_model(hybrid_override_pattern="M*-E", num_layers=4)
    assert w.layer_kinds() == ["mamba", "attn", "mlp", "moe"]
    attn = nbytes(w, "attn")
    both = nbytes(w, "attn+mlp")
    assert both == attn + nbytes(w, "mlp")
    assert nbytes(w, "mamba") > 0


def test_mamba_memory_efficient_path_recomputes_conv_and_scan():
    """use_mamba_mem_eff_path (default) keeps the in_proj output and recomputes the conv1d
    output [T, d_inner + 2*ngroups*d_state] and the fp32 chunk states; turning it off keeps them."""
    w = moe_model(hybrid_override_pattern="M*-E", num_layers=4,
                  extra_model={"mamba_num_heads": 64, "mamba_head_dim": 64,
                               "mamba_state_dim": 128, "mamba_num_groups": 8})
    off = w.replace(extra_model={**w.extra_model, "use_mamba_mem_eff_path": False})
    di, gs = 64 * 64 / 2, 2 * 8 * 128 / 2                 # per TP rank (t = 2)
    extra = 2 * (di + gs) * MT + 4 * di * 128 / 256 * MT
    assert nbytes(off, "mamba") - nbytes(w, "mamba") == extra


def test_te_fused_cross_entropy_keeps_16_bit_logits_instead_of_fp32_softmax():
    """cross_entropy_loss_fusion with impl 'te': the gradient is written into the bf16
    logits (2 V/t T) instead of keeping the fp32 softmax (4 V/t T), and there is no logits
    transient."""
    from mbridge_recompute.memory import estimate
    w = gqa(tensor_model_parallel_size=1, sequence_parallel=False)
    fused = w.replace(extra_model={**w.extra_model, "cross_entropy_loss_fusion": True,
                                   "cross_entropy_fusion_impl": "te"})
    native = w.replace(extra_model={**w.extra_model, "cross_entropy_loss_fusion": True})
    diff = estimate(w).ranks[0].activations["logits"] - estimate(fused).ranks[0].activations["logits"]
    assert diff == (4 - 2) * 32000 * S
    assert estimate(native).ranks[0].activations["logits"] == estimate(w).ranks[0].activations["logits"]
    assert "logits+cross-entropy (fp32) on the last stage" not in estimate(fused).ranks[0].transients
    assert estimate(w).ranks[0].transients["logits+cross-entropy (fp32) on the last stage"] == 2 * 32000 * S
