"""The next runs of a tune, or why it stops: the decision procedure, one function per rule.

PROCEDURE is what the tool prints; the functions below are those sentences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.tune.calibrate import holds_labels
from mbridge_recompute.units import GB

PROCEDURE = (
    "1. plan uncalibrated; run the baseline: the current setting, or the selective [] control "
    "when the current setting recomputes nothing",
    "2. read each finished run: peak allocated per reporting rank after iteration 1 and in the "
    "steady state, the OOM point (what the rank held plus what it asked for), the steady step "
    "time, the diagnosis of a failure, and the comparison with the baseline (compare's contract)",
    "3. calibrate per pipeline rank from every run, OOMs included: the offset is the largest "
    "measured-minus-modelled over the runs (an OOM counts as a floor); an OOM in an iteration "
    "that a run the model calls heavier got through is that setting's own, not carried over",
    "4. re-plan with those offsets; of the settings not yet run on the peak/cost frontier, run "
    "the cheapest predicted to fit the budget on every rank at its band's upper edge and, with "
    "--free-gb, to free that much against the baseline's measured peak there too; with two runs "
    "left, also its cheaper neighbour on the frontier when that one fits at the point estimate "
    "only (the plan's 'tight')",
    "5. a run passes when compare says pass, it is matched with the baseline, its peak allocated "
    "plus what the model puts on the device beyond it (the residual) fits the budget and, with "
    "--free-gb, it frees that much at the matched point",
    "6. stop when a run passed and no cheaper setting is predicted to pass (the answer is the "
    "passing run with the shortest step time), when the run budget is spent, when nothing left "
    "is predicted to fit, or when a failure is one recompute cannot fix (static memory, "
    "fragmentation, a baseline that fails for another reason, an unmatched comparison, offsets "
    "the plan refuses as impossible)",
)

# diagnose's kinds that no recompute setting changes
CANNOT_HELP = {
    "static": "weights, gradients and optimizer state do not shrink with recompute",
    "fragmentation": "the allocator, not the activations, is short of memory",
}


@dataclass
class Verdict:
    passed: bool
    why: str
    final: bool = True          # False: the run did not finish (interrupted): run it again
    stop: Optional[str] = None  # a stop reason this run forces (static OOM, unmatched, ...)


@dataclass
class Choice:
    candidate: str
    role: str                   # baseline / candidate / neighbour
    why: str
    predicted: dict = field(default_factory=dict)


@dataclass
class Decision:
    runs: list = field(default_factory=list)      # Choice
    stop: Optional[str] = None                   # answer / run-budget / nothing-fits / cannot-help / ...
    why: str = ""

    def to_dict(self) -> dict:
        return {"runs": [c.__dict__ for c in self.runs], "stop": self.stop, "why": self.why}


def setting_key(s: RecomputeSetting) -> tuple:
    """What makes two settings the same run: labels as a set (megatron-core tests membership)."""
    return (s.granularity, None if s.modules is None else frozenset(s.modules), s.method, s.num_layers,
            s.distribute_saved_activations)


def baseline_setting(current: RecomputeSetting) -> RecomputeSetting:
    """The first run: the current setting, or the [] control when it recomputes nothing."""
    if current.granularity is None or (current.granularity == "selective" and current.modules == ()):
        return RecomputeSetting.selective()
    return current.recompute


def _gb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / GB:.2f}"


def judge(m, budget: int, need: Optional[int], residual: int, baseline: bool) -> Verdict:
    """`residual`: what the device holds beyond the run's measured peak allocated (the model's
    device less allocated peak of that setting and rank)."""
    """Whether a finished run passes (PROCEDURE 5), and a stop it forces."""
    if m.launch_status == "interrupted":
        return Verdict(False, "interrupted before it ended: it runs again when the tune resumes", final=False)
    diag = m.diagnosis or {}
    if diag.get("kind") in CANNOT_HELP:
        return Verdict(False, f"{diag['kind']}: {CANNOT_HELP[diag['kind']]} ({diag['evidence']})",
                       stop="cannot-help")
    if not m.matched:
        return Verdict(False, "not matched with the baseline: " + "; ".join(m.unmatched[:2]),
                       stop="unmatched")
    if m.status != "pass":
        if m.status != "oom" and m.survived == 0 and m.launch_status != "ok":
            why = (f"the run {m.launch_status} (exit {m.returncode}) and its log shows no training: "
                   f"{m.last_line or 'empty'}")
        elif m.status == "oom" and m.ooms:
            o = m.ooms[0]
            held = "" if o.demand_gb is None else f", needing at least {o.demand_gb:.2f} GB allocated"
            why = f"out of memory in {o.stage} of iteration {o.iteration}{held}"
        elif m.status in ("nan", "incomplete"):
            why = f"{m.status}: " + "; ".join(m.notes[:2])
        else:
            why = (f"the run {m.launch_status} (exit {m.returncode}) and its log shows no training: "
                   f"{m.last_line or 'empty'}")
        if m.launch_status == "timed-out":
            why = "timed out (--timeout); " + why
        if baseline and m.status != "oom":
            return Verdict(False, why, stop="baseline-failed")
        return Verdict(False, why)
    peak = m.steady_peak_gb
    if peak is None:
        return Verdict(False, "passed, but no memory report after iteration 2 to judge its peak by",
                       stop="baseline-failed" if baseline else None)
    device = peak * GB + residual
    if device > budget:
        return Verdict(False, f"peak {peak:.3f} GB allocated + {_gb(residual)} GB beyond it on the device "
                              f"is over the {_gb(budget)} GB budget")
    if need is not None and not baseline:
        freed = None if m.delta_peak_gb is None else -m.delta_peak_gb
        if freed is None or freed * GB < need:
            return Verdict(False, f"frees {'-' if freed is None else f'{freed:.3f}'} GB at the matched "
                                  f"point, less than the {_gb(need)} GB asked")
    if need is not None and baseline:
        return Verdict(False, f"the baseline: {peak:.3f} GB allocated; the saving asked is against it")
    t = "-" if m.step_time_ms is None else f"{m.step_time_ms:.2f} ms"
    return Verdict(True, f"passed: {peak:.3f} GB allocated at its peak, step {t}")


@dataclass
class Situation:
    """What the decision looks at: the calibrated plan, what ran, what is excluded."""
    candidates: list                   # the calibrated plan's Candidates (and priced extras), plan's order
    base: object                       # the baseline's Candidate
    diagnosis: Optional[str]           # the plan's, when nothing fits
    baseline: str                      # candidate syntax
    budget: int
    need: Optional[int]                # --free-gb in bytes
    target_rank: int                   # pipeline rank the saving is measured on
    done: dict                         # candidate -> Verdict of its finished run
    costs: dict                        # candidate -> modelled cost %
    step_times: dict                   # candidate -> measured step time (ms) or None
    against_model: dict                # candidate -> why: a failure of its own; its label supersets wait
    runs_left: int
    allowed: Optional[set] = None      # --candidates: only these (setting_key of each)
    base_measured: Optional[int] = None   # the baseline's measured peak allocated on target_rank


def _saving(s: Situation, c, upper: bool = False) -> int:
    """What `c` is predicted to free against the baseline on the target rank: the baseline's
    measured peak allocated less `c`'s calibrated one (whose offset is the largest any run
    showed, so a run that saved less than modelled lowers every other prediction too); before the
    baseline measured anything, the modelled difference.

    `upper`: the least it may free, at the band's upper edge. A saving is measured at the matched
    point against the baseline's own measurement, so of the calibrated band only the error of the
    change from the measured setting applies (memory.band.CALIBRATED_DELTA of it: savings were up
    to 2x too large on the published sweeps); the terms a calibration keeps (MoE imbalance growing
    in a long run) move the baseline as much."""
    from mbridge_recompute.memory.band import CALIBRATED_DELTA

    k = s.target_rank
    error = 0
    if upper and c.ref_peaks:
        error = round(CALIBRATED_DELTA[1] * abs(c.rank_peaks[k] - c.ref_peaks[k]))
    if s.base_measured is not None:
        return s.base_measured - _allocated(s, c, k) - error
    return s.base.rank_peak(k) - c.rank_peak(k) - error


def fits(s: Situation, c) -> bool:
    """Predicted to pass at the band's upper edge: the plan's fit (its upper edge within the
    budget on every rank) and, asked for a saving, that saving at the upper edge too."""
    return bool(c.fits) and (s.need is None or _saving(s, c, upper=True) >= s.need)


def point_fits(s: Situation, c) -> bool:
    """Predicted to pass at the point estimate (the calibrated peak), whatever the band says: a
    `tight` setting, worth a run beside a fitting one (the cheaper neighbour)."""
    return c.allowed and c.peak_bytes <= s.budget and (s.need is None or _saving(s, c) >= s.need)


def eligible(s: Situation) -> list:
    """Candidates the loop may still run, cheapest first (plan's order), on their frontier: one
    that another of them beats in peak and cost alike is never the cheapest to pass, nor a
    neighbour worth a run."""
    pool = _runnable(s)
    return [c for c in pool if not any(_dominates(o, c) for o in pool if o is not c)]


def _dominates(o, c) -> bool:
    return (o.peak_bytes <= c.peak_bytes and o.cost_pct <= c.cost_pct
            and (o.peak_bytes < c.peak_bytes or o.cost_pct < c.cost_pct))


def _runnable(s: Situation) -> list:
    out = []
    for c in s.candidates:
        if not c.allowed or not getattr(c, "modelled", True) or c.setting.changes:
            continue
        if c.name in s.done or c.name == s.baseline:
            continue
        if s.allowed is not None and setting_key(c.setting) not in s.allowed:
            continue
        if any(holds_labels(c.setting, RecomputeSetting.parse(f, "tune.json")) for f in s.against_model):
            continue
        out.append(c)
    return out


def best_passed(s: Situation) -> Optional[str]:
    """The passing run with the shortest measured step time (ties: the lower modelled cost)."""
    passed = [c for c, v in s.done.items() if v.passed]
    if not passed:
        return None
    return min(passed, key=lambda c: (s.step_times.get(c) if s.step_times.get(c) is not None else math.inf,
                                      s.costs.get(c, math.inf)))


def _allocated(s: Situation, c, rank: int) -> int:
    """The calibrated peak allocated of a rank: what its memory report would show."""
    return int(c.allocated_peak(rank))


def _predicted(s: Situation, c) -> dict:
    ranks = range(len(c.rank_peaks))
    return {"rank_peak_bytes": [int(c.rank_peak(r)) for r in ranks], "peak_bytes": int(c.peak_bytes),
            "rank_allocated_bytes": [_allocated(s, c, r) for r in ranks],
            "hottest_pp_rank": c.hottest_pp_rank, "cost_pct": round(c.cost_pct, 3), "fits": fits(s, c),
            "point_fits": point_fits(s, c), "verdict": getattr(c, "verdict", None),
            "upper_bytes": int(c.upper_bytes),
            "frees_bytes": int(_saving(s, c)) if s.need is not None else None,
            "frees_at_upper_bytes": int(_saving(s, c, upper=True)) if s.need is not None else None}


def _describe(s: Situation, c) -> str:
    hot = c.hottest_pp_rank
    text = (f"predicted {_gb(_allocated(s, c, hot))} GB allocated on pp_rank {hot} ({_gb(c.peak_bytes)} GB "
            f"on the device, band to {_gb(c.upper_bytes)} GB: {c.verdict} against the {_gb(s.budget)} GB "
            f"budget), cost {c.cost_pct:.2f} %")
    if s.need is not None:
        text += f", frees {_gb(_saving(s, c))} GB ({_gb(_saving(s, c, upper=True))} at the band's edge)"
    return text


def next_round(s: Situation) -> Decision:
    """PROCEDURE 4 and 6, once the baseline has run."""
    pool = eligible(s)
    best = best_passed(s)
    if best is not None:
        bound = s.costs.get(best, math.inf)
        cheaper = [c for c in pool if c.cost_pct < bound - 1e-9]
        hopeful = [c for c in cheaper if fits(s, c)]
        if not hopeful:
            near = cheaper[-1] if cheaper else None
            why = f"{best} passed and no cheaper setting is predicted to pass"
            if near is not None:
                why += f" (the nearest, {near.name}: {_describe(s, near)})"
            return Decision(stop="answer", why=why)
    else:
        hopeful = [c for c in pool if fits(s, c)]
    if s.runs_left <= 0:
        return Decision(stop="run-budget", why="the budget of runs (--max-runs) is spent"
                        + (f"; the best so far is {best}" if best else "; no run passed"))
    if not hopeful:
        if best is not None:
            return Decision(stop="answer", why=f"{best} passed; nothing else left is predicted to pass")
        diag = s.diagnosis
        return Decision(stop="nothing-fits", why="no setting left is predicted to fit the budget"
                        + (" and free what was asked" if s.need is not None else "")
                        + (f": {diag}" if diag else ""))
    choice = hopeful[0]
    runs = [Choice(choice.name, "candidate", "the cheapest setting not yet run that is predicted to "
                   f"pass at its band's upper edge: {_describe(s, choice)}", _predicted(s, choice))]
    i = pool.index(choice)
    if s.runs_left >= 2 and i > 0:
        nb = pool[i - 1]
        if point_fits(s, nb) and not fits(s, nb):
            runs.append(Choice(nb.name, "neighbour", "its cheaper neighbour, predicted to fit at the point "
                               f"estimate only: {_describe(s, nb)}", _predicted(s, nb)))
    return Decision(runs=runs)


def first_round(report, baseline: str, current: RecomputeSetting) -> Decision:
    """PROCEDURE 1."""
    c = next((x for x in report.candidates if x.name == baseline), None) or report.current
    what = (f"the current setting {current.describe()}" if current.recompute.candidate() == baseline
            and baseline != "[]" else "the [] control (the current setting recomputes nothing)")
    ranks = range(len(c.rank_peaks))
    alloc = [int(c.allocated_peak(r)) for r in ranks]
    hot = c.hottest_pp_rank
    pred = {"rank_peak_bytes": [int(c.rank_peak(r)) for r in ranks], "rank_allocated_bytes": alloc,
            "peak_bytes": int(c.peak_bytes), "hottest_pp_rank": hot,
            "cost_pct": round(c.cost_pct, 3), "fits": bool(c.fits)}
    return Decision(runs=[Choice(baseline, "baseline", f"the baseline: {what}; uncalibrated prediction "
                                 f"{_gb(alloc[hot])} GB allocated on pp_rank {hot} ({_gb(c.peak_bytes)} GB "
                                 "on the device)", pred)])
