"""The memory budget a plan must fit, and the calibration that anchors predictions to a run."""

from __future__ import annotations

import math
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.plan.calibration import Calibration
from mbridge_recompute.plan.capacity import capacity
from mbridge_recompute.units import GB

HEADROOM_FRACTION = 0.05      # default budget: GPU memory minus max(5 %, 2 GB)
HEADROOM_MIN_GB = 2.0


def default_budget_bytes(w) -> int:
    cap = capacity(w).bytes
    return int(cap - max(HEADROOM_FRACTION * cap, HEADROOM_MIN_GB * GB))


def gb_to_bytes(value: float, field: str) -> int:
    """A user's positive GB figure in bytes, or InputError naming `field`."""
    nbytes = value * GB
    if not math.isfinite(nbytes) or value <= 0:   # nan, inf, and 1e300 GB (inf bytes)
        raise InputError(field, f"must be a positive, finite number of GB, got {value}")
    return int(nbytes)


def budget_statement(w, budget_gb: Optional[float]) -> tuple[int, str]:
    if budget_gb is not None:
        return gb_to_bytes(budget_gb, "--budget-gb"), f"budget {budget_gb:g} GB per GPU (--budget-gb)"
    b = default_budget_bytes(w)
    cap = capacity(w)
    if b <= 0:
        raise InputError(cap.field, f"a GPU of {cap.bytes / GB:.2f} GB less the headroom of "
                                    f"max({HEADROOM_FRACTION:.0%}, {HEADROOM_MIN_GB:g} GB) leaves no "
                                    "memory to plan for (give the real capacity, or --budget-gb)")
    return b, (f"budget {b / GB:.2f} GB = the GPU's {cap.bytes / GB:.2f} GB minus a headroom of "
               f"max({HEADROOM_FRACTION:.0%}, {HEADROOM_MIN_GB:g} GB) for allocator fragmentation and "
               f"workspaces the model does not itemise (override with --budget-gb); capacity: {cap.how}")


def verdict(c, budget: int) -> str:
    """fits: the band's upper edge is within the budget on every rank; no: its lower edge is over
    the budget on some rank; tight: the band crosses the budget (memory/band.py)."""
    if c.upper_bytes <= budget:
        return "fits"
    if c.lower_bytes > budget:
        return "no"
    return "tight"


def settle(candidates, budget: int, calibration: Optional[Calibration]) -> None:
    """The one place calibration and the fit are applied: every candidate's rank peaks move by
    the measured offsets (which also narrows its band), and it fits when it is allowed and its
    band's upper edge is within the budget."""
    for c in candidates:
        c.offsets = calibration.offsets(len(c.rank_peaks)) if calibration else ()
        ref = calibration.ref_rank_peaks if calibration else ()
        c.ref_peaks = ref if len(ref) == len(c.rank_peaks) else ()
        c.verdict = verdict(c, budget) if c.modelled else "no"
        c.fits = c.allowed and c.verdict == "fits"
        c.point_fits = c.allowed and c.modelled and c.peak_bytes <= budget
