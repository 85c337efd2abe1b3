"""What a plan is asked: the budget, a measurement to calibrate with, a memory to free on one
pipeline rank, and what the report shows. Read once against the workload (`read`), so that the
planner itself takes plain, checked values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.plan.budget import budget_statement, gb_to_bytes
from mbridge_recompute.plan.measured import Measured, from_peak_gb
from mbridge_recompute.setting import RecomputeSetting


@dataclass(frozen=True)
class Question:
    budget_gb: Optional[float] = None           # default: the GPU's capacity less headroom
    measured: Optional[Measured] = None         # a read --measured report
    measured_peak_gb: Optional[float] = None    # or one measured peak allocated ...
    measured_setting: Optional[RecomputeSetting] = None   # ... of this setting (default: current)
    measured_iteration: Optional[int] = None    # ... taken after this iteration (None: steady)
    measured_source: str = "--measured-peak-gb"
    free_gb: Optional[float] = None             # free this much on pipeline rank `rank`
    rank: Optional[int] = None                  # the rank of measured_peak_gb and of free_gb
    per_rank: bool = False                      # text: every rank's numbers
    alternatives: bool = False                  # price layout / offload / optimizer changes too
    top: Optional[int] = None                   # frontier points shown and sweep neighbours


class Asked(NamedTuple):
    budget: int                  # bytes per GPU
    budget_text: str             # the budget as an assumption sentence
    measured: Optional[Measured]
    need: Optional[int]          # bytes to free (--free-gb), or None


def read(q: Question, w) -> Asked:
    """`q` checked against `w` (InputError naming the option otherwise)."""
    budget, text = budget_statement(w, q.budget_gb)
    if q.rank is not None and not 0 <= q.rank < w.pipeline_model_parallel_size:
        raise InputError("--rank", f"must be a pipeline rank from 0 to "
                                   f"{w.pipeline_model_parallel_size - 1}, got {q.rank}")
    measured = q.measured
    if measured is None and q.measured_peak_gb is not None:
        measured = from_peak_gb(q.measured_peak_gb, q.measured_iteration, q.measured_source,
                                q.measured_setting, q.rank)
    need = None if q.free_gb is None else gb_to_bytes(q.free_gb, "--free-gb")
    return Asked(budget, text, measured, need)
