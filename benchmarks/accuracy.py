"""Predicted vs measured peak-memory deltas on the published recompute studies.

For every row of the card's measured evidence (card.yaml `evidence`) this prints
the measured change of peak allocated memory against the study's control, our
memory model's predicted change on the hottest rank (at the iteration each row was
measured after: in iteration 1 the Adam state the first optimizer step creates does
not exist yet, `RankMemory.first_iteration_allocated_bytes`), and the Megatron Bridge
theoretical estimator's prediction (benchmarks/bridge_formula.py: it ignores
recompute settings, so it always predicts 0). Where our prediction and the
measurement differ by more than 25 % (of the measured change, at least 0.2 GB),
the row names the modelled term that moves most, or says "open discrepancy".
No constant is tuned to these rows.

Then it runs the planner's selection on the same workloads, with the budget the
measurements imply, and prints what it recommends; then the replay cost model against every
measured step-time change of those studies (plan/evidence.py: labels whose measured cost is far
above the model are flagged in every plan); and last, the absolute peaks of the
published Megatron-LM functional tests against ours and Megatron-LM's own formula
(benchmarks/measured_peaks.py).

    .venv/bin/python benchmarks/accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bridge_formula  # noqa: E402
import measured_peaks  # noqa: E402

from mbridge_recompute import memory  # noqa: E402
from mbridge_recompute.facts import card  # noqa: E402
from mbridge_recompute.inputs.loading import load_workload  # noqa: E402
from mbridge_recompute.plan import evidence, planner  # noqa: E402
from mbridge_recompute.setting import RecomputeSetting  # noqa: E402
from mbridge_recompute.units import GB  # noqa: E402

TOLERANCE = 0.25          # relative
FLOOR_GB = 0.2            # below this measured change, compare against 0.2 GB instead
STUDIES = {e["id"]: e["workload"] for e in card.load()["evidence"] if e.get("workload")}


def _peak_gb(row: dict):
    v = row.get("peak_allocated_gb", row.get("peak_memory_gb"))
    return float(v) if isinstance(v, (int, float)) else None


def _hot(est):
    """The rank with the largest predicted allocated peak (what the studies measured)."""
    return max(est.ranks, key=lambda r: r.allocated_peak_bytes)


def _peak_at(est, iteration) -> int:
    """Predicted peak allocated (max_memory_allocated: no residual, no memory PyTorch does not
    count) after `iteration` (None: a later, steady-state iteration), like for like with the
    studies' mem-max-allocated-gigabytes."""
    if iteration == 1:
        return max(r.first_iteration_allocated_bytes for r in est.ranks)
    return _hot(est).allocated_peak_bytes


def attribute(base, cand) -> str:
    """The modelled term whose change is largest between two hottest-rank estimates."""
    terms = {}
    for k in set(base.activations) | set(cand.activations):
        terms[f"act:{k}"] = cand.activations.get(k, 0) - base.activations.get(k, 0)
    terms["transient"] = cand.transient_bytes - base.transient_bytes
    terms["static"] = cand.static_bytes - base.static_bytes
    name, delta = max(terms.items(), key=lambda kv: abs(kv[1]))
    if abs(delta) < 2**20:
        return "no modelled term moves (the model treats this setting as a no-op here)"
    moved = f"; peak term {base.peak_term} -> {cand.peak_term}" if base.peak_term != cand.peak_term else ""
    return f"{name} {delta / GB:+.3f} GB{moved}"


def study_rows(ev: dict) -> list[dict]:
    w = load_workload(str(ROOT / STUDIES[ev["id"]]))
    rows = ev["rows"]
    if ev.get("control") == "[]":
        base_row = next(r for r in rows if r["modules"] == [])
    else:                               # no control in the study: its first row is the baseline
        base_row = rows[0]
    base_setting = RecomputeSetting.selective(*base_row["modules"])
    base_w = base_setting.apply(w)
    base_est = memory.estimate(base_w)
    base_hot = _hot(base_est)
    base_meas = _peak_gb(base_row)
    base_it = base_row.get("peak_after_iteration")
    base_pred = _peak_at(base_est, base_it)
    at = (f" after iteration 1 (steady state {base_hot.allocated_peak_bytes / GB:.2f} GB)"
          if base_it == 1 else "")
    out = [{"study": ev["id"], "setting": base_setting.candidate(), "baseline": True,
            "measured_peak_gb": base_meas, "predicted_peak_gb": base_pred / GB, "predicted_at": at,
            "predicted_activation_gb": base_hot.activation_bytes / GB,
            "bridge_activation_gb": bridge_formula.activation_bytes(base_w) / GB,
            "note": f"baseline; predicted - measured = "
                    f"{(base_pred / GB - base_meas) if base_meas else float('nan'):+.2f} GB "
                    f"(allocated against allocated: model error)"}]
    for row in rows:
        if row is base_row:
            continue
        setting = RecomputeSetting.selective(*row["modules"])
        ws = setting.apply(w)
        est = memory.estimate(ws)
        hot = _hot(est)
        # a row without a measured peak is predicted at the control's point
        row_it = row.get("peak_after_iteration") if _peak_gb(row) is not None else base_it
        pred = (_peak_at(est, row_it) - base_pred) / GB
        bridge = bridge_formula.predicted_delta_bytes(base_w, setting) / GB
        meas_peak = _peak_gb(row)
        rec = {"study": ev["id"], "setting": setting.candidate(), "baseline": False,
               "measured_peak_gb": meas_peak, "predicted_peak_gb": hot.allocated_peak_bytes / GB,
               "predicted_delta_gb": pred, "bridge_delta_gb": bridge, "outcome": row.get("outcome")}
        if meas_peak is None or base_meas is None:
            rec["measured_delta_gb"] = None
            rec["note"] = f"no peak measured ({row.get('outcome')}); modelled: {attribute(base_hot, hot)}"
            out.append(rec)
            continue
        meas = meas_peak - base_meas
        rec["measured_delta_gb"] = meas
        if row.get("approximate") or base_row.get("approximate"):
            rec["bound"] = "(approximate peaks)"
        if row_it != base_it:
            # both sides predicted at their own iteration (Adam state appears in the first step)
            rec["bound"] = f"(iteration {row_it or 'steady'} vs {base_it or 'steady'})"
        err = abs(pred - meas)
        if err > TOLERANCE * max(abs(meas), FLOOR_GB):
            rec["note"] = f"> 25 % off; term moving most: {attribute(base_hot, hot)} (open discrepancy)"
        else:
            rec["note"] = "within 25 %"
        out.append(rec)
    return out


def selection_rows() -> list[dict]:
    """What the planner recommends where the measurements say what was needed."""
    out = []
    w = load_workload(str(ROOT / "examples/moonlight_16b.yaml"))
    control = _hot(memory.estimate(RecomputeSetting.selective().apply(w))).peak_bytes
    budget = (control - 0.5 * GB) / GB
    r = planner.plan(w, budget_gb=budget).to_dict()
    out.append({"study": "moonlight_16b", "budget": f"[] control - 0.5 GB = {budget:.2f} GB",
                "recommended": r["recommendation"]["name"] if r["recommendation"] else None,
                "measured_answer": "moe_act (cheapest boundary saving > 0.5 GB)"})
    w = load_workload(str(ROOT / "examples/nemotron_3_nano.yaml"))
    full = planner.plan(w).to_dict()
    # the most any allowed selective set without `moe` can do, and the most a set with `moe` can do
    narrow = min(c["peak_bytes"] for c in full["candidates"] if c["allowed"]
                 and c["recompute_granularity"] == "selective" and "moe" not in c["recompute_modules"])
    whole = min(c["peak_bytes"] for c in full["candidates"] if c["allowed"]
                and "moe" in (c["recompute_modules"] or []))
    budget = (narrow + whole) / 2 / GB
    r = planner.plan(w, budget_gb=budget).to_dict()
    out.append({"study": "nemotron_3_nano",
                "budget": f"between the best set without moe ({narrow / GB:.2f} GB) and with moe "
                          f"({whole / GB:.2f} GB) = {budget:.2f} GB",
                "recommended": r["recommendation"]["name"] if r["recommendation"] else None,
                "measured_answer": "moe (moe_act alone did not make the step viable)"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for ev in card.load()["evidence"]:
        if ev["id"] in STUDIES:
            rows += study_rows(ev)
    sel = selection_rows()
    costs = [dict(c._asdict(), architecture=str(c.architecture), far_above=c.far_above)
             for c in evidence.checks()]
    if args.json:
        print(json.dumps({"rows": rows, "selection": sel, "cost": costs,
                          "measured_peaks": measured_peaks.rows()}, indent=2))
        return 0

    def f(x, fmt="{:+.3f}"):
        return "-" if x is None else fmt.format(x)

    print("peak allocated, decimal GB; deltas against each study's baseline row; hottest rank predicted")
    print(f"{'study':<30} {'setting':<20} {'measured':>9} {'meas d':>8} {'ours d':>8} {'bridge d':>8}  note")
    for r in rows:
        if r["baseline"]:
            print(f"{r['study']:<30} {r['setting']:<20} {f(r['measured_peak_gb'], '{:.3f}'):>9} "
                  f"{'':>8} {'':>8} {'':>8}  predicted peak {r['predicted_peak_gb']:.2f} GB"
                  f"{r['predicted_at']}; "
                  f"activations ours {r['predicted_activation_gb']:.2f} vs Bridge formula "
                  f"{r['bridge_activation_gb']:.2f} GB; {r['note']}")
        else:
            print(f"{r['study']:<30} {r['setting']:<20} {f(r['measured_peak_gb'], '{:.3f}'):>9} "
                  f"{f(r['measured_delta_gb']):>8} {f(r['predicted_delta_gb']):>8} "
                  f"{f(r['bridge_delta_gb']):>8}  {r.get('bound', '')} {r['note']}")
    print()
    print("selection on the same workloads")
    for s in sel:
        print(f"  {s['study']}: budget {s['budget']}: recommended {s['recommended']}; "
              f"measured answer: {s['measured_answer']}")
    print()
    print("replay cost: measured step-time change vs the cost model, per pair of rows differing by one "
          "label (and each set against []); FAR = measured > 3x the model and > +1 point")
    for c in evidence.checks():
        print(f"  {'FAR ' if c.far_above else '    '}{c.sentence()}")
    print()
    return measured_peaks.main([])


if __name__ == "__main__":
    sys.exit(main())
