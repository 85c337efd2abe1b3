"""The plan's sentences: its assumptions, the notes of the search, and the diagnoses when
nothing fits. The planner decides; this module only says it in words."""

from __future__ import annotations

from mbridge_recompute.units import GB

PEAK_AND_COST = ("peak = the hottest pipeline rank's predicted peak memory; replay cost = modelled "
                 "replayed forward work as % of the step, not a measured time; offload copies and "
                 "pinned host memory are their own figures, never netted into it")

ALTERNATIVES = (
    "alternatives (--alternatives), same GPU count: other pipeline sizes (PP x 2, PP / 2: the "
    "data-parallel size, micro-batches and bubble follow), other VPP sizes dividing every "
    "rank's layers, a layout moving 1-2 layers off the hottest rank, context parallelism, the "
    "distributed optimizer, fine-grained offloading of the modules holding the most; each alone "
    "and with the recompute frontier's cheapest points. Cost = change of the modelled step: "
    "micro-batches x (3 x forward + replay + exposed offload / CP transfers) x (1 + bubble), "
    "bubble = (p-1)/(v*m) for m >= p, (p-m)/m + (m-1)/(m*v) below; pipeline P2P traffic and "
    "the distributed optimizer's collectives are "
    "taken as overlapped (no modelled time)")


EP_OVERLAP_NOT_PRICED = (
    "EP overlap (overlap_moe_expert_parallel_comm) is not among the alternatives: its memory is "
    "modelled (the extra in-flight forward, one layer's forward and another's backward working "
    "sets at once), but the step model has no all-to-all time for it to hide")


def calibrate_first(current, band_upper: int, budget: int, cheaper=None, target=None,
                    calibrated: bool = False) -> str:
    """What to do when a band crosses the budget (the recommendation's, or a cheaper setting's
    whose predicted peak fits): measure the current setting, then plan again anchored on it (the
    band narrows to what changes between settings); already calibrated, run the setting itself."""
    which = (f"the cheaper {cheaper.name} (predicted {cheaper.peak_bytes / GB:.2f} GB) may fit: its band "
             if cheaper is not None else "the band of the recommendation ")
    if calibrated and target is not None:
        return (f"confirm first: {which}reaches {band_upper / GB:.2f} GB, over the "
                f"{budget / GB:.2f} GB budget, even calibrated. Run {target.name} itself for 2 "
                f"iterations (run_harness.py --candidates '{target.name}' --no-control --launch -- "
                "<the job's Bridge harness arguments> -ms 2) and compare its mem-max-allocated-"
                "gigabytes with the budget less the device terms (compare_runs.py)")
    return (f"calibrate first: {which}reaches {band_upper / GB:.2f} GB, "
            f"over the {budget / GB:.2f} GB budget. Run the current setting ({current.name}) for 2 "
            f"iterations, e.g. run_harness.py --candidates '{current.name}' --no-control --launch "
            "-- <the job's Bridge harness arguments> -ms 2, then plan again with "
            "--measured-peak-gb <the hottest rank's mem-max-allocated-gigabytes> "
            "--measured-iteration 1 (Bridge prints memory once, after iteration 1), or with "
            "--measured <compare_runs.py --json of that run>")


def searched(n: int, combinable: list, distinct_chunks, longest: int, grid: str) -> str:
    return (f"searched {n} candidates: off, the [] control, selective subsets of "
            f"{', '.join(combinable) or 'no label'} (moe not combined with the labels it contains), "
            f"full uniform N (0.16.1: dividing every model chunk) and block N for chunks of "
            f"{distinct_chunks} layers (N {grid}, up to {longest}); each checked with the built-in "
            "rules")


def not_applicable(label: str, reason: str) -> str:
    return f"label {label}: not applicable ({reason})"


def dropped(e, control) -> str:
    """Why label effect `e` left the search, in the label table's figures: its saving on the []
    control's hottest rank (the table's column) and its best on any rank (what the search judged)."""
    best = max(range(len(e.rank_saving_bytes)), key=lambda r: (e.rank_saving_bytes[r], -r))
    return (f"label {e.label}: dropped from the search: saves {e.saving_bytes / GB:+.2f} GB on the "
            f"hottest rank (pp_rank {control.hottest_pp_rank}, the label table's figure) and at best "
            f"{e.rank_saving_bytes[best] / GB:+.2f} GB on any rank (pp_rank {best}): a no-op, "
            "negligible or adding memory")


def rejected_alone(label: str, ids) -> str:
    return f"label {label}: rejected on its own by {', '.join(ids)}; not combined with other labels"


def baseline_errors(ids) -> str:
    return ("the workload has errors under every recompute setting (" + ", ".join(sorted(ids))
            + "); candidates are judged on the rest")


def refused(problems: str) -> str:
    return f"megatron-core rejects this pipeline split ({problems}); fix the layer placement first"


def no_free(free: dict) -> str:
    return (f"no allowed setting frees {free['free_bytes'] / GB:.2f} GB on pp_rank {free['pp_rank']} "
            f"against the current {free['from']}: the most is {free['most_freed_bytes'] / GB:.2f} GB "
            f"({free['most_freed_by']}); a layout change (more PP or TP, CP, VPP) or a shorter "
            "sequence / smaller micro-batch is needed there")


def no_fit(estimate, rec, budget: int) -> str:
    """Why nothing fits: static memory alone, or activations recompute cannot shrink enough."""
    worst = max(estimate.ranks, key=lambda r: r.static_bytes)
    if worst.static_bytes > budget:
        return (f"static memory alone (weights, gradients, optimizer state, residual) is "
                f"{worst.static_bytes / GB:.2f} GB on pp_rank {worst.pp_rank}, over the "
                f"{budget / GB:.2f} GB budget: no recompute setting can fit; shard more (TP, PP, EP, "
                f"the distributed optimizer over more data-parallel ranks) or use more GPUs")
    return (f"even the lowest-peak candidate ({rec.name if rec else 'none'}) is predicted over the "
            f"budget; recompute alone is not enough: shorten the sequence, lower the micro-batch, "
            f"or shard activations further (TP with SP, CP, PP)")
