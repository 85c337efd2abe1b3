"""Every run of a tune, OOMs included, as per-rank offsets for the plan.

The plan's calibration (`plan/calibration.py`) anchors one measured figure: measured peak
allocated minus the model's peak allocated for the setting that ran, kept constant across
settings. A tune holds several runs, and each says something of its own:

* a memory report of a rank, its latest: in the steady state where the run got there, else
  after iteration 1 (against the model's first-iteration peak, which lacks Adam's moments):
  an offset, like for like;
* an OOM: the rank needed at least what it held plus what it asked for (`OOMPoint.demand_gb`),
  so the offset is at least that demand minus the model's peak at that iteration: a floor.

Per pipeline rank the offset is the largest of these (a rank the reports do not cover takes the
largest over all ranks): never below what a run was seen to need. Bridge prints memory for
data-parallel rank 0 only, and an MoE run's hottest expert-parallel rank may be another one, so
a report is itself a floor for the stage's hottest rank; only an OOM can show that rank.

One kind of OOM is not a floor for the others: a run that ran out of memory in an iteration that
another run got through although the model says that other run needs at least as much there.
The model then misses memory that belongs to the failed setting itself (a CUDA-graph pool a
checkpoint boundary breaks, a kernel's workspace): carrying it to every setting would condemn
them all. It is kept as that setting's own failure (`against_model`), and the loop does not
choose a setting holding all of its labels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB

# an OOM in these stages is optimizer state, not a step's activations: compared with the
# steady-state model, which holds Adam's moments (oom.py's stages)
_STATIC_STAGES = ("setup", "optimizer-state-init", "optimizer-step")


class Models:
    """The model's peak allocated per pipeline rank of any setting of one workload, after
    iteration 1 and in the steady state, as `plan/calibration.py` compares them with a report."""

    def __init__(self, pricer):
        self.pricer = pricer
        self._cache: dict = {}

    def _estimate(self, setting: RecomputeSetting):
        from mbridge_recompute import memory
        from mbridge_recompute.rules.findings import disabled_by

        key = setting
        if key not in self._cache:
            ran = setting.apply(self.pricer.w)
            est = memory.estimate(ran, disabled=disabled_by(self.pricer.findings(setting)))
            self._cache[key] = (ran, est)
        return self._cache[key]

    def allocated(self, setting: RecomputeSetting, first_iteration: bool) -> tuple:
        from mbridge_recompute.plan.calibration import model_allocated_bytes

        ran, est = self._estimate(setting)
        return tuple(int(model_allocated_bytes(ran, r, first_iteration)) for r in est.ranks)

    def extra(self, setting: RecomputeSetting, pp_rank: int) -> int:
        """The model's device peak less its peak allocated for `setting` on one rank: what the
        device holds beyond what the allocator counts (the residual: CUDA context, NCCL, TE
        workspaces), which a measured peak allocated lacks when it is held against the budget."""
        from mbridge_recompute.plan.calibration import model_allocated_bytes

        ran, est = self._estimate(setting)
        r = est.ranks[pp_rank]
        return int(r.peak_bytes - model_allocated_bytes(ran, r, False))

    @property
    def ranks(self) -> int:
        return len(self._estimate(RecomputeSetting.selective())[1].ranks)


@dataclass
class Observation:
    run: str
    candidate: str
    kind: str                     # "report" (a memory report) or "oom" (the OOM point)
    pp_rank: int
    iteration: Optional[int]      # 1, or None for the steady state
    measured_bytes: int           # the report's peak allocated, or the OOM's demand
    model_bytes: int              # the model's peak allocated for that setting, rank, iteration
    applied: bool = True
    why: str = ""

    @property
    def offset_bytes(self) -> int:
        return self.measured_bytes - self.model_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["offset_bytes"] = self.offset_bytes
        return d


@dataclass
class Offsets:
    per_rank: tuple = ()                              # bytes per pipeline rank; () uncalibrated
    observations: list = field(default_factory=list)
    against_model: dict = field(default_factory=dict)   # candidate -> why its failure is its own
    binding: tuple = ()                               # per rank: index of the observation that set it

    def to_dict(self) -> dict:
        return {"rank_offset_bytes": list(self.per_rank),
                "observations": [o.to_dict() for o in self.observations],
                "against_model": dict(self.against_model), "binding": list(self.binding)}


def _setting(candidate: str) -> RecomputeSetting:
    return RecomputeSetting.parse(candidate, "tune.json")


def _survivors(m, measurements: list, iteration: int, rank: int, need: int, models: Models) -> list:
    """Runs that got through `iteration` although the model says they need at least `need` there."""
    first = iteration == 1
    out = []
    for other in measurements:
        if other is m or other.survived < iteration:
            continue
        theirs = models.allocated(_setting(other.candidate), first)[rank]
        if theirs >= need:
            out.append((other, theirs))
    return out


def observe(measurements: list, models: Models) -> Offsets:
    """The offsets every measurement implies (module docstring)."""
    ranks = models.ranks
    obs: list = []
    against: dict = {}
    for m in measurements:
        s = _setting(m.candidate)
        # a rank's latest report: the steady state where the run got there (what is predicted;
        # iteration 1 adds the model's account of the optimizer state the first step creates)
        steady_ranks = {p.rank for p in m.steady}
        early = [p for p in m.first_iteration if p.rank not in steady_ranks]
        for peaks, first in ((early, True), (m.steady, False)):
            model = models.allocated(s, first)
            for p in peaks:
                if 0 <= p.pp_rank < ranks:
                    obs.append(Observation(m.name, m.candidate, "report", p.pp_rank, 1 if first else None,
                                           int(p.allocated_gb * GB), model[p.pp_rank]))
        for o in m.ooms:
            if o.demand_gb is None:
                continue
            first = o.iteration == 1 and o.stage not in _STATIC_STAGES
            model = models.allocated(s, first)
            rank = o.pp_rank if o.pp_rank is not None and 0 <= o.pp_rank < ranks else \
                max(range(ranks), key=lambda r: (model[r], -r))
            ob = Observation(m.name, m.candidate, "oom", rank, 1 if first else None, int(o.demand_gb * GB),
                             model[rank])
            if o.pp_rank is None and ranks > 1:
                ob.why = "the log does not name the rank: taken as the modelled hottest"
            got_through = _survivors(m, measurements, o.iteration, rank, model[rank], models)
            if got_through:
                other, theirs = max(got_through, key=lambda t: t[1])
                ob.applied = False
                ob.why = (f"ran out of memory in iteration {o.iteration}, which {other.candidate} got "
                          f"through although the model gives it {theirs / GB:.2f} GB there against "
                          f"{model[rank] / GB:.2f} GB: memory the model does not see in this setting, "
                          "not carried to the others")
                against[m.candidate] = ob.why
            obs.append(ob)
    applied = [o for o in obs if o.applied]
    if not applied:
        return Offsets((), obs, against, ())
    overall = max(range(len(obs)), key=lambda i: (obs[i].applied, obs[i].offset_bytes))
    per_rank, binding = [], []
    for r in range(ranks):
        own = [i for i, o in enumerate(obs) if o.applied and o.pp_rank == r]
        i = max(own, key=lambda j: obs[j].offset_bytes) if own else overall
        per_rank.append(obs[i].offset_bytes)
        binding.append(i)
    return Offsets(tuple(per_rank), obs, against, tuple(binding))


def anchor(offsets: Offsets, models: Models, baseline: RecomputeSetting, runs: int):
    """The plan's `Measured` whose calibration moves every pipeline rank by exactly its offset:
    per rank, the baseline's modelled steady peak allocated plus the offset (the plan prices the
    baseline and takes measured minus model back out)."""
    from mbridge_recompute.plan.measured import Measured

    model = models.allocated(baseline, False)
    rank_bytes = {r: model[r] + off for r, off in enumerate(offsets.per_rank)}
    return Measured(f"tune.json ({runs} run{'s' if runs != 1 else ''})",
                    hottest_bytes=max(rank_bytes.values()), rank_bytes=rank_bytes, iteration=None,
                    setting=baseline,
                    setting_source="the largest offset per pipeline rank over the tune's runs")


def holds_labels(candidate: RecomputeSetting, failed: RecomputeSetting) -> bool:
    """Whether `candidate` recomputes every label of the selective setting `failed`."""
    if candidate.granularity != "selective" or failed.granularity != "selective" or not failed.modules:
        return False
    return set(failed.modules) <= set(candidate.modules or ())
