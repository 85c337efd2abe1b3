"""`plan`: per-rank memory, per-label saving and cost, and the cheapest setting that fits."""

from __future__ import annotations

from pathlib import Path

from mbridge_recompute import files
from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mbridge_recompute.units import GB, gb

DESCRIPTION = ("Estimate per-pipeline-rank memory, each recompute label's saving and replay cost, "
               "and recommend the cheapest recompute setting whose predicted peak fits the budget. "
               "With no workload it plans the embedded default (Llama3 70B FP8, TP4 PP4 VPP5, 32 x 80 GB).")
EPILOG = """examples:
  plan.py                                        # the embedded default workload
  plan.py examples/moonlight_16b.yaml --budget-gb 36.1 --json
  plan.py --model deepseek-v3 --set model.virtual_pipeline_model_parallel_size=2
  plan.py WORKLOAD.yaml --measured-peak-gb 66.3  # anchor to the measured [] control peak
  plan.py WORKLOAD.yaml --top 3 --json > plan.json && run_harness.py --from-plan plan.json ...
                                                 # the sweep: [] control, the recommendation, 3 neighbours

exit codes: 0 a fitting setting exists, 1 nothing fits the budget, 2 unusable input."""


def add_arguments(parser) -> None:
    from mbridge_recompute.inputs.loading import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--budget-gb", type=float, metavar="GB",
                        help="per-GPU memory budget in decimal GB (default: cluster.gpu_memory_gb "
                             "minus max(5%%, 2 GB))")
    cal = parser.add_mutually_exclusive_group()
    cal.add_argument("--measured-peak-gb", type=float, metavar="GB",
                     help="measured peak allocated GB of the selective [] control run; anchors predictions")
    cal.add_argument("--measured", metavar="COMPARE.json",
                     help="`compare --json` output; its control run's peak_allocated_gb anchors predictions")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout (sizes in bytes)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw per-rank stacked memory bars and the memory/cost frontier "
                             "(needs matplotlib)")
    parser.add_argument("--force", action="store_true", help="overwrite the --plot file if it exists")
    parser.add_argument("--top", type=int, metavar="N",
                        help="keep only the N frontier points nearest the recommendation in cost "
                             "(text and JSON), and sweep the recommendation's N nearest fitting "
                             "neighbours in harness_candidates, what run_harness.py --from-plan "
                             "runs (default 2)")


def run(args) -> int:
    from mbridge_recompute.inputs.loading import load_from_args
    from mbridge_recompute.plan.budget import measured_peak_from_compare
    from mbridge_recompute.plan.planner import plan

    if args.top is not None and args.top < 1:
        raise InputError("--top", f"must be >= 1, got {args.top}")
    if args.plot:
        files.check_target(Path(args.plot), args.force, "--plot", (".png", ".svg", ".pdf"))
    from mbridge_recompute.facts import releases

    release = releases.target(args.mcore_version)
    w = load_from_args(args, release.requested, default=True)
    measured, source = args.measured_peak_gb, "--measured-peak-gb"
    if args.measured:
        measured, source = measured_peak_from_compare(args.measured), f"--measured {args.measured}"
    report = plan(w, budget_gb=args.budget_gb, measured_peak_gb=measured, measured_source=source,
                  version=release, top=args.top)
    if w.not_modelled:   # input fields that can change memory and that the model does not represent
        report.assumptions.append("not modelled (read from the input, can change memory): "
                                  + "; ".join(w.not_modelled))
    if args.model:
        from mbridge_recompute.inputs import catalog

        report.extra["model_source"] = catalog.describe(args.model)
    if args.plot:
        report.extra["plot"] = _plot(report, Path(args.plot), args.force)
    from mbridge_recompute.output import emit

    emit(report, args.json, render_text)
    return EXIT_OK if report.fits else EXIT_PROBLEM


# --------------------------------------------------------------------------- text



TEXT_FRONTIER_ROWS = 15      # frontier rows in the text report when --top is not given


def render_text(r) -> str:
    """The plan as text, read from the PlanReport's attributes."""

    wl = r.workload
    out = [f"workload: {wl['num_layers']} layers, hidden {wl['hidden_size']}, TP{wl['tp']} PP{wl['pp']} "
           f"VPP{wl['vpp']} CP{wl['cp']} EP{wl['ep']} DP{wl['dp']}, seq {wl['seq_length']}, "
           f"MBS {wl['micro_batch_size']}, {wl['num_microbatches']} micro-batches, "
           f"{wl['gpu_memory_gb']:g} GB GPUs; recompute now: {wl['recompute']}",
           f"megatron-core {r.release.name}: {r.release.how}",
           f"budget: {gb(r.budget_bytes)} GB per GPU (sizes below in decimal GB)"]
    m = r.extra.get("model_source")
    if m:
        out.append(f"model: {m['title']} (catalog '{m['name']}'); layout: "
                   + ("from the cited recipe/study" if m.get("layout_source") else
                      "not in the catalog, defaults or your --set/workload values"))
    out.append("")
    if r.estimate is not None:
        out += _rank_table(r) + [""] + _label_table(r) + [""] + _frontier_table(r) + [""]
    cur = r.current
    if cur is not None:
        out.append(f"current setting {cur.setting.describe()}: predicted peak {gb(cur.peak_bytes)} GB, "
                   f"replay cost {cur.cost_pct:.2f} %, "
                   + ("fits" if cur.fits else "does not fit" if cur.allowed else
                      "rejected: " + ", ".join(cur.rejected_by)))
    rec = r.recommendation
    if rec is None:
        out.append("recommendation: none" + (" (every candidate is rejected by the checker)"
                                             if r.candidates else ""))
    else:
        from mbridge_recompute.plan.report import CAVEAT
        from mbridge_recompute.write.snippets import render_all

        verdict = "fits" if r.fits else "does NOT fit"
        out.append(f"recommendation: {rec.setting.describe()} ({rec.name}): predicted peak "
                   f"{gb(rec.peak_bytes)} GB on pp_rank {rec.hottest_pp_rank}, replay cost "
                   f"{rec.cost_pct:.2f} %, {verdict} the {gb(r.budget_bytes)} GB budget")
        snip = render_all(rec.setting)
        if snip.get("yaml"):
            out += ["", "Bridge YAML:", snip["yaml"].rstrip()]
        if snip.get("overrides"):
            out += ["", "Hydra overrides: " + " ".join(snip["overrides"])]
        out += ["", "matched sweep candidates: " + " ".join(r.harness_candidates), "  " + CAVEAT]
    if r.diagnosis:
        out += ["", "nothing fits: " + r.diagnosis]
    if r.workload_findings:
        out += ["", "errors under every setting (fix the workload first):"]
        out += [f"  {f['id']}: {f['message']}" for f in r.workload_findings]
    out += ["", "assumptions:"] + [f"  - {a}" for a in r.assumptions]
    return "\n".join(out)


def _rank_table(r) -> list:
    """Per-rank memory under the current setting, activations by component."""
    from mbridge_recompute.output import table

    ranks = r.estimate.ranks
    comps: dict = {}
    for rank in ranks:
        for k, v in rank.activations.items():
            comps[k] = comps.get(k, 0) + v
    shown = [k for k, _ in sorted(comps.items(), key=lambda kv: -kv[1])][:6]
    headers = ["pp_rank", "static"] + [f"act:{k}" for k in shown]
    if len(comps) > len(shown):
        headers.append("act:other")
    headers += ["activations", "transient", "peak", "peak term"]
    rows = []
    for rank in ranks:
        row = [rank.pp_rank, gb(rank.static_bytes)] + [gb(rank.activations.get(k, 0)) for k in shown]
        if len(comps) > len(shown):
            row.append(gb(sum(v for k, v in rank.activations.items() if k not in shown)))
        row += [gb(rank.activation_bytes), gb(rank.transient_bytes), gb(rank.peak_bytes),
                rank.peak_term]
        rows.append(row)
    return [f"memory per pipeline rank (current setting; hottest rank {r.hottest_pp_rank})",
            table(headers, rows, "r" * (len(headers) - 1) + "l")]


def _label_table(r) -> list:
    from mbridge_recompute.output import table

    rows = [[e.label, "yes" if e.applicable else "no", gb(e.saving_bytes) if e.applicable else "-",
             f"{e.cost_pct:.2f}" if e.applicable else "-", e.reason] for e in r.labels]
    return ["recompute labels (saving on the hottest rank vs the [] control)",
            table(["label", "applies", "saving GB", "cost %", "why"], rows, "llrrl")]


def _frontier_table(r) -> list:
    from mbridge_recompute.output import table

    front = r.shown_frontier
    limit = r.top or TEXT_FRONTIER_ROWS
    rows = [[c.name, gb(c.peak_bytes), f"{c.cost_pct:.2f}", "yes" if c.fits else "no", c.peak_term]
            for c in front[:limit]]
    more = len(front) - min(limit, len(front))
    dominated = sum(1 for c in r.candidates if c.dominated_by is not None)
    rejected = [c for c in r.candidates if not c.allowed]
    out = [f"frontier (peak vs replay cost; {dominated} dominated and {len(rejected)} rejected "
           f"candidates not shown{f', {more} more points' if more > 0 else ''})",
           table(["candidate", "peak GB", "cost %", "fits", "peak term"], rows, "lrrll")]
    groups: dict = {}
    for c in rejected:
        groups.setdefault(", ".join(c.rejected_by), []).append(c.name)
    for why, names in groups.items():
        shown_names = " ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"  rejected by {why}: {shown_names}")
    return out


# --------------------------------------------------------------------------- plot

def _plot(r, path: Path, force: bool = False) -> str:
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot", "needs matplotlib (pip install 'mbridge-recompute[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, ax) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [2, 3]})
    _rank_bars(bars, r)
    allowed = [c for c in r.candidates if c.allowed]
    dom = [c for c in allowed if c.dominated_by is not None]
    front = sorted(r.frontier, key=lambda c: c.cost_pct)
    ax.scatter([c.cost_pct for c in dom], [c.peak_bytes / GB for c in dom], s=12, c="0.7",
               label="dominated")
    ax.plot([c.cost_pct for c in front], [c.peak_bytes / GB for c in front], "o-", label="frontier")
    seen = set()
    for c in front[:12]:
        spot = (round(c.cost_pct, 2), round(c.peak_bytes / GB, 2))
        if spot in seen:                 # e.g. "none" and "[]": one point, one label
            continue
        seen.add(spot)
        ax.annotate(c.name, (c.cost_pct, c.peak_bytes / GB), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")
    ax.axhline(r.budget_bytes / GB, color="r", ls="--", lw=1, label="budget")
    rec = r.recommendation
    if rec:
        ax.scatter([rec.cost_pct], [rec.peak_bytes / GB], s=90, facecolors="none", edgecolors="g",
                   label=f"recommended: {rec.name}")
    ax.set_xlabel("modelled replay cost (% of step)")
    ax.set_ylabel("predicted peak on the hottest rank (GB)"
                  + (", calibrated" if r.calibration else ""))
    ax.legend(fontsize=8)
    ax.set_title("candidates: peak vs replay cost", fontsize=9)
    fig.tight_layout()
    import io

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=120, format=path.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    files.write(path, buffer.getvalue(), force, "--plot")   # exclusive, or atomic with --force
    return str(path)


def _rank_bars(ax, r) -> None:
    """Per pipeline rank, the modelled peak as stacked bars: static, activations by component,
    the transient that sets the peak (current setting, uncalibrated)."""
    ranks = r.estimate.ranks if r.estimate is not None else []
    xs = [k.pp_rank for k in ranks]
    bottom = [k.static_bytes / GB for k in ranks]
    ax.bar(xs, bottom, color="0.55", label="static")
    parts = sorted({name for k in ranks for name in k.activations})
    for name in parts:
        vals = [k.activations.get(name, 0) / GB for k in ranks]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, label=f"act: {name}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar(xs, [k.transient_bytes / GB for k in ranks], bottom=bottom, color="none",
           edgecolor="k", hatch="//", label="transient at the peak")
    ax.axhline(r.budget_bytes / GB, color="r", ls="--", lw=1, label="budget")
    ax.set_xticks(xs)
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("modelled GB (current setting, uncalibrated)")
    ax.set_title("memory per pipeline rank", fontsize=9)
    ax.legend(fontsize=7)
