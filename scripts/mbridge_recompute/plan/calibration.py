"""Calibration: a measured peak anchors the model to the run it was measured on.

The measured run's own setting (by default the workload's current one, `--measured-setting` or
a compare record's `setting` for another) is priced like any candidate. What was measured minus
what the model predicts for that setting, on the measured pipeline rank and at the measured
iteration, is one term of its own: the unexplained offset. It is kept constant across
settings: each candidate's prediction is its modelled peak plus the offset (per pipeline rank
where ranks were measured one by one, the hottest measured rank's elsewhere).

Like for like: the measured figure is peak *allocated* (torch.cuda.max_memory_allocated,
Bridge's mem-max-allocated-gigabytes), so the model side leaves out the residual it adds for
the CUDA context, NCCL and Transformer Engine workspaces, which the caching allocator does not
count. Being constant across settings, the offset behaves as static memory does: a candidate's
static part is its modelled static plus the offset. An anchor that would make a term negative is
refused: a measured figure at or below the anchored setting's modelled static memory (negative
activations), or an offset that takes some candidate's static part to zero or below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mbridge_recompute.errors import InputError, Rejected
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB


def _gb(nbytes: float) -> str:
    """Decimal GB with two decimals, or three significant digits for a tiny figure."""
    v = nbytes / GB
    return f"{v:.2f}" if abs(v) >= 0.1 or v == 0 else f"{v:.3g}"


@dataclass
class Calibration:
    setting: RecomputeSetting          # the setting the measured run ran
    source: str                        # where the figure comes from (--measured-peak-gb, a file)
    setting_source: str                # where the setting comes from, in words
    pp_rank: int                       # the pipeline rank of the anchoring measurement
    measured_allocated_bytes: int      # measured peak allocated there
    predicted_allocated_bytes: int     # the model's peak allocated for that setting and rank
    iteration: Optional[int] = None    # measured after this iteration (None: steady state)
    rank_offsets: tuple = ()           # per pipeline rank: the offset each rank moves by
    measured_ranks: tuple = ()         # pipeline ranks with a measurement of their own
    ref_rank_peaks: tuple = ()         # the measured setting's modelled device peak per rank: a
    #                                    calibrated band grows with a candidate's distance from it

    @property
    def field(self) -> str:
        """The option the figure came in by."""
        return self.source.split(" ")[0]

    @property
    def offset_bytes(self) -> int:
        """The unexplained offset: measured minus predicted, like for like."""
        return self.measured_allocated_bytes - self.predicted_allocated_bytes

    def offsets(self, ranks: int) -> tuple:
        """The offset of each of `ranks` pipeline ranks: per rank where ranks were measured; a
        candidate with another pipeline size (a --alternatives PP change) takes the anchoring
        rank's offset on every rank."""
        if self.rank_offsets and len(self.rank_offsets) == ranks:
            return self.rank_offsets
        return (self.offset_bytes,) * ranks

    def to_dict(self) -> dict:
        return {"setting": self.setting.candidate(), "setting_describe": self.setting.describe(),
                "setting_source": self.setting_source, "source": self.source,
                "rank": self.pp_rank, "iteration": self.iteration,
                "measured_allocated_bytes": self.measured_allocated_bytes,
                "predicted_allocated_bytes": self.predicted_allocated_bytes,
                "offset_bytes": self.offset_bytes,
                "rank_offset_bytes": list(self.rank_offsets),
                "measured_pp_ranks": list(self.measured_ranks)}


def model_allocated_bytes(w, rank, first_iteration: bool) -> int:
    """The model's peak allocated of one rank (memory/moments.py): what the allocator counts,
    without the residual, the flex dispatcher's buffers or activations parked in a CUDA-graph
    pool; after iteration 1 without the Adam moments the first step creates."""
    return rank.first_iteration_allocated_bytes if first_iteration else rank.allocated_peak_bytes


def static_allocated_bytes(w, rank, first_iteration: bool) -> int:
    """The model's static memory of one rank as the allocator counts it (no residual); in
    iteration 1 without the Adam state the first optimizer step creates."""
    static = rank.static_bytes - rank.outside_allocator_bytes - rank.static.get("cuda_graph_buffers", 0)
    if first_iteration:
        static -= rank.lazy_bytes
    return static


def calibrate(pricer, measured, current: RecomputeSetting) -> Calibration:
    """The offset between `measured` and the model's prediction for the setting that ran."""
    from mbridge_recompute import memory
    from mbridge_recompute.placement import place
    from mbridge_recompute.rules.findings import disabled_by

    w = pricer.w
    setting = measured.setting if measured.setting is not None else current
    where = measured.setting_source or "the workload's current setting"
    ran = setting.apply(w)
    if ran.pipeline_model_parallel_size != w.pipeline_model_parallel_size:
        raise InputError("--measured-setting", f"{setting.candidate()!r} changes the pipeline size; "
                                               "calibrate on a run of this workload's pipeline")
    if not place(ran, pricer.version).ok:
        raise Rejected("--measured-setting", f"{setting.candidate()!r}: megatron-core rejects its "
                                             "layer placement, so the model cannot price what ran")
    est = memory.estimate(ran, disabled=disabled_by(pricer.findings(setting)))
    model = [model_allocated_bytes(ran, r, measured.first_iteration) for r in est.ranks]
    for r in measured.rank_bytes:
        if not 0 <= r < len(model):
            raise InputError("--rank", f"must be a pipeline rank from 0 to {len(model) - 1}, got {r}")
    own = dict(measured.rank_bytes)
    if own:
        hot = max(own, key=lambda r: (own[r], -r))
        peak = own[hot]
    else:
        hot = max(range(len(model)), key=lambda r: (model[r], -r))
        peak = measured.hottest_bytes
    for r, nbytes in (own or {hot: peak}).items():
        static = static_allocated_bytes(ran, est.ranks[r], measured.first_iteration)
        if nbytes <= static:
            raise Rejected(measured.source.split(" ")[0], (
                f"the measured {_gb(nbytes)} GB of {setting.describe()} on pp_rank {r} is not "
                f"above the model's static memory there ({_gb(static)} GB allocated: weights, "
                "gradients, optimizer state): its activations would be negative. Check that "
                "the figure is the peak allocated of that setting (--measured-setting, --rank) "
                "on this workload"))
    base = peak - model[hot]
    offsets = tuple(own[r] - model[r] if r in own else base for r in range(len(model)))
    return Calibration(setting, measured.source, where, hot, peak, model[hot], measured.iteration,
                       offsets, tuple(sorted(own)), tuple(r.peak_bytes for r in est.ranks))


def refuse_impossible(cal: Calibration, candidates) -> None:
    """Rejected when the offset takes some candidate's static part (static + offset: the offset
    is kept constant as static memory is) to zero or below on some rank."""
    for c in candidates:
        if not c.modelled:
            continue
        for r, static in enumerate(c.rank_static):
            if static + c.offset(r) > 0:
                continue
            raise Rejected(cal.field, (
                f"the unexplained offset {_gb(c.offset(r))} GB on pp_rank {r} (measured "
                f"{_gb(cal.measured_allocated_bytes)} GB of {cal.setting.describe()}, model "
                f"{_gb(cal.predicted_allocated_bytes)} GB) would take {c.name}'s static part "
                f"({_gb(static)} GB) to {_gb(static + c.offset(r))} GB: a negative term. The "
                "measurement and the model disagree by more than the static memory"))


def lines(cal: Calibration) -> list:
    """The calibration as text lines (each under 100 columns): what was measured, what the
    model predicts there, and the offset as a term of its own."""
    when = "after iteration 1 (before Adam's moments)" if cal.iteration == 1 else "steady state"
    out = [f"calibration: {cal.setting.describe()} ({cal.setting_source}) measured "
           f"{_gb(cal.measured_allocated_bytes)} GB",
           f"  peak allocated on pp_rank {cal.pp_rank}, {when} ({cal.source}); model: "
           f"{cal.predicted_allocated_bytes / GB:.2f} GB allocated",
           f"  unexplained offset: {cal.offset_bytes / GB:+.2f} GB, kept constant across settings"]
    if len(cal.measured_ranks) > 1:
        out.append("  per pipeline rank: " + ", ".join(
            f"{r}: {cal.rank_offsets[r] / GB:+.2f}" for r in cal.measured_ranks)
            + " GB (others take pp_rank " + f"{cal.pp_rank}'s)")
    return out


def sentence(cal: Calibration) -> str:
    """The calibration as one assumption sentence."""
    when = ("after iteration 1, before the first optimizer step creates Adam's moments: the "
            "offset is taken against the model's first-iteration peak and the steady state is "
            "predicted as model + offset" if cal.iteration == 1 else "in the steady state")
    return (f"calibrated: {cal.setting.describe()} ({cal.setting_source}) measured "
            f"{cal.measured_allocated_bytes / GB:.2f} GB peak allocated on pp_rank {cal.pp_rank} "
            f"({cal.source}), {when}; the model predicts {cal.predicted_allocated_bytes / GB:.2f} GB "
            "allocated there (its peak less the residual, which the allocator does not count); "
            f"every candidate = its modelled peak + the unexplained offset "
            f"({cal.offset_bytes / GB:+.2f} GB, kept constant across settings)")


UNCALIBRATED = ("uncalibrated: pass --measured-peak-gb GB (the peak allocated of the current "
                "setting, or of --measured-setting) or --measured compare.json to anchor the "
                "predictions to a run")
