"""The memory budget a plan must fit, and the calibration that anchors predictions to a run."""

from __future__ import annotations

import math
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.plan.capacity import capacity
from mbridge_recompute.plan.report import Calibration
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
    return b, (f"budget {b / GB:.2f} GB = the GPU's {cap.bytes / GB:.2f} GB minus a headroom of "
               f"max({HEADROOM_FRACTION:.0%}, {HEADROOM_MIN_GB:g} GB) for allocator fragmentation and "
               f"workspaces the model does not itemise (override with --budget-gb); capacity: {cap.how}")


def settle(candidates, budget: int, calibration: Optional[Calibration]) -> None:
    """The one place calibration and the fit are applied: every candidate's peak moves by the
    measured offset, and it fits when it is allowed and its (calibrated) peak is in budget."""
    offset = calibration.offset_bytes if calibration else 0
    for c in candidates:
        c.offset_bytes = offset
        c.fits = c.allowed and c.peak_bytes <= budget


def measured_peak_from_compare(path: str) -> float:
    """The control run's peak_allocated_gb from a `compare --json` report."""
    from mbridge_recompute.inputs.loading import read_json

    data = read_json(path, "--measured")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise InputError("--measured", f"{path}: expected the JSON object of `compare --json` "
                                       "(keys control, runs)")
    control = data.get("control")
    runs = [r for r in data["runs"] if isinstance(r, dict)]
    run = next((r for r in runs if r.get("name") == control), None) or \
        next((r for r in runs if r.get("control") is True), None)
    if run is None:
        raise InputError("--measured", f"{path}: no run named after the control {control!r}")
    peak = run.get("peak_allocated_gb")
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0:
        raise InputError("--measured", f"{path}: control run {control!r} has no peak_allocated_gb "
                                       f"(status {run.get('status')!r})")
    return float(peak)
