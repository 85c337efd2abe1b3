"""`plan(w, ...)`: price every candidate recompute setting, mark the frontier, and recommend the
cheapest one whose predicted peak fits the budget.

Calibration: a measured peak allocated of the setting that ran (by default the current one)
anchors the model: every candidate is predicted as its modelled peak + the unexplained offset
(plan/calibration.py), applied in one place (`budget.settle`).
"""

from __future__ import annotations

from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.placement import place
from mbridge_recompute.plan import calibration as calib
from mbridge_recompute.plan.budget import budget_statement, gb_to_bytes, settle
from mbridge_recompute.plan.capacity import capacity
from mbridge_recompute.plan.labels import evaluate_labels
from mbridge_recompute.plan.measured import Measured, from_peak_gb
from mbridge_recompute.plan.pricing import Pricer, disabled_by
from mbridge_recompute.plan.report import PlanReport
from mbridge_recompute.plan.search import full_settings, mark_dominated, order, recommend, selective_settings
from mbridge_recompute.rules.findings import errors
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB

NEGLIGIBLE_FRACTION = 1e-3    # a label saving under 0.1 % of the control's peak cannot change a fit


FUSIONS = ("bias_activation_fusion", "masked_softmax_fusion", "apply_rope_fusion",
           "cross_entropy_loss_fusion", "bias_dropout_fusion", "moe_permute_fusion")


def precision(w) -> str:
    """The training precision in words: bf16 / fp16 / fp32 weights and activations, plus the
    low-precision linears."""
    base = "bf16" if w.bf16 else "fp16" if w.fp16 else "fp32 (neither bf16 nor fp16 set)"
    if w.fp8:
        base += f" + fp8 {w.fp8} {w.fp8_recipe}" + (" (fp8 params)" if w.fp8_param else "")
    if w.fp4:
        base += f" + fp4 {w.fp4}"
    return base


def fusions_on(w) -> list:
    """The memory-relevant fusions switched on (Workload fields or model keys)."""
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    out = []
    for name in FUSIONS:
        value = getattr(w, name, None) if name in w.__dataclass_fields__ else extra.get(name)
        if value:
            out.append(name + (f" ({extra.get('cross_entropy_fusion_impl', 'native')})"
                               if name == "cross_entropy_loss_fusion" else ""))
    return out


def workload_summary(w, setting: RecomputeSetting) -> dict:
    from mbridge_recompute.memory.shape import attention_core

    gpus = w.num_gpus or w.model_parallel_size
    return {"num_layers": w.num_layers, "hidden_size": w.hidden_size,
            "tp": w.tensor_model_parallel_size, "pp": w.pipeline_model_parallel_size,
            "vpp": len(place(w).chunks[0]) if place(w).ok else w.vpp,
            "cp": w.context_parallel_size, "ep": w.expert_model_parallel_size,
            "dp": w.data_parallel_size, "seq_length": w.seq_length,
            "micro_batch_size": w.micro_batch_size, "num_microbatches": w.num_microbatches,
            "num_gpus": gpus, "num_gpus_given": w.num_gpus is not None,
            "gpu_memory_gb": w.gpu_memory_gb, "gpu_capacity_bytes": capacity(w).bytes,
            "gpu_capacity": capacity(w).how, "recompute": setting.describe(),
            "precision": precision(w), "attention_backend": w.attention_backend,
            "attention_core": attention_core(w), "transformer_impl": w.transformer_impl,
            "fusions": fusions_on(w),
            "defaults_source": getattr(w, "defaults_source", None) or "mcore"}


def _refused(w, release, budget: int, assumptions: list, top) -> PlanReport:
    """A pipeline split megatron-core rejects: nothing to price, the findings say why."""
    from mbridge_recompute.rules import check_workload

    report = check_workload(w, validator="builtin", version=release)
    problems = ", ".join(p.cid for p in place(w, release.key).problems)
    return PlanReport(workload=workload_summary(w, RecomputeSetting.from_workload(w)),
                      budget_bytes=budget, estimate=None, labels=[], candidates=[], current=None,
                      recommendation=None, fits=False,
                      diagnosis=(f"megatron-core rejects this pipeline split ({problems}); "
                                 "fix the layer placement first"),
                      calibration=None, workload_findings=errors(report["findings"]), assumptions=assumptions,
                      top=top,
                      release=release)


def free_memory(cands: list, current, need: int, rank: int) -> tuple:
    """The cheapest allowed candidate that frees at least `need` bytes on pipeline rank `rank`
    against the current setting, and the answer's facts."""
    base = current.rank_peak(rank)
    allowed = [c for c in cands if c.allowed]
    able = sorted((c for c in allowed if base - c.rank_peak(rank) >= need), key=order)
    best = max(allowed, key=lambda c: base - c.rank_peak(rank), default=None)
    pick = able[0] if able else None
    facts = {"pp_rank": rank, "free_bytes": need, "from": current.name,
             "from_peak_bytes": base, "answer": pick.name if pick else None,
             "freed_bytes": (base - pick.rank_peak(rank)) if pick else None,
             "most_freed_bytes": (base - best.rank_peak(rank)) if best else 0,
             "most_freed_by": best.name if best else None}
    return pick, facts


def plan(w, budget_gb: Optional[float] = None, measured_peak_gb: Optional[float] = None,
         measured_source: str = "--measured-peak-gb", version=None,
         top: Optional[int] = None, measured: Optional[Measured] = None,
         measured_iteration: Optional[int] = None, free_gb: Optional[float] = None,
         rank: Optional[int] = None, per_rank: bool = False,
         alternatives: bool = False,
         measured_setting: Optional[RecomputeSetting] = None) -> PlanReport:
    """The whole planning report for workload `w` on megatron-core `version` (a
    `releases.Release`, a release string, or None for the installed / newest one).

    `measured` (or `measured_peak_gb` of `measured_setting`, default the current setting, on
    pipeline rank `rank` or the hottest, taken after `measured_iteration`) calibrates;
    `free_gb` asks for the cheapest setting freeing that much on pipeline rank `rank` (default:
    the rank the measurement says failed, else the hottest)."""
    from mbridge_recompute import memory
    from mbridge_recompute.facts import releases

    release = releases.resolve(version)
    version = release              # resolved once: every step below is handed the Release
    budget, budget_text = budget_statement(w, budget_gb)
    if rank is not None and not 0 <= rank < w.pipeline_model_parallel_size:
        raise InputError("--rank", f"must be a pipeline rank from 0 to "
                                   f"{w.pipeline_model_parallel_size - 1}, got {rank}")
    if measured is None and measured_peak_gb is not None:
        measured = from_peak_gb(measured_peak_gb, measured_iteration, measured_source,
                                measured_setting, rank)
    need = None if free_gb is None else gb_to_bytes(free_gb, "--free-gb")
    if not place(w, version).ok:
        return _refused(w, release, budget, [budget_text], top)

    pricer = Pricer(w, version)
    current = memory.estimate(w, disabled=disabled_by(pricer._check(w)["findings"]))
    control = pricer.price(RecomputeSetting.selective())
    effects, singles = evaluate_labels(pricer, control)

    # single labels: keep those that save something on some rank; a label the checker rejects
    # on its own stays as a (rejected) point but is not combined
    floor = NEGLIGIBLE_FRACTION * control.model_peak_bytes
    combinable, notes = [], [f"{e.label}: not applicable ({e.reason})" for e in effects
                             if e.label not in singles]
    kept = []
    for label, single in singles.items():
        saving = max((c - s for c, s in zip(control.rank_peaks, single.rank_peaks)), default=0)
        if saving <= floor:
            notes.append(f"{label}: dropped from the search, modelled saving at most {saving / GB:+.3f} GB "
                         "on any rank (no-op, negligible or adds memory)")
            continue
        kept.append(single)
        if single.allowed:
            combinable.append(label)
        else:
            notes.append(f"{label}: rejected on its own by {', '.join(single.rejected_by)}; "
                         "not combined with other labels")
    priced = {c.setting for c in kept}
    settings = [RecomputeSetting.off()] + [s for s in selective_settings(combinable)[1:]
                                           if s not in priced] + full_settings(w, version)
    cands = [control] + kept + [pricer.price(s) for s in settings]

    current_setting = RecomputeSetting.from_workload(w)
    current_cand = next((c for c in cands if c.setting == current_setting), None) \
        or pricer.price(current_setting)
    calibration = None
    if measured is not None and measured.hottest_bytes is not None:
        calibration = calib.calibrate(pricer, measured, current_setting)
    settle(cands + [current_cand], budget, calibration)
    recompute_rec = None
    if alternatives:
        from mbridge_recompute.plan import alternatives as alt

        mark_dominated(cands)
        recompute_rec = recommend(sorted(cands, key=order))
        front = sorted((c for c in cands if c.allowed and c.dominated_by is None), key=order)
        bases = [c.setting for c in front[:4]]
        bases += [c.setting for c in front if c.setting.granularity == "full"][:1]
        extra = [pricer.price(s) for s in alt.settings(w, version, list(control.rank_peaks), bases)
                 if s not in {c.setting for c in cands}]
        cands += extra
        for c in cands:
            c.dominated_by = None
        settle(cands + [current_cand], budget, calibration)
    if calibration is not None:
        calib.refuse_impossible(calibration, cands + [current_cand])
    mark_dominated(cands)
    cands.sort(key=order)
    rec = recommend(cands)
    fits = rec is not None and rec.fits
    side_by_side = alternative_rows(w, cands, current_cand) if alternatives else []
    free = None
    if need is not None:
        target = rank if rank is not None else (
            measured.failed_rank if measured is not None and measured.failed_rank is not None
            else current_cand.hottest_pp_rank)
        rec, free = free_memory(cands, current_cand, need, target)
        fits = rec is not None

    from mbridge_recompute.memory import coverage

    chunks = place(w, version)
    unmodelled = coverage.unmodelled(w)      # once: the warnings and the assumptions both name them
    assumptions = list(current.assumptions) + [u.sentence() for u in unmodelled]
    assumptions.append(budget_text)
    assumptions.append("peak = the hottest pipeline rank's predicted peak allocated memory; "
                       "cost = modelled replayed forward work as % of the step, not a measured time")
    assumptions.append(f"searched {len(cands)} candidates: off, the [] control, selective subsets of "
                       f"{', '.join(combinable) or 'no label'} (moe not combined with the labels it "
                       f"contains), full uniform N (0.16.1: dividing every model chunk) for chunks of "
                       f"{chunks.distinct_chunk_sizes} layers and block 1..{max(chunks.chunk_sizes)}; "
                       "each checked with the built-in rules")
    assumptions += [f"label {n}" for n in notes]
    if alternatives:
        assumptions.append(
            "alternatives (--alternatives), same GPU count: other VPP sizes dividing every rank's "
            "layers, a layout moving 1-2 layers off the hottest rank, context parallelism, the "
            "distributed optimizer, fine-grained offloading of the modules holding the most; each "
            "alone and with the recompute frontier's cheapest points. Cost = change of the modelled "
            "step: micro-batches x (3 x forward + replay + exposed offload / CP transfers) x "
            "(1 + bubble), bubble = (p-1)/(v*m); pipeline P2P traffic and the distributed "
            "optimizer's collectives are taken as overlapped (no modelled time)")
    if pricer.baseline_errors:
        assumptions.append("the workload has errors under every recompute setting ("
                           + ", ".join(sorted(pricer.baseline_errors))
                           + "); candidates are judged on the rest")
    assumptions.append(calib.sentence(calibration) if calibration else calib.UNCALIBRATED)

    return PlanReport(
        warnings=coverage.findings(w, unmodelled),
        workload=workload_summary(w, current_setting), budget_bytes=budget, estimate=current,
        labels=effects, candidates=cands, current=current_cand, recommendation=rec, fits=fits,
        diagnosis=None if fits else (diagnose_no_free(free) if free else
                                     diagnose_no_fit(current, rec, budget)),
        calibration=calibration, free=free, per_rank=per_rank, alternatives=alternatives,
        recompute_recommendation=recompute_rec, side_by_side=side_by_side,
        workload_findings=errors(pricer.baseline["findings"]),
        assumptions=assumptions, top=top, release=release)


def alternative_rows(w, cands: list, current) -> list:
    """Each alternative alone (on the current recompute setting) beside every allowed single
    label and full recompute with one layer per checkpoint: what it frees on the hottest rank
    against the current setting, its modelled step cost and, for layout kinds, the bubble."""
    from mbridge_recompute import memory

    now = current.setting.recompute
    cur = current.step or memory.step_cost(w)
    rows = []
    for c in cands:
        alone = c.setting.changes and c.setting.recompute == now
        single = not c.setting.changes and c.setting.granularity == "selective" \
            and len(c.setting.modules or ()) == 1
        full1 = not c.setting.changes and c.setting.granularity == "full" and c.setting.num_layers == 1
        if not (alone or single or full1) or not c.allowed:
            continue
        row = {"name": c.name, "kind": c.setting.kind, "peak_bytes": c.peak_bytes,
               "frees_bytes": current.peak_bytes - c.peak_bytes, "cost_pct": round(c.cost_pct, 3),
               "fits": c.fits, "dominated_by": c.dominated_by, "detail": ""}
        if alone:
            new = c.step
            parts = []
            if new.bubble != cur.bubble:
                parts.append(f"bubble {100 * cur.bubble:.2f} % -> {100 * new.bubble:.2f} %")
            if new.microbatches != cur.microbatches:
                parts.append(f"micro-batches {cur.microbatches} -> {new.microbatches}")
            for what, a, b in (("exposed offload", cur.offload, new.offload),
                               ("exposed CP exchange", cur.cp, new.cp)):
                if b != a:
                    parts.append(f"{what} {100 * b / (3 * new.forward):.2f} % of the compute")
            row["detail"] = ", ".join(parts)
        rows.append(row)
    return sorted(rows, key=lambda r: (r["cost_pct"], r["peak_bytes"]))


def diagnose_no_free(free: dict) -> str:
    return (f"no allowed setting frees {free['free_bytes'] / GB:.2f} GB on pp_rank {free['pp_rank']} "
            f"against the current {free['from']}: the most is {free['most_freed_bytes'] / GB:.2f} GB "
            f"({free['most_freed_by']}); a layout change (more PP or TP, CP, VPP) or a shorter "
            "sequence / smaller micro-batch is needed there")


def diagnose_no_fit(current, rec, budget: int) -> str:
    """Why nothing fits: static memory alone, or activations recompute cannot shrink enough."""
    worst = max(current.ranks, key=lambda r: r.static_bytes)
    if worst.static_bytes > budget:
        return (f"static memory alone (weights, gradients, optimizer state, residual) is "
                f"{worst.static_bytes / GB:.2f} GB on pp_rank {worst.pp_rank}, over the "
                f"{budget / GB:.2f} GB budget: no recompute setting can fit; shard more (TP, PP, EP, "
                f"the distributed optimizer over more data-parallel ranks) or use more GPUs")
    return (f"even the lowest-peak candidate ({rec.name if rec else 'none'}) is predicted over the "
            f"budget; recompute alone is not enough: shorten the sequence, lower the micro-batch, "
            f"or shard activations further (TP with SP, CP, PP)")
