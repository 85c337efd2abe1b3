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
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

from mbridge_recompute.placement import place
from mbridge_recompute.plan.report import Candidate
from mbridge_recompute.setting import RecomputeSetting

MAX_SUBSET_LABELS = 10        # beyond this many useful labels, subsets are capped (never hit in 0.16.1)


def full_settings(w, version: Optional[str] = None) -> list[RecomputeSetting]:
    """uniform:N and block:N candidates for the model chunks of `w`."""
    from mbridge_recompute.facts import card, releases

    chunks = place(w, version).chunk_sizes
    if not chunks:
        return []
    g = 0
    for c in chunks:
        g = math.gcd(g, c)
    key = releases.resolve_version(version)
    if card.holds("uniform-num-layers-not-dividing-chunk", key):
        # this release raises IndexError when the group runs past the chunk
        uniform = [RecomputeSetting.full("uniform", n) for n in range(1, g + 1) if g % n == 0]
    else:
        uniform = [RecomputeSetting.full("uniform", n) for n in range(1, max(chunks) + 1)]
    block = [RecomputeSetting.full("block", n) for n in range(1, max(chunks) + 1)]
    return uniform + block


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
    """A candidate is dominated when another allowed one is no worse in peak and cost and better in one."""
    allowed = [c for c in cands if c.allowed]
    for c in allowed:
        for o in allowed:
            if o is c:
                continue
            if o.peak_bytes <= c.peak_bytes and o.cost_pct <= c.cost_pct and \
                    (o.peak_bytes < c.peak_bytes or o.cost_pct < c.cost_pct):
                c.dominated_by = o.name
                break


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
    """The cheapest allowed candidate that fits, else the lowest-peak allowed one (which then
    does not fit), else None when every candidate is rejected."""
    allowed = [c for c in cands if c.allowed]
    fitting = sorted((c for c in allowed if c.fits), key=order)
    if fitting:
        return fitting[0]
    if not allowed:
        return None
    return min(allowed, key=lambda c: (c.peak_bytes, c.cost_pct))
