"""Replayed forward work (FLOPs plus communication) as a share of the step."""

from __future__ import annotations

from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs


def replay_cost_pct(w, knobs: Knobs = DEFAULT_KNOBS) -> float:
    raise NotImplementedError("being written")
