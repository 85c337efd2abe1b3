"""Which layers sit in which model chunk, and how many micro-batches each chunk holds at once.

Layer placement: PP ranks get equal shares (or `num_layers_in_first/last_pipeline_stage`),
each rank's share is split over its VPP chunks, and virtual stage j*p + r is rank r's
chunk j, as `get_num_layers_to_build` lays them out.

In-flight micro-batches: 1F1B keeps p - rank forwards alive before the first backward
(warm-up p - rank - 1, then one forward of the steady state). The interleaved schedule
runs 2(p - rank - 1) + (v - 1)*group warm-up chunk forwards (+1 with EP A2A overlap)
(pipeline_parallel/schedules.py:762-779 @ core_v0.16.1) in the order of
`get_schedule_table` (schedules.py:798-825) and frees chunks backward in reverse chunk
order; we replay that order and record every distinct in-flight vector.
"""

from __future__ import annotations

from functools import lru_cache


def stage_layer_counts(L: int, p: int, first, last) -> list:
    counts = [0] * p
    fixed = {}
    if p > 1 and first:
        fixed[0] = int(first)
    if p > 1 and last:
        fixed[p - 1] = int(last)
    rest = L - sum(fixed.values())
    free = [r for r in range(p) if r not in fixed]
    for r, n in fixed.items():
        counts[r] = n
    if free:
        base, extra = divmod(max(rest, 0), len(free))
        for i, r in enumerate(free):
            counts[r] = base + (1 if i < extra else 0)
    return counts


def chunk_layout(kinds: list, p: int, v: int, first=None, last=None) -> list:
    """[rank][chunk] -> list of layer kinds, in MCore's virtual-stage order."""
    counts = stage_layer_counts(len(kinds), p, first, last)
    per_chunk = []
    for r in range(p):
        base, extra = divmod(counts[r], v)
        per_chunk.append([base + (1 if j < extra else 0) for j in range(v)])
    layout = [[None] * v for _ in range(p)]
    i = 0
    for j in range(v):
        for r in range(p):
            n = per_chunk[r][j]
            layout[r][j] = kinds[i:i + n]
            i += n
    return layout


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
