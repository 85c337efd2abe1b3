"""Per-label effect: saving on the hottest rank against the selective [] control, and replay cost."""

from __future__ import annotations

from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs, LabelEffect


def label_effects(w, version: str | None = None, knobs: Knobs = DEFAULT_KNOBS) -> list[LabelEffect]:
    raise NotImplementedError("being written")
