"""Activation and static memory model of a Megatron-Core training step (pure Python, no torch).

Public API:
    estimate(w, knobs=DEFAULT_KNOBS) -> MemoryEstimate        per-PP-rank peak for w's own recompute setting
    label_effects(w, version=None, knobs=DEFAULT_KNOBS) -> list[LabelEffect]
                                                             one per recompute label of the target version,
                                                             saving vs the selective [] control
    replay_cost_pct(w, knobs=DEFAULT_KNOBS) -> float           replayed forward work as % of the step
"""

from mbridge_recompute.memory.types import (DEFAULT_KNOBS, PAPER_KNOBS, Knobs, LabelEffect,
                                            MemoryEstimate, RankMemory)
from mbridge_recompute.memory.peak import estimate
from mbridge_recompute.memory.effects import label_effects
from mbridge_recompute.memory.cost import replay_cost_pct

__all__ = ["estimate", "label_effects", "replay_cost_pct", "MemoryEstimate", "RankMemory",
           "LabelEffect", "Knobs", "DEFAULT_KNOBS", "PAPER_KNOBS"]
