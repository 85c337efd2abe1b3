"""`plan(w, ...)`: the recompute plan of one workload, as the algorithm it is:

    inputs       the question read against the workload (plan/question.py)
    candidates   off, the [] control, single labels, label sets, full recompute (candidates.py)
    pricing      each candidate's peak per pipeline rank and its step cost (pricing.py)
    calibration  a measured peak anchors the model: one offset, constant across settings
                 (calibration.py), applied with the fit in one place (budget.settle)
    selection    the frontier, the cheapest fitting candidate, --free-gb's answer (search.py);
                 with --alternatives, layout / offload / optimizer points on the same frontier
    report       the PlanReport, its sentences written elsewhere (sentences.py), checked against
                 the invariants before anyone prints it (invariants.py)
"""

from __future__ import annotations

from mbridge_recompute.memory import band
from mbridge_recompute.placement import place
from mbridge_recompute.plan import calibration as calib
from mbridge_recompute.plan import invariants, question, sentences
from mbridge_recompute.plan.budget import settle
from mbridge_recompute.plan.candidates import NEGLIGIBLE_FRACTION, find  # noqa: F401 (tests read it)
from mbridge_recompute.plan.pricing import Pricer
from mbridge_recompute.plan.report import PlanReport
from mbridge_recompute.plan.search import grid_words, mark_dominated, order, recommend, refine
from mbridge_recompute.plan.summary import workload_summary
from mbridge_recompute.rules.findings import disabled_by
from mbridge_recompute.setting import RecomputeSetting


def plan(w, version=None, **options) -> PlanReport:
    """The whole planning report for workload `w` on megatron-core `version` (a
    `releases.Release`, a release string, or None for the installed / newest one). `options`
    are the fields of `question.Question`: the budget, a measurement, --free-gb, the view."""
    from mbridge_recompute.facts import releases

    release = releases.resolve(version)   # resolved once: every step below is handed the Release
    q = question.Question(**options)
    asked = question.read(q, w)
    if not place(w, release).ok:
        return invariants.checked(_refused(w, release, asked, q))

    pricer = Pricer(w, release)
    found = find(pricer)
    cands, current = list(found.candidates), found.current

    calibration = None
    if asked.measured is not None and asked.measured.hottest_bytes is not None:
        calibration = calib.calibrate(pricer, asked.measured, current.setting)

    def settle_one(c) -> None:
        settle([c], asked.budget, calibration)

    settle(cands + [current], asked.budget, calibration)
    cands += refine(pricer, cands, _accepts(asked, q, current), settle_one)

    recompute_rec = None
    if q.alternatives:
        recompute_rec, extra = _widen(pricer, cands, found.control)
        for c in extra:
            settle_one(c)
        cands += extra
    if calibration is not None:
        calib.refuse_impossible(calibration, cands + [current])

    mark_dominated(cands)
    cands.sort(key=order)
    rec = recommend(cands)
    fits = rec is not None and rec.fits
    verdict = rec.verdict if rec is not None else "no"
    free = None
    if asked.need is not None:
        target = q.rank if q.rank is not None else (
            asked.measured.failed_rank if asked.measured is not None
            and asked.measured.failed_rank is not None else current.hottest_pp_rank)
        rec, free = free_memory(cands, current, asked.need, target)
        fits = rec is not None
        verdict = "fits" if fits else "no"
    rejected = pricer.workload_errors
    if rejected:
        # megatron-core (or Bridge, or the GPU) refuses the workload under every setting: no
        # memory figure makes it run, so nothing "fits" and the exit is 1 (the text says why first)
        fits, verdict = False, "no"
    side_by_side = []
    if q.alternatives:
        from mbridge_recompute.plan import alternatives as alt

        side_by_side = alt.rows(pricer, cands, current, settle_one)

    estimate = _current_estimate(pricer)
    tight = verdict == "tight" and free is None
    cheaper = None
    if free is None and rec is not None and rec.fits and not rejected:
        # a cheaper setting whose predicted peak fits but whose band crosses the budget: a
        # calibration run can tell whether it is enough
        cheaper = next((c for c in cands if c.allowed and c.verdict == "tight" and c.point_fits
                        and order(c) < order(rec)), None)
    report = PlanReport(
        warnings=[], workload=workload_summary(w, current.setting), budget_bytes=asked.budget,
        estimate=estimate, labels=found.effects, candidates=cands, current=current,
        recommendation=rec, fits=fits, verdict=verdict,
        bands=[pricer.band(w, estimate, r, calibration is not None) for r in estimate.ranks],
        calibrate_first=sentences.calibrate_first(current, (cheaper or rec).upper_bytes, asked.budget,
                                                  cheaper, cheaper or rec, calibration is not None)
        if tight or cheaper is not None else None, cheaper_tight=cheaper,
        diagnosis=None if fits or rejected else sentences.calibrate_first(
            current, rec.upper_bytes, asked.budget, None, rec, calibration is not None) if tight
        else (sentences.no_free(free) if free else sentences.no_fit(estimate, rec, asked.budget)),
        calibration=calibration, free=free, per_rank=q.per_rank, alternatives=q.alternatives,
        recompute_recommendation=recompute_rec, side_by_side=side_by_side,
        workload_findings=rejected, assumptions=[], top=q.top,
        release=release)
    _explain(report, pricer, found, asked, q)
    from mbridge_recompute.plan.evidence import memory_notes

    report.evidence_notes = memory_notes(w)
    return invariants.checked(report)


def _current_estimate(pricer):
    """The current setting's per-rank memory, as megatron-core runs it (the checker's silent
    no-ops switched off)."""
    from mbridge_recompute import memory

    return memory.estimate(pricer.w, disabled=disabled_by(pricer._check(pricer.w)["findings"]))


def _accepts(asked, q, current) -> list:
    """What the plan asks of a candidate, as tests `refine` bisects block N against: that it
    fits, and with --free-gb that it frees enough on the asked rank."""
    tests = [lambda c: c.fits]
    if asked.need is not None:
        rank = q.rank if q.rank is not None else current.hottest_pp_rank
        base = current.rank_peak(rank)
        tests.append(lambda c: c.allowed and len(c.rank_peaks) == len(current.rank_peaks)
                     and base - c.rank_peak(rank) >= asked.need)
    return tests


def _widen(pricer, cands: list, control) -> tuple:
    """--alternatives: the cheapest pure-recompute answer, and the layout / offload / optimizer
    changes priced alone and with the recompute frontier's cheapest points."""
    from mbridge_recompute.plan import alternatives as alt

    mark_dominated(cands)
    recompute_rec = recommend(sorted(cands, key=order))
    front = sorted((c for c in cands if c.allowed and c.dominated_by is None), key=order)
    bases = [c.setting for c in front[:4]]
    bases += [c.setting for c in front if c.setting.granularity == "full"][:1]
    have = {c.setting for c in cands}
    extra = [pricer.price(s) for s in alt.settings(pricer.w, pricer.version,
                                                   list(control.rank_peaks), bases)
             if s not in have]
    return recompute_rec, extra


def free_memory(cands: list, current, need: int, rank: int) -> tuple:
    """The cheapest allowed candidate that frees at least `need` bytes on pipeline rank `rank`
    against the current setting, and the answer's facts."""
    base = current.rank_peak(rank)
    # only a candidate with the same pipeline ranks can answer for rank `rank`
    allowed = [c for c in cands if c.allowed and c.modelled
               and len(c.rank_peaks) == len(current.rank_peaks)]
    able = sorted((c for c in allowed if base - c.rank_peak(rank) >= need), key=order)
    best = max(allowed, key=lambda c: base - c.rank_peak(rank), default=None)
    pick = able[0] if able else None
    facts = {"pp_rank": rank, "free_bytes": need, "from": current.name,
             "from_peak_bytes": base, "answer": pick.name if pick else None,
             "freed_bytes": (base - pick.rank_peak(rank)) if pick else None,
             "most_freed_bytes": (base - best.rank_peak(rank)) if best else 0,
             "most_freed_by": best.name if best else None}
    return pick, facts


def _explain(report: PlanReport, pricer, found, asked, q) -> None:
    """The report's warnings and assumptions, in the order a reader needs them."""
    from mbridge_recompute.memory import coverage

    w = pricer.w
    chunks = place(w, pricer.version)
    unmodelled = coverage.unmodelled(w)      # once: the warnings and the assumptions both name them
    report.warnings = coverage.findings(w, unmodelled) + _bug_warnings(report)
    out = list(report.estimate.assumptions) + [u.sentence() for u in unmodelled]
    out += [asked.budget_text, sentences.PEAK_AND_COST,
            sentences.searched(len(report.candidates), found.combinable, chunks.distinct_chunk_sizes,
                               max(chunks.chunk_sizes), grid_words(chunks.chunk_sizes))]
    out += found.notes
    if q.alternatives:
        out.append(sentences.ALTERNATIVES)
        if w.is_moe and w.expert_model_parallel_size > 1:
            out.append(sentences.EP_OVERLAP_NOT_PRICED)
    if pricer.baseline_errors:
        out.append(sentences.baseline_errors(pricer.baseline_errors))
    out.append(calib.sentence(report.calibration) if report.calibration else calib.UNCALIBRATED)
    report.assumptions = out


def _bug_warnings(report) -> list:
    """One warning per known memory bug of the release the current setting meets (card
    `memory_bugs:`), on the rank where it keeps the most."""
    best: dict = {}
    for b in report.bands or []:
        for t in b.terms:
            if t.name.startswith(band.BUG_TERM) and t.upper > best.get(t.name, (0, ""))[0]:
                best[t.name] = (t.upper, t.why)
    return [{"id": "known-memory-bug", "severity": "warning", "kind": "model-coverage",
             "message": why, "field": name[len(band.BUG_TERM):], "value": "",
             "fix": "widened in the error band; a run of this setting measures it",
             "source": "card", "citation": "", "upstream_message": ""}
            for name, (_, why) in best.items()]


def _refused(w, release, asked, q) -> PlanReport:
    """A pipeline split megatron-core rejects: nothing to price, the findings say why."""
    from mbridge_recompute.plan.pricing import unfixable
    from mbridge_recompute.rules import check_workload

    control, off = (check_workload(s.apply(w), validator="builtin", version=release)
                    for s in (RecomputeSetting.selective(), RecomputeSetting.off()))
    problems = ", ".join(p.cid for p in place(w, release).problems)
    return PlanReport(workload=workload_summary(w, RecomputeSetting.from_workload(w)),
                      budget_bytes=asked.budget, estimate=None, labels=[], candidates=[],
                      current=None, recommendation=None, fits=False,
                      diagnosis=sentences.refused(problems), calibration=None,
                      workload_findings=unfixable(control, off), assumptions=[asked.budget_text],
                      top=q.top, release=release)
