"""Choosing a recompute setting: candidates, their memory/cost frontier, a recommendation.

The selector owns no memory arithmetic and no rules. For each candidate setting
it asks the memory model for the hottest PP rank's peak (`memory.estimate`) and
the replay cost (`memory.replay_cost_pct`), and asks the checker whether the
setting is allowed (`rules.check_workload`). The objective is the least replay
cost whose predicted peak fits the budget.

Candidates:
- "off" (no recompute) and the selective `[]` control;
- selective label subsets of the labels that do something on this architecture
  (`LabelEffect.applicable` and a positive modelled saving), without redundant
  nesting (`moe` already contains `moe_act` and `shared_experts`, card.yaml);
- full recompute `uniform:N` for N dividing the layers of every model chunk
  (megatron-core 0.16.1 raises IndexError otherwise, transformer_block.py:532-542
  @ core_v0.16.1) and `block:N` for N = 1 .. the largest chunk
  (recompute_num_layers counts per model chunk, transformer_block.py:326).

Calibration: a measured peak of the `[]` control run anchors the model: every
candidate is predicted as measured control peak + modelled delta from the
control.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.output import GB
from mbridge_recompute.setting import RecomputeSetting

HEADROOM_FRACTION = 0.05      # default budget: GPU memory minus max(5 %, 2 GB)
HEADROOM_MIN_GB = 2.0
MAX_SUBSET_LABELS = 10        # beyond this many useful labels, subsets are capped (never hit in 0.16.1)
NEGLIGIBLE_FRACTION = 1e-3    # a label saving under 0.1 % of the control's peak cannot change a fit

CAVEAT = ("The recommendation is a prediction, not a measurement: run it against the matched "
          "selective [] control (run_harness.py --from-plan plan.json) and keep it only if the "
          "measured peak fits and the step time is acceptable.")


# --------------------------------------------------------------------------- data

@dataclass
class Candidate:
    setting: RecomputeSetting
    model_peak_bytes: int             # hottest rank, as modelled
    peak_bytes: int                   # hottest rank, calibrated when a measurement was given
    hottest_pp_rank: int
    peak_term: str
    cost_pct: float
    allowed: bool = True
    rejected_by: list = field(default_factory=list)     # ids of error findings
    fits: bool = False
    dominated_by: Optional[str] = None
    rank_peaks: list = field(default_factory=list)      # modelled peak of every PP rank

    @property
    def name(self) -> str:
        return self.setting.candidate()

    def as_dict(self) -> dict:
        d = {"name": self.name, "describe": self.setting.describe()}
        d.update(self.setting.as_fields())
        d.update({"peak_bytes": int(self.peak_bytes), "model_peak_bytes": int(self.model_peak_bytes),
                  "hottest_pp_rank": self.hottest_pp_rank, "peak_term": self.peak_term,
                  "cost_pct": round(self.cost_pct, 3), "fits": self.fits, "allowed": self.allowed,
                  "rejected_by": list(self.rejected_by), "dominated": self.dominated_by is not None,
                  "dominated_by": self.dominated_by})
        return d


@dataclass
class Calibration:
    measured_peak_bytes: int
    control_model_peak_bytes: int
    source: str

    @property
    def offset_bytes(self) -> int:
        return self.measured_peak_bytes - self.control_model_peak_bytes

    def as_dict(self) -> dict:
        return {"measured_peak_bytes": self.measured_peak_bytes,
                "control_model_peak_bytes": self.control_model_peak_bytes,
                "offset_bytes": self.offset_bytes, "source": self.source}


# --------------------------------------------------------------------------- budget

def default_budget_bytes(w) -> int:
    cap = w.gpu_memory_gb * GB
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
    return b, (f"budget {b / GB:.2f} GB = cluster.gpu_memory_gb {w.gpu_memory_gb:g} GB minus a headroom of "
               f"max({HEADROOM_FRACTION:.0%}, {HEADROOM_MIN_GB:g} GB) for allocator fragmentation and "
               "workspaces the model does not itemise (override with --budget-gb)")


# --------------------------------------------------------------------------- layers per chunk

def chunk_layer_counts(w) -> list[int]:
    """Decoder layers of every model chunk (PP rank x virtual stage), as MCore splits them."""
    pp, vpp = w.pipeline_model_parallel_size, w.vpp
    total = len(w.layer_kinds()) if w.hybrid_override_pattern else w.num_layers
    first, last = w.num_layers_in_first_pipeline_stage, w.num_layers_in_last_pipeline_stage
    stages = [None] * pp
    if first or last:
        rest_ranks = pp - (1 if first else 0) - (1 if last else 0)
        rest = total - (first or 0) - (last or 0)
        middle = rest // rest_ranks if rest_ranks > 0 else 0
        stages = [middle] * pp
        if first:
            stages[0] = first
        if last:
            stages[-1] = last
    else:
        stages = [total // pp] * pp
    chunks = []
    for n in stages:
        base, extra = divmod(n, vpp)
        chunks += [base + (1 if i < extra else 0) for i in range(vpp)]
    return [c for c in chunks if c > 0] or [total]


def full_settings(w, version: Optional[str] = None) -> list[RecomputeSetting]:
    """uniform:N and block:N candidates. 0.16.1 needs N to divide every chunk for uniform
    (IndexError otherwise, tb:532-542 @ core_v0.16.1); main clamps the last group
    (recompute.py:157-166 @ d98e8a6), so any N up to the chunk works there."""
    from mbridge_recompute.facts import releases

    chunks = chunk_layer_counts(w)
    g = 0
    for c in chunks:
        g = math.gcd(g, c)
    if releases.resolve_version(version or releases.target_version()) == "0.16.1":
        uniform = [RecomputeSetting.full("uniform", n) for n in range(1, g + 1) if g % n == 0]
    else:
        uniform = [RecomputeSetting.full("uniform", n) for n in range(1, max(chunks) + 1)]
    block = [RecomputeSetting.full("block", n) for n in range(1, max(chunks) + 1)]
    return uniform + block


# --------------------------------------------------------------------------- selective subsets

def _nested() -> dict:
    """label -> labels it contains (card.yaml `contains`)."""
    from mbridge_recompute.facts import card

    return {e["label"]: set(e.get("contains") or []) for e in card.load()["labels"]}


def applicable_labels(effects) -> tuple[list[str], list[str]]:
    """(labels that do something on this architecture, notes on the ones that do not)."""
    keep, notes = [], []
    for e in effects:
        if e.applicable:
            keep.append(e.label)
        else:
            notes.append(f"{e.label}: not applicable ({e.reason})")
    return keep, notes


def best_rank_saving(control: Candidate, single: Candidate) -> int:
    """The largest saving a label gives on any PP rank. Not only the hottest: a label that helps
    another rank matters once other labels have lowered the hottest one below it."""
    return max((c - s for c, s in zip(control.rank_peaks, single.rank_peaks)), default=0)


def selective_settings(labels: list[str]) -> list[RecomputeSetting]:
    """Every subset of `labels` except redundant nests; the empty set is the control."""
    contains = _nested()
    labels = list(labels)[:MAX_SUBSET_LABELS]
    out = [RecomputeSetting.selective()]
    for k in range(1, len(labels) + 1):
        for combo in itertools.combinations(labels, k):
            chosen = set(combo)
            if any(contains.get(a, set()) & chosen for a in chosen):
                continue                          # e.g. moe with moe_act: moe already replays it
            out.append(RecomputeSetting.selective(*combo))
    return out


# --------------------------------------------------------------------------- evaluation

def _hottest(est):
    return max(est.ranks, key=lambda r: r.peak_bytes)


def evaluate(w, setting: RecomputeSetting, check, baseline_errors: set) -> Candidate:
    from mbridge_recompute import memory

    ws = setting.apply(w)
    est = memory.estimate(ws)
    hot = _hottest(est)
    cost = float(memory.replay_cost_pct(ws)) if setting.granularity else 0.0
    cand = Candidate(setting=setting, model_peak_bytes=int(hot.peak_bytes), peak_bytes=int(hot.peak_bytes),
                     hottest_pp_rank=hot.pp_rank, peak_term=hot.peak_term, cost_pct=cost,
                     rank_peaks=[int(r.peak_bytes) for r in est.ranks])
    report = check(ws)
    errors = sorted({f["id"] for f in report["findings"] if f["severity"] == "error"} - baseline_errors)
    if errors:
        cand.allowed, cand.rejected_by = False, errors
    return cand


def mark_dominated(cands: list[Candidate]) -> None:
    """A candidate is dominated when another allowed one is no worse in peak and cost and better in one."""
    allowed = [c for c in cands if c.allowed]
    for c in allowed:
        for o in allowed:
            if o is c:
                continue
            if o.peak_bytes <= c.peak_bytes and o.cost_pct <= c.cost_pct and \
                    (o.peak_bytes < c.peak_bytes or o.cost_pct < c.cost_pct):
                c.dominated_by = o.name
                break


def _order(c: Candidate):
    # cheapest first; among equal cost the lower peak, then the simpler setting
    return (round(c.cost_pct, 9), c.peak_bytes, _complexity(c.setting))


def _complexity(s: RecomputeSetting) -> int:
    if s.granularity is None:
        return 0
    if s.granularity == "selective":
        return 1 + len(s.modules or ())
    return 100 + (s.num_layers or 0)


def recommend(cands: list[Candidate]) -> tuple[Optional[Candidate], bool]:
    """(chosen, fits): the cheapest allowed candidate that fits, else the lowest-peak allowed one."""
    allowed = [c for c in cands if c.allowed]
    fitting = sorted((c for c in allowed if c.fits), key=_order)
    if fitting:
        return fitting[0], True
    if not allowed:
        return None, False
    return min(allowed, key=lambda c: (c.peak_bytes, c.cost_pct)), False


def harness_candidates(rec: Optional[Candidate], frontier: list[Candidate], neighbours: int = 2) -> list[str]:
    """The matched sweep: the [] control, the recommendation and its `neighbours` nearest
    (in replay cost) fitting frontier points."""
    out = ["[]"]
    if rec is None or rec.name in ("[]", "none"):
        return out                       # nothing to recompute: the control run alone confirms the fit
    out.append(rec.name)
    fitting = [c for c in frontier if c.fits and c.setting.granularity is not None and c.name not in out]
    fitting.sort(key=lambda c: abs(c.cost_pct - rec.cost_pct))
    return out + [c.name for c in fitting[:neighbours]]


# --------------------------------------------------------------------------- calibration

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


def search(w, effects, control_cand: Candidate, check, baseline_errors: set,
           version: Optional[str]) -> tuple[list, list, list]:
    """Evaluate every candidate. Returns (candidates, labels searched, notes on labels left out)."""
    labels, dropped = applicable_labels(effects)
    floor = NEGLIGIBLE_FRACTION * control_cand.model_peak_bytes
    singles, keep = [], []
    for lb in labels:
        c = evaluate(w, RecomputeSetting.selective(lb), check, baseline_errors)
        saving = best_rank_saving(control_cand, c)
        if saving <= floor:
            # a no-op, a negligible saving or added memory on every rank: never worth its replay
            dropped.append(f"{lb}: dropped from the search, modelled saving at most {saving / GB:+.3f} GB "
                           "on any rank (no-op, negligible or adds memory)")
            continue
        singles.append(c)
        if c.allowed:
            keep.append(lb)
        else:
            # rejected on its own, so in every set that holds it: keep the single (the report
            # says why) and leave the label out of the combinations
            dropped.append(f"{lb}: rejected on its own by {', '.join(c.rejected_by)}; "
                           "not combined with other labels")
    labels = keep
    single_settings = {c.setting for c in singles}
    settings = [RecomputeSetting.off()] + [s for s in selective_settings(labels)[1:]
                                           if s not in single_settings] + full_settings(w, version)
    cands = [control_cand] + singles + [evaluate(w, s, check, baseline_errors) for s in settings]
    return cands, labels, dropped


def diagnose_no_fit(current, rec: Optional[Candidate], budget: int) -> str:
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


# --------------------------------------------------------------------------- the plan

def plan(w, budget_gb: Optional[float] = None, measured_peak_gb: Optional[float] = None,
         measured_source: str = "--measured-peak-gb", version: Optional[str] = None,
         neighbours: int = 2) -> dict:
    """The whole planning report (plain data; sizes in bytes)."""
    from mbridge_recompute import memory
    from mbridge_recompute.rules import check_workload

    budget, budget_text = budget_statement(w, budget_gb)
    measured_bytes = None if measured_peak_gb is None else gb_to_bytes(measured_peak_gb, measured_source)

    current = memory.estimate(w)
    effects = [e for e in memory.label_effects(w, version=version)]

    def check(ws):
        return check_workload(ws, validator="builtin", version=version)

    control = RecomputeSetting.selective()
    baseline = check(control.apply(w))
    baseline_errors = {f["id"] for f in baseline["findings"] if f["severity"] == "error"}

    control_cand = evaluate(w, control, check, baseline_errors)
    cands, labels, dropped = search(w, effects, control_cand, check, baseline_errors, version)

    calibration = None
    if measured_bytes is not None:
        calibration = Calibration(measured_bytes, control_cand.model_peak_bytes, measured_source)
        for c in cands:
            c.peak_bytes = c.model_peak_bytes + calibration.offset_bytes
    for c in cands:
        c.fits = c.allowed and c.peak_bytes <= budget
    mark_dominated(cands)
    cands.sort(key=_order)
    frontier = [c for c in cands if c.allowed and c.dominated_by is None]
    rec, fits = recommend(cands)

    current_setting = RecomputeSetting.from_workload(w)
    current_cand = next((c for c in cands if c.setting == current_setting), None)
    if current_cand is None:
        current_cand = evaluate(w, current_setting, check, baseline_errors)
        if calibration:
            current_cand.peak_bytes += calibration.offset_bytes
        current_cand.fits = current_cand.allowed and current_cand.peak_bytes <= budget

    assumptions = list(current.assumptions)
    assumptions.append(budget_text)
    assumptions.append("peak = the hottest pipeline rank's predicted peak allocated memory; "
                       "cost = modelled replayed forward work as % of the step, not a measured time")
    assumptions.append(f"searched {len(cands)} candidates: off, the [] control, selective subsets of "
                       f"{', '.join(labels) or 'no label'} (moe not combined with the labels it contains), "
                       f"full uniform N (0.16.1: dividing every model chunk) for chunks of "
                       f"{sorted(set(chunk_layer_counts(w)))} layers "
                       f"and block 1..{max(chunk_layer_counts(w))}; each checked with the built-in rules")
    assumptions += [f"label {d}" for d in dropped]
    if baseline_errors:
        assumptions.append("the workload has errors under every recompute setting ("
                           + ", ".join(sorted(baseline_errors)) + "); candidates are judged on the rest")
    if calibration:
        assumptions.append(
            f"calibrated: the [] control's modelled peak {calibration.control_model_peak_bytes / GB:.2f} GB "
            f"is anchored to the measured {calibration.measured_peak_bytes / GB:.2f} GB ({measured_source}); "
            f"each candidate = measured + its modelled delta from the control "
            f"(offset {calibration.offset_bytes / GB:+.2f} GB)")
    else:
        assumptions.append("uncalibrated: pass --measured-peak-gb (or --measured compare.json) with the "
                           "[] control's measured peak to anchor the predictions")

    recommendation = None
    if rec is not None:
        from mbridge_recompute.write.snippets import render_all

        recommendation = rec.as_dict()
        recommendation["fits"] = fits
        recommendation["budget_bytes"] = budget
        recommendation["snippets"] = render_all(rec.setting)
        recommendation["caveat"] = CAVEAT

    hottest_now = _hottest(current)
    diagnosis = None if fits else diagnose_no_fit(current, rec, budget)

    return {
        "workload": {"num_layers": w.num_layers, "hidden_size": w.hidden_size,
                     "tp": w.tensor_model_parallel_size, "pp": w.pipeline_model_parallel_size,
                     "vpp": w.vpp, "cp": w.context_parallel_size, "ep": w.expert_model_parallel_size,
                     "dp": w.data_parallel_size, "seq_length": w.seq_length,
                     "micro_batch_size": w.micro_batch_size, "num_microbatches": w.num_microbatches,
                     "gpu_memory_gb": w.gpu_memory_gb, "recompute": current_setting.describe()},
        "budget_bytes": budget,
        "ranks": [r.as_dict() for r in current.ranks],
        "hottest_pp_rank": hottest_now.pp_rank,
        "labels": [e.as_dict() for e in effects],
        "current": current_cand.as_dict(),
        "frontier": [c.as_dict() for c in frontier],
        "candidates": [c.as_dict() for c in cands],
        "recommendation": recommendation,
        "fits": fits,
        "diagnosis": diagnosis,
        "harness_candidates": harness_candidates(rec, frontier, neighbours),
        "calibration": calibration.as_dict() if calibration else None,
        "workload_findings": [f for f in baseline["findings"] if f["severity"] == "error"],
        "assumptions": assumptions,
    }
