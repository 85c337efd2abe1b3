"""The moments of training whose memory can set a rank's peak, and the two peaks they give.

A rank's *device* peak (what the capacity budget is held against) and its *allocated* peak
(what `torch.cuda.max_memory_allocated` and Bridge's `mem-max-allocated-gigabytes` report)
differ by what PyTorch's caching allocator never counts: the residual (CUDA context, NCCL and
Transformer Engine workspaces, allocator slack), the flex dispatcher's communication buffers
(memory/dispatcher.py) and, with CUDA graphs, the saved activations that live in a graph's
private pool (memory/graphs.py). The allocated peak counts since process start: it is the
largest of the moments below that the run goes through.

- iteration 1, forward/backward: Adam's moments do not exist yet (the first optimizer step
  creates them, memory/static.optimizer_state_bytes);
- the optimizer step: static memory plus the step's temporaries (`step_temporaries`);
- the steady forward/backward (iteration 2 on, or while CUDA graphs are still warming up);
- with CUDA graphs, their capture and the graphed steady state.
"""

from __future__ import annotations

from typing import NamedTuple

STEP = "optimizer step: fp32 copies of the 16-bit gradient shard"
IT1 = "iteration 1 forward/backward (before the first step creates Adam's moments)"
STEADY = "steady forward/backward"
CAPTURE = "CUDA-graph capture"
GRAPHED = "graphed steady state (captured modules' activations in the graph pool)"
GRAPHED_STEP = "optimizer step once the graphs' static buffers exist"


def step_temporaries(w, params, dp: int, c: int, t: int, ep: int, etp: int) -> float:
    """Bytes the optimizer step allocates on top of static memory.

    With 16-bit gradient buffers the step gives every main (fp32) parameter shard an fp32 copy
    of its gradient shard: `shard_main_param.grad = shard_model_grad.float()`
    (distrib_optimizer.py:2419 @ core_v0.16.1, :2476 @ core_v0.17.1, :2697 @ core_v0.18.2,
    :2782 @ core_v0.19.0); without the distributed optimizer `main_param.grad =
    model_param.main_grad.float()` for every parameter (optimizer.py:754-767 @ core_v0.16.1).
    They live until the next zero_grad. With fp32 gradient buffers `.float()` returns the same
    tensor, and the precision-aware optimizer uses the 16-bit shard as `decoupled_grad`
    (no copy). fp32 weights have no separate main copy.
    """
    if not (w.bf16 or w.fp16) or w.grad_reduce_in_fp32 or w.use_precision_aware_optimizer:
        return 0.0
    if w.use_distributed_optimizer:
        dense = params.dense / max(1, dp * c)
        expert = params.expert / max(1, dp * t * c // max(1, ep * etp))
        return 4.0 * (dense + expert)
    return 4.0 * params.total


class Peaks(NamedTuple):
    allocated: int              # the largest allocated moment
    moment: str                 # which one
    first_iteration: int        # the largest allocated moment of iteration 1
    moments: dict               # moment -> allocated bytes


def allocated_peaks(*, static_alloc: float, lazy: float, act: float, trans: float, step: float,
                    graphed: float = 0.0, io: float = 0.0, warmup=None,
                    it1_less: float = 0.0) -> Peaks:
    """The allocated moments of one rank, the largest of them, and the largest of iteration 1.

    `static_alloc`: static memory PyTorch allocates (no residual, no flex buffers, no graph
    buffers); `lazy`: the optimizer state the first step creates; `act` / `trans`: saved
    activations at the worst in-flight moment and the transient on top; `graphed`: the part
    of `act` inside CUDA graphs, `io`: the graphs' static buffers, `warmup`: eager iterations
    before the capture (None: no graphs); `it1_less`: saved bytes iteration 1 does not keep
    (fine-grained offloading's warm-up offloads every group).
    """
    eager_it1 = static_alloc - lazy + act - it1_less + trans
    m = {}
    if warmup is None:
        m = {IT1: eager_it1, STEP: static_alloc + step, STEADY: static_alloc + act + trans}
        first = (IT1, STEP)
    else:
        graphed_it = static_alloc + io + act - graphed + trans
        if warmup == 0:
            # captured before iteration 1: every iteration replays, iteration 1 without moments
            m[CAPTURE] = static_alloc - lazy + io + graphed
            m[IT1] = graphed_it - lazy - it1_less
            m[STEP] = static_alloc + io + step
            first = (CAPTURE, IT1, STEP)
        else:
            m[IT1] = eager_it1
            m[STEP] = static_alloc + step
            first = (IT1, STEP)
            if warmup >= 2:
                m[STEADY] = static_alloc + act + trans
            # after the warm-up: the capture runs the graphed modules of every micro-batch in
            # flight in schedule order, then replays allocate only the eager part
            m[CAPTURE] = static_alloc + io + graphed
            m[GRAPHED_STEP] = static_alloc + io + step
        m[GRAPHED] = graphed_it
    moment, value = max(m.items(), key=lambda kv: kv[1])
    return Peaks(round(value), moment, round(max(m[k] for k in first)),
                 {k: round(v) for k, v in m.items()})
