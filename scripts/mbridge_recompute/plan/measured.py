"""What a measured run says, for the plan: the setting it ran, its peak allocated memory per
pipeline rank, the iteration the peaks were taken after, and the rank that ran out of memory.

Sources: `--measured-peak-gb X` (one number: the peak allocated of the hottest rank, or of
pipeline rank `--rank`, of the setting `--measured-setting` names, by default the workload's
current one), or `--measured FILE` holding `compare --json` (a run's per-rank peaks, each run
with its own setting) or `diagnose --json` (the rank that ran out of memory). Megatron Bridge
prints one memory line per model-parallel rank of data-parallel rank 0, "[Rank N] (after K
iterations) ..."; with the default rank order tp-cp-ep-dp-pp the pipeline rank is the
outermost, so global rank N is pipeline rank N // (world / PP).

A peak measured after iteration 1 has no Adam moments yet (the first optimizer step creates
them): it is compared with the model's first-iteration peak, like for like, and the steady
state is then predicted from the offset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB

# No GPU holds this much: a measured figure above it is not a measurement (1e300 overflowed).
MAX_MEASURED_GB = 10_000.0


@dataclass
class Measured:
    source: str
    hottest_bytes: Optional[int] = None          # the measured run's hottest measured rank
    rank_bytes: dict = field(default_factory=dict)   # pp_rank -> peak bytes (the max over its ranks)
    iteration: Optional[int] = None              # peaks taken after this iteration (None: steady)
    failed_rank: Optional[int] = None            # pp_rank that ran out of memory
    setting: Optional[RecomputeSetting] = None   # what ran; None: the workload's current setting
    setting_source: str = ""                     # where `setting` comes from, in words

    @property
    def first_iteration(self) -> bool:
        return self.iteration == 1


def measured_bytes(value, field_name: str) -> int:
    """A measured GB figure in bytes: positive, finite and no larger than a GPU can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field_name, f"must be a number of GB, got {value!r}")
    if not math.isfinite(value) or value <= 0 or value > MAX_MEASURED_GB:
        raise InputError(field_name, f"must be a positive number of GB up to {MAX_MEASURED_GB:g}, "
                                     f"got {value}")
    return int(value * GB)


def _world(w) -> int:
    return w.num_gpus or w.model_parallel_size * w.data_parallel_size


def pp_rank_of(global_rank: int, w) -> int:
    per_stage = max(1, _world(w) // w.pipeline_model_parallel_size)
    return min(global_rank // per_stage, w.pipeline_model_parallel_size - 1)


def _global_rank(value, field_name: str, w) -> int:
    """A global rank from a report: a non-negative integer, inside the world when it is known."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(field_name, f"must be a global rank (an integer >= 0), got {value!r}")
    if w.num_gpus and value >= w.num_gpus:
        raise InputError(field_name, f"rank {value} is outside the world of {w.num_gpus} GPUs "
                                     "(cluster.num_gpus)")
    return value


def parse_setting(text, field_name: str) -> RecomputeSetting:
    if not isinstance(text, str):
        raise InputError(field_name, f"must be a setting in candidate syntax ('[]', 'moe_act', "
                                     f"'uniform:2', 'none'), got {text!r}")
    return RecomputeSetting.parse(text, field_name)


def from_peak_gb(value: float, iteration: Optional[int], source: str,
                 setting: Optional[RecomputeSetting] = None, rank: Optional[int] = None) -> Measured:
    """`--measured-peak-gb`: of pipeline rank `rank` when given, else of the hottest rank."""
    nbytes = measured_bytes(value, source)
    return Measured(source, hottest_bytes=nbytes, rank_bytes={rank: nbytes} if rank is not None else {},
                    iteration=iteration, setting=setting,
                    setting_source="--measured-setting" if setting is not None else "")


def read(path: str, w, setting: Optional[RecomputeSetting] = None) -> Measured:
    """A `compare --json` or `diagnose --json` report as a Measured. From a compare report the
    run whose setting is `setting` is taken, else the control run."""
    from mbridge_recompute import files

    data = files.read_json(path, "--measured", "report")
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return _from_compare(data, path, w, setting)
    if isinstance(data, dict) and isinstance(data.get("findings"), list):
        return _from_diagnose(data, path, w)
    raise InputError("--measured", f"{path}: expected the JSON object of `compare --json` (keys "
                                   "control, runs) or `diagnose --json` (key findings)")


def _pick_run(data: dict, path: str, setting: Optional[RecomputeSetting]) -> tuple:
    """(index, run, its setting, where the setting comes from)."""
    runs = [(i, r) for i, r in enumerate(data["runs"]) if isinstance(r, dict)]
    if setting is not None:
        for i, r in runs:
            if r.get("setting") is not None and \
                    parse_setting(r["setting"], f"--measured: runs[{i}].setting") == setting:
                return i, r, setting, f"runs[{i}].setting of {path}"
        ran = ", ".join(repr(r.get("setting")) for _, r in runs)
        raise InputError("--measured-setting", f"no run of {path} ran {setting.candidate()!r} "
                                               f"(runs: {ran})")
    control = data.get("control")
    found = next(((i, r) for i, r in runs if r.get("name") == control), None) or \
        next(((i, r) for i, r in runs if r.get("control") is True), None)
    if found is None:
        raise InputError("--measured", f"{path}: no run named after the control {control!r}")
    i, run = found
    if run.get("setting") is None:
        # a compare report of the matched sweep: its control is the selective [] run
        return i, run, RecomputeSetting.selective(), f"{path}: the control run (no setting recorded: [])"
    return i, run, parse_setting(run["setting"], f"--measured: runs[{i}].setting"), \
        f"runs[{i}].setting of {path}"


def _from_compare(data: dict, path: str, w, setting: Optional[RecomputeSetting]) -> Measured:
    i, run, ran, ran_source = _pick_run(data, path, setting)
    where = f"--measured: runs[{i}]"
    name = run.get("name")
    if run.get("peak_allocated_gb") is None:
        raise InputError("--measured", f"{path}: run {name!r} has no peak_allocated_gb "
                                       f"(status {run.get('status')!r})")
    peak = measured_bytes(run["peak_allocated_gb"], f"{where}.peak_allocated_gb")
    iteration = 1 if run.get("peak_after") == 1 else None
    records = run.get("ranks")
    if records is None:
        records = {}
    if not isinstance(records, dict):
        raise InputError(f"{where}.ranks", f"must be a mapping of global rank -> record, got "
                                           f"{type(records).__name__}")
    ranks: dict = {}
    for key, rec in records.items():
        try:
            g = int(key)
        except (TypeError, ValueError):
            raise InputError(f"{where}.ranks", f"key {key!r} is not a global rank") from None
        g = _global_rank(g, f"{where}.ranks", w)
        if not isinstance(rec, dict):
            raise InputError(f"{where}.ranks.{key}", f"must be a mapping with max_allocated_gb, got "
                                                     f"{type(rec).__name__}")
        if rec.get("max_allocated_gb") is None:
            continue                                    # the rank printed no memory line
        a = measured_bytes(rec["max_allocated_gb"], f"{where}.ranks.{key}.max_allocated_gb")
        r = pp_rank_of(g, w)
        ranks[r] = max(ranks.get(r, 0), a)
    failed = None
    if run.get("status") == "oom":
        ooms = run.get("ooms") or []
        if not isinstance(ooms, list):
            raise InputError(f"{where}.ooms", "must be a list")
        oom_rank = next((o.get("rank") for o in ooms if isinstance(o, dict)
                         and o.get("rank") is not None), None)
        if oom_rank is not None:
            failed = pp_rank_of(_global_rank(oom_rank, f"{where}.ooms[].rank", w), w)
        elif run.get("hottest_rank") is not None:
            failed = pp_rank_of(_global_rank(run["hottest_rank"], f"{where}.hottest_rank", w), w)
    return Measured(f"--measured {path}", hottest_bytes=peak, rank_bytes=ranks,
                    iteration=iteration, failed_rank=failed, setting=ran, setting_source=ran_source)


def _from_diagnose(data: dict, path: str, w) -> Measured:
    """A diagnosis names the rank that ran out of memory; it holds no peak to calibrate with."""
    failed = None
    for i, f in enumerate(data["findings"]):
        oom = f.get("oom") if isinstance(f, dict) else None
        if isinstance(oom, dict) and oom.get("rank") is not None:
            failed = pp_rank_of(_global_rank(oom["rank"], f"--measured: findings[{i}].oom.rank", w), w)
            break
    return Measured(f"--measured {path}", failed_rank=failed)
