"""Per-PP-rank peak: static + saved activations of the in-flight micro-batches + largest transient."""

from __future__ import annotations

from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs, MemoryEstimate


def estimate(w, knobs: Knobs = DEFAULT_KNOBS) -> MemoryEstimate:
    raise NotImplementedError("being written")
