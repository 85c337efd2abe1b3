"""A tune as the reader sees it: the report of a command (text or JSON), the history table of a
tune.json, and its plot (peak per pipeline rank against cost, predicted and measured, step by
step). Rendering only: every figure comes from tune.json or the Tuner, nothing is recomputed."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.units import GB


def _gb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / GB:.2f}"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


# ------------------------------------------------------------------ the command's report

def report(st, tuner, mode: str, notes: list) -> dict:
    """The JSON object of a dry run or a launch."""
    from mbridge_recompute.output import shell_line
    from mbridge_recompute.runs import harness
    from mbridge_recompute.tune.decide import PROCEDURE

    pending = st.pending()
    nxt = []
    if pending and (st.stop is None or st.stop.get("reason") == "interrupted"):
        sweep = tuner.build([r.candidate for r in pending], launch=False)
        by_name = {r.name: r for r in sweep.runs}
        for rec in pending:
            run = by_name.get(rec.name)
            why = next((c["why"] for s in st.steps for c in s["decision"]["runs"]
                        if c["candidate"] == rec.candidate), "")
            nxt.append({"candidate": rec.candidate, "role": rec.role, "step": rec.step, "why": why,
                        "run_dir": rec.run_dir, "argv": list(run.argv) if run else None,
                        "cwd": run.cwd if run else None,
                        "env": dict(run.env) if run else {},
                        "display": harness.display(run) if run else None})
    preview = None
    if mode == "dry-run" and len(st.runs) == len(pending) == 1 and pending[0].role == "baseline":
        d = tuner.preview()
        preview = d.to_dict() if d is not None else None
    o = tuner.opts
    return {
        "mode": mode, "ok": st.answer is not None if mode == "launch" else True,
        "tune_json": str(Path(o.root) / "tune.json"), "root": str(o.root), "workload": o.workload,
        "release": tuner.version, "launcher": o.launcher, "repo": o.repo,
        "harness_arguments": list(o.passthrough), "harness_command": shell_line(o.passthrough),
        "budget_bytes": st.budget_bytes, "free_bytes": st.need_bytes, "baseline": st.baseline,
        "max_runs": o.max_runs, "runs_used": st.runs_started,
        "procedure": list(PROCEDURE), "warnings": list(st.plan.get("warnings") or []),
        "notes": list(notes) + list(tuner.sweep_notes),
        "steps": list(st.steps), "runs": [asdict(r) for r in st.runs],
        "next": nxt, "preview": preview, "stop": st.stop, "answer": st.answer,
    }


class Lines:
    """Text at the invocation's width (output.py): prose wraps under a hanging indent, a command
    continues with backslashes, config text stays as written."""

    def __init__(self):
        self.out: list = []

    def say(self, text: str, indent: str = "") -> None:
        from mbridge_recompute.output import quote_overrides, wrap

        self.out += wrap(quote_overrides(text), indent, indent + "    ")

    def raw(self, line: str = "") -> None:
        self.out.append(line)

    def command(self, argv: list, head: str = "", indent: str = "") -> None:
        from mbridge_recompute.output import shell_lines

        self.out += shell_lines(argv, indent, indent + "    ", head=head)

    def text(self) -> str:
        return "\n".join(self.out)


def _run_lines(out: Lines, r: dict) -> None:
    v = r.get("verdict") or {}
    m = r.get("measurement") or {}
    if r["state"] != "finished":
        out.say(f"{r['role']} {r['candidate']}: {r['state']}", "  ")
        return
    peaks = ", ".join(f"rank {p['rank']} {p['allocated_gb']:.3f}" for p in m.get("steady") or []) or \
        ", ".join(f"rank {p['rank']} {p['allocated_gb']:.3f} (it. 1)" for p in m.get("first_iteration") or [])
    mark = "PASS" if v.get("passed") else "measured" if r["role"] == "baseline" else "no"
    out.say(f"{r['role']} {r['candidate']}: {mark} - {v.get('why', '')}", "  ")
    if peaks:
        out.say(f"measured GB: {peaks}", "    ")


def render_text(rep: dict) -> str:
    from mbridge_recompute.output import shell_token

    out = Lines()
    free = f", frees >= {_gb(rep['free_bytes'])} GB against the baseline" if rep["free_bytes"] else ""
    out.say(f"tune {rep['mode']}: {rep['workload']}, budget {_gb(rep['budget_bytes'])} GB per GPU{free}")
    out.say(f"runs {rep['runs_used']} of at most {rep['max_runs']}, launcher {rep['launcher']}, "
            f"record {rep['tune_json']}", "  ")
    for w in rep["warnings"]:
        out.say(w, "  ")
    for n in rep["notes"]:
        out.say(f"note: {n}")
    if rep["mode"] == "dry-run" and not any(r["state"] == "finished" for r in rep["runs"]):
        out.raw()
        out.raw("decision procedure:")
        for p in rep["procedure"]:
            out.say(p, "  ")
    by_step: dict = {}
    for r in rep["runs"]:
        by_step.setdefault(r["step"], []).append(r)
    for s in rep["steps"]:
        out.raw()
        cal = s.get("calibration")
        head = f"step {s['step']}"
        if cal and cal.get("rank_offset_bytes"):
            head += ": offsets " + ", ".join(f"pp{i} {o / GB:+.2f}" for i, o in
                                             enumerate(cal["rank_offset_bytes"])) + " GB"
        out.say(head)
        for cand, why in (cal or {}).get("against_model", {}).items():
            out.say(f"{cand}: {why}", "  ")
        for c in s["decision"]["runs"]:
            out.say(f"run {c['candidate']} ({c['role']}): {c['why']}", "  ")
        for r in by_step.get(s["step"], []):
            _run_lines(out, r)
        if s["decision"].get("stop"):
            out.say(f"stop ({s['decision']['stop']}): {s['decision']['why']}", "  ")
    if rep["next"]:
        when = "--launch runs them" if rep["mode"] == "dry-run" else "pending"
        out.raw()
        out.raw(f"next runs ({when}):")
        for n in rep["next"]:
            out.say(f"# {n['candidate']} ({n['role']}): {n['why']}")
            if n["argv"] is None:
                out.raw("(not built)")
                continue
            env = " ".join(f"{k}={shell_token(v)}" for k, v in n["env"].items())
            cd = f"cd {shell_token(n['cwd'])} && " if n.get("cwd") else ""
            out.command(n["argv"], head=(cd + env).strip())
    if rep.get("preview"):
        p = rep["preview"]
        out.raw()
        if p["runs"]:
            out.say("then, if the baseline measures as modelled: "
                    + "; ".join(f"{c['candidate']} ({c['why']})" for c in p["runs"]))
        elif p["stop"]:
            out.say(f"then, if the baseline measures as modelled: stop ({p['stop']}): {p['why']}")
    if rep["stop"] and not any(s["decision"].get("stop") for s in rep["steps"][-1:]):
        out.raw()
        out.say(f"stopped ({rep['stop']['reason']}): {rep['stop']['why']}")
    a = rep.get("answer")
    if a:
        out.raw()
        out.say(f"answer: {a['describe']} ({a['candidate']})")
        answer_lines(out, a)
    elif rep["mode"] == "launch":
        out.raw()
        out.raw("answer: none")
    return out.text()


def answer_lines(out: Lines, a: dict, formats: bool = True) -> None:
    m = a["measured"]
    out.say("measured peak allocated: " + (", ".join(
        f"rank {p['rank']} (pp {p['pp_rank']}) {p['allocated_gb']:.3f} GB after {p['after']}"
        for p in m["ranks"]) or "-"), "  ")
    out.say(f"step time {_num(m['step_time_ms'], '.2f')} ms, {_num(m['tflops_per_gpu'], '.2f')} TFLOP/s/GPU; "
            f"{a['step_time_cost']}; modelled replay cost {a['modelled_cost_pct']:.2f} %", "  ")
    out.say(f"run directory: {a['run_dir']}", "  ")
    if not formats:
        return
    written = a["formats"]
    for fmt in ("yaml", "overrides", "harness", "mlm", "python"):
        value = written.get(fmt)
        if not value:
            why = (written.get("unexpressible") or {}).get(fmt)
            if why:
                out.say(f"{fmt}: cannot say it ({why})", "  ")
            continue
        out.raw(f"  {fmt}:")
        if isinstance(value, list):
            out.command(value, indent="    ")
        else:
            for ln in value.rstrip("\n").splitlines():
                out.raw(f"    {ln}")


# ------------------------------------------------------------------ --from: history

def rows(st) -> list:
    """One row per run and pipeline rank: predicted (when it was chosen) and measured peaks."""
    predicted = {}
    for s in st.steps:
        for c in s["decision"]["runs"]:
            predicted[c["candidate"]] = c.get("predicted") or {}
    out = []
    for r in st.runs:
        pred = predicted.get(r.candidate, {})
        m = r.measurement or {}
        v = r.verdict or {}
        ranks = pred.get("rank_allocated_bytes") or pred.get("rank_peak_bytes") or []
        measured: dict = {}
        for p in (m.get("first_iteration") or []) + (m.get("steady") or []):
            measured[p["pp_rank"]] = max(measured.get(p["pp_rank"], 0.0), p["allocated_gb"])
        for k in range(max(len(ranks), max(measured, default=-1) + 1)):
            out.append({"step": r.step, "candidate": r.candidate, "role": r.role, "pp_rank": k,
                        "predicted_gb": ranks[k] / GB if k < len(ranks) else None,
                        "measured_gb": measured.get(k),
                        "measured_after": _after(m, k),
                        "cost_pct": pred.get("cost_pct"), "delta_time_pct": m.get("delta_time_pct"),
                        "status": _status(m, r.state), "passed": v.get("passed")})
    return out


def _status(m: dict, state: str) -> str:
    """compare's status, or "no result" for a run that failed before it trained (no log lines)."""
    if not m:
        return state
    if m.get("status") != "oom" and not m.get("survived") and m.get("launch_status") != "ok":
        return "no result"
    return m.get("status") or state


def _after(m: dict, pp_rank: int):
    """The iteration a rank's measured peak was taken after: its latest steady report, else 1."""
    steady = [p["after"] for p in m.get("steady") or [] if p["pp_rank"] == pp_rank]
    if steady:
        return max(steady)
    return 1 if any(p["pp_rank"] == pp_rank for p in m.get("first_iteration") or []) else None


def history_report(st, path: str) -> dict:
    return {"mode": "history", "tune_json": path, "baseline": st.baseline, "budget_bytes": st.budget_bytes,
            "free_bytes": st.need_bytes, "runs_used": st.runs_started, "rows": rows(st),
            "steps": list(st.steps), "runs": [asdict(r) for r in st.runs], "stop": st.stop,
            "answer": st.answer, "plan": st.plan}


def render_history(rep: dict) -> str:
    from mbridge_recompute.output import table

    body = [[r["step"], r["candidate"], r["role"], r["pp_rank"], _num(r["predicted_gb"], ".2f"),
             _num(r["measured_gb"], ".3f") + (" (it. 1)" if r["measured_after"] == 1 else ""),
             r["status"], _num(r["cost_pct"], ".2f"), _num(r["delta_time_pct"], "+.2f"),
             "yes" if r["passed"] else "no" if r["passed"] is not None else "-"] for r in rep["rows"]]
    lines = [f"tune history: {rep['tune_json']} ({rep['runs_used']} runs; budget {_gb(rep['budget_bytes'])} "
             "GB per GPU; predicted when chosen and measured: peak allocated)", "",
             table(["step", "run", "role", "pp", "predicted GB", "measured GB", "status", "cost %",
                    "Δ time %", "pass"], body, "rllrrrlrrl")]
    if rep["stop"]:
        lines += ["", f"stop ({rep['stop']['reason']}): {rep['stop']['why']}"]
    if rep["answer"]:
        a = rep["answer"]
        tail = Lines()
        answer_lines(tail, a, formats=False)
        lines += [f"answer: {a['describe']} ({a['candidate']})"] + tail.out
    if rep.get("plot"):
        lines.append(f"plot: {rep['plot']}")
    return "\n".join(lines)


def _free_target(st) -> Optional[float]:
    """With --free-gb: the baseline's measured peak allocated less what was asked (GB)."""
    base = st.run(st.baseline)
    steady = ((base.measurement or {}).get("steady") or []) if base else []
    if st.need_bytes is None or not steady:
        return None
    return max(p["allocated_gb"] for p in steady) - st.need_bytes / GB


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("--plot", "needs matplotlib (pip install 'mbridge-recompute[plot]'), or pass "
                                   "--no-plot for the table alone") from None


def plot(st, path: Path, force: bool) -> str:
    """Left: peak per pipeline rank against cost, predicted (open) and measured (filled), each
    run labelled with its step. Right: per step, the hottest predicted and measured peak."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mbridge_recompute import files

    data = rows(st)
    fig, (ax, steps) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    ranks = sorted({r["pp_rank"] for r in data})
    for k in ranks:
        mine = [r for r in data if r["pp_rank"] == k and r["cost_pct"] is not None]
        colour = f"C{k % 10}"
        pred = [r for r in mine if r["predicted_gb"] is not None]
        meas = [r for r in mine if r["measured_gb"] is not None]
        ax.scatter([r["cost_pct"] for r in pred], [r["predicted_gb"] for r in pred], facecolors="none",
                   edgecolors=colour, s=50, label=f"pp_rank {k} predicted")
        ax.scatter([r["cost_pct"] for r in meas], [r["measured_gb"] for r in meas], c=colour, s=30,
                   marker="s", label=f"pp_rank {k} measured")
        for r in mine:
            if r["predicted_gb"] is not None and r["measured_gb"] is not None:
                ax.plot([r["cost_pct"]] * 2, [r["predicted_gb"], r["measured_gb"]], c=colour, lw=0.8)
            y = r["measured_gb"] if r["measured_gb"] is not None else r["predicted_gb"]
            if y is not None:
                ax.annotate(f"{r['step']}: {r['candidate']}" + ("" if r["passed"] else " x"),
                            (r["cost_pct"], y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    # the budget is held against the device peak, not this axis; a saving asked is a line on it
    target = _free_target(st)
    if target is not None:
        ax.axhline(target, color="r", ls="--", lw=1,
                   label=f"baseline less the {st.need_bytes / GB:.2f} GB asked")
    ax.set_xlabel("modelled replay cost (% of step)")
    ax.set_ylabel("peak allocated per pipeline rank (GB)")
    ax.set_title(f"runs: peak per rank vs cost, predicted and measured (x: did not pass); budget "
                 f"{st.budget_bytes / GB:.2f} GB on the device", fontsize=9)
    ax.legend(fontsize=7)
    per_step: dict = {}
    for r in data:
        s = per_step.setdefault(r["step"], {"predicted": None, "measured": None})
        for key, value in (("predicted", r["predicted_gb"]), ("measured", r["measured_gb"])):
            if value is not None:
                s[key] = max(s[key] or 0.0, value)
    xs = sorted(per_step)
    steps.plot(xs, [per_step[x]["predicted"] for x in xs], "o--", label="predicted (hottest rank)")
    steps.plot(xs, [per_step[x]["measured"] for x in xs], "s-", label="measured (hottest reporting rank)")
    if target is not None:
        steps.axhline(target, color="r", ls="--", lw=1)
    steps.set_xlabel("step")
    steps.set_xticks(xs)
    steps.set_ylabel("GB")
    steps.set_title("per step: predicted vs measured", fontsize=9)
    steps.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=110, format="png")
    finally:
        plt.close(fig)
    files.write(path, buffer.getvalue(), force, "--plot")
    return str(path)
