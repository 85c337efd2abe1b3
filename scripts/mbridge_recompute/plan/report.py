"""The plan's result as types: candidates, label effects, calibration, the whole report.

Logic builds these; `commands/plan.py` renders them as text by attribute, and `to_dict()` is
used only for `--json` (sizes in bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from mbridge_recompute.plan.calibration import Calibration
from mbridge_recompute.setting import RecomputeSetting

if TYPE_CHECKING:
    from mbridge_recompute.memory.cost import StepCost, StepShares

CAVEAT = ("The recommendation is a prediction, not a measurement: run it against the matched "
          "selective [] control (run_harness.py --from-plan plan.json) and keep it only if the "
          "measured peak fits and the step time is acceptable.")


def _switched_off(label: str, block: str) -> str:
    """'moe', 'layernorm in moe layers', 'core_attn offloading' (an offload upstream skips)."""
    from mbridge_recompute.memory.offload import SKIPPED

    if label.startswith(SKIPPED):
        return f"{label[len(SKIPPED):]} offloading"
    return label + ("" if block == "all" else f" in {block} layers")


@dataclass
class Candidate:
    """One recompute setting, priced: modelled peak per pipeline rank, replay cost, legality."""
    setting: RecomputeSetting
    rank_peaks: tuple                 # modelled peak of every PP rank (bytes)
    rank_terms: tuple                 # the term that sets each rank's peak
    cost_pct: float                   # the change of the modelled step, % (shares.cost_pct)
    rejected_by: tuple = ()           # error findings this setting adds over the [] control
    offsets: tuple = ()               # calibration per PP rank: the unexplained offset
    rank_static: tuple = ()           # static memory of every PP rank (bytes); () when not modelled
    fits: bool = False
    dominated_by: Optional[str] = None
    disabled: tuple = ()              # (label, block) the checker finds switched off, not priced
    step: Optional[StepCost] = None   # its modelled step (memory/cost.py), what cost_pct compares
    shares: Optional[StepShares] = None   # cost_pct split: replay, offload copies, layout (CP)
    rank_host: tuple = ()             # fine-grained offloading: pinned host bytes per PP rank
    rank_allocated: tuple = ()        # modelled allocated peak of every PP rank (max_memory_allocated)
    rank_band: tuple = ()             # per PP rank: (below, above) bytes of the device peak's band
    rank_band_calibrated: tuple = ()  # the same once a calibration absorbed what it can
    verdict: str = "no"               # fits / tight (the band crosses the budget) / no (budget.settle)
    point_fits: bool = False          # the predicted peak itself is within the budget
    ref_peaks: tuple = ()             # calibrated: the measured setting's modelled peak per rank

    @property
    def name(self) -> str:
        """Candidate syntax, as `run_harness.py --candidates` reads it ('[]', 'moe_act', 'block:4')."""
        return self.setting.candidate()

    @property
    def allowed(self) -> bool:
        return not self.rejected_by

    @property
    def modelled(self) -> bool:
        """False for a layout megatron-core rejects: no estimate, no peak."""
        return bool(self.rank_static)

    def offset(self, rank: int) -> int:
        return self.offsets[rank] if self.offsets else 0

    def rank_peak(self, rank: int) -> int:
        """Rank `rank`'s peak, calibrated when a measurement was given."""
        return self.rank_peaks[rank] + self.offset(rank)

    def allocated_peak(self, rank: int) -> int:
        """Rank `rank`'s allocated peak (what max_memory_allocated reports), calibrated like
        its device peak."""
        base = self.rank_allocated[rank] if self.rank_allocated else self.rank_peaks[rank]
        return base + self.offset(rank)

    def band(self, rank: int) -> tuple:
        """(below, above): how far rank `rank`'s measured device peak may lie from its predicted
        one (memory/band.py). Once calibrated, what stays is the terms a calibration keeps plus
        the error of the change from the measured setting (memory.band.CALIBRATED_DELTA of it)."""
        from mbridge_recompute.memory.band import CALIBRATED_DELTA

        if self.offsets and self.rank_band_calibrated:
            below, above = self.rank_band_calibrated[rank]
            delta = abs(self.rank_peaks[rank] - self.ref_peaks[rank]) if self.ref_peaks else 0
            return (below + round(CALIBRATED_DELTA[0] * delta),
                    above + round(CALIBRATED_DELTA[1] * delta))
        return tuple(self.rank_band[rank]) if self.rank_band else (0, 0)

    def band_edges(self, rank: int) -> tuple:
        """(lower, upper) edges of rank `rank`'s device-peak band, calibrated."""
        below, above = self.band(rank)
        peak = self.rank_peak(rank)
        return max(peak - below, 0), peak + above

    @property
    def upper_bytes(self) -> int:
        """The band's upper edge on the rank where it is highest: what must fit the budget."""
        return max(self.band_edges(r)[1] for r in range(len(self.rank_peaks)))

    @property
    def lower_bytes(self) -> int:
        """The band's lower edge on the rank where it is highest: over the budget, nothing fits."""
        return max(self.band_edges(r)[0] for r in range(len(self.rank_peaks)))

    @property
    def hottest_pp_rank(self) -> int:
        return max(range(len(self.rank_peaks)), key=lambda r: (self.rank_peak(r), -r))

    @property
    def model_peak_bytes(self) -> int:
        """The modelled (uncalibrated) peak of the modelled hottest rank."""
        return max(self.rank_peaks)

    @property
    def peak_bytes(self) -> int:
        """The hottest rank's peak, calibrated when a measurement was given."""
        return self.rank_peak(self.hottest_pp_rank)

    @property
    def peak_term(self) -> str:
        return self.rank_terms[self.hottest_pp_rank]

    @property
    def replay_pct(self) -> float:
        """Replayed forward work as % of the step (>= 0; offload copies never net into it)."""
        return self.shares.replay_pct if self.shares else 0.0

    @property
    def offload_pct(self) -> float:
        """Exposed fine-grained offload copy time as % of the step (>= 0)."""
        return self.shares.offload_pct if self.shares else 0.0

    @property
    def host_bytes(self) -> int:
        """Pinned host memory the offloaded activations take on the hottest rank (>= 0)."""
        return self.rank_host[self.hottest_pp_rank] if self.rank_host else 0

    def to_dict(self) -> dict:
        d = {"name": self.name, "describe": self.setting.describe(), "kind": self.setting.kind}
        d.update(self.setting.as_fields())
        ranks = range(len(self.rank_peaks))
        m = self.modelled
        d.update({"peak_bytes": int(self.peak_bytes) if m else None,
                  "model_peak_bytes": int(self.model_peak_bytes) if m else None,
                  "hottest_pp_rank": self.hottest_pp_rank if m else None, "peak_term": self.peak_term,
                  "rank_peak_bytes": [int(self.rank_peak(r)) for r in ranks] if m else None,
                  # the calibration's unexplained offset on the hottest rank (0 uncalibrated):
                  # peak_bytes = the model's peak there + offset_bytes
                  "offset_bytes": int(self.offset(self.hottest_pp_rank)) if m else None,
                  "rank_static_bytes": [int(x) for x in self.rank_static] if m else None,
                  "rank_offset_bytes": [int(self.offset(r)) for r in ranks] if m else None,
                  "verdict": self.verdict if self.allowed and m else "rejected",
                  "point_fits": self.point_fits,
                  "band_lower_bytes": int(self.lower_bytes) if m else None,
                  "band_upper_bytes": int(self.upper_bytes) if m else None,
                  "rank_band_bytes": [[int(x) for x in self.band_edges(r)] for r in ranks] if m else None,
                  "allocated_peak_bytes": int(self.allocated_peak(self.hottest_pp_rank)) if m else None,
                  "rank_allocated_peak_bytes": [int(self.allocated_peak(r)) for r in ranks] if m else None,
                  "cost_pct": round(self.cost_pct, 3),
                  "replay_pct": round(self.replay_pct, 3), "offload_pct": round(self.offload_pct, 3),
                  "cp_pct": round(self.shares.cp_pct, 3) if self.shares else 0.0,
                  "layout_pct": round(self.shares.layout_pct, 3) if self.shares else 0.0,
                  "bubble_pct": round(100 * self.step.bubble, 4) if self.step else 0.0,
                  "host_bytes": int(self.host_bytes),
                  "rank_host_bytes": [int(x) for x in self.rank_host] if m else None,
                  "fits": self.fits, "allowed": self.allowed,
                  "rejected_by": list(self.rejected_by),
                  "switched_off": [_switched_off(label, block) for label, block in self.disabled],
                  "dominated": self.dominated_by is not None,
                  "dominated_by": self.dominated_by})
        return d


@dataclass
class LabelEffect:
    """One recompute label on this workload: does it do anything, and what it saves and costs."""
    label: str
    applicable: bool
    reason: str                       # why (not) -- from the rules when the config or runtime says so
    saving_bytes: int                 # on the [] control's hottest rank; negative adds memory
    rank_saving_bytes: tuple          # per PP rank: the [] control's peak minus the label's
    cost_pct: float                   # its replay work, % of the step (>= 0)
    per_layer_saving_bytes: dict = field(default_factory=dict)   # layer kind -> bytes per micro-batch
    cost_far_below_measured: tuple = ()   # plan/evidence.py sentences: studies where it cost far more
    offload_pct: float = 0.0          # with offloading: the exposed copy time of its setting, %
    per_layer_bytes: dict = field(default_factory=dict)    # layer kind -> bytes one layer keeps
    adds: str = ""                    # why it adds memory (the tensors it pins, a larger replay)

    def to_dict(self) -> dict:
        return {"label": self.label, "applicable": self.applicable, "reason": self.reason,
                "saving_bytes": self.saving_bytes, "rank_saving_bytes": list(self.rank_saving_bytes),
                "cost_pct": self.cost_pct, "offload_pct": self.offload_pct,
                "per_layer_saving_bytes": dict(self.per_layer_saving_bytes),
                "per_layer_bytes": dict(self.per_layer_bytes), "adds_memory_because": self.adds,
                "cost_far_below_measured": list(self.cost_far_below_measured)}


def band_dict(b) -> Optional[dict]:
    """A rank's band as JSON: bytes below / above the allocated and the device peak, and the
    terms it is made of."""
    if b is None:
        return None
    return {"allocated_below_bytes": b.allocated[0], "allocated_above_bytes": b.allocated[1],
            "device_below_bytes": b.device[0], "device_above_bytes": b.device[1],
            "terms": [{"name": t.name, "below_bytes": t.lower, "above_bytes": t.upper,
                       "device_only": t.device_only, "kept_by_calibration": t.kept, "why": t.why}
                      for t in b.terms]}


def nearest(points: list, anchor: Optional[Candidate], n: int) -> list:
    """The n points closest in replay cost to `anchor` (the anchor itself first when present)."""
    if anchor is None:
        return points[:n]
    return sorted(points, key=lambda c: (c.name != anchor.name, abs(c.cost_pct - anchor.cost_pct)))[:n]


@dataclass
class PlanReport:
    workload: dict                    # the summary line's facts (layers, parallelism, batch, ...)
    budget_bytes: int
    estimate: object                  # memory.MemoryEstimate of the current setting (None if refused)
    labels: list                      # LabelEffect per label of the release
    candidates: list                  # Candidate, cheapest first
    current: Optional[Candidate]
    recommendation: Optional[Candidate]
    fits: bool
    diagnosis: Optional[str]
    calibration: Optional[Calibration]
    workload_findings: list           # error findings under every setting (fix the workload first)
    assumptions: list
    top: Optional[int] = None         # --top: frontier points shown and sweep neighbours
    release: object = None            # facts.releases.Release the plan was made for
    extra: dict = field(default_factory=dict)   # set by the command: model_source, plot
    warnings: list = field(default_factory=list)  # not-modelled settings (memory/coverage.py)
    free: Optional[dict] = None       # --free-gb: the rank, what was asked, what the answer frees
    alternatives: bool = False        # --alternatives: layout / offload / optimizer points too
    recompute_recommendation: Optional[Candidate] = None   # the cheapest pure-recompute answer
    side_by_side: list = field(default_factory=list)       # alternatives beside single labels
    per_rank: bool = False            # --per-rank: the text shows every rank's numbers
    verdict: str = "no"               # the recommendation's: fits / tight / no
    bands: list = field(default_factory=list)       # memory.band.Band of each rank, current setting
    calibrate_first: Optional[str] = None           # with a tight verdict: the run to measure first
    cheaper_tight: Optional[Candidate] = None       # a cheaper setting whose band crosses the budget
    evidence_notes: list = field(default_factory=list)   # published runs of this workload, set beside it

    NEIGHBOURS = 2                    # sweep neighbours of the recommendation without --top

    @property
    def frontier(self) -> list:
        """Allowed, undominated candidates, cheapest first."""
        return [c for c in self.candidates if c.allowed and c.dominated_by is None]

    @property
    def shown_frontier(self) -> list:
        """What the report shows: every frontier point, or the `top` nearest the recommendation."""
        front = self.frontier
        if self.top is None:
            return front
        near = nearest(front, self.recommendation, self.top)
        return sorted(near, key=lambda c: (c.cost_pct, c.peak_bytes))

    @property
    def harness_candidates(self) -> list:
        """The matched sweep: the [] control, the recommendation and its nearest fitting frontier
        points (`top` of them, default 2)."""
        rec = self.recommendation
        out = ["[]"]
        if rec is None or rec.name in ("[]", "none"):
            return out                   # nothing to recompute: the control alone confirms the fit
        out.append(rec.name)
        fitting = [c for c in self.frontier if c.fits and c.setting.granularity is not None
                   and c.name not in out]
        return out + [c.name for c in nearest(fitting, rec, self.top or self.NEIGHBOURS)]

    @property
    def hottest_pp_rank(self) -> Optional[int]:
        return self.estimate.hottest.pp_rank if self.estimate is not None else None

    def to_dict(self) -> dict:
        rec = None
        if self.recommendation is not None:
            from mbridge_recompute.write.snippets import render_all

            rec = self.recommendation.to_dict()
            rec.update({"fits": self.fits, "verdict": self.verdict, "budget_bytes": self.budget_bytes,
                        "calibrate_first": self.calibrate_first,
                        "snippets": render_all(self.recommendation.setting), "caveat": CAVEAT})
        out = {
            "version": self.release.requested if self.release else None,
            "facts": self.release.key if self.release else None,
            "release": self.release.to_dict() if self.release else None,
            "workload": dict(self.workload),
            "budget_bytes": self.budget_bytes,
            "ranks": [dict(r.as_dict(), band=band_dict(b)) for r, b in
                      zip(self.estimate.ranks, self.bands or [None] * len(self.estimate.ranks))]
            if self.estimate is not None else [],
            "hottest_pp_rank": self.hottest_pp_rank,
            "labels": [e.to_dict() for e in self.labels],
            "current": self.current.to_dict() if self.current is not None else None,
            "frontier": [c.to_dict() for c in self.shown_frontier],
            "candidates": [c.to_dict() for c in self.candidates],
            "recommendation": rec,
            "fits": self.fits,
            "verdict": self.verdict,
            "cheaper_if_calibrated": self.cheaper_tight.to_dict() if self.cheaper_tight else None,
            "calibrate_first": self.calibrate_first,
            "evidence_notes": list(self.evidence_notes),
            "diagnosis": self.diagnosis,
            "harness_candidates": self.harness_candidates,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "workload_findings": list(self.workload_findings),
            "warnings": list(self.warnings),
            "free": dict(self.free) if self.free else None,
            "alternatives": list(self.side_by_side),
            "recompute_recommendation": (self.recompute_recommendation.to_dict()
                                         if self.recompute_recommendation else None),
            "assumptions": list(self.assumptions),
        }
        out.update(self.extra)
        return out
