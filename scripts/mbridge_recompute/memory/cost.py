"""Replayed forward work (FLOPs plus communication) as a share of the step, and the modelled
step of a layout (pipeline bubble, exposed offload and context-parallel transfers) so that
recompute and layout changes are priced on one axis.

Per rank and per micro-batch: a GEMM costs 2 FLOPs per weight per token; attention
scores cost 2*s*(d_qk + d_v) FLOPs per head per token times the causal factor; the
step is forward + backward = 3x the forward FLOPs (the usual 6*N*tokens plus the
attention terms). Replayed communication (SP all-gather / reduce-scatter of a
replayed TP region, MoE dispatch and combine all-to-alls) and replayed memory-bound
kernels (norms, activations) are converted to FLOP-equivalents with the two
`Knobs` rates. Percentages average over all layers of the model.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import NamedTuple

from mbridge_recompute.layer_spec import norm_fused
from mbridge_recompute.memory.recompute import block_mods
from mbridge_recompute.memory.shape import Shape
from mbridge_recompute.memory.static import layer_parts
from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs


def _tokens_rank(sh: Shape) -> float:
    """Token-GEMM work per rank: a TP x CP group shares one micro-batch's tokens."""
    return sh.s * sh.b / (sh.t * sh.c)


def _gemm_flops(sh: Shape, kind: str, names: tuple | None = None) -> float:
    """Forward GEMM FLOPs of a layer's weights per rank (routed experts: top-k of E)."""
    S = _tokens_rank(sh)
    total = 0.0
    for part in layer_parts(sh, kind):
        if not part.linear and part.name != "router":
            continue
        if names is not None and part.name not in names:
            continue
        n = part.count
        if part.split == "expert":
            n = part.count * sh.k / max(sh.E, 1)
        total += 2 * n * S
    return total


def _attn_core_flops(sh: Shape, knobs: Knobs) -> float:
    dqk = (sh.dqk + sh.dr) if sh.mla else sh.d
    dv = sh.dv if sh.mla else sh.d
    return 2 * sh.s * sh.a * (dqk + dv) * _tokens_rank(sh) * knobs.attention_flops_factor


def _tp_comm_bytes(sh: Shape, regions: int) -> float:
    """Bytes per rank moved by `regions` TP collectives over a [T, h] activation."""
    if sh.t <= 1:
        return 0.0
    one = sh.elt * sh.h * sh.T * (sh.t - 1) / sh.t
    return regions * one * (1 if sh.sp else 2)     # all-reduce ~ 2x an all-gather


def _a2a_bytes(sh: Shape) -> float:
    """Dispatch + combine all-to-all bytes per rank for one MoE layer forward."""
    if sh.ep <= 1 and sh.etp <= 1:
        return 0.0
    return 2 * sh.elt * sh.h * sh.n_routed() * (sh.ep - 1) / max(sh.ep, 1)


ATTN_NAMES = ("qkv projection", "output projection", "q down-projection", "q up-projection",
              "q projection", "kv down-projection", "kv up-projection")
MLP_NAMES = ("MLP fc1/fc2",)
MOE_NAMES = ("router", "routed experts", "shared experts")


@lru_cache(maxsize=1024)
def layer_forward_flops(sh: Shape, kind: str, knobs: Knobs) -> float:
    f = _gemm_flops(sh, kind)
    if kind in ("attn+mlp", "attn+moe", "attn"):
        f += _attn_core_flops(sh, knobs)
    if kind == "mamba":
        # SSD scan: ~ 2 * d_inner * d_state * 3 per token (coarse)
        f += 6 * sh.mamba_heads * sh.mamba_head_dim * sh.mamba_state * _tokens_rank(sh)
    return f


def output_forward_flops(sh: Shape) -> float:
    return 2 * sh.vocab * sh.h * _tokens_rank(sh)


def _membound(sh: Shape, elements: float, knobs: Knobs) -> float:
    return elements * sh.elt * knobs.memory_bound_flops_per_byte


@lru_cache(maxsize=8192)
def layer_replay_flops(sh: Shape, kind: str, mods: frozenset, knobs: Knobs) -> float:
    """FLOP-equivalent of what the selective labels `mods` replay in one layer's backward."""
    has_attn = kind in ("attn+mlp", "attn+moe", "attn")
    has_mlp = kind in ("attn+mlp", "mlp")
    has_moe = kind in ("attn+moe", "moe")
    cfb = knobs.comm_flops_per_byte
    T, Tr, h = sh.T, sh.Tr, sh.h
    attn_mods, ffn_mods = block_mods(mods, "attn"), block_mods(mods, "moe" if has_moe else "mlp")
    out = 0.0
    if "core_attn" in attn_mods and has_attn:
        out += _attn_core_flops(sh, knobs)
    if "mla_up_proj" in attn_mods and has_attn and sh.mla:
        out += _gemm_flops(sh, kind, ("q up-projection", "kv up-projection"))
        out += _tp_comm_bytes(sh, 2) * cfb if sh.sp else 0.0
    if "layernorm" in mods:
        # a norm fused into the next GEMM is no module the label can replay (layer_spec.py)
        attn_norm = has_attn and "layernorm" in attn_mods and not norm_fused("attention", sh.te, sh.mla)
        ffn_norm = "layernorm" in ffn_mods and (has_moe or has_mlp) \
            and not norm_fused("mlp", sh.te, moe=has_moe)
        out += (attn_norm + ffn_norm) * _membound(sh, 2 * h * Tr, knobs)
    mods = ffn_mods
    if "mlp" in mods and has_mlp:
        out += _gemm_flops(sh, kind, MLP_NAMES) + _tp_comm_bytes(sh, 2) * cfb
        out += _membound(sh, 3 * sh.f / sh.t * T, knobs)
    if has_moe:
        n = sh.n_routed()
        f_e = sh.f_e / sh.etp
        if "moe" in mods:
            out += _gemm_flops(sh, kind, MOE_NAMES) + _a2a_bytes(sh) * cfb
            out += _membound(sh, 3 * f_e * n, knobs)
            if sh.f_s:
                out += _tp_comm_bytes(sh, 2) * cfb
        else:
            if "moe_act" in mods and sh.grouped:
                out += _membound(sh, 3 * f_e * n, knobs)
            if "shared_experts" in mods and sh.f_s:
                out += _gemm_flops(sh, kind, ("shared experts",)) + _tp_comm_bytes(sh, 2) * cfb
    if "gdn_norm_out" in mods and kind == "gdn":
        out += _membound(sh, 2 * sh.gdn_v / sh.t * T, knobs)
    return out


@lru_cache(maxsize=1024)
def layer_full_replay_flops(sh: Shape, kind: str, knobs: Knobs) -> float:
    """A whole layer's forward replayed by full recompute, with its TP / EP communication."""
    f = layer_forward_flops(sh, kind, knobs)
    regions = sum(1 for blk in ("attn", "mlp", "mamba", "gdn") if blk in kind.split("+"))
    f += _tp_comm_bytes(sh, 2 * regions) * knobs.comm_flops_per_byte
    if "moe" in kind.split("+"):
        f += _a2a_bytes(sh) * knobs.comm_flops_per_byte
        if sh.f_s:
            f += _tp_comm_bytes(sh, 2) * knobs.comm_flops_per_byte
    return f


def replay_and_step_flops(w, knobs: Knobs = DEFAULT_KNOBS, disabled=()) -> tuple:
    """(replayed FLOP-equivalents, step FLOPs) per micro-batch summed over all layers, for the
    setting in force (less what the checker found switched off: `disabled`)."""
    from mbridge_recompute.memory.recompute import full_recompute_units, granularity_of, modules_of
    from mbridge_recompute.memory.shape import shape_of

    sh = shape_of(w, knobs)
    kinds = Counter(w.layer_kinds())
    forward = sum(n * layer_forward_flops(sh, k, knobs) for k, n in kinds.items()) \
        + output_forward_flops(sh)
    step = 3 * forward
    replay = 0.0
    granularity = granularity_of(w, disabled)
    if granularity == "full":
        recomputed = Counter(kind for kind, rec in full_recompute_units(w) if rec)
        replay = sum(n * layer_full_replay_flops(sh, k, knobs) for k, n in recomputed.items())
    elif granularity == "selective":
        mods = modules_of(w, disabled)
        replay = sum(n * layer_replay_flops(sh, k, mods, knobs) for k, n in kinds.items())
    return replay, step


def replay_cost_pct(w, knobs: Knobs = DEFAULT_KNOBS, disabled=()) -> float:
    """Replayed forward FLOPs (+ communication) of w's own setting as % of the step's FLOPs."""
    replay, step = replay_and_step_flops(w, knobs, disabled)
    return 100.0 * replay / step if step else 0.0


# --- the modelled step of a layout -----------------------------------------------------

class StepCost(NamedTuple):
    """One optimizer step on one GPU, in FLOP-equivalents: m micro-batches of forward +
    backward (3x forward) + replay + exposed transfers, stretched by the pipeline bubble."""
    microbatches: int
    forward: float                 # forward FLOPs of one micro-batch on this GPU (all layers)
    replay: float                  # replayed FLOP-equivalents per micro-batch
    offload: float                 # exposed offload transfer per micro-batch
    cp: float                      # exposed context-parallel KV exchange per micro-batch
    bubble: float                  # pipeline bubble fraction (p - 1) / (v * m); 0 without PP

    @property
    def total(self) -> float:
        return self.microbatches * (3 * self.forward + self.replay + self.offload + self.cp) \
            * (1 + self.bubble)


def bubble_fraction(p: int, v: int, m: int) -> float:
    """Idle share of the pipeline schedule against its busy time: (p - 1) / (v * m) for the
    interleaved schedule with v model chunks per rank, (p - 1) / m for 1F1B (Narayanan et al.
    2021, section 2.2), which assume at least p micro-batches. With fewer, no rank has anything
    to interleave while the first micro-batch crosses the p * v virtual stages: the step takes
    (p * v + m - 1) chunk times of t / v against m * t busy, a bubble of (p - m) / m +
    (m - 1) / (m * v); both agree at m = p, and at v = 1 it is (p - 1) / m. None without
    pipeline parallelism."""
    if p <= 1:
        return 0.0
    v, m = max(v, 1), max(m, 1)
    if m >= p:
        return (p - 1) / (v * m)
    return (p - m) / m + (m - 1) / (m * v)


def _cp_exposed(sh: Shape, knobs: Knobs) -> float:
    """Ring attention (cp_comm_type p2p), per attention layer and micro-batch. Each rank passes
    its K and V chunk on c - 1 times in forward, and K, V and their gradients in backward, each
    step's transfer overlapped with the attention of the chunk in hand: what the attention
    cannot cover is exposed. Between the steps, on the compute stream and so never hidden, the
    partial outputs are merged with the softmax LSE in forward (flash_attn_fwd_out_correction,
    context_parallel.py:116-127, called at :1654 @ TE v2.9: read out, out_per_step, write out)
    and the dq / dk / dv partials accumulated in backward (:2294-2437: read and write each):
    memory-bound kernels priced like replayed ones. So CP > 1 always costs something."""
    if sh.c <= 1:
        return 0.0
    dqk = sh.dqk + sh.dr if sh.mla else sh.d
    dv = sh.dv if sh.mla else sh.d
    kv = 2 * sh.elt * sh.g_ * dqk * sh.T
    comm = (sh.c - 1) * kv * knobs.comm_flops_per_byte
    attn = _attn_core_flops(sh, knobs)
    out = sh.elt * sh.a_ * dv * sh.T
    q = sh.elt * sh.a_ * dqk * sh.T
    merges = (sh.c - 1) * (3 * out + 3 * (q + kv)) * knobs.memory_bound_flops_per_byte
    return max(0.0, comm - attn) + max(0.0, 2 * comm - 2 * attn) + merges


def _mamba_cp_exposed(sh: Shape, knobs: Knobs) -> float:
    """Mamba under CP (all-to-all context parallelism), per Mamba layer and micro-batch: the
    in_proj output z, x, B, C, dt goes from sequence- to head-sharding before the convolution
    and the scan, and y comes back after (pre_conv_ssm / post_conv_ssm, B and C repeated to at
    least one group per CP rank, mamba_context_parallel.py:133-204, 304-377 @ core_v0.16.1);
    each all-to-all moves (c - 1) / c of its tensor, synchronously, and the backward mirrors
    them: nothing overlaps it."""
    if sh.c <= 1:
        return 0.0
    d_inner = sh.mamba_heads * sh.mamba_head_dim / sh.t
    groups = max(sh.mamba_groups / sh.t, sh.c)
    pre = sh.elt * sh.T * (2 * d_inner + 2 * groups * sh.mamba_state + sh.mamba_heads / sh.t)
    post = sh.elt * sh.T * d_inner
    return 2 * (pre + post) * (sh.c - 1) / sh.c * knobs.comm_flops_per_byte


def step_cost(w, knobs: Knobs = DEFAULT_KNOBS, disabled=()) -> StepCost:
    """The modelled step of `w` under its own recompute setting and layout."""
    from mbridge_recompute.memory.offload import in_force, offloaded_bytes
    from mbridge_recompute.memory.recompute import full_recompute_units, granularity_of, layout_of, modules_of
    from mbridge_recompute.memory.shape import shape_of

    sh = in_force(shape_of(w, knobs), tuple(tuple(d) for d in disabled))
    replay, step = replay_and_step_flops(w, knobs, disabled)
    layout = layout_of(w)
    p, v = len(layout), len(layout[0])
    kinds = w.layer_kinds()
    mods = modules_of(w, disabled)
    offload = 0.0
    if sh.offload:
        rate = knobs.pcie_flops_per_byte
        # a layer that full recompute checkpoints keeps nothing to offload (as peak.py counts it)
        kept = Counter(k for k, rec in full_recompute_units(w) if not rec) \
            if granularity_of(w, disabled) == "full" else Counter(kinds)
        for k, n in kept.items():
            moved = offloaded_bytes(sh, k, mods, sh.offload) * rate
            fwd = layer_forward_flops(sh, k, knobs)
            offload += n * (max(0.0, moved - fwd) + max(0.0, moved - 2 * fwd))
    counts = Counter(kinds)
    cp = sum(n * _cp_exposed(sh, knobs) for k, n in counts.items() if "attn" in k.split("+")) \
        + counts.get("mamba", 0) * _mamba_cp_exposed(sh, knobs)
    # per GPU: a pipeline rank runs 1/p of the layers
    return StepCost(w.num_microbatches, step / 3 / p, replay / p, offload / p, cp / p,
                    bubble_fraction(p, v, w.num_microbatches))


def change_pct(step: StepCost, reference: StepCost) -> float:
    """`step` against `reference`, in % of the reference step."""
    return 100.0 * (step.total - reference.total) / reference.total if reference.total else 0.0


class StepShares(NamedTuple):
    """A candidate's modelled step against a reference step (its layout without recompute and
    without offloading), split so that no term nets another: each in % of the reference step.

    replay_pct   replayed forward work, stretched by the candidate's bubble (>= 0)
    offload_pct  exposed fine-grained offload copies, stretched likewise (>= 0)
    cp_pct       the exposed context-parallel exchange of the candidate's own CP (>= 0; part of
                 layout_pct, shown on its own)
    layout_pct   the change the layout alone makes: pipeline bubble, micro-batches, per-GPU work,
                 CP exchange (0 on the reference layout; below 0 only when the bubble shrinks)
    cost_pct     replay_pct + offload_pct + layout_pct: the whole change of the modelled step
    """
    replay_pct: float
    offload_pct: float
    cp_pct: float
    layout_pct: float

    @property
    def cost_pct(self) -> float:
        return self.replay_pct + self.offload_pct + self.layout_pct


def shares(step: StepCost, reference: StepCost) -> StepShares:
    """`step` split into its terms against `reference` (see StepShares)."""
    ref = reference.total
    if not ref:
        return StepShares(0.0, 0.0, 0.0, 0.0)
    stretch = step.microbatches * (1 + step.bubble)
    layout = step.microbatches * (3 * step.forward + step.cp) * (1 + step.bubble)
    return StepShares(100.0 * stretch * step.replay / ref, 100.0 * stretch * step.offload / ref,
                      100.0 * stretch * step.cp / ref, 100.0 * (layout - ref) / ref)


def step_cost_pct(w, reference, knobs: Knobs = DEFAULT_KNOBS, disabled=()) -> float:
    """The modelled step of `w` against `reference`'s (a layout without recompute), in %."""
    return change_pct(step_cost(w, knobs, disabled), step_cost(reference, knobs))
