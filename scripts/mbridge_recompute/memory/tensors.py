"""Saved tensors of one decoder layer for one micro-batch, tensor by tensor, per block type.

Each function returns `Saved(name, component, bytes)` entries for what autograd (and
the checkpoint functions) keep between a layer's forward and its backward on one
TP x CP rank, under a set of selective `recompute_modules` labels. Ids A1..A9 and
M1..M6 follow the per-tensor tables of the reference (TE spec / local spec / MoE).

Notation (per rank): T = s*b/c tokens, Tr = T/t under sequence parallelism else T,
a' = a/t query heads, g' = max(g/t, 1) KV heads, f' = ffn/t, e = activation bytes,
q = bytes per element of a GEMM input a low-precision linear keeps (its quantized copy).
"""

from __future__ import annotations

from functools import lru_cache

from mbridge_recompute.layer_spec import LAYER_BLOCKS, norm_fused
from mbridge_recompute.memory import lora
from mbridge_recompute.memory.recompute import block_mods
from mbridge_recompute.memory.shape import Shape
from mbridge_recompute.memory.types import Saved


def _act_saved(sh: Shape, width: float, tokens: float, *, weighted: bool = False) -> list:
    """What the activation function keeps of the fc1 output, plus unfused intermediates.

    `width` is the fc1 output width per rank (2f' for gated units). Fused paths
    (bias_swiglu / bias_geglu / TE activation) keep only their input (fp8 with
    activation_func_fp8_input_store). The unfused GLU `act(x0) * x1` keeps the
    chunk views, which pin the whole fc1 output, plus act(x0) saved by the multiply
    (mlp.py:219-228 @ core_v0.16.1), and the fresh x1 + offset. `weighted` is the MoE expert
    path, whose
    unfused form also keeps the activation output for the probs multiply
    (experts.py:719-733 @ core_v0.16.1).
    """
    e = sh.elt
    out = []
    fusable = sh.act in ("silu", "gelu", "quick_gelu") if sh.gated else sh.act == "gelu"
    if weighted and sh.act == "squared_relu" and not sh.gated and sh.fused_sq_relu:
        # weighted_squared_relu keeps its input and the probs (fused_weighted_squared_relu.py:74)
        return [Saved("fc1 output (activation input)", "", e * width * tokens)]
    if sh.te_act_func and not weighted:
        out.append(Saved("fc1 output (activation input)", "", e * width * tokens))
    elif sh.bias_act_fusion and fusable:
        store = 1 if (sh.act_fp8_store and sh.gated) else e
        out.append(Saved("fc1 output (activation input)", "", store * width * tokens))
    else:
        out.append(Saved("fc1 output (activation input)", "", e * width * tokens))
        inner = width / 2 if sh.gated else width
        if sh.gated:
            # `act(x0) * (x1 + glu_linear_offset)`: the multiply keeps act(x0) and the fresh
            # sum x1 + offset (measured on megatron-core 0.16.1: 8f' bytes per token in all).
            out.append(Saved("unfused GLU: act(x0) kept by the multiply", "", e * inner * tokens))
            out.append(Saved("unfused GLU: x1 + glu_linear_offset kept by the multiply", "",
                             e * inner * tokens))
        if weighted:
            out.append(Saved("unfused: activation output kept by the probs multiply", "",
                             e * inner * tokens))
    return out


def _tag(entries: list, component: str) -> list:
    return [Saved(n, component, b) for n, _, b in entries]


# --- attention -------------------------------------------------------------------

def _attention_norm(sh: Shape, mods: frozenset) -> list:
    """Input norm. TE GQA spec: fused into linear_qkv (layer_spec.py; `layernorm` is a no-op)."""
    e, h, Tr = sh.elt, sh.h, sh.Tr
    out = [Saved("A1 attention-norm input", "norms", e * h * Tr)]
    if norm_fused("attention", sh.te, sh.mla) or "layernorm" not in mods:
        out.append(Saved("A2 attention-norm statistics (fp32)", "norms", sh.stats * Tr))
    return out


def _softmax_kernel(sh: Shape, heads: float) -> bool:
    """Whether the fused scale-mask-softmax kernel runs (it keeps only its 16-bit output).

    megatron-core's DotProductAttention: masked_softmax_fusion, bf16/fp16, 16 < sk <= 4096,
    sq % 4 == 0, b*np % 4 == 0 (fusions/fused_softmax.py:238-270 @ core_v0.16.1). TE's
    UnfusedDotProductAttention: NVTE_MASKED_SOFTMAX_FUSION (on by default), bf16/fp16,
    16 < sk < 16384, sk % 8 == 0, sq % 4 == 0, b*np % 4 == 0 (TE pytorch/attention
    FusedScaleMaskSoftmax.is_kernel_available; read in TE's source, TE cannot be imported here).
    """
    sq = sk = sh.s / sh.c
    if sh.elt != 2 or (sh.b * heads) % 4 or sq % 4:
        return False
    if sh.attn_core == "te_unfused":
        return 16 < sk < 16384 and sk % 8 == 0
    return sh.softmax_fusion and 16 < sk <= 4096


def softmax_in_fp32(sh: Shape, heads: float) -> bool:
    """The unfused softmax runs in fp32 (keeping an fp32 output): the fused kernel is not
    eligible and the core computes in fp32 (TE always; megatron-core with
    attention_softmax_in_fp32) on 16-bit activations."""
    fp32 = sh.attn_core == "te_unfused" or sh.softmax_fp32
    return fp32 and sh.elt != 4 and not _softmax_kernel(sh, heads)


def _probs(sh: Shape, heads: float) -> list:
    """Unfused core attention (megatron-core's DotProductAttention or TE's unfused backend):
    the softmax probabilities [b, np, sq, sk] and attention dropout.

    The fused kernel keeps its 16-bit output. Otherwise the softmax runs in fp32 (always in
    TE; with attention_softmax_in_fp32 in megatron-core) and keeps the fp32 output, and the
    probs x V bmm keeps the 16-bit cast (6 bytes per score). With attention dropout the bmm
    keeps the dropped probs instead, plus the 1-byte mask.
    """
    e = sh.elt
    soft = 4 if softmax_in_fp32(sh, heads) else e
    n = heads * (sh.s / sh.c) * sh.T
    out = [Saved("softmax output", "attention", soft * n)]
    if sh.attn_dropout:
        out.append(Saved("attention-dropout mask", "attention", 1 * n))
        out.append(Saved("dropped probs (bmm input)", "attention", e * n))
    elif soft != e:
        out.append(Saved("16-bit copy of the fp32 probs (bmm input)", "attention", e * n))
    return out


def scores_bytes(sh: Shape) -> float:
    """One layer's attention scores [b*np, sq, sk] in the activation dtype, for unfused cores:
    megatron-core writes them into the persistent global "mpu" buffer
    (dot_product_attention.py:188-200 @ core_v0.16.1), TE into a fresh tensor."""
    if sh.attn_core == "te_fused":
        return 0.0
    return sh.elt * sh.a_ * (sh.s / sh.c) * sh.T


def _mask_type(sh: Shape) -> list:
    """The core_attn checkpoint also keeps attn_mask_type as a one-element int32 tensor."""
    return [Saved("core_attn checkpoint: attn_mask_type (int32)", "attention", 4)] if sh.tiny else []


def _rope_tables(sh: Shape, dim: int) -> list:
    """Unfused RoPE (apply_rope_fusion off) computes cos and sin [s/c, 1, 1, dim] in the
    activation dtype for q and for k, and the multiplies keep them (measured)."""
    if not sh.rope or sh.rope_fusion:
        return []
    return [Saved("RoPE cos/sin for q and k (unfused rotary)", "attention",
                  4 * sh.elt * dim * sh.s / sh.c)]


def _attention_gqa(sh: Shape, mods: frozenset) -> list:
    e, h, T, Tr, d = sh.elt, sh.h, sh.T, sh.Tr, sh.d
    a_, g_ = sh.a_, sh.g_
    out = _attention_norm(sh, mods)
    out.extend(_rope_tables(sh, d))
    if norm_fused("attention", sh.te, sh.mla) or "layernorm" not in mods:
        out.append(Saved("A3 QKV GEMM input (norm output)", "attention",
                         (sh.q_bytes if sh.te else e) * h * Tr))
    if sh.qk_norm:
        out.append(Saved("QK-norm inputs", "attention", e * (a_ + g_) * d * T))
        out.append(Saved("QK-norm statistics (fp32)", "attention", sh.stats * (a_ + g_) * T))
    # The fused QKV GEMM output; v (and q, k without RoPE) are views of it. A saved
    # view keeps the whole buffer alive. With g < t it is the TP-gathered buffer.
    qkv_buf = e * ((sh.a + 2 * sh.g) if sh.g < sh.t else (a_ + 2 * g_)) * d * T
    # With several query heads per group, q is a slice [.., ng, (np/ng)*hn] of the fused
    # buffer and the reshape to [.., np, hn] cannot be a view: it copies
    # (attention.py:1463 @ core_v0.16.1). Measured on a GPU (no RoPE, GQA 16/4): the copy is
    # what autograd keeps, and the fused buffer is then pinned only through k / v views.
    q_reshape_copies = a_ / g_ > 1
    if "core_attn" in mods:
        # tensor_parallel.checkpoint saves (q, k, v) as passed in (attention.py:1134-1143).
        out.extend(_mask_type(sh))
        pinned = False
        if sh.rope:
            out.append(Saved("core_attn checkpoint: q after RoPE", "attention", e * a_ * d * T))
            out.append(Saved("core_attn checkpoint: k after RoPE", "attention", e * g_ * d * T))
        else:
            pinned = True
            if q_reshape_copies:
                out.append(Saved("core_attn checkpoint: q (GQA reshape copy)", "attention",
                                 e * a_ * d * T))
        if sh.te and sh.rope and sh.fused_single_qkv_rope:
            out.append(Saved("core_attn checkpoint: v", "attention", e * g_ * d * T))
        else:
            pinned = True
        if pinned:
            out.append(Saved("core_attn checkpoint: fused QKV buffer pinned by the v view",
                             "attention", qkv_buf))
    elif sh.attn_core == "te_fused":
        # TEDotProductAttention keeps contiguous q, k, v, its output and the softmax LSE.
        out.append(Saved("A4 q (TE attention)", "attention", e * a_ * d * T))
        out.append(Saved("A5 k, v (TE attention)", "attention", 2 * e * g_ * d * T))
        out.append(Saved("A7 softmax LSE (fp32)", "attention", 4 * a_ * T))
    else:
        # Unfused cores (megatron-core DotProductAttention, TE UnfusedDotProductAttention):
        # k and v are repeat_interleave'd to a' heads for GQA and kept by the two bmms.
        rep = a_ / g_ > 1
        view = False
        if sh.rope:
            out.append(Saved("q after RoPE (baddbmm input)", "attention", e * a_ * d * T))
        elif q_reshape_copies:
            out.append(Saved("q (GQA reshape copy, baddbmm input)", "attention", e * a_ * d * T))
        else:
            view = True
        if rep:
            out.append(Saved("k repeated to a' heads", "attention", e * a_ * d * T))
            out.append(Saved("v repeated to a' heads", "attention", e * a_ * d * T))
        else:
            if sh.rope:
                out.append(Saved("k after RoPE", "attention", e * g_ * d * T))
            else:
                view = True
            view = True    # v is a view of the fused QKV output
        if view:
            out.append(Saved("fused QKV buffer pinned by q/k/v views", "attention", qkv_buf))
        out.extend(_probs(sh, a_))
    out.append(Saved("A6 attention output O (linear_proj input)", "attention", e * a_ * d * T))
    if sh.low_precision and not sh.save_original_ok:
        out.append(Saved("A8 linear_proj quantized copy of O", "attention",
                         sh.q_bytes * a_ * d * T))
    if sh.hidden_dropout:
        out.append(Saved("A9 attention BDA dropout mask", "attention", 1 * h * Tr))
    return out


def _attention_mla(sh: Shape, mods: frozenset) -> list:
    """Multi-latent attention: separate input norm, low-rank down/up projections, RoPE dims."""
    e, h, T, Tr, q = sh.elt, sh.h, sh.T, sh.Tr, sh.q_bytes
    a_ = sh.a_
    out = _attention_norm(sh, mods)
    if "layernorm" not in mods:
        # Two consumers (q and kv down-projections). In bf16 they share the norm output;
        # a low-precision linear keeps its own quantized copy.
        if sh.low_precision:
            out.append(Saved("input-norm output: quantized copies in the q/kv down-projections",
                             "attention", 2 * q * h * Tr))
        else:
            out.append(Saved("input-norm output (q/kv down-projection input)", "attention",
                             e * h * Tr))
    if sh.q_lora:
        out.append(Saved("q_compressed (q-norm input)", "attention", e * sh.q_lora * Tr))
        out.append(Saved("q-norm statistics (fp32)", "attention", sh.stats * Tr))
        out.append(Saved("q-norm output (q up-projection input)", "attention", q * sh.q_lora * Tr))
    # kv_compressed is a split view of [Tr, kv_lora + rope] and keeps it alive.
    out.append(Saved("kv down-projection output (kv-norm input)", "attention",
                     e * (sh.kv_lora + sh.dr) * Tr))
    out.append(Saved("kv-norm statistics (fp32)", "attention", sh.stats * Tr))
    out.append(Saved("kv-norm output (kv up-projection input)", "attention", q * sh.kv_lora * Tr))
    if "mla_up_proj" in mods:
        out.append(Saved("mla_up_proj checkpoint: k_pos_emb", "attention", e * sh.dr * T))
    else:
        out.extend(_rope_tables(sh, sh.dr))     # RoPE runs inside the up-projection checkpoint
        out.append(Saved("query [T, a', qk+rope]", "attention", e * a_ * (sh.dqk + sh.dr) * T))
        out.append(Saved("key [T, a', qk+rope]", "attention", e * a_ * (sh.dqk + sh.dr) * T))
        out.append(Saved("value [T, a', v]", "attention", e * a_ * sh.dv * T))
    if "core_attn" not in mods:
        if sh.attn_core == "te_fused":
            out.append(Saved("A7 softmax LSE (fp32)", "attention", 4 * a_ * T))
        else:
            out.extend(_probs(sh, a_))
    else:
        out.extend(_mask_type(sh))
    out.append(Saved("A6 attention output O (linear_proj input)", "attention", e * a_ * sh.dv * T))
    if sh.low_precision and not sh.save_original_ok:
        out.append(Saved("A8 linear_proj quantized copy of O", "attention", q * a_ * sh.dv * T))
    if sh.hidden_dropout:
        out.append(Saved("A9 attention BDA dropout mask", "attention", 1 * h * Tr))
    return out


# --- MLP / MoE -------------------------------------------------------------------

def _mlp(sh: Shape, mods: frozenset) -> list:
    e, h, T, Tr, q = sh.elt, sh.h, sh.T, sh.Tr, sh.q_bytes
    f_ = sh.f / sh.t
    out = [Saved("M1 MLP-norm input (residual)", "norms", e * h * Tr)]
    mlp = "mlp" in mods
    if norm_fused("mlp", sh.te):
        # pre-MLP norm fused into linear_fc1 (TELayerNormColumnParallelLinear).
        if not mlp:
            out.append(Saved("M2 MLP-norm statistics (fp32)", "norms", sh.stats * Tr))
            out.append(Saved("M3 fc1 input (norm output)", "mlp", q * h * Tr))
    else:
        if "layernorm" not in mods:
            out.append(Saved("M2 MLP-norm statistics (fp32)", "norms", sh.stats * Tr))
            out.append(Saved("M3 fc1 input (norm output)", "mlp", e * h * Tr))
    if not mlp:
        width = 2 * f_ if sh.gated else f_
        out.extend(_tag(_act_saved(sh, width, T), "mlp"))
        out.append(Saved("M5 fc2 input (activation output)", "mlp", q * f_ * T))
    if sh.hidden_dropout:
        out.append(Saved("M6 MLP BDA dropout mask", "mlp", 1 * h * Tr))
    return out


def _moe(sh: Shape, mods: frozenset) -> list:
    e, h, T, Tr, q = sh.elt, sh.h, sh.T, sh.Tr, sh.q_bytes
    out = [Saved("pre-MLP norm input (residual)", "norms", e * h * Tr)]
    if "layernorm" not in mods:
        out.append(Saved("pre-MLP norm statistics (fp32)", "norms", sh.stats * Tr))
        # Router input, MoE checkpoint input and (bf16 / save-original) shared fc1 input.
        out.append(Saved("pre-MLP norm output (MoE input)", "moe", e * h * Tr))
    if "moe" not in mods:
        n = sh.n_routed()
        f_e = sh.f_e / sh.etp
        out.append(Saved("router logits, scores (fp32) and routing map", "moe", 9 * sh.E * Tr))
        out.append(Saved("dispatched tokens (expert fc1 input)", "moe", q * h * n))
        out.append(Saved("permuted probs (fp32)", "moe", 4 * n))
        act = _act_saved(sh, 2 * f_e if sh.gated else f_e, n, weighted=True)
        moe_act = "moe_act" in mods and sh.grouped
        for i, entry in enumerate(act):
            if i == 0 or not moe_act:     # moe_act keeps fc1's output, drops what it computes
                out.append(Saved("expert " + entry.name, "moe", entry.nbytes))
        if not moe_act:
            out.append(Saved("expert fc2 input (activation output)", "moe", q * f_e * n))
        if sh.f_s and "shared_experts" not in mods:
            f_s = sh.f_s / sh.t
            if sh.low_precision and not sh.save_original_ok:
                out.append(Saved("shared-expert fc1 quantized input copy", "moe", q * h * Tr))
            for entry in _act_saved(sh, 2 * f_s if sh.gated else f_s, T):
                out.append(Saved("shared-expert " + entry.name, "moe", entry.nbytes))
            out.append(Saved("shared-expert fc2 input", "moe", q * f_s * T))
    if sh.hidden_dropout:
        out.append(Saved("M6 MoE BDA dropout mask", "moe", 1 * h * Tr))
    return out


# --- hybrid mixers (coarse) ------------------------------------------------------

def _mamba(sh: Shape, mods: frozenset) -> list:
    """Mamba-2 mixer, coarse. The memory-efficient path (use_mamba_mem_eff_path, the default)
    runs mamba_split_conv1d_scan_combined on a contiguous copy of the in_proj output, which it
    keeps, and recomputes conv1d and the scan in backward (mamba_mixer.py:630-680 @
    core_v0.16.1); the separate norm keeps the scan output and out_proj keeps the norm output.
    Without it, the conv output and fp32 chunk states are kept too."""
    e, h, T, Tr, q, t = sh.elt, sh.h, sh.T, sh.Tr, sh.q_bytes, sh.t
    di = sh.mamba_heads * sh.mamba_head_dim / t
    gs = 2 * sh.mamba_groups * sh.mamba_state / t
    out = [Saved("mixer-norm input (residual)", "norms", e * h * Tr),
           Saved("mixer-norm statistics (fp32)", "norms", sh.stats * Tr),
           Saved("in_proj input (norm output)", "mamba", q * h * Tr),
           Saved("in_proj output (z, xBC, dt)", "mamba", e * (2 * di + gs + sh.mamba_heads / t) * T)]
    if not sh.mamba_mem_eff:
        out += [Saved("conv1d output xBC", "mamba", e * (di + gs) * T),
                Saved("SSD chunk states (fp32, chunk 256)", "mamba",
                      4 * di * sh.mamba_state / 256 * T)]
    out += [Saved("scan output y (norm input)", "mamba", e * di * T),
            Saved("mixer out-norm statistics (fp32)", "mamba", sh.stats * T),
            Saved("out-norm output (out_proj input)", "mamba", q * di * T)]
    if sh.hidden_dropout:
        out.append(Saved("BDA dropout mask", "mamba", 1 * h * Tr))
    return out


def _gdn(sh: Shape, mods: frozenset) -> list:
    """GatedDeltaNet mixer, coarse."""
    e, h, T, Tr, q, t = sh.elt, sh.h, sh.T, sh.Tr, sh.q_bytes, sh.t
    qk, v, nv = sh.gdn_qk / t, sh.gdn_v / t, sh.gdn_nv / t
    out = [Saved("mixer-norm input (residual)", "norms", e * h * Tr),
           Saved("mixer-norm statistics (fp32)", "norms", sh.stats * Tr),
           Saved("in_proj input (norm output)", "gdn", q * h * Tr),
           Saved("in_proj output (q, k, v, z, b, a)", "gdn", e * (2 * qk + 2 * v + 2 * nv) * T),
           Saved("conv1d output (q, k, v)", "gdn", e * (2 * qk + v) * T),
           Saved("core output (gated-norm input)", "gdn", e * v * T)]
    if "gdn_norm_out" not in mods:
        out.append(Saved("gated-norm output (out_proj input)", "gdn", q * v * T))
    if sh.hidden_dropout:
        out.append(Saved("BDA dropout mask", "gdn", 1 * h * Tr))
    return out


# --- one layer -------------------------------------------------------------------

def _attention(sh: Shape, mods: frozenset) -> list:
    return _attention_mla(sh, mods) if sh.mla else _attention_gqa(sh, mods)


# block name (layer_spec.LAYER_BLOCKS) -> what it keeps for backward
BLOCK_TENSORS = {"attn": _attention, "mlp": _mlp, "moe": _moe, "mamba": _mamba, "gdn": _gdn}


@lru_cache(maxsize=8192)
def layer_tensors(sh: Shape, kind: str, mods: frozenset) -> tuple:
    """Saved tensors of one layer of `kind` for one micro-batch under selective labels `mods`."""
    out = []
    for name in LAYER_BLOCKS[kind]:
        here = block_mods(mods, name)
        out.extend(BLOCK_TENSORS[name](sh, here))
        out.extend(lora.saved(sh, name, here))      # LoRA adapters of the block, if any
    return tuple(out)


@lru_cache(maxsize=8192)
def layer_bytes(sh: Shape, kind: str, mods: frozenset) -> int:
    return round(sum(x.nbytes for x in layer_tensors(sh, kind, mods)))


@lru_cache(maxsize=8192)
def layer_components(sh: Shape, kind: str, mods: frozenset) -> dict:
    comp: dict = {}
    for x in layer_tensors(sh, kind, mods):
        comp[x.component] = comp.get(x.component, 0.0) + x.nbytes
    return comp


def largest_tensor(sh: Shape, kind: str, mods: frozenset) -> float:
    return max((x.nbytes for x in layer_tensors(sh, kind, mods)), default=0.0)


# --- model ends --------------------------------------------------------------------

@lru_cache(maxsize=256)
def embedding_tensors(sh: Shape) -> tuple:
    """First stage: token ids kept by the embedding lookup, position ids, dropout mask."""
    out = [Saved("input ids (int64)", "embedding", 8 * sh.T)]
    if sh.learned_pos:
        out.append(Saved("position ids (int64)", "embedding", 8 * sh.T))
    if sh.hidden_dropout:
        out.append(Saved("embedding dropout mask", "embedding", 1 * sh.h * sh.Tr))
    return tuple(out)


@lru_cache(maxsize=256)
def output_tensors(sh: Shape) -> tuple:
    """Last stage: final norm, output-layer input and what cross-entropy keeps.

    vocab_parallel_cross_entropy (and the native fused one) casts the logits to fp32 and
    keeps the softmax, computed in place, for backward (tensor_parallel/cross_entropy.py:
    28-65 @ core_v0.16.1). TE's parallel cross-entropy writes the gradient into the 16-bit
    logits instead, which it keeps.
    """
    e, h, Tr = sh.elt, sh.h, sh.Tr
    if sh.te_cross_entropy:
        ce = Saved("cross-entropy gradient in the logits [T, V/t] (TE fused)", "logits",
                   e * sh.vocab_ * sh.T)
    else:
        ce = Saved("cross-entropy fp32 softmax [T, V/t]", "logits", 4 * sh.vocab_ * sh.T)
    return (Saved("final-norm input", "logits", e * h * Tr),
            Saved("final-norm statistics (fp32)", "logits", sh.stats * Tr),
            Saved("output-layer input (final-norm output)", "logits", e * h * Tr),
            ce,
            Saved("cross-entropy target mask (bool) and target indices (int64)", "logits",
                  9 * sh.T))


def logits_transient(sh: Shape) -> float:
    """On top of the saved softmax: the 16-bit logits during the forward cast (and the
    16-bit gradient cast in backward). TE's fused cross-entropy works in place."""
    return 0.0 if sh.te_cross_entropy else sh.elt * sh.vocab_ * sh.T


def rotary_freqs_bytes(sh: Shape) -> float:
    """The fp32 rotary frequencies [s/c, 1, 1, d] a full-recompute checkpoint keeps among its
    arguments, once per chunk and micro-batch (one shared tensor; measured)."""
    if not sh.rope:
        return 0.0
    return 4 * (sh.dr if sh.mla else sh.d) * sh.s / sh.c


def checkpoint_bytes(sh: Shape, distribute: bool) -> float:
    """Full recompute keeps one [Tr, h] input per checkpointed unit (1/t with
    distribute_saved_activations, which requires no sequence parallelism)."""
    b = sh.elt * sh.h * sh.Tr
    if distribute and not sh.sp and sh.t > 1:
        b /= sh.t
    return b


# --- multi-token prediction --------------------------------------------------------------

@lru_cache(maxsize=1024)
def mtp_tensors(sh: Shape, inner: str, mods: frozenset, checkpointed: bool) -> tuple:
    """One MTP depth for one micro-batch, on the chunk that holds MTP.

    The depth embeds the rolled input ids again, normalises that embedding (enorm) and the
    incoming hidden state (hnorm), concatenates them into eh_proj (2h -> h), runs one decoder
    layer of kind `inner` (the last decoder layer's spec; selective labels apply to it as to
    any layer) and its final norm (mtp:1255-1360, 1655-1738 @ d98e8a6). Full recompute with
    method uniform checkpoints the whole depth and keeps only its two inputs, the hidden state
    and the embedding output (mtp:1385-1423 @ 0.19.2); method block skips MTP recompute.
    """
    e, h, Tr, T, q = sh.elt, sh.h, sh.Tr, sh.T, sh.q_bytes
    out = [Saved("MTP input ids, rolled (int64)", "mtp", 8 * T)]
    if checkpointed:
        return tuple(out + [Saved("MTP checkpoint: hidden state and embedding output", "mtp",
                                  2 * e * h * Tr)])
    out += [Saved("MTP enorm input (embedding output)", "mtp", e * h * Tr),
            Saved("MTP hnorm input (hidden state)", "mtp", e * h * Tr),
            Saved("MTP enorm / hnorm statistics (fp32)", "mtp", 2 * sh.stats * Tr),
            Saved("MTP eh_proj input (both norms concatenated)", "mtp", q * 2 * h * Tr)]
    out += [Saved("MTP layer: " + x.name, "mtp", x.nbytes) for x in layer_tensors(sh, inner, mods)]
    out += [Saved("MTP final-norm input", "mtp", e * h * Tr),
            Saved("MTP final-norm statistics (fp32)", "mtp", sh.stats * Tr)]
    return tuple(out)


@lru_cache(maxsize=256)
def mtp_loss_tensors(sh: Shape) -> tuple:
    """What one MTP depth adds on the loss stage: its slice of the concatenated hidden states
    as output-layer input, and its own cross-entropy over the rolled labels
    (process_mtp_loss, mtp:932-1069 @ d98e8a6; gpt_model.py:600-660 @ core_v0.16.1)."""
    main = output_tensors(sh)
    return (Saved("MTP output-layer input", "logits", sh.elt * sh.h * sh.Tr), main[3], main[4])
