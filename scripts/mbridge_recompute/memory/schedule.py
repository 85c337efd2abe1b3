"""How many micro-batches each model chunk holds at once (layer placement: placement.py).

In-flight micro-batches: 1F1B keeps p - rank forwards alive before the first backward
(warm-up p - rank - 1, then one forward of the steady state). The interleaved schedule
runs 2(p - rank - 1) + (v - 1)*group warm-up chunk forwards (+1 with EP A2A overlap)
(pipeline_parallel/schedules.py:762-779 @ core_v0.16.1) in the order of
`get_schedule_table` (schedules.py:798-825) and frees chunks backward in reverse chunk
order; we replay that order and record every distinct in-flight vector.
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
    """Distinct per-chunk counts of live forwards, sampled right after each forward.

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
    # steady state: forward warm + j, then backward j (chunk v - 1 - table[j]); cool-down
    # only frees, so the maxima are among the post-forward vectors.
    for j in range(total - warm):
        counts[table[warm + j]] += 1
        seen.add(tuple(counts))
        counts[v - 1 - table[j]] -= 1
    return tuple(sorted(seen))
