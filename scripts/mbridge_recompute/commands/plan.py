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
  plan.py WORKLOAD.yaml --measured-peak-gb 66.3  # anchor to the current setting's measured peak
  plan.py WORKLOAD.yaml --measured-peak-gb 61.2 --measured-setting '[]'   # ... or another's
  plan.py WORKLOAD.yaml --top 3 --json > plan.json && run_harness.py --from-plan plan.json ...
                                                 # the sweep: [] control, the recommendation, 3 neighbours

exit codes: 0 a setting fits at its error band's upper edge, 1 nothing does (tight: the band
crosses the budget, calibrate first; or nothing fits; or the workload is rejected under every
setting), 2 unusable input."""


def add_arguments(parser) -> None:
    from mbridge_recompute.inputs.loading import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--budget-gb", type=float, metavar="GB",
                        help="per-GPU memory budget in decimal GB (default: the GPU's capacity as "
                             "PyTorch reports it, from cluster.gpu_memory_gib, cluster.gpu or "
                             "cluster.gpu_memory_gb, minus max(5%%, 2 GB))")
    cal = parser.add_mutually_exclusive_group()
    cal.add_argument("--measured-peak-gb", type=float, metavar="GB",
                     help="measured peak allocated GB (max_memory_allocated) of the hottest rank, "
                          "or of pipeline rank --rank, running the current setting (or "
                          "--measured-setting); anchors every prediction: the difference is one "
                          "unexplained offset kept constant across settings")
    cal.add_argument("--measured", metavar="REPORT.json",
                     help="`compare --json` output (the control run, or the run of "
                          "--measured-setting, anchors each pipeline rank with the setting its "
                          "record says it ran; a run that died in iteration 2 is matched at "
                          "iteration 1) or `diagnose --json` output (the rank that ran out of "
                          "memory is the --free-gb rank)")
    parser.add_argument("--measured-setting", metavar="SETTING",
                        help="the setting the measurement ran, in candidate syntax ('[]' for the "
                             "control, moe_act, 'moe_act,layernorm', uniform:2, block:1, none); "
                             "default: the workload's current setting")
    parser.add_argument("--measured-iteration", type=int, metavar="N",
                        help="the iteration after which --measured-peak-gb was taken: 1 means "
                             "before the first optimizer step created Adam's moments (default: a "
                             "later, steady iteration)")
    parser.add_argument("--free-gb", type=float, metavar="GB",
                        help="recommend the cheapest setting that frees at least GB decimal GB on "
                             "--rank against the current setting (exit 1 if none does)")
    parser.add_argument("--rank", type=int, metavar="R",
                        help="pipeline rank of --measured-peak-gb and for --free-gb (default: the "
                             "hottest; for --free-gb the rank --measured says ran out of memory)")
    parser.add_argument("--alternatives", action="store_true",
                        help="also price layout, offloading and optimizer changes for the same GPU "
                             "count (other VPP sizes, a layout moving layers off the hottest rank, "
                             "CP, the distributed optimizer, fine-grained offloading), alone and "
                             "with recompute, on the same frontier")
    parser.add_argument("--per-rank", action="store_true",
                        help="text: every pipeline rank's saving per label and peak per candidate")
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
    from mbridge_recompute.plan import measured as measured_input
    from mbridge_recompute.plan.planner import plan

    if args.top is not None and args.top < 1:
        raise InputError("--top", f"must be >= 1, got {args.top}")
    if args.plot:
        files.check_target(Path(args.plot), args.force, "--plot", (".png", ".svg", ".pdf"))
    release = args.release
    w = load_from_args(args, release, default=True)
    if args.measured_iteration is not None and (args.measured_iteration < 1
                                                or args.measured_peak_gb is None):
        raise InputError("--measured-iteration", "must be >= 1 and goes with --measured-peak-gb")
    if args.rank is not None and args.free_gb is None and not args.per_rank \
            and args.measured_peak_gb is None:
        raise InputError("--rank", "goes with --measured-peak-gb, --free-gb or --per-rank")
    setting = None
    if args.measured_setting is not None:
        if args.measured_peak_gb is None and not args.measured:
            raise InputError("--measured-setting", "goes with --measured-peak-gb or --measured")
        setting = measured_input.parse_setting(args.measured_setting, "--measured-setting")
    measured = measured_input.read(args.measured, w, setting) if args.measured else None
    report = plan(w, budget_gb=args.budget_gb, measured_peak_gb=args.measured_peak_gb,
                  measured=measured, measured_iteration=args.measured_iteration,
                  measured_setting=setting,
                  free_gb=args.free_gb, rank=args.rank, per_rank=args.per_rank,
                  alternatives=args.alternatives,
                  version=release, top=args.top)
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
CORES = {"te_fused": "TE fused/flash", "te_unfused": "TE unfused, probabilities kept",
         "mcore": "megatron-core DotProductAttention, probabilities kept"}
DEFAULTS = {"mcore": "megatron-core TransformerConfig's", "megatron-lm": "Megatron-LM's arguments'",
            "bridge": "Megatron Bridge providers'"}


HANG = " " * 4                # continuation of a header line


def pct(value: float, signed: bool = False) -> str:
    """A percentage as the text shows it: the JSON's figure (rounded to 3 decimals,
    report.Candidate.to_dict) to 2, so the text never rounds a figure differently."""
    return format(round(value, 3), "+.2f" if signed else ".2f")


def render_text(r) -> str:
    """The plan as text, read from the PlanReport's attributes, at the current text width."""
    from mbridge_recompute.output import shell_lines, wrap

    wl = r.workload
    gpus = f"{wl['num_gpus']} GPU{'s' if wl['num_gpus'] != 1 else ''}" + (
        "" if wl["num_gpus_given"] else " (assumed: see the first line)")
    # a workload refused under every setting is said before anything else: no figure below runs
    head = []
    if r.workload_findings:
        head.append("REJECTED under every recompute setting: fix the workload first"
                    + ("; the memory figures below hold only once it is fixed" if r.estimate is not None
                       else "") + " (exit 1):")
        head += [f"  {f['id']}: {f['message']}" for f in r.workload_findings]
    # what the input left open and the loader decided moves every figure below: said first
    head += [f"note: {note}" for note in wl.get("input_notes", [])]
    head += [f"workload: {wl['architecture']}, {wl['num_layers']} layers, hidden {wl['hidden_size']}; "
            f"defaults: {DEFAULTS.get(wl['defaults_source'], wl['defaults_source'])}",
            f"  precision: {wl['precision']}; {wl['precision_from']}",
            f"  parallelism: TP{wl['tp']} PP{wl['pp']} VPP{wl['vpp']} CP{wl['cp']} EP{wl['ep']} "
            f"DP{wl['dp']} on {gpus}; {wl['parallelism_from']}",
            f"  batch: seq {wl['seq_length']}, MBS {wl['micro_batch_size']}, "
            f"{wl['num_microbatches']} micro-batches",
            f"  attention {wl['attention_backend']} ({CORES[wl['attention_core']]}); "
            f"fusions: {', '.join(wl['fusions']) or 'none'}",
            f"  recompute now: {wl['recompute']}",
            f"GPU: {wl['gpu_capacity'].split(' [')[0]}",
            f"megatron-core {r.release.name}: {r.release.how}",
            f"budget: {gb(r.budget_bytes)} GB per GPU (sizes below in decimal GB)"]
    m = r.extra.get("model_source")
    if m:
        head.append(f"model: {m['title']} (catalog '{m['name']}'); layout: "
                    + ("from the cited recipe/study" if m.get("layout_source") else
                       "not in the catalog, defaults or your --set/workload values"))
    if r.calibration is not None:
        from mbridge_recompute.plan.calibration import lines

        head += lines(r.calibration)
    out = [line for text in head for line in wrap(text, "", HANG)]
    if r.warnings:
        out += _warnings_table(r)
    out.append("")
    if r.estimate is not None:
        out += _rank_table(r) + [""] + _label_table(r) + [""] + _frontier_table(r) + [""]
        if r.side_by_side:
            out += _alternatives_table(r) + [""]
    said = []
    cur = r.current
    if r.bands and r.estimate is not None:
        said.append(_band_sentence(r))
    if cur is not None:
        said.append(f"current setting {cur.setting.describe()}: predicted peak {gb(cur.peak_bytes)} GB "
                    f"{_band_words(cur)}, {_costs(r, cur)}, "
                    + (_verdict_words(cur, r.budget_bytes) if cur.allowed else
                       "rejected: " + ", ".join(cur.rejected_by))
                    + ("; rejected as it is: " + ", ".join(f["id"] for f in r.workload_findings)
                       if r.workload_findings else ""))
    rec = r.recommendation
    if r.free:
        fr = r.free
        said.append(f"to free {gb(fr['free_bytes'])} GB on pp_rank {fr['pp_rank']} (current "
                    f"{fr['from']}: {gb(fr['from_peak_bytes'])} GB there): "
                    + (f"{fr['answer']} frees {gb(fr['freed_bytes'])} GB" if fr["answer"] else
                       f"nothing does; the most is {gb(fr['most_freed_bytes'])} GB ({fr['most_freed_by']})"))
    if rec is None:
        said.append("recommendation: none" + (" (every candidate is rejected by the checker)"
                                              if r.candidates else ""))
    out += [line for text in said for line in wrap(text)]
    if rec is not None:
        from mbridge_recompute.plan.report import CAVEAT
        from mbridge_recompute.write.snippets import render_all

        out += wrap(("recommendation once the workload is fixed: " if r.workload_findings else
                     "recommendation: ") + f"{rec.setting.describe()} ({rec.name}): predicted peak "
                    f"{gb(rec.peak_bytes)} GB {_band_words(rec)} on pp_rank {rec.hottest_pp_rank}, "
                    f"{_costs(r, rec)}: {_verdict_words(rec, r.budget_bytes)}")
        if r.calibrate_first:
            out += wrap(r.calibrate_first, "  ", "    ")
        if r.cheaper_tight is not None:
            ct = r.cheaper_tight
            out += wrap(f"cheaper if a calibration confirms it: {ct.setting.describe()} ({ct.name}): "
                        f"predicted peak {gb(ct.peak_bytes)} GB {_band_words(ct)}, {_costs(r, ct)}: "
                        f"{_verdict_words(ct, r.budget_bytes)}", "  ", "    ")
        pure = r.recompute_recommendation
        if r.alternatives and pure is not None and pure.name != rec.name:
            out += wrap(f"beside it, the cheapest recompute-only setting: {pure.setting.describe()} "
                        f"({pure.name}): {gb(pure.peak_bytes)} GB, cost {pct(pure.cost_pct)} %, "
                        + ("fits" if pure.fits else "does NOT fit"), "  ", "    ")
        snip = render_all(rec.setting)
        if snip.get("yaml"):
            out += ["", "Bridge YAML:", snip["yaml"].rstrip()]
        if snip.get("overrides"):
            out += ["", "Hydra overrides:"] + shell_lines(snip["overrides"], "  ", "  ")
        out += [""] + wrap("matched sweep candidates: " + " ".join(r.harness_candidates))
        out += wrap(CAVEAT, "  ", "  ")
    for note in r.evidence_notes:
        out += [""] + wrap(note)
    if r.diagnosis and r.verdict != "tight":       # a tight verdict's advice is under the recommendation
        out += [""] + wrap("nothing fits: " + r.diagnosis)
    out += ["", "assumptions:"] + [line for a in r.assumptions for line in wrap(a, "  - ", "    ")]
    return "\n".join(out)


def _offloading(r) -> bool:
    """Whether any candidate offloads activations (then its copy time and host memory show)."""
    return any(c.rank_host and any(c.rank_host) or c.offload_pct for c in r.candidates)


def _costs(r, c) -> str:
    """A candidate's cost terms in words: the replay, and with offloading its exposed copies and
    host memory, never netted into each other; with --alternatives the whole step change."""
    out = f"replay cost {pct(c.replay_pct)} %"
    if _offloading(r):
        out += (f", offload copies {pct(c.offload_pct)} % exposed, {gb(c.host_bytes)} GB in pinned "
                "host memory")
    if r.alternatives:
        out += f", modelled step {pct(c.cost_pct, signed=True)} %"
    return out


def _columns(spec: list, items, free: bool = True, breaks="") -> str:
    """A table from (header, align, cell of an item) triples: a new figure is one more triple.
    The last column is the free-text one when `free`."""
    from mbridge_recompute.output import table

    return table([h for h, _, _ in spec], [[cell(it) for _, _, cell in spec] for it in items],
                 "".join(a for _, a, _ in spec), free=-1 if free else None, breaks=breaks)


def _band_words(c) -> str:
    return f"(band {gb(c.lower_bytes)}-{gb(c.upper_bytes)} GB)"


def _verdict_words(c, budget: int) -> str:
    """fits / tight / no against the budget, said with the band edge that decides it."""
    if c.verdict == "fits":
        return f"fits the {gb(budget)} GB budget at the band's upper edge"
    if c.verdict == "tight":
        return f"TIGHT: the band crosses the {gb(budget)} GB budget"
    return f"does NOT fit the {gb(budget)} GB budget (even the band's lower edge is over it)"


def _band_sentence(r) -> str:
    """The hottest rank's band and the terms it is made of (memory/band.py)."""
    k = r.estimate.hottest.pp_rank
    b = r.bands[k]
    terms = ", ".join(f"{t.name} -{gb(t.lower)}/+{gb(t.upper)}" + (" (device)" if t.device_only else "")
                      for t in b.terms if t.lower or t.upper)
    return (f"error band of pp_rank {k}'s peaks: allocated -{gb(b.allocated[0])}/+{gb(b.allocated[1])}"
            f" GB, device -{gb(b.device[0])}/+{gb(b.device[1])} GB"
            + (" (calibrated: only what changes between settings is left)" if r.calibration else "")
            + f"; terms: {terms}")


def _warnings_table(r) -> list:
    """The settings the model does not read, largest possible effect first: the bound each is
    sized to (memory/bounds.py), the setting, what it changes."""
    from mbridge_recompute.output import wrap

    def bound(f) -> str:
        nbytes = f.get("effect_bytes")
        return "not sized" if nbytes is None else gb(nbytes)

    spec = [("up to GB", "r", bound), ("setting", "l", lambda f: f"{f['field']}={f['value']}"
                                       if f.get("value") not in (None, "") else f["field"]),
            ("what it changes", "l", lambda f: f.get("changes") or f["message"])]
    return wrap("settings the memory model does not read, which the plan does not account for, "
                "largest possible effect first (up to = a bound sized on this workload, "
                "data/coverage.yaml, not a prediction):") + [_columns(spec, r.warnings)]


def _rank_table(r) -> list:
    """Per-rank memory under the current setting, activations by component; calibrated, the
    model's peak, the unexplained offset and their sum (what the frontier's peaks are)."""
    from mbridge_recompute.output import wrap

    ranks = r.estimate.ranks
    comps: dict = {}
    for rank in ranks:
        for k, v in rank.activations.items():
            comps[k] = comps.get(k, 0) + v
    # the six largest components; one under 0.005 GB on every rank (0.00 in the table) is named
    # in the title instead of taking a column
    tiny = [c for c in comps if all(k.activations.get(c, 0) < 0.005 * GB for k in ranks)]
    shown = [c for c, _ in sorted(comps.items(), key=lambda kv: -kv[1]) if c not in tiny][:6]
    other = [c for c in comps if c not in shown and c not in tiny]
    cal = r.calibration is not None and r.current is not None
    spec = [("pp rank", "r", lambda k: k.pp_rank), ("static", "r", lambda k: gb(k.static_bytes))]
    spec += [(c, "r", lambda k, c=c: gb(k.activations.get(c, 0))) for c in shown]
    if other:
        spec.append(("other", "r", lambda k: gb(sum(k.activations.get(c, 0) for c in other + tiny))))
    spec += [("saved total", "r", lambda k: gb(k.activation_bytes)),
             ("transient", "r", lambda k: gb(k.transient_bytes)),
             ("model allocated" if cal else "allocated peak", "r", lambda k: gb(k.allocated_peak_bytes)),
             ("model device" if cal else "device peak", "r", lambda k: gb(k.peak_bytes))]
    if cal:
        spec += [("offset", "r", lambda k: f"{r.current.offset(k.pp_rank) / GB:+.2f}"),
                 ("peak", "r", lambda k: gb(k.peak_bytes + r.current.offset(k.pp_rank)))]
    spec.append(("peak term", "l", lambda k: k.peak_term))
    title = (f"memory per pipeline rank in GB (current setting; hottest rank {r.hottest_pp_rank}): "
             "static, saved activations by component and their total, the transient at the peak"
             + (f" (under 0.005 GB: {', '.join(tiny)})" if tiny and not other else "")
             + ("; peak = the model's peak + the calibration's unexplained offset" if cal else ""))
    hot = r.estimate.hottest
    return wrap(title) + wrap(
        "allocated peak: what torch.cuda.max_memory_allocated and Bridge's "
        "mem-max-allocated-gigabytes report (compare runs with it); device peak: allocated plus "
        "what PyTorch does not count (residual, flex-dispatcher buffers, CUDA-graph pools: "
        f"{gb(hot.peak_bytes - hot.allocated_peak_bytes)} GB on pp_rank {hot.pp_rank}), the figure "
        "the budget is held against", indent="  ") + [_columns(spec, ranks)]


def _label_table(r) -> list:
    from mbridge_recompute.output import wrap

    ranks = len(r.estimate.ranks) if r.per_rank else 0

    def fig(value):                      # a figure of an applicable label, "-" otherwise
        return lambda e: value(e) if e.applicable else "-"

    spec = [("label", "l", lambda e: e.label), ("applies", "l", lambda e: "yes" if e.applicable else "no"),
            ("saving GB", "r", fig(lambda e: gb(e.saving_bytes)))]
    spec += [(f"rank {k}", "r", fig(lambda e, k=k: gb(e.rank_saving_bytes[k]))) for k in range(ranks)]
    spec.append(("replay %", "r", fig(lambda e: f"{e.cost_pct:.2f}")))
    if _offloading(r):
        spec.append(("offload %", "r", fig(lambda e: f"{e.offload_pct:.2f}")))
    spec.append(("why", "l", lambda e: e.reason + (f"; adds memory: {e.adds}"
                                                    if e.applicable and e.adds else "")))
    return wrap("recompute labels (saving on the hottest rank vs the [] control"
                + (", then on each pipeline rank)" if ranks else ")")) + [_columns(spec, r.labels)]


def _alternatives_table(r) -> list:
    from mbridge_recompute.output import table, wrap

    rows = [[a["name"], a["kind"], gb(a["frees_bytes"]), gb(a["peak_bytes"]), f"{a['replay_pct']:.2f}",
             f"{a['cost_pct']:+.2f}", "yes" if a["fits"] else "no",
             "; ".join(x for x in (a["relation"], a["detail"],
                                   "dominated by " + a["dominated_by"] if a["dominated_by"] else "")
                       if x)]
            for a in r.side_by_side]
    return wrap("alternatives beside recompute: frees = peak(current) - peak(option) on the hottest "
                "rank, for the option each row names (a label is added to the current labels, full "
                "recompute replaces them, a layout / offload / optimizer change keeps them); step = "
                "the change of the modelled step") + [
            table(["option", "kind", "frees GB", "peak GB", "replay %", "step %", "fits", "how"], rows,
                  "llrrrrll", free=-1, breaks="@")]


def _frontier_table(r) -> list:
    from mbridge_recompute.output import wrap

    front = r.shown_frontier
    limit = r.top or TEXT_FRONTIER_ROWS
    ranks = len(r.estimate.ranks) if r.per_rank else 0
    cal = r.calibration is not None
    spec = [("candidate", "l", lambda c: c.name)]
    if r.alternatives:
        spec.append(("kind", "l", lambda c: c.setting.kind))
    if cal:                              # peak = model + offset on the candidate's hottest rank
        spec += [("model GB", "r", lambda c: gb(c.rank_peaks[c.hottest_pp_rank])),
                 ("offset GB", "r", lambda c: f"{c.offset(c.hottest_pp_rank) / GB:+.2f}")]
    spec.append(("peak GB", "r", lambda c: gb(c.peak_bytes)))
    spec += [(f"rank {k}", "r", lambda c, k=k: gb(c.rank_peak(k)) if k < len(c.rank_peaks) else "-")
             for k in range(ranks)]
    spec.append(("replay %", "r", lambda c: pct(c.replay_pct)))
    if _offloading(r):
        spec += [("offload %", "r", lambda c: pct(c.offload_pct)),
                 ("host GB", "r", lambda c: gb(c.host_bytes))]
    if r.alternatives:
        spec.append(("step %", "r", lambda c: pct(c.cost_pct, signed=True)))
    spec += [("band top GB", "r", lambda c: gb(c.upper_bytes)),
             ("fits", "l", lambda c: c.verdict if c.allowed else "no"),
             ("peak term", "l", lambda c: c.peak_term)]
    more = len(front) - min(limit, len(front))
    dominated = sum(1 for c in r.candidates if c.dominated_by is not None)
    rejected = [c for c in r.candidates if not c.allowed]
    out = wrap(f"frontier (peak vs {'modelled step' if r.alternatives else 'replay cost'}; "
               f"{dominated} dominated and {len(rejected)} rejected "
               f"candidates not shown{f', {more} more points' if more > 0 else ''})")
    out.append(_columns(spec, front[:limit], breaks="@"))
    groups: dict = {}
    for c in rejected:
        groups.setdefault(", ".join(c.rejected_by), []).append(c.name)
    if groups:
        out.append("")
    for why, names in groups.items():
        shown_names = " ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out += wrap(f"rejected by {why}: {shown_names}", "  ", "    ")
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
    ax.scatter([c.cost_pct for c in dom], [c.peak_bytes / GB for c in dom], s=12, c="#b3b3b3",
               label="dominated")
    ax.plot([c.cost_pct for c in front], [c.peak_bytes / GB for c in front], "-", c="C0", lw=1,
            label="frontier")
    markers = {"recompute": "o", "vpp": "s", "layout": "D", "cp": "^", "offload": "v", "optimizer": "P"}
    for kind in dict.fromkeys(c.setting.kind.split("+")[0] for c in front):
        pts = [c for c in front if c.setting.kind.split("+")[0] == kind]
        ax.scatter([c.cost_pct for c in pts], [c.peak_bytes / GB for c in pts],
                   marker=markers.get(kind, "o"), s=28, label=f"frontier: {kind}")
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
    ax.set_xlabel("modelled step cost (% of step)" if r.alternatives else "modelled replay cost (% of step)")
    ax.set_ylabel("predicted peak on the hottest rank (GB)"
                  + (", calibrated" if r.calibration else ""))
    ax.legend(fontsize=8)
    ax.set_title("candidates: peak vs " + ("modelled step cost" if r.alternatives else "replay cost"),
                 fontsize=9)
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
