"""What a measured run says, for the plan: peaks per pipeline rank, the iteration they were
taken after, and the rank that ran out of memory.

Sources: `--measured-peak-gb X` (one number: the [] control's hottest rank), or `--measured
FILE` holding `compare --json` (its control run's per-rank peaks) or `diagnose --json` (the rank
that ran out of memory). Megatron Bridge prints one memory line per model-parallel rank of data-
parallel rank 0, "[Rank N] (after K iterations) ..."; with the default rank order tp-cp-ep-dp-pp
the pipeline rank is the outermost, so global rank N is pipeline rank N // (world / PP).

A peak measured after iteration 1 has no Adam moments yet (the first optimizer step creates
them): it is compared with the model's first-iteration peak, like for like, and the steady
state is then predicted from the offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.units import GB


@dataclass
class Measured:
    source: str
    hottest_bytes: Optional[int] = None          # the control's hottest measured rank
    rank_bytes: dict = field(default_factory=dict)   # pp_rank -> peak bytes (the max over its ranks)
    iteration: Optional[int] = None              # peaks taken after this iteration (None: steady)
    failed_rank: Optional[int] = None            # pp_rank that ran out of memory

    @property
    def first_iteration(self) -> bool:
        return self.iteration == 1


def pp_rank_of(global_rank: int, w) -> int:
    world = w.num_gpus or w.model_parallel_size * w.data_parallel_size
    per_stage = max(1, world // w.pipeline_model_parallel_size)
    return min(global_rank // per_stage, w.pipeline_model_parallel_size - 1)


def from_peak_gb(value: float, iteration: Optional[int], source: str) -> Measured:
    from mbridge_recompute.plan.budget import gb_to_bytes

    return Measured(source, hottest_bytes=gb_to_bytes(value, source), iteration=iteration)


def read(path: str, w) -> Measured:
    """A `compare --json` or `diagnose --json` report as a Measured."""
    from mbridge_recompute.inputs.yamlio import read_json

    data = read_json(path, "--measured")
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return _from_compare(data, path, w)
    if isinstance(data, dict) and isinstance(data.get("findings"), list):
        return _from_diagnose(data, path, w)
    raise InputError("--measured", f"{path}: expected the JSON object of `compare --json` (keys "
                                   "control, runs) or `diagnose --json` (key findings)")


def _num(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


def _from_compare(data: dict, path: str, w) -> Measured:
    control = data.get("control")
    runs = [r for r in data["runs"] if isinstance(r, dict)]
    run = next((r for r in runs if r.get("name") == control), None) or \
        next((r for r in runs if r.get("control") is True), None)
    if run is None:
        raise InputError("--measured", f"{path}: no run named after the control {control!r}")
    peak = _num(run.get("peak_allocated_gb"))
    if peak is None:
        raise InputError("--measured", f"{path}: control run {control!r} has no peak_allocated_gb "
                                       f"(status {run.get('status')!r})")
    after = run.get("peak_after")
    iteration = 1 if after == 1 else None
    ranks: dict = {}
    for key, rec in (run.get("ranks") or {}).items():
        try:
            g = int(key)
        except (TypeError, ValueError):
            continue
        a = _num((rec or {}).get("max_allocated_gb"))
        if a is None or g < 0:
            continue
        r = pp_rank_of(g, w)
        ranks[r] = max(ranks.get(r, 0), int(a * GB))
    hot = run.get("hottest_rank")
    failed = None
    if run.get("status") == "oom":
        oom_rank = next((o.get("rank") for o in run.get("ooms") or [] if isinstance(o, dict)
                         and isinstance(o.get("rank"), int)), None)
        failed = pp_rank_of(oom_rank, w) if oom_rank is not None else None
    if failed is None and isinstance(hot, int) and run.get("status") == "oom":
        failed = pp_rank_of(hot, w)
    return Measured(f"--measured {path}", hottest_bytes=int(peak * GB), rank_bytes=ranks,
                    iteration=iteration, failed_rank=failed)


def _from_diagnose(data: dict, path: str, w) -> Measured:
    """A diagnosis names the rank that ran out of memory; it holds no peak to calibrate with."""
    failed = None
    for f in data["findings"]:
        oom = f.get("oom") if isinstance(f, dict) else None
        if isinstance(oom, dict) and isinstance(oom.get("rank"), int):
            failed = pp_rank_of(oom["rank"], w)
            break
    return Measured(f"--measured {path}", failed_rank=failed)
