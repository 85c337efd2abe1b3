"""Per-PP-rank peak: static + saved activations of the in-flight micro-batches + largest transient.

The peak is not the sum of all saved activations. On each rank it is reached at
the schedule's worst moment: the in-flight vector (live forwards per model chunk,
see schedule.py) with the most saved bytes, plus the largest transient that can
coincide with it:
- the forward working set of one layer (SP all-gather buffer, the fused QKV GEMM
  output before TE attention copies it, the MoE dispatch receive buffer);
- the gradient buffers of one layer in backward (the gradient of its largest saved
  tensor, a gathered [T, h] gradient and the residual gradient);
- the recompute replay working set (full uniform: a whole group of n layers at once;
  full block: one layer; selective: the re-materialised tensors of one layer) on top
  of those gradient buffers;
- on the last stage, the logits and cross-entropy: the 16-bit logits [T, V/t] alive next
  to the saved fp32 softmax (forward) and the 16-bit gradient cast (backward).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from mbridge_recompute.memory import lora, moments
from mbridge_recompute.memory.dispatcher import flex_backend, flex_buffer_bytes
from mbridge_recompute.memory.graphs import graphed_kinds, graphed_layer_bytes, graphs_of, io_bytes
from mbridge_recompute.memory.offload import in_force, offloaded_bytes, offloaded_components
from mbridge_recompute.memory.recompute import chunk_groups, granularity_of, layout_of, modules_of
from mbridge_recompute.memory.schedule import inflight_vectors
from mbridge_recompute.memory.shape import Shape, extra_value, shape_of
from mbridge_recompute.memory.static import (
    dummy_wgrad_bytes,
    optimizer_state_bytes,
    rank_params,
    static_bytes,
)
from mbridge_recompute.memory.tensors import (
    checkpoint_bytes,
    embedding_tensors,
    largest_tensor,
    layer_bytes,
    layer_components,
    layer_tensors,
    logits_transient,
    mtp_loss_tensors,
    mtp_tensors,
    output_tensors,
    rotary_freqs_bytes,
    scores_bytes,
    softmax_in_fp32,
)
from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs, MemoryEstimate, RankMemory
from mbridge_recompute.placement import place
from mbridge_recompute.units import GIB

NONE = frozenset()

TERM_LOGITS = "logits+cross-entropy (fp32) on the last stage"
TERM_GRADS = "gradient buffers of one layer during backward"
TERM_FORWARD = "forward working set of one layer (SP all-gather, QKV and dispatch buffers)"
TERM_OVERLAP = "EP-overlap combined step: one layer's forward working set next to another's backward"
TERM_OFFLOAD = "offloaded activations reloaded for two layers plus gradient buffers during backward"
TERM_KEPT = "offload kept (last layer)"   # the last stage's last layer: its backward follows at once


def _replay_term(layers: int, full: bool) -> str:
    if full:
        return (f"full-recompute replay working set ({layers} layer"
                f"{'s' if layers != 1 else ''} at once) plus gradient buffers during backward")
    return "selective-recompute replay of one layer plus gradient buffers during backward"


class RecomputeMode(NamedTuple):
    granularity: str | None
    mods: frozenset
    method: str | None
    num_layers: int | None
    distribute: bool


class ChunkMemory(NamedTuple):
    saved: float                 # bytes kept per micro-batch in flight
    components: dict
    fwd_ws: float
    bwd_ws: float
    replay_ws: float             # 0 when nothing is replayed
    replay_layers: int
    offload_kept: float = 0.0    # offloaded bytes of the chunk's last layer (kept on the GPU when
    #                              its backward follows at once)
    offload_reload: float = 0.0  # two layers' offloaded bytes back on the GPU during backward
    host: float = 0.0            # bytes per micro-batch in flight that wait in pinned host memory


def moe_dispatch_ws(sh: Shape) -> float:
    """Token-dispatch buffers alive at once in one MoE layer's forward (beyond what the
    experts keep), the larger of dispatch and combine (token_dispatcher.py @ d98e8a6):
    - alltoall / flex: the permuted local copies [k*Tr, h], the received tokens [n, h], a
      second [n, h] copy sorted by local expert when EP holds several experts (:664-790); the
      combine mirrors it, with an fp32 [n, h] reduce-scatter input under ETP > 1 and an fp32
      router (:796-908);
    - allgather: the gather itself lands in the persistent global buffer (`global_buffer_bytes`);
      combine unpermutes to [Tr*etp*ep, h] and reduce-scatters it, in fp32 with an fp32
      router (:337-368).
    """
    e, h, n = sh.elt, sh.h, sh.n_routed()
    if sh.dispatcher == "allgather":
        gathered = sh.Tr * sh.etp * sh.ep
        return (e + (4 if sh.router_fp32 and sh.etp * sh.ep > 1 else 0)) * h * gathered
    copies = 2 if sh.E / sh.ep > 1 else 1
    dispatch = e * h * (sh.k * sh.Tr + copies * n)
    combine = dispatch + (4 * h * n if sh.router_fp32 and sh.etp > 1 else 0.0)
    return combine


def global_buffer_bytes(sh: Shape, kinds) -> float:
    """megatron-core's global "mpu" memory buffer: one tensor, kept at the largest size ever
    asked of it (utils.py:735-753 @ d98e8a6). Users: the unfused megatron-core attention scores
    (dot_product_attention.py:188-200), the allgather dispatcher's token gather (:296-301) and
    the sequence-parallel all-gather of megatron-core's own linears (local spec)."""
    kinds = set(kinds)
    out = 0.0
    if sh.attn_core == "mcore" and any("attn" in k for k in kinds):
        out = max(out, scores_bytes(sh))
    if sh.dispatcher == "allgather" and sh.etp * sh.ep > 1 and any("moe" in k for k in kinds):
        out = max(out, sh.elt * sh.h * sh.Tr * sh.etp * sh.ep)
    if not sh.te and sh.sp and sh.t > 1:
        out = max(out, sh.elt * sh.h * sh.T)
    return out


@lru_cache(maxsize=1024)
def _forward_ws(sh: Shape, kind: str) -> float:
    blocks = kind.split("+")
    gather = 0.0
    if sh.sp and sh.t > 1 and sh.te:
        gather = sh.q_bytes * sh.h * sh.T     # TE's own all-gather (local spec: the global buffer)
    extra = 0.0
    if "attn" in blocks:
        heads = sh.a_ + 2 * sh.g_ if not sh.mla else 3 * sh.a_
        width = sh.d if not sh.mla else sh.dqk + sh.dr
        extra = max(extra, sh.elt * heads * width * sh.T)
        if sh.attn_core != "te_fused":
            # the scores (TE: a fresh tensor; megatron-core: the global buffer) and, on the
            # fp32 softmax path, their fp32 copy next to the saved fp32 output
            fresh = scores_bytes(sh) if sh.attn_core == "te_unfused" else 0.0
            fp32_copy = 4 * scores_bytes(sh) / sh.elt if softmax_in_fp32(sh, sh.a_) else 0.0
            extra = max(extra, fresh + fp32_copy)
    if "moe" in blocks:
        extra = max(extra, moe_dispatch_ws(sh))
    return gather + extra


@lru_cache(maxsize=1024)
def _bwd_ws(sh: Shape, kind: str) -> float:
    return largest_tensor(sh, kind, NONE) + sh.elt * sh.h * (sh.T + sh.Tr)


@lru_cache(maxsize=4096)
def _dropped(sh: Shape, kind: str, mods: frozenset) -> float:
    """Bytes a selective replay re-materialises in one layer: tensors kept without
    recompute that the labels drop."""
    if not mods:
        return 0.0
    kept = {x.name for x in layer_tensors(sh, kind, mods)}
    return sum(x.nbytes for x in layer_tensors(sh, kind, NONE) if x.name not in kept)


@lru_cache(maxsize=4096)
def chunk_graphed(sh: Shape, kinds: tuple, mode: RecomputeMode, g, saved: float) -> tuple:
    """(saved bytes per micro-batch inside CUDA graphs, graphed layers) of one chunk."""
    if g is None:
        return 0.0, 0
    if g.full_iteration:
        return saved, 0
    if mode.granularity == "full":
        return 0.0, 0          # full recompute runs only under full-iteration graphs
    inside = sum(graphed_layer_bytes(sh, k, mode.mods, g) for k in kinds)
    return min(inside, saved), graphed_kinds(kinds, g)


def _add(comp: dict, other: dict, scale: float = 1.0) -> None:
    for k, v in other.items():
        comp[k] = comp.get(k, 0.0) + v * scale


@lru_cache(maxsize=256)
def _kind_index(kinds: tuple) -> tuple:
    """(the distinct kinds in order of first appearance, for each a prefix count over
    `kinds`): a group's layers of each kind in O(kinds) instead of O(layers)."""
    distinct = tuple(dict.fromkeys(kinds))
    prefix = {}
    for k in distinct:
        run, acc = [0], 0
        for x in kinds:
            acc += x == k
            run.append(acc)
        prefix[k] = run
    return distinct, prefix


def _group_counts(kinds: tuple, index: tuple, start: int, stop: int) -> list:
    """(kind, layers of that kind) in kinds[start:stop], in order of first appearance
    (`index` is `_kind_index(kinds)`)."""
    distinct, prefix = index
    if len(distinct) == 1:
        return [(distinct[0], stop - start)]
    counts = [(k, prefix[k][stop] - prefix[k][start]) for k in distinct]
    return sorted(((k, n) for k, n in counts if n), key=lambda kn: kinds.index(kn[0], start, stop))


@lru_cache(maxsize=4096)
def chunk_memory(sh: Shape, kinds: tuple, mode: RecomputeMode, first: bool, last: bool,
                 hold_output: bool, mtp: tuple = (), loss_depths: int = 0) -> ChunkMemory:
    """What one model chunk keeps per micro-batch in flight, and its transients. `mtp` holds
    the inner layer kind of each MTP depth on this chunk; `loss_depths` the MTP depths whose
    loss this (last) chunk computes."""
    comp: dict = {}
    saved = 0.0
    replay = 0.0
    replay_layers = 0
    fwd = bwd = 0.0
    full = mode.granularity == "full"

    offload_last, offload_top, host = 0.0, [], 0.0
    groups = chunk_groups(mode.granularity, mode.method, mode.num_layers, len(kinds))
    if full and any(rec for _, _, rec in groups):
        ck = rotary_freqs_bytes(sh)
        saved += ck
        comp["checkpoints"] = comp.get("checkpoints", 0.0) + ck
    index = _kind_index(kinds)
    for start, stop, rec in groups:
        counts = _group_counts(kinds, index, start, stop)
        if full and rec:
            ck = checkpoint_bytes(sh, mode.distribute)
            saved += ck
            comp["checkpoints"] = comp.get("checkpoints", 0.0) + ck
            group_bytes = float(sum(n * layer_bytes(sh, k, NONE) for k, n in counts))
            if group_bytes > replay:
                replay, replay_layers = group_bytes, stop - start
        else:
            for k, n in counts:
                saved += n * layer_bytes(sh, k, mode.mods)
                _add(comp, layer_components(sh, k, mode.mods), n)
                d = _dropped(sh, k, mode.mods)
                if d > replay:
                    replay, replay_layers = d, 1
                if sh.offload:
                    # what leaves the GPU is taken out of the component it belongs to, so every
                    # component stays what the GPU holds (>= 0); the host holds it instead
                    parts = dict(offloaded_components(sh, k, mode.mods, sh.offload))
                    moved = sum(parts.values())
                    saved -= n * moved
                    host += n * moved
                    _add(comp, parts, -n)
                    offload_top = sorted((offload_top + [moved] * min(n, 2)), reverse=True)[:2]
            if sh.offload and stop > start:
                offload_last = offloaded_bytes(sh, kinds[stop - 1], mode.mods, sh.offload)
    for k in dict.fromkeys(kinds):
        fwd = max(fwd, _forward_ws(sh, k))
        bwd = max(bwd, _bwd_ws(sh, k))
    # MTP: full uniform recompute checkpoints each depth (recompute_num_layers must be 1, a
    # checker finding otherwise); block skips MTP recompute (mtp-block-skips-recompute).
    mtp_ckpt = full and mode.method == "uniform"
    for inner in mtp:
        for x in mtp_tensors(sh, inner, mode.mods, mtp_ckpt):
            saved += x.nbytes
            _add(comp, {x.component: x.nbytes})
        if mtp_ckpt:
            whole = float(sum(x.nbytes for x in mtp_tensors(sh, inner, NONE, False)))
            if whole > replay:
                replay, replay_layers = whole, 1
        else:
            d = _dropped(sh, inner, mode.mods)
            if d > replay:
                replay, replay_layers = d, 1
        fwd = max(fwd, _forward_ws(sh, inner))
        bwd = max(bwd, _bwd_ws(sh, inner))
    ends = []
    if first:
        ends += embedding_tensors(sh)
    if last:
        ends += output_tensors(sh)
        ends += [x for _ in range(loss_depths) for x in mtp_loss_tensors(sh)]
    for x in ends:
        saved += x.nbytes
        _add(comp, {x.component: x.nbytes})
    if hold_output:
        # The stage output stays referenced until its backward unless
        # deallocate_pipeline_outputs (Korthikanti et al. appendix B: sbh per micro-batch);
        # a stage holding MTP sends the hidden states of every depth concatenated.
        b = sh.elt * sh.h * sh.Tr * (1 + len(mtp))
        saved += b
        _add(comp, {"pipeline": b})
    return ChunkMemory(saved, comp, fwd, bwd, replay, replay_layers, offload_last, sum(offload_top),
                       host)


def _mode(w, disabled=()) -> RecomputeMode:
    return RecomputeMode(granularity_of(w, disabled), modules_of(w, disabled), w.recompute_method,
                         w.recompute_num_layers, bool(w.distribute_saved_activations))


def _group_size(w) -> int:
    g = w.extra_model.get("microbatch_group_size_per_vp_stage") if isinstance(w.extra_model, dict) else None
    return int(g) if g else w.pipeline_model_parallel_size


def _optimizer_bytes(w, sh: Shape, knobs: Knobs) -> float:
    if knobs.optimizer_bytes_per_param is not None:
        return knobs.optimizer_bytes_per_param
    return sum(optimizer_state_bytes(w, sh.elt == 2))


def _optimizer_sentence(w, sh: Shape) -> str:
    eager, lazy = optimizer_state_bytes(w, sh.elt == 2)
    if not w.use_precision_aware_optimizer:
        return ("Adam with fp32 master weights and two fp32 moments "
                f"({eager + lazy:g} bytes per parameter with {sh.elt}-byte weights)")
    remainders = (sh.elt == 2 and eager == 0 and w.bf16 and w.main_params_dtype == "fp32"
                  and w.store_param_remainders)
    return (f"Precision-aware Adam (TE FusedAdam): moments {w.exp_avg_dtype} / "
            f"{w.exp_avg_sq_dtype}, master weights {w.main_params_dtype}"
            + (" kept as 16-bit remainders of the bf16 weights" if remainders else "")
            + f" ({eager + lazy:g} bytes per parameter)")


def _attention_sentence(w, sh: Shape) -> str:
    core = {"te_fused": "TE's fused / flash kernels (q, k, v, the output and fp32 softmax "
                        "statistics; no probabilities)",
            "te_unfused": "TE's UnfusedDotProductAttention (the softmax probabilities [b, a', s, s], "
                          "fused-kernel eligibility per TE's softmax rules, else fp32)",
            "mcore": "megatron-core's DotProductAttention (the softmax probabilities, the scores in "
                     "the persistent global buffer)"}[sh.attn_core]
    return (f"Core attention: attention_backend {w.attention_backend} with transformer_impl "
            f"{w.transformer_impl} runs {core}"
            + ("; TE may still fall back to its unfused kernel where fused ones do not support "
               "the shape" if w.attention_backend == "auto" and sh.attn_core == "te_fused" else "")
            + ".")


def assumptions(w, sh: Shape, knobs: Knobs) -> list:
    gib = knobs.residual_bytes / GIB
    out = [
        f"Residual of {gib:.2f} GiB per GPU for the CUDA context, NCCL and Transformer Engine "
        "workspaces and allocator slack (not fragmentation).",
        (_optimizer_sentence(w, sh) if knobs.optimizer_bytes_per_param is None else
         f"Optimizer state of {knobs.optimizer_bytes_per_param:g} bytes per parameter") +
        ", sharded by the distributed optimizer over DP x CP (routed experts over "
        "DP x TP x CP / (EP x ETP)); gradient buffers are not sharded.",
        f"Activations are {sh.elt}-byte elements; norm statistics, softmax LSE, router scores "
        "and permuted probs are fp32.",
        (f"The vocabulary is padded to a multiple of make_vocab_size_divisible_by x TP = "
         f"{w.make_vocab_size_divisible_by} x {w.tensor_model_parallel_size} ({sh.vocab})"
         if w.should_pad_vocab else f"The vocabulary is not padded (should_pad_vocab false: {sh.vocab})")
        + "; the last stage keeps "
        + ("the 16-bit logits holding the TE fused cross-entropy gradient" if sh.te_cross_entropy
           else "the fp32 cross-entropy softmax") + " [T, V/t] per in-flight micro-batch"
        + (" and per MTP depth." if w.mtp_num_layers else "."),
        _attention_sentence(w, sh),
        "Transients on top of saved activations: one layer's forward working set, one layer's "
        "gradient buffers, the recompute replay working set, and on the last stage the 16-bit "
        "logits next to the saved fp32 softmax; the largest of them sets the peak.",
        "Replay cost counts 2 FLOPs per weight per token, causal attention at "
        f"{knobs.attention_flops_factor} of the full score FLOPs, the step as 3x the forward; "
        f"one replayed communication byte = {knobs.comm_flops_per_byte:g} FLOPs and one byte of a "
        f"replayed memory-bound kernel = {knobs.memory_bound_flops_per_byte:g} FLOPs.",
        "Interleaved schedule: microbatch_group_size_per_vp_stage defaults to PP; every distinct "
        "in-flight vector of the MCore order is evaluated.",
        "Two peaks per rank: allocated (what torch.cuda.max_memory_allocated and Bridge's "
        "mem-max-allocated-gigabytes count, since process start: the largest of iteration 1 "
        "without Adam's moments, the optimizer step, the steady forward/backward and, with CUDA "
        "graphs, their capture and the graphed steady state) and device (allocated plus what "
        "PyTorch does not count: the residual, flex-dispatcher buffers, activations held in a "
        "CUDA-graph pool); the budget is held against the device peak.",
        "Not modelled in general: allocator fragmentation; settings of this workload the model "
        "does not read are listed as 'not modelled: KEY=VALUE' below.",
        "Local-spec fused softmax eligibility follows fused_softmax.py:238-270 @ core_v0.16.1 "
        "except its batch-per-block divisibility check.",
    ]
    if sh.wgrad_dummies:
        out.append("gradient_accumulation_fusion: from the first backward on, every distinct "
                   "weight shape keeps one 16-bit dummy weight gradient (Transformer Engine's "
                   "get_dummy_wgrad cache; on the last stage the output layer's [V/t, h]), counted "
                   "as static dummy_wgrads" + ("." if sh.grouped_dummies else
                                               "; grouped-GEMM experts only from TE 2.10.")
                   + (" Unset, it is taken as on, as Bridge's providers and Megatron-LM's "
                      "arguments default it where the fused kernel exists (gpt_provider.py:205 @ "
                      "megatron-bridge v0.6.0; --no-gradient-accumulation-fusion); "
                      "TransformerConfig's own default is off (model_parallel_config.py:168 @ "
                      "core_v0.16.1): set it false for a run that leaves it so."
                      if extra_value(w, "gradient_accumulation_fusion") is None else ""))
    if not w.te_version:
        out.append("Transformer Engine is assumed >= 2.7, so set_save_original_input applies "
                   "where MCore uses it (fp8 recipes other than delayed, fp4).")
    if sh.low_precision:
        out.append("FP8/FP4 linears keep their quantized input copy (1 byte + scales for fp8); "
                   "linear weights keep a row-wise and a column-wise quantized copy between "
                   "micro-batches.")
    if sh.E:
        out.append(f"MoE: dropless routing with load-imbalance factor {knobs.moe_load_imbalance:g} "
                   "on the hottest EP rank (capped by the capacity factor when set); router keeps "
                   "~9 bytes per expert per token; fp8 alignment padding ignored.")
    kinds = set(w.layer_kinds())
    if kinds & {"mamba", "gdn"}:
        out.append("Mamba / GatedDeltaNet mixers are modelled coarsely (projection outputs, conv "
                   "output, scan output, gated-norm output, chunk states); no recompute label of "
                   "0.16.1 applies to them.")
    if not sh.bias_act_fusion and sh.gated:
        out.append("bias_activation_fusion is off (MCore default): the unfused GLU keeps the whole "
                   "fc1 output plus act(x0) (6 bytes per ffn column per token instead of 4).")
    if not sh.te:
        out.append("Local spec: separate norm modules, unfused DotProductAttention with "
                   "materialised softmax probabilities (CP must be 1).")
    if w.mtp_num_layers:
        out.append(f"MTP: {w.mtp_num_layers} depth(s), each a decoder layer of the last layer's kind "
                   "with enorm, hnorm, eh_proj (2h -> h) and its final norm, on the chunk that holds "
                   "MTP (the last one without a layout), plus a copy of the word embedding there "
                   "unless that is the first chunk; its loss on the last stage.")
    if sh.offload:
        out.append(f"Fine-grained activation offloading of {', '.join(sorted(sh.offload))}: the "
                   "saved tensors of those modules of at least 1M elements leave the GPU after their "
                   "layer's forward; the last stage keeps its last layer's, and two layers' come "
                   "back during the backward (the reload runs one layer ahead); pinned host memory "
                   "and the copy streams' own buffers are not counted. Exposed PCIe time: what a "
                   f"layer's compute does not cover at {knobs.pcie_flops_per_byte:g} FLOPs per byte.")
    if sh.E and sh.dispatcher == "flex":
        out.append(f"flex dispatcher ({flex_backend(w)}): its communication buffers "
                   f"({flex_buffer_bytes(w, sh) / GIB:.2f} GiB per GPU, sized as DeepEP's buffer "
                   "size hints / HybridEP's worst-case token buffers) are allocated outside PyTorch: "
                   "in the device peak, not in the allocated one; the permuted tokens it returns "
                   "are taken as alltoall's working set.")
    if w.bf16 or w.fp16:
        if not w.grad_reduce_in_fp32 and not w.use_precision_aware_optimizer:
            out.append("16-bit gradient buffers: the optimizer step gives each fp32 main-parameter "
                       "shard an fp32 copy of its gradient shard (4 bytes per locally optimised "
                       "parameter, alive through the step), a floor under every setting's peak.")
    g = graphs_of(w)
    if g is not None:
        scope = ("the whole forward-backward" if g.full_iteration else "whole layers"
                 if not g.scopes else ", ".join(sorted(g.scopes)))
        out.append(f"CUDA graphs ({g.impl}, capturing {scope}) after {g.warmup} eager "
                   "iteration(s): the captured modules' saved activations live in the graph pool "
                   "(in the device peak, out of the allocated one once graphed); the graphs' static "
                   "input/output buffers are estimated as two [Tr, h] per graphed layer and "
                   "micro-batch in flight plus one gradient pair; pool fragmentation is not "
                   "modelled (it widens the band).")
    if w.pipeline_model_parallel_size > 1 and not sh.deallocate_outputs:
        out.append("deallocate_pipeline_outputs is off (MCore default): each in-flight "
                   "micro-batch keeps its stage output [Tr, h].")
    if w.recompute_granularity == "full" and w.recompute_method == "uniform":
        out.append("Full uniform recompute replays a whole group of recompute_num_layers "
                   "layers at once; megatron-core 0.16.1 fails with IndexError when the group "
                   "size does not divide the layers of a chunk (estimated here with a short "
                   "last group, as main does).")
    return out


def estimate(w, knobs: Knobs = DEFAULT_KNOBS, disabled=()) -> MemoryEstimate:
    """Per-pipeline-rank memory of `w` under its own recompute setting, less what the checker
    found switched off (`disabled`: the (label, block) pairs of its silent-no-op findings)."""
    sh = in_force(shape_of(w, knobs), tuple(tuple(d) for d in disabled))
    layout = layout_of(w)
    p, v = len(layout), len(layout[0])      # model chunks per rank: 1 without interleaving
    mode = _mode(w, tuple(tuple(d) for d in disabled))
    M = w.num_microbatches
    group = _group_size(w)
    overlap = bool(w.overlap_moe_expert_parallel_comm and w.is_moe and w.expert_model_parallel_size > 1)
    extra = 1 if (overlap and v > 1 and p > 1) else 0
    tied = bool(w.share_embeddings_and_output_weights)
    pl = place(w)
    graphs = graphs_of(w)
    flex = flex_buffer_bytes(w, sh)
    depths = pl.mtp_layers
    inner = tuple(w.layer_kinds()[-1:]) * depths       # MTP layers take the last layer's spec
    static_total_of = {}
    ranks = []
    for r in range(p):
        chunks = []
        for j in range(v):
            first = r == 0 and j == 0
            last = r == p - 1 and j == v - 1
            hold = p > 1 and not sh.deallocate_outputs and not last
            mtp = inner if pl.mtp_at == (r, j) else ()
            chunks.append(chunk_memory(sh, tuple(layout[r][j]), mode, first, last, hold,
                                       mtp, depths if last else 0))
        vectors = inflight_vectors(p, v, M, r, group, extra)
        best = max(vectors, key=lambda vec: sum(c * ch.saved for c, ch in zip(vec, chunks)))
        activation = sum(c * ch.saved for c, ch in zip(best, chunks))
        comp: dict = {}
        for c, ch in zip(best, chunks):
            _add(comp, ch.components, c)
        host = sum(c * ch.host for c, ch in zip(best, chunks))
        if overlap and p == 1:
            # combined 1F1B without pipelining: the next micro-batch's first layer runs its forward
            # before this one's last layer has run its backward (combined_1f1b.py:34-48, 73-90 @
            # core_v0.16.1): one layer's saved tensors on top of a whole micro-batch
            one = max((layer_bytes(sh, k, mode.mods) for k in layout[r][0]), default=0)
            activation += one
            _add(comp, {"EP-overlap forward": one})
        warmup_offloaded = 0.0
        if r == p - 1 and chunks[-1].offload_kept:
            # the last stage runs each micro-batch's backward right after its forward: the last
            # layer's group is not offloaded (should_bulk_offload) -- except in iteration 1, the
            # offload manager's warm-up, which offloads every group
            # (fine_grained_activation_offload.py:928-950, 522-560 @ core_v0.16.1)
            activation += chunks[-1].offload_kept
            host -= chunks[-1].offload_kept
            _add(comp, {TERM_KEPT: chunks[-1].offload_kept})
            warmup_offloaded = chunks[-1].offload_kept
        # transients
        trans = {TERM_FORWARD: max(ch.fwd_ws for ch in chunks),
                 TERM_GRADS: max(ch.bwd_ws for ch in chunks)}
        if sh.offload:
            # the previous layer's offload copy is still in flight on the D2H stream while the
            # next layer runs its forward: its tensors are released once the copy's event has
            # completed (bulk_offload, :952-990 @ core_v0.16.1)
            in_flight = max(ch.offload_reload for ch in chunks) / 2     # one layer's offload
            trans[TERM_FORWARD] += in_flight
        if overlap:
            # a layer's forward (its dispatch buffers included) co-scheduled with another
            # layer's backward: both working sets at once
            trans[TERM_OVERLAP] = trans[TERM_FORWARD] + trans[TERM_GRADS]
        if any(ch.offload_reload for ch in chunks):
            # the reload runs one layer ahead of the backward (bulk_reload): two layers back
            trans[TERM_OFFLOAD] = max(ch.offload_reload for ch in chunks) + max(ch.bwd_ws for ch in chunks)
        rep = max(chunks, key=lambda ch: ch.replay_ws + ch.bwd_ws if ch.replay_ws else 0.0)
        if rep.replay_ws:
            trans[_replay_term(rep.replay_layers, mode.granularity == "full")] = \
                rep.replay_ws + rep.bwd_ws
        if r == p - 1 and sh.vocab and logits_transient(sh):
            trans[TERM_LOGITS] = logits_transient(sh)
        term, transient = max(trans.items(), key=lambda kv: kv[1])
        kinds = [k for ch in layout[r] for k in ch]
        here = pl.mtp_at is not None and pl.mtp_at[0] == r
        params = rank_params(sh, kinds, r == 0, r == p - 1, tied, p,
                             inner if here else (), here and pl.mtp_at != (0, 0))
        trainable = lora.rank_params(sh, kinds, inner if here else ()) if sh.lora else None
        static = static_bytes(sh, params, dp=w.data_parallel_size,
                              distributed=bool(w.use_distributed_optimizer),
                              grad_fp32=bool(w.grad_reduce_in_fp32), fp8_param=bool(w.fp8_param),
                              residual=knobs.residual_bytes,
                              optimizer_bytes=_optimizer_bytes(w, sh, knobs),
                              global_buffer=global_buffer_bytes(sh, kinds + list(inner if here else ())),
                              dummy_wgrads=dummy_wgrad_bytes(sh, kinds, r == p - 1,
                                                             inner if here else ()),
                              trainable=trainable, trainable_bytes=sh.lora.dtype_bytes if sh.lora else None)
        # CUDA graphs: the captured part of the saved activations and the graphs' static buffers
        graphed = io = 0.0
        if graphs is not None:
            for j, (c, ch) in enumerate(zip(best, chunks)):
                inside, layers = chunk_graphed(sh, tuple(layout[r][j]), mode, graphs, ch.saved)
                graphed += c * inside
                io += io_bytes(sh, layers, c)
        static["cuda_graph_buffers"] = round(io)
        static["flex_buffers"] = round(flex)
        static_total = sum(static.values())
        static_total_of[r] = static_total
        activation_i = round(activation)
        transient_i = round(transient)
        step = moments.step_temporaries(w, trainable or params, w.data_parallel_size, sh.c, sh.t, sh.ep,
                                        sh.etp)
        if step > activation_i + transient_i:
            term = moments.STEP
        lazy = _lazy_share(w, sh, knobs) * static.get("optimizer", 0)
        outside = static["residual"] + static["flex_buffers"] + static["cuda_graph_buffers"]
        alloc = moments.allocated_peaks(
            static_alloc=static_total - outside,
            lazy=lazy, act=activation_i, trans=transient_i, step=step, graphed=graphed, io=io,
            warmup=graphs.warmup if graphs is not None else None, it1_less=warmup_offloaded)
        ranks.append(RankMemory(
            pp_rank=r, static_bytes=static_total, activation_bytes=activation_i,
            transient_bytes=transient_i,
            peak_term=term, activations={k: round(x) for k, x in sorted(comp.items())},
            static=static, in_flight_microbatches=sum(best) / v, host_bytes=max(0, round(host)),
            transients={k: round(x) for k, x in trans.items()},
            params=round(params.total), layers=len(kinds), step_bytes=round(step),
            lazy_bytes=round(lazy), graphed_bytes=round(graphed),
            allocated_peak_bytes=alloc.allocated, allocated_moment=alloc.moment,
            first_iteration_allocated_bytes=alloc.first_iteration,
            allocated_moments=alloc.moments,
            moe_layers=sum("moe" in k for k in kinds + list(inner if here else ()))))
    hottest = max(ranks, key=lambda rk: (rk.peak_bytes, -rk.pp_rank))
    return MemoryEstimate(ranks=ranks, hottest=hottest, assumptions=assumptions(w, sh, knobs),
                          per_layer=per_layer(w, sh, mode))


def _lazy_share(w, sh: Shape, knobs: Knobs) -> float:
    """The share of the optimizer state the first step creates (Adam's moments and, with the
    precision-aware optimizer, its master weights); 0 with a fixed per-parameter knob."""
    if knobs.optimizer_bytes_per_param is not None:
        return 0.0
    eager, lazy = optimizer_state_bytes(w, sh.elt == 2)
    return lazy / (eager + lazy) if eager + lazy else 0.0


def first_iteration_peak_bytes(w, rank: RankMemory) -> int:
    """A rank's device peak during the first iteration, when Adam state is still to be created.

    The optimizer state made by the first step (`optimizer_state_bytes`) is absent from the
    first forward and backward; that step then allocates it once the activations are freed,
    next to its own temporaries (memory/moments.step_temporaries), so the first iteration peaks
    at the larger of the two moments. The allocated figure of the same moment is
    `rank.first_iteration_allocated_bytes`.
    """
    fwd_bwd = rank.static_bytes - rank.lazy_bytes + rank.activation_bytes + rank.transient_bytes
    return max(fwd_bwd, rank.static_bytes + rank.step_bytes)


def per_layer(w, sh: Shape, mode: RecomputeMode) -> dict:
    """Saved bytes of one layer of each kind for one micro-batch under w's setting."""
    out = {}
    for kind in dict.fromkeys(w.layer_kinds()):
        tensors: dict = {}
        for x in layer_tensors(sh, kind, mode.mods):
            tensors[x.name] = tensors.get(x.name, 0.0) + x.nbytes
        out[kind] = {
            "total": layer_bytes(sh, kind, mode.mods),
            "tensors": {k: round(x) for k, x in tensors.items()},
            "components": {k: round(x) for k, x in layer_components(sh, kind, mode.mods).items()},
            "full_recompute_keeps": round(checkpoint_bytes(sh, mode.distribute)),
        }
    return out
