"""The flex token dispatcher's communication buffers, which live outside PyTorch's allocator.

MoEFlexTokenDispatcher runs one communication group over the ETP x EP ranks
(token_dispatcher.py:1322-1363 @ core_v0.16.1) through one of two backends:
- DeepEP (`moe_flex_dispatcher_backend: deepep`, the default): one `deep_ep.Buffer` per
  process, sized by the larger of the dispatch and combine configs' buffer size hints for the
  layer's hidden bytes (fused_a2a.py:33-65 @ core_v0.16.1). The NVLink buffer is cudaMalloc'd
  and the RDMA buffer lives in the NVSHMEM symmetric heap (DeepEP csrc/legacy/config.hpp:53-99
  @ dd758ca; default configs deep_ep/buffers/legacy.py:233-260 @ dd758ca).
- HybridEP (`hybridep`): one `HybridEPBuffer`, built at the first dispatch with the tokens per
  rank of that call (fused_a2a.py:338-364 @ core_v0.16.1, :380-420 @ core_v0.19.0), whose
  expert token, prob and scaling-factor buffers are sized for the worst case, every token of
  every rank routed to one rank (DeepEP hybrid-ep csrc/hybrid_ep/buffer/intranode.cu:126-130,
  195-262 @ 94a9f8f), allocated with cudaMalloc / cuMemCreate.
Neither is in `torch.cuda.memory_allocated`: they count against the device, not against the
allocated peak. What the dispatch returns (the permuted tokens, probs and routing handles) is
allocated through PyTorch, like the alltoall dispatcher's, and modelled as its working set.
"""

from __future__ import annotations

from mbridge_recompute.errors import InputError
from mbridge_recompute.memory.shape import Shape

NVL_PEERS = 8              # LEGACY_NUM_MAX_NVL_PEERS
DEEPEP_NUM_SMS = 20        # Buffer.num_sms, MCore's moe_deepep_num_sms default
# num_ranks -> (nvl chunked recv tokens, rdma chunked recv tokens) of the default dispatch
# config (deep_ep/buffers/legacy.py:245-258 @ dd758ca); combine configs are no larger
_DEEPEP_RECV = {2: (256, 128), 4: (256, 128), 8: (256, 128), 16: (288, 128), 24: (288, 128),
                32: (288, 128), 48: (288, 128), 64: (288, 128), 96: (480, 128), 128: (560, 128),
                144: (720, 128), 160: (720, 128)}
_TOPK, _SCALES, _META = 128, 128, 8


def _deepep_bytes(hidden_bytes: int, ranks: int) -> float:
    nvl_recv, rdma_recv = _DEEPEP_RECV.get(ranks, max(_DEEPEP_RECV.values()))
    channels = DEEPEP_NUM_SMS // 2
    nvl_ranks = min(ranks, NVL_PEERS)
    rdma_ranks = max(ranks // NVL_PEERS, 1)
    per_token = hidden_bytes + _META + _TOPK * 8 + _TOPK * 4 + _SCALES * 4
    nvl = channels * nvl_ranks * (nvl_recv * per_token + (2 * rdma_ranks + 3) * 4)
    rdma = 0.0
    if ranks > NVL_PEERS:
        rdma = channels * rdma_ranks * rdma_recv * 2 * (per_token + 16)
    return nvl + rdma


def _hybridep_bytes(sh: Shape, ranks: int) -> float:
    per_node = min(ranks, NVL_PEERS)
    max_tokens = sh.Tr * ranks          # the tokens of one micro-batch on every rank of the group
    local = sh.E / max(sh.ep, 1)
    per_token = 2 * sh.h + 4 * local * per_node + 4 * sh.h / 128
    nodes = max(ranks // per_node, 1)
    # internode: RDMA staging buffers of the same per-token size for the other nodes' tokens
    return max_tokens * per_token * (2 if nodes > 1 else 1)


def flex_buffer_bytes(w, sh: Shape) -> float:
    """Bytes the flex dispatcher's backend holds outside PyTorch on one GPU (0 otherwise)."""
    if not sh.E or sh.dispatcher != "flex":
        return 0.0
    ranks = sh.ep * sh.etp
    if ranks <= 1:
        return 0.0
    backend = flex_backend(w)
    if backend == "hybridep":
        return _hybridep_bytes(sh, ranks)
    if backend == "deepep":
        return _deepep_bytes(sh.h * max(sh.elt, 2), ranks)
    return 0.0     # ncclep (0.19+): NCCL's own buffers, inside the residual


BACKENDS = ("deepep", "hybridep", "ncclep")   # transformer_config.py:869 @ core_v0.19.0


def flex_backend(w) -> str:
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    backend = extra.get("moe_flex_dispatcher_backend")
    if backend is None:
        return "deepep"
    if backend not in BACKENDS:
        raise InputError("model.moe_flex_dispatcher_backend",
                         f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend
