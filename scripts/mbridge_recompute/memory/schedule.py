"""How many micro-batches each model chunk holds at once (layer placement: placement.py).

In-flight micro-batches: 1F1B keeps p - rank forwards alive before the first backward
(warm-up p - rank - 1, then one forward of the steady state). The interleaved schedule
runs 2(p - rank - 1) + (v - 1)*group warm-up chunk forwards (+1 with EP A2A overlap)
(pipeline_parallel/schedules.py:762-779 @ core_v0.16.1) in the order of
`get_schedule_table` (schedules.py:798-825) and frees chunks backward in reverse chunk
order; we replay that order and record every distinct in-flight vector.

With EP all-to-all overlap (overlap_moe_expert_parallel_comm) the steady state is combined
1F1B: each step runs one chunk's forward co-scheduled layer by layer with another chunk's
backward (pipeline_parallel/combined_1f1b.py:22-45, schedules.py:1322-1345 @ core_v0.16.1), so
the saved activations grow and shrink together; the vector is sampled after each combined step
(and after the warm-up, which holds the one extra forward).
"""

from __future__ import annotations

from functools import lru_cache


def _schedule_table(M: int, v: int, group: int) -> list:
    """Chunk id of each forward, as `get_schedule_table` orders (micro-batch, chunk)."""
    chunks = []
    for lo in range(0, M, group):
        hi = M if lo + group >= M else lo + group
        for c in range(v):
            chunks.extend([c] * (hi - lo))
    return chunks


@lru_cache(maxsize=1024)
def inflight_vectors(p: int, v: int, M: int, rank: int, group: int, extra: int = 0) -> tuple:
    """Distinct per-chunk counts of live forwards, sampled right after each forward (after
    each combined forward-backward step when `extra`, the EP-overlap warm-up forward, is set).

    Returns a tuple of tuples (one count per chunk). The peak of saved activations is
    the max over these vectors of sum(count[c] * bytes_per_microbatch[c]).
    """
    if p <= 1:
        return (tuple([1] * v),)
    if v <= 1:
        return ((min(p - rank, M),),)
    total = M * v
    warm = min(2 * (p - rank - 1) + (v - 1) * group + extra, total)
    table = _schedule_table(M, v, group)
    counts = [0] * v
    for k in range(warm):
        counts[table[k]] += 1
    if warm == total:
        return (tuple(counts),)
    seen = set()
    combined = extra > 0
    if combined:
        seen.add(tuple(counts))
    # steady state: forward warm + j, then backward j (chunk v - 1 - table[j]); cool-down
    # only frees, so the maxima are among the post-forward vectors.
    for j in range(total - warm):
        counts[table[warm + j]] += 1
        if not combined:
            seen.add(tuple(counts))
        counts[v - 1 - table[j]] -= 1
        if combined:
            seen.add(tuple(counts))
    return tuple(sorted(seen))
