"""The candidates a plan considers, the frontier they form, and the recommendation.

Candidates:
- "off" (no recompute) and the selective `[]` control;
- selective label subsets of the labels that do something on this architecture and save
  memory on some rank, without redundant nesting (`moe` already contains `moe_act` and
  `shared_experts`, card.yaml `contains`);
- full recompute `uniform:N` and `block:N`, sized against the model chunks of
  `placement.place` (recompute_num_layers counts per chunk, transformer_block.py:326
  @ core_v0.16.1). Where the card says uniform N must divide every chunk (0.16: IndexError,
  tb:532-542 @ core_v0.16.1) only divisors are searched; later releases clamp the last group
  (recompute.py:158-164 @ core_v0.19.0).

Bounded search: a chunk of up to FULL_ALL_UP_TO layers gets every N; a longer one gets N in
1-16, the divisors of each chunk and a x sqrt(2) grid (a few dozen, whatever the layer count),
and `refine` then bisects block N at the fit boundary (block's peak falls and its cost rises
with N, so the smallest fitting N is the cheapest) and searches uniform N around the grid's
lowest peak (every uniform N replays every layer: one cost, only the lowest peak counts).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

from mbridge_recompute.placement import place
from mbridge_recompute.plan.report import Candidate
from mbridge_recompute.setting import RecomputeSetting

MAX_SUBSET_LABELS = 10        # beyond this many useful labels, subsets are capped (never hit in 0.16.1)
FULL_ALL_UP_TO = 64           # chunks up to this many layers: every recompute_num_layers is priced
SMALL_N = 16                  # longer chunks: 1..SMALL_N, divisors, and a x sqrt(2) grid


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def full_counts(chunks) -> list[int]:
    """The recompute_num_layers values priced for chunks of these sizes (bounded, see above)."""
    longest = max(chunks)
    if longest <= FULL_ALL_UP_TO:
        return list(range(1, longest + 1))
    ns = set(range(1, SMALL_N + 1)) | {longest}
    for c in set(chunks):
        ns |= set(divisors(c))
    x = float(SMALL_N)
    while x < longest:
        x *= 2 ** 0.5
        ns.add(min(longest, round(x)))
    return sorted(n for n in ns if n <= longest)


def uniform_must_divide(version: Optional[str]) -> bool:
    """Whether this release raises IndexError when a uniform group runs past the chunk."""
    from mbridge_recompute.facts import card, releases

    return card.holds("uniform-num-layers-not-dividing-chunk", releases.resolve_version(version))


def full_settings(w, version: Optional[str] = None) -> list[RecomputeSetting]:
    """uniform:N and block:N candidates for the model chunks of `w`."""
    chunks = place(w, version).chunk_sizes
    if not chunks:
        return []
    g = 0
    for c in chunks:
        g = math.gcd(g, c)
    counts = full_counts(chunks)
    if uniform_must_divide(version):
        uniform = [RecomputeSetting.full("uniform", n) for n in divisors(g)]
    else:
        uniform = [RecomputeSetting.full("uniform", n) for n in counts]
    block = [RecomputeSetting.full("block", n) for n in counts]
    return uniform + block


def grid_words(chunks) -> str:
    """How the full-recompute N were chosen, for the assumptions."""
    if max(chunks) <= FULL_ALL_UP_TO:
        return "every value"
    return (f"1-{SMALL_N}, the chunk's divisors and a x sqrt(2) grid, block N bisected at the "
            "fit boundary and uniform N searched around the lowest peak")


def refine(pricer, cands: list, accepts, settle_one) -> list:
    """More full-recompute candidates where the bounded grid left a gap that matters: block N
    between the largest grid N `accepts` refuses and the smallest it takes (bisection), and
    uniform N around the grid's lowest peak. `settle_one(c)` calibrates and fits a new one.
    Returns the new candidates."""
    have = {c.setting: c for c in cands}
    new = []

    def price(method: str, n: int):
        s = RecomputeSetting.full(method, n)
        if s not in have:
            c = pricer.price(s)
            settle_one(c)
            have[s] = c
            new.append(c)
        return have[s]

    full = [c for c in cands if not c.setting.changes and c.setting.granularity == "full"
            and c.allowed and c.modelled]
    block = sorted((c for c in full if c.setting.method == "block"), key=lambda c: c.setting.num_layers)
    for test in accepts:
        ok = [i for i, c in enumerate(block) if test(c)]
        if not ok or ok[0] == 0:
            continue
        lo, hi = block[ok[0] - 1].setting.num_layers, block[ok[0]].setting.num_layers
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if test(price("block", mid)):
                hi = mid
            else:
                lo = mid
    uniform = sorted((c for c in full if c.setting.method == "uniform"), key=lambda c: c.setting.num_layers)
    ns = [c.setting.num_layers for c in uniform]
    if uniform and not uniform_must_divide(pricer.version):
        best = min(range(len(uniform)), key=lambda i: (uniform[i].peak_bytes, ns[i]))
        lo = ns[best - 1] if best > 0 else ns[best]
        hi = ns[best + 1] if best + 1 < len(ns) else ns[best]
        while hi - lo > 2:                       # ternary search for the lowest peak
            a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            if price("uniform", a).peak_bytes <= price("uniform", b).peak_bytes:
                hi = b
            else:
                lo = a
        for n in range(lo, hi + 1):
            price("uniform", n)
    return new


def _nested() -> dict:
    """label -> labels it contains (card.yaml `contains`)."""
    from mbridge_recompute.facts import card

    return {e["label"]: set(e.get("contains") or []) for e in card.load()["labels"]}


def selective_settings(labels: list[str]) -> list[RecomputeSetting]:
    """Every subset of `labels` except redundant nests; the empty set is the control."""
    contains = _nested()
    labels = list(labels)[:MAX_SUBSET_LABELS]
    out = [RecomputeSetting.selective()]
    for k in range(1, len(labels) + 1):
        for combo in itertools.combinations(labels, k):
            chosen = set(combo)
            if any(contains.get(a, set()) & chosen for a in chosen):
                continue                          # e.g. moe with moe_act: moe already replays it
            out.append(RecomputeSetting.selective(*combo))
    return out


def mark_dominated(cands: list[Candidate]) -> None:
    """A candidate is dominated when another allowed one is no worse in peak and cost and better
    in one. One sweep in cost order (O(n log n)): within one cost only the lowest peak survives,
    and a point is dominated by any cheaper one whose peak is no higher."""
    peak = {id(c): c.peak_bytes for c in cands}
    allowed = sorted((c for c in cands if c.allowed), key=lambda c: (c.cost_pct, peak[id(c)]))
    cheaper = None                     # the lowest peak among strictly cheaper points
    i = 0
    while i < len(allowed):
        j = i
        while j < len(allowed) and allowed[j].cost_pct == allowed[i].cost_pct:
            j += 1
        head = allowed[i]              # the lowest peak at this cost
        for c in allowed[i:j]:
            c.dominated_by = None
            if cheaper is not None and peak[id(cheaper)] <= peak[id(c)]:
                c.dominated_by = cheaper.name
            elif peak[id(c)] > peak[id(head)]:
                c.dominated_by = head.name
        if cheaper is None or peak[id(head)] < peak[id(cheaper)]:
            cheaper = head
        i = j


def order(c: Candidate):
    """Cheapest first; among equal cost the lower peak, then the simpler setting."""
    return (round(c.cost_pct, 9), c.peak_bytes, _complexity(c.setting))


def _complexity(s: RecomputeSetting) -> int:
    if s.granularity is None:
        return 0
    if s.granularity == "selective":
        return 1 + len(s.modules or ())
    return 100 + (s.num_layers or 0)


def recommend(cands: list[Candidate]) -> Optional[Candidate]:
    """The cheapest allowed candidate that fits at its band's upper edge; else the cheapest
    `tight` one whose predicted peak is within the budget (to be confirmed by a calibration run),
    else the lowest-peak allowed one (which then does not fit); None when every candidate is
    rejected."""
    allowed = [c for c in cands if c.allowed]
    fitting = sorted((c for c in allowed if c.fits), key=order)
    if fitting:
        return fitting[0]
    if not allowed:
        return None
    tight = sorted((c for c in allowed if c.verdict == "tight" and c.point_fits), key=order)
    if tight:
        return tight[0]
    return min(allowed, key=lambda c: (c.peak_bytes, c.cost_pct))
