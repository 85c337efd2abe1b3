"""Per-layer CUDA graphs: what they take out of PyTorch's allocated bytes and what they add.

Transformer Engine graphs (cuda_graph_impl=transformer_engine) are captured by
TECudaGraphHelper with one `make_graphed_callables` call: one graph per (layer, micro-batch),
captured in the pipeline schedule's order into one shared memory pool, with static input and
output buffers reused between micro-batches whose forward and backward do not overlap
(cuda_graphs.py:1788-1935, 2100-2145 @ core_v0.16.1; `_reuse_graph_input_output_buffers` from
TE 2.7). The capture follows `cuda_graph_warmup_steps` eager iterations (default 3,
transformer_config.py:769 @ core_v0.16.1; Bridge train.py captures when step - start ==
cuda_graph_warmup_steps) and empties the allocator cache before and after it
(cuda_graphs.py _start_capturing / _finish_capturing @ core_v0.16.1). Local graphs
(cuda_graph_impl=local, CudaGraphManager) record during the warm-up iterations and capture into
one global mempool (cuda_graphs.py:1368-1430 @ core_v0.16.1); full-iteration graphs capture the
whole forward-backward at iteration cuda_graph_warmup_steps (full_cuda_graph.py:139-185 @
core_v0.16.1).

What that means for the two figures a plan reports:
- Inside a graph, tensors live at fixed addresses of the private pool. Once a graph's backward
  has been captured its saved tensors are freed as far as the caching allocator is concerned
  (their blocks stay reserved in the pool), and replays allocate nothing. So in the graphed
  steady state the saved activations of the captured modules are *not* in
  `torch.cuda.memory_allocated`, only in the reserved pool; the static input/output buffers
  are allocated and stay.
- `max_memory_allocated` counts since process start (neither Megatron-LM nor Bridge resets it),
  so the eager warm-up iterations and the capture itself count: with two or more eager
  iterations the eager steady peak (Adam moments present) is what the allocator reports.
- The device holds the pool (the graphed activations in flight) next to the eager working set:
  about the eager peak plus the static buffers.
Measured: the MoE/MLA functional test with attention graphed and cuda_graph_warmup_steps 0
peaks at 41.20 GB allocated, 14.7 GB under the same model without graphs (53.18 / 55.93 GB,
tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph
@ d98e8a6).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.layer_spec import LAYER_BLOCKS
from mbridge_recompute.memory.recompute import block_mods
from mbridge_recompute.memory.shape import Shape
from mbridge_recompute.memory.tensors import BLOCK_TENSORS

DEFAULT_WARMUP_STEPS = 3      # transformer_config.py:769 @ core_v0.16.1 (same through main)

# tensor-name prefixes of the MoE block that the moe_router scope captures: the pre-MLP norm
# and the router (transformer_layer.py:970-1005 @ core_v0.16.1: the graph runs _forward_mlp,
# and the MoE layer returns after routing when only the router is captured)
_ROUTER = ("pre-MLP norm", "router logits")


class Graphs(NamedTuple):
    impl: str                  # "transformer_engine", "local" or "full_iteration"
    scopes: frozenset          # empty: whole layers; else attn / mlp / moe / moe_router / mamba
    warmup: int                # eager iterations before the capture
    full_iteration: bool

    @property
    def whole_layers(self) -> bool:
        return not self.scopes or self.full_iteration


def scope_names(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    return [str(x) for x in value]


def capture(w, has_modules_field: bool) -> tuple:
    """(effective cuda_graph_impl, capture scopes, full_iteration migrated) as __post_init__ leaves them.

    0.16/0.17 read cuda_graph_scope ("full" = the whole layer, tc:1689-1736 @ core_v0.16.1).
    0.18+ read cuda_graph_modules, copy a deprecated cuda_graph_scope into it, and turn a
    full_iteration entry into cuda_graph_impl="full_iteration" -- even when graphs were off
    (tc:2159-2219 @ core_v0.18.2).
    """
    impl = w.cuda_graph_impl
    if has_modules_field:
        given = w.cuda_graph_scope if w.cuda_graph_scope is not None else w.cuda_graph_modules
    else:
        given = w.cuda_graph_scope
    scopes = [x for x in scope_names(given) if x != "full"]
    migrated = False
    if has_modules_field:
        if "full_iteration" in scopes:
            scopes = [x for x in scopes if x != "full_iteration"]
            if impl in ("none", "local", "full_iteration"):
                impl, migrated = "full_iteration", True
        scopes = [x for x in scopes if x != "full_iteration_inference"]
    if impl == "local" and ("moe_router" in scopes or "moe_preprocess" in scopes):
        # local graphs do not tell router from preprocess: both are set (tc:1725-1735 @ core_v0.16.1)
        for x in ("moe_router", "moe_preprocess"):
            if x not in scopes:
                scopes.append(x)
    return impl, scopes, migrated


def graphs_of(w) -> Optional[Graphs]:
    """The CUDA-graph capture a workload runs, or None without graphs."""
    impl, scopes, _ = capture(w, w.cuda_graph_modules is not None)
    if impl in (None, "none"):
        return None
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    warmup = extra.get("cuda_graph_warmup_steps")
    if warmup is None:
        warmup = DEFAULT_WARMUP_STEPS
    elif isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError("model.cuda_graph_warmup_steps",
                         f"must be a whole number of iterations >= 0, got {warmup!r}")
    full = impl == "full_iteration" or "full_iteration" in scopes
    names = frozenset(x for x in scopes if x not in ("full_iteration", "moe_preprocess"))
    return Graphs(impl, names, warmup, full)


def graphed_layer_bytes(sh: Shape, kind: str, mods: frozenset, g: Graphs) -> float:
    """Saved bytes of one layer (one micro-batch) that live inside the graph's pool."""
    if g.whole_layers:
        scopes = {"attn", "mlp", "moe", "mamba", "gdn"}
    else:
        scopes = set(g.scopes)
    out = 0.0
    for name in LAYER_BLOCKS[kind]:
        tensors = BLOCK_TENSORS[name](sh, block_mods(mods, name))
        if name in scopes:
            out += sum(x.nbytes for x in tensors)
        elif name == "moe" and "moe_router" in scopes:
            out += sum(x.nbytes for x in tensors if x.name.startswith(_ROUTER))
    return out


def graphed_kinds(kinds, g: Graphs) -> int:
    """How many of a chunk's layers carry a graph (a layer whose blocks are all outside the
    scopes is not captured)."""
    if g.whole_layers:
        return len(kinds)
    scopes = set(g.scopes)
    if "moe_router" in scopes:
        scopes.add("moe")
    return sum(1 for k in kinds if any(b in scopes for b in k.split("+")))


def io_bytes(sh: Shape, graphed_layers: int, inflight: float) -> float:
    """Static buffers of one chunk's graphs: per graphed layer an input and an output
    [Tr, h] per micro-batch in flight, plus one static gradient pair (TE reuses buffers of
    micro-batches that are not in flight at once, TE >= 2.7)."""
    per = sh.elt * sh.h * sh.Tr
    return graphed_layers * (2 * inflight + 2) * per
