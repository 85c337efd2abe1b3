"""Parameters per layer and per PP rank, and the static bytes they cost.

Bytes per parameter (Adam, mixed precision): 16-bit weights (2), main gradients in
fp32 when grad_reduce_in_fp32 else 16-bit (4 / 2), fp32 master weights + two fp32
moments (12; fewer with the precision-aware optimizer, see `optimizer_state_bytes`)
sharded by the distributed optimizer over DP x CP for dense
parameters and over the expert-data-parallel group DP*TP*CP/(EP*ETP) for routed
experts (the split Megatron Bridge's estimator uses). The gradient buffer is not
sharded by the distributed optimizer. FP8 training keeps a quantized copy of each
linear weight (row-wise and column-wise/transposed: 2 bytes per parameter) between
micro-batches. Under gradient_accumulation_fusion each distinct weight shape also keeps one
16-bit dummy weight gradient from its first backward on (`dummy_wgrad_bytes`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from mbridge_recompute.layer_spec import LAYER_BLOCKS
from mbridge_recompute.memory.shape import Shape
from mbridge_recompute.memory.types import RankParams


class Part(NamedTuple):
    name: str
    count: float       # parameters in the whole layer (all TP/EP ranks together)
    split: str         # "tp": sharded over TP; "rep": replicated on every TP rank;
    #                    "expert": routed experts, sharded over EP x ETP
    linear: bool       # a GEMM weight (gets a low-precision copy under fp8/fp4)


def _norm(sh: Shape, width: int) -> float:
    return 2 * width if sh.layernorm else width


def _attention_parts(sh: Shape) -> list:
    h, a, d = sh.h, sh.a, sh.d
    bias = sh.add_bias
    parts = [Part("attention norm", _norm(sh, h), "rep", False)]
    if sh.mla:
        qk = sh.dqk + sh.dr
        if sh.q_lora:
            parts += [Part("q down-projection", h * sh.q_lora, "rep", True),
                      Part("q norm", _norm(sh, sh.q_lora), "rep", False),
                      Part("q up-projection", sh.q_lora * a * qk, "tp", True)]
        else:
            parts.append(Part("q projection", h * a * qk, "tp", True))
        parts += [Part("kv down-projection", h * (sh.kv_lora + sh.dr), "rep", True),
                  Part("kv norm", _norm(sh, sh.kv_lora), "rep", False),
                  Part("kv up-projection", sh.kv_lora * a * (sh.dqk + sh.dv), "tp", True),
                  Part("output projection", a * sh.dv * h, "tp", True)]
    else:
        qkv = (a + 2 * sh.g) * d
        parts += [Part("qkv projection", h * qkv + (qkv if bias else 0), "tp", True),
                  Part("output projection", a * d * h, "tp", True)]
        if bias:
            parts.append(Part("output projection bias", h, "rep", False))
        if sh.qk_norm:
            parts.append(Part("qk norms", 2 * _norm(sh, d), "rep", False))
    return parts


def _mlp_weights(sh: Shape, f: int) -> float:
    return (3 if sh.gated else 2) * sh.h * f


def _mlp_parts(sh: Shape) -> list:
    bias = sh.add_bias * ((2 if sh.gated else 1) * sh.f)
    parts = [Part("MLP norm", _norm(sh, sh.h), "rep", False),
             Part("MLP fc1/fc2", _mlp_weights(sh, sh.f) + bias, "tp", True)]
    if sh.add_bias:
        parts.append(Part("MLP fc2 bias", sh.h, "rep", False))
    return parts


def _moe_parts(sh: Shape) -> list:
    parts = [Part("MoE norm", _norm(sh, sh.h), "rep", False),
             Part("router", sh.E * sh.h, "rep", False),
             Part("routed experts", sh.E * _mlp_weights(sh, sh.f_e), "expert", True)]
    if sh.f_s:
        parts.append(Part("shared experts", _mlp_weights(sh, sh.f_s), "tp", True))
        if sh.shared_gate:
            parts.append(Part("shared-expert gate", sh.h, "rep", False))
    return parts


def _mamba_parts(sh: Shape) -> list:
    di = sh.mamba_heads * sh.mamba_head_dim
    gs = 2 * sh.mamba_groups * sh.mamba_state
    nh = sh.mamba_heads
    return [Part("mixer norm", _norm(sh, sh.h), "rep", False),
            Part("in_proj", sh.h * (2 * di + gs + nh), "tp", True),
            Part("conv1d", (di + gs) * 5, "tp", False),
            Part("A, D, dt_bias, gated norm", 3 * nh + di, "tp", False),
            Part("out_proj", di * sh.h, "tp", True)]


def _gdn_parts(sh: Shape) -> list:
    qk, v, nv = sh.gdn_qk, sh.gdn_v, sh.gdn_nv
    return [Part("mixer norm", _norm(sh, sh.h), "rep", False),
            Part("in_proj", sh.h * (2 * qk + 2 * v + 2 * nv), "tp", True),
            Part("conv1d", (2 * qk + v) * 4, "tp", False),
            Part("A_log, dt_bias, out norm", 2 * nv + v, "tp", False),
            Part("out_proj", v * sh.h, "tp", True)]


def mtp_parts(sh: Shape) -> list:
    """What one MTP depth adds around its decoder layer: enorm and hnorm, eh_proj (a
    column-parallel 2h -> h linear without bias) and its final norm
    (MultiTokenPredictionLayer, mtp:666-720 @ core_v0.16.1; mtp:1157-1247 @ d98e8a6)."""
    return [Part("MTP enorm, hnorm and final norm", 3 * _norm(sh, sh.h), "rep", False),
            Part("MTP eh_proj", 2 * sh.h * sh.h, "tp", True)]


def _glu(sh: Shape) -> int:
    return 2 if sh.gated else 1


def _attention_wgrads(sh: Shape) -> list:
    h, a, t = sh.h, sh.a, sh.t
    if sh.mla:
        qk = sh.dqk + sh.dr
        q = ([(sh.q_lora, h), (a * qk / t, sh.q_lora)] if sh.q_lora else [(a * qk / t, h)])
        return q + [(sh.kv_lora + sh.dr, h), (a * (sh.dqk + sh.dv) / t, sh.kv_lora),
                    (h, a * sh.dv / t)]
    return [((a + 2 * sh.g) * sh.d / t, h), (h, a * sh.d / t)]


def _mlp_wgrads(sh: Shape) -> list:
    return [(_glu(sh) * sh.f / sh.t, sh.h), (sh.h, sh.f / sh.t)]


def _moe_wgrads(sh: Shape) -> list:
    out = []
    if sh.grouped_dummies or not sh.grouped:
        out += [(_glu(sh) * sh.f_e / sh.etp, sh.h), (sh.h, sh.f_e / sh.etp)]
    if sh.f_s:
        out += [(_glu(sh) * sh.f_s / sh.t, sh.h), (sh.h, sh.f_s / sh.t)]
    return out


def _mamba_wgrads(sh: Shape) -> list:
    di = sh.mamba_heads * sh.mamba_head_dim
    gs = 2 * sh.mamba_groups * sh.mamba_state
    return [((2 * di + gs + sh.mamba_heads) / sh.t, sh.h), (sh.h, di / sh.t)]


def _gdn_wgrads(sh: Shape) -> list:
    qk, v, nv = sh.gdn_qk, sh.gdn_v, sh.gdn_nv
    return [((2 * qk + 2 * v + 2 * nv) / sh.t, sh.h), (sh.h, v / sh.t)]


# block name (layer_spec.LAYER_BLOCKS) -> the (rows, columns) of its local GEMM weights
BLOCK_WGRADS = {"attn": _attention_wgrads, "mlp": _mlp_wgrads, "moe": _moe_wgrads,
                "mamba": _mamba_wgrads, "gdn": _gdn_wgrads}


def dummy_wgrad_bytes(sh: Shape, kinds, last_stage: bool, mtp_kinds=()) -> float:
    """The dummy weight gradients a rank keeps under gradient_accumulation_fusion: one 16-bit
    tensor per distinct local weight shape of its GEMMs, the output layer's [V/t, h] on the last
    stage included.

    The fused wgrad GEMM writes into main_grad, and the backward still hands autograd a tensor
    of the weight's shape: megatron-core's own linears (the output layer, every linear of the
    local spec) take it from Transformer Engine's get_dummy_wgrad (tensor_parallel/layers.py:602 @
    core_v0.16.1, :592 @ core_v0.17.1, :631 @ core_v0.18.2, :713 @ core_v0.19.0), as do TE's
    Linear and LayerNormLinear (linear.py:741-747, layernorm_linear.py:850-856 @ TE v2.3;
    linear.py:692-698 @ v2.2.1) for every parameter DDP marks with grad_added_to_main_grad
    (distributed_data_parallel.py:119 @ core_v0.16.1, :122 @ core_v0.19.0). get_dummy_wgrad keeps
    one tensor per (shape, dtype) in a module-level dict that is never emptied
    (pytorch/module/base.py:89-100 @ TE v2.3, :82 @ v2.2.1; absent at v2.2). TE's
    GroupedLinear (grouped GEMM experts) uses it from v2.10 (grouped_linear.py:459-465); before
    that it made a fresh tensor per expert each backward (grouped_linear.py:457 @ v2.9), freed
    with it. The MTP depths add eh_proj's [h/t, 2h] (multi_token_prediction.py:1000-1012 @
    core_v0.19.0); the router's weight gradient is a fresh tensor each backward (moe_utils.py:
    1363-1374 @ core_v0.19.0), no dummy."""
    if not sh.wgrad_dummies:
        return 0.0
    return _dummy_wgrad_bytes(sh, frozenset(kinds) | frozenset(mtp_kinds), last_stage,
                              bool(mtp_kinds))


@lru_cache(maxsize=1024)
def _dummy_wgrad_bytes(sh: Shape, kinds: frozenset, last_stage: bool, mtp: bool) -> float:
    shapes = set()
    for kind in kinds:
        for name in LAYER_BLOCKS[kind]:
            shapes.update((round(r), round(c)) for r, c in BLOCK_WGRADS[name](sh))
    if mtp:
        shapes.add((round(sh.h / sh.t), 2 * sh.h))
    if last_stage and sh.vocab:
        shapes.add((round(sh.vocab_), sh.h))
    return float(sh.elt * sum(r * c for r, c in shapes))


# block name (layer_spec.LAYER_BLOCKS) -> its parameters
BLOCK_PARTS = {"attn": _attention_parts, "mlp": _mlp_parts, "moe": _moe_parts,
               "mamba": _mamba_parts, "gdn": _gdn_parts}


@lru_cache(maxsize=256)
def layer_parts(sh: Shape, kind: str) -> tuple:
    out = []
    for name in LAYER_BLOCKS[kind]:
        out.extend(BLOCK_PARTS[name](sh))
    return tuple(out)


def local_count(sh: Shape, part: Part) -> float:
    if part.split == "tp":
        return part.count / sh.t
    if part.split == "expert":
        return part.count / (sh.ep * sh.etp)
    return part.count


def rank_params(sh: Shape, kinds, first_stage: bool, last_stage: bool,
                tied: bool, p: int, mtp_kinds=(), mtp_embedding: bool = False) -> RankParams:
    """Parameters of one pipeline rank: its decoder layers, the MTP depths it holds (each a
    decoder layer of kind `mtp_kinds[i]` plus `mtp_parts`), the embedding on the first stage
    and, where MTP sits on another model chunk than the first, the MTP stage's own copy of the
    word embedding (gpt_model.py:167 @ core_v0.19.0: `if self.pre_process or self.mtp_process`)."""
    return _rank_params(sh, tuple(kinds), first_stage, last_stage, tied, p, tuple(mtp_kinds),
                        bool(mtp_embedding))


@lru_cache(maxsize=4096)
def _rank_params(sh: Shape, kinds: tuple, first_stage: bool, last_stage: bool,
                 tied: bool, p: int, mtp_kinds: tuple, mtp_embedding: bool) -> RankParams:
    dense = expert = linear = 0.0
    parts = [part for kind in kinds for part in layer_parts(sh, kind)]
    for kind in mtp_kinds:
        parts += list(layer_parts(sh, kind)) + mtp_parts(sh)
    for part in parts:
        n = local_count(sh, part)
        if part.split == "expert":
            expert += n
        else:
            dense += n
        if part.linear:
            linear += n
    emb = out = 0.0
    if first_stage or mtp_embedding:
        copies = int(first_stage) + int(mtp_embedding)
        emb = copies * (sh.vocab_ * sh.h + (sh.s * sh.h if sh.learned_pos else 0))
    if last_stage:
        out = _norm(sh, sh.h)
        # The output layer holds its own [V/t, h] weight unless it is the (tied) embedding
        # on the same rank (PP = 1 with shared embeddings).
        if not (tied and p == 1):
            out += sh.vocab_ * sh.h
    return RankParams(dense + emb + out, expert, linear, emb, out)


_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def optimizer_state_bytes(w, half: bool) -> tuple:
    """Adam state bytes per parameter: (made when the optimizer is built, made by its first step).

    Without the precision-aware optimizer MCore clones an fp32 main copy of every 16-bit
    parameter shard when it builds the distributed optimizer (distrib_optimizer.py:378-399 @
    core_v0.16.1) and the two fp32 moments appear at the first step. With it (TE FusedAdam),
    moments take exp_avg_dtype / exp_avg_sq_dtype (optimizer/__init__.py:365-387 @ core_v0.16.1)
    and, unless an fp8 recipe other than delayed keeps MCore's fp32 copy
    (optimizer_config.py:355-362), FusedAdam holds the master weight itself: with fp32 master
    weights, bf16 parameters and store_param_remainders (MCore default True,
    optimizer_config.py:192) only the trailing 16 bits (int16) are stored
    (TE pytorch/optimizers/fused_adam.py:98-102, 213-215, 414-415). FusedAdam creates all of
    its state in step() (fused_adam.py:626-630); MCore calls init_state_fn only when loading a
    checkpoint (optimizer.py:791, 808, 1019 @ core_v0.16.1), so none of the lazy part exists
    during the first iteration's forward and backward.
    """
    if not w.use_precision_aware_optimizer:
        return (4.0 if half else 0.0), 8.0
    moments = float(_DTYPE_BYTES[w.exp_avg_dtype] + _DTYPE_BYTES[w.exp_avg_sq_dtype])
    if not half:
        return 0.0, moments
    # OptimizerConfig.fp8_recipe defaults to None (optimizer_config.py:171, used at :355-362)
    te_master = w.main_params_dtype != "fp32" or not w.fp8 or w.fp8_recipe == "delayed"
    if not te_master:
        return 4.0, moments
    if w.main_params_dtype == "fp32" and w.store_param_remainders and w.bf16:
        return 0.0, 2.0 + moments
    return 0.0, _DTYPE_BYTES[w.main_params_dtype] + moments


def static_bytes(sh: Shape, params: RankParams, *, dp: int, distributed: bool,
                 grad_fp32: bool, fp8_param: bool, residual: int,
                 optimizer_bytes: float | None = None, global_buffer: float = 0.0,
                 dummy_wgrads: float = 0.0, trainable: RankParams | None = None,
                 trainable_bytes: float | None = None) -> dict:
    """Static memory of one rank by term (bytes). `trainable`: with a frozen base (LoRA), the
    parameters that train (the adapters, `trainable_bytes` each): only they get gradient
    buffers and optimizer state, as megatron-core builds both for requires_grad parameters
    only (distributed_data_parallel.py, optimizer/__init__.py param groups)."""
    half = sh.elt == 2
    w_bytes = sh.elt
    weights = params.total * w_bytes
    if fp8_param and sh.low_precision:
        weights -= params.linear * (w_bytes - 1)
    adapters = 0.0
    base = params
    if trainable is not None:
        adapters = trainable.total * (trainable_bytes or w_bytes)
        params = trainable            # gradients and optimizer state below: the adapters only
    grads = params.total * (4 if (grad_fp32 or not half) else 2)
    per_param_opt = 12 if half else 8          # fp32 master copy only when weights are 16-bit
    if optimizer_bytes is not None:
        per_param_opt = optimizer_bytes
    dense_shard = dp * sh.c if distributed else 1
    expert_shard = max(1, dp * sh.t * sh.c // (sh.ep * sh.etp)) if distributed else 1
    optimizer = per_param_opt * (params.dense / dense_shard + params.expert / expert_shard)
    copies = 0.0
    if sh.low_precision:
        per = 2.0 if sh.fp8 else 1.0 + 1 / 8
        if sh.fp8_recipe in ("mxfp8", "blockwise") and sh.fp8:
            per += 2 / 32
        if fp8_param:
            per -= 1.0     # the parameter itself is already the row-wise fp8 copy
        copies = base.linear * per      # the base GEMMs' low-precision weights (adapters stay 16-bit)
    out = {"weights": round(weights), "grads": round(grads), "optimizer": round(optimizer),
           "fp8_weight_copies": round(copies), "global_buffer": round(global_buffer),
           "dummy_wgrads": round(dummy_wgrads), "residual": int(residual)}
    if trainable is not None:
        out["lora_adapters"] = round(adapters)
    return out
