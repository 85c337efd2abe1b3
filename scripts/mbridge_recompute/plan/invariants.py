"""What must hold in every plan report, checked in one place before it is printed.

A report that breaks one of these is a bug of the memory model or the planner, never a number
to print: `check` raises `InvariantViolation` (exit 1, the invariant named) instead. The list
below is the one statement of them; the property tests (tests/test_plan_invariants.py) drive
generated workloads through the planner and assert the same list.

The check reads the report as it is printed (`PlanReport.to_dict()`), sizes in bytes.
"""

from __future__ import annotations

import math

from mbridge_recompute.errors import Rejected
from mbridge_recompute.units import GB

# id -> the statement (what the closing notes and the error quote)
INVARIANTS = {
    "finite": "no figure is NaN or infinite",
    "budget-positive": "the budget is a positive number of bytes",
    "peak-above-static": "every peak > its static part > 0, on every pipeline rank of the current "
                         "setting and of every priced candidate (a calibrated plan's static part "
                         "includes the unexplained offset, which is kept constant as static memory is)",
    "terms-non-negative": "every activation component, transient, static term, host-memory figure and "
                          "in-flight count is >= 0, and a rank's peak is static + the larger of "
                          "activations + transient and the optimizer step's temporaries",
    "allocated-within-device": "a rank's allocated peak (what max_memory_allocated counts) is > 0 and "
                               "at most its device peak; its first-iteration figure at most that",
    "label-saving-within-tensors": "a label saves at most what its tensors hold: per layer no more than "
                                   "the layer keeps, per rank no more than the [] control's "
                                   "activations and transient there",
    "negative-saving-has-cause": "a label saves less than nothing only with its named cause (the "
                                 "tensors it pins, a larger transient)",
    "costs-non-negative": "replay cost, exposed offload copies and CP exchange are >= 0 for every "
                          "label and candidate",
    "cost-decomposes": "a candidate's cost is its replay + offload copies + layout change; the layout "
                       "change is 0 without a layout change and below 0 only where the bubble shrinks",
    "fits-within-budget": "a candidate said to fit peaks within the budget",
    "frees-is-peak-difference": "'frees' in --alternatives is peak(current) - peak(option) for the "
                                "option the row states",
    "freed-is-peak-difference": "--free-gb's freed bytes are the rank's current peak minus the "
                                "answer's there",
    "offset-is-measured-minus-predicted": "the calibration offset is the measured peak allocated minus "
                                          "the predicted one",
}

TOL_PCT = 0.005          # cost figures are printed rounded to 3 decimals


class InvariantViolation(Rejected):
    """A report that breaks an invariant: exit 1 naming it, nothing printed as a result."""

    def __init__(self, name: str, where: str):
        self.invariant = name
        super().__init__(f"invariant {name}", (
            f"{INVARIANTS[name]}; broken by {where}. This is a bug of the memory model or the "
            "planner, not of the input: no figure is printed"))


def _gb(x) -> str:
    return f"{x / GB:.3f} GB"


def _finite(obj, path: str = "report"):
    if isinstance(obj, float) and not math.isfinite(obj):
        raise InvariantViolation("finite", f"{path} = {obj}")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _finite(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _finite(v, f"{path}[{i}]")


def _ranks(r: dict) -> None:
    for rank in r["ranks"]:
        where = f"ranks[{rank['pp_rank']}]"
        terms = {f"activations.{k}": v for k, v in rank["activations"].items()}
        terms.update({f"static.{k}": v for k, v in rank["static"].items()})
        terms.update({f"transients.{k}": v for k, v in rank["transients"].items()})
        terms.update({k: rank[k] for k in ("activation_bytes", "transient_bytes", "step_bytes",
                                           "in_flight_microbatches", "host_bytes") if k in rank})
        for k, v in terms.items():
            if v < 0:
                raise InvariantViolation("terms-non-negative", f"{where}.{k} = {v}")
        moment = max(rank["activation_bytes"] + rank["transient_bytes"], rank.get("step_bytes", 0))
        if rank["peak_bytes"] != rank["static_bytes"] + moment:
            raise InvariantViolation("terms-non-negative", f"{where}: peak {rank['peak_bytes']} is not "
                                     "static + max(activations + transient, step)")
        if "allocated_peak_bytes" in rank and not (
                0 < rank["first_iteration_allocated_bytes"] <= rank["allocated_peak_bytes"]
                <= rank["peak_bytes"]):
            raise InvariantViolation("allocated-within-device", f"{where}: allocated "
                                     f"{_gb(rank['allocated_peak_bytes'])} (iteration 1 "
                                     f"{_gb(rank['first_iteration_allocated_bytes'])}), device "
                                     f"{_gb(rank['peak_bytes'])}")
        if abs(sum(rank["activations"].values()) - rank["activation_bytes"]) > len(rank["activations"]):
            raise InvariantViolation("terms-non-negative", f"{where}: the activation components do "
                                     "not sum to the activations")
        if not rank["peak_bytes"] > rank["static_bytes"] > 0:
            raise InvariantViolation("peak-above-static", f"{where}: peak {_gb(rank['peak_bytes'])}, "
                                     f"static {_gb(rank['static_bytes'])}")


def _offsets(r: dict, ranks: int) -> list:
    cal = r.get("calibration")
    return list(cal["rank_offset_bytes"]) if cal else [0] * ranks


def _candidate(c: dict, budget: int, current_bubble, what: str) -> None:
    if c["peak_bytes"] is None:                  # a layout megatron-core rejects: no estimate
        return
    for r, (peak, static, offset) in enumerate(zip(c["rank_peak_bytes"], c["rank_static_bytes"],
                                                   c["rank_offset_bytes"])):
        part = static + offset
        if not peak > part > 0:
            raise InvariantViolation("peak-above-static", f"{what} on pp_rank {r}: peak {_gb(peak)}, "
                                     f"static part {_gb(part)}")
    for k in ("host_bytes",):
        if c[k] < 0:
            raise InvariantViolation("terms-non-negative", f"{what}.{k} = {c[k]}")
    for k in ("replay_pct", "offload_pct", "cp_pct"):
        if c[k] < 0:
            raise InvariantViolation("costs-non-negative", f"{what}.{k} = {c[k]}")
    if abs(c["cost_pct"] - (c["replay_pct"] + c["offload_pct"] + c["layout_pct"])) > 3 * TOL_PCT:
        raise InvariantViolation("cost-decomposes", f"{what}: cost {c['cost_pct']} % vs replay "
                                 f"{c['replay_pct']} + offload {c['offload_pct']} + layout "
                                 f"{c['layout_pct']}")
    if abs(c["layout_pct"]) > TOL_PCT and not c.get("changes"):
        raise InvariantViolation("cost-decomposes", f"{what}: layout change {c['layout_pct']} % "
                                 "without a layout change")
    if c["layout_pct"] < -TOL_PCT and not (current_bubble is not None
                                           and c["bubble_pct"] < current_bubble):
        raise InvariantViolation("cost-decomposes", f"{what}: layout change {c['layout_pct']} % "
                                 f"with a bubble of {c['bubble_pct']} % (current {current_bubble} %)")
    if c["fits"] and c["peak_bytes"] > budget:
        raise InvariantViolation("fits-within-budget", f"{what}: peak {_gb(c['peak_bytes'])} over "
                                 f"the {_gb(budget)} budget")


def _labels(r: dict, offsets: list) -> None:
    control = next((c for c in r["candidates"] if c["name"] == "[]"), None)
    for e in r["labels"]:
        what = f"label {e['label']}"
        if e["cost_pct"] < 0 or e.get("offload_pct", 0) < 0:
            raise InvariantViolation("costs-non-negative", f"{what}: cost {e['cost_pct']} %, "
                                     f"offload {e.get('offload_pct')} %")
        if not e["applicable"]:
            continue
        for kind, saving in e["per_layer_saving_bytes"].items():
            held = e["per_layer_bytes"].get(kind, 0)
            if saving > held:
                raise InvariantViolation("label-saving-within-tensors", f"{what}: saves "
                                         f"{_gb(saving)} per {kind} layer, which keeps {_gb(held)}")
        if control is not None and control["peak_bytes"] is not None:
            for k, saving in enumerate(e["rank_saving_bytes"]):
                held = control["rank_peak_bytes"][k] - offsets[k] - control["rank_static_bytes"][k]
                if saving > held:
                    raise InvariantViolation("label-saving-within-tensors", f"{what}: saves "
                                             f"{_gb(saving)} on pp_rank {k}, where the [] control "
                                             f"holds {_gb(held)} above static")
        if (e["saving_bytes"] < 0 or min(e["rank_saving_bytes"], default=0) < 0) \
                and not e.get("adds_memory_because"):
            raise InvariantViolation("negative-saving-has-cause", f"{what}: saving "
                                     f"{_gb(e['saving_bytes'])} with no cause named")


def _alternatives(r: dict) -> None:
    current = r["current"]
    for row in r["alternatives"]:
        if row["frees_bytes"] != current["peak_bytes"] - row["peak_bytes"] or not row.get("relation"):
            raise InvariantViolation("frees-is-peak-difference", f"row {row['name']}: frees "
                                     f"{_gb(row['frees_bytes'])}, peaks {_gb(current['peak_bytes'])} "
                                     f"(current) and {_gb(row['peak_bytes'])}")
        for k in ("replay_pct", "offload_pct", "cp_pct"):
            if row[k] < 0:
                raise InvariantViolation("costs-non-negative", f"row {row['name']}.{k} = {row[k]}")


def _free(r: dict) -> None:
    f = r.get("free")
    if not f or f["answer"] is None:
        return
    answer = next(c for c in r["candidates"] if c["name"] == f["answer"])
    if f["freed_bytes"] != f["from_peak_bytes"] - answer["rank_peak_bytes"][f["pp_rank"]]:
        raise InvariantViolation("freed-is-peak-difference", f"--free-gb answer {f['answer']}")


def _calibration(r: dict) -> None:
    cal = r.get("calibration")
    if cal and cal["offset_bytes"] != cal["measured_allocated_bytes"] - cal["predicted_allocated_bytes"]:
        raise InvariantViolation("offset-is-measured-minus-predicted", f"offset {cal['offset_bytes']}")


def check(report) -> None:
    """Raise InvariantViolation for the first invariant `report` breaks."""
    try:
        r = report.to_dict()
    except (ValueError, OverflowError) as e:       # int() of a NaN or an infinite figure
        raise InvariantViolation("finite", f"a figure that is not a number ({e})") from None
    _finite(r)
    if not r["budget_bytes"] > 0:
        raise InvariantViolation("budget-positive", f"budget_bytes = {r['budget_bytes']}")
    _ranks(r)
    offsets = _offsets(r, len(r["ranks"]))
    current = r.get("current")
    bubble = current["bubble_pct"] if current else None
    for c in r["candidates"]:
        _candidate(c, r["budget_bytes"], bubble, f"candidate {c['name']}")
    if current is not None:
        _candidate(current, r["budget_bytes"], bubble, "the current setting")
    _labels(r, offsets)
    _alternatives(r)
    _free(r)
    _calibration(r)


def checked(report):
    """`report`, once it holds every invariant."""
    check(report)
    return report
