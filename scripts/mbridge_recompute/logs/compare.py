"""Compare parsed runs against a matched control, per the measurement contract.

Definitions (the text of `compare --help` says the same):

* **steady window** of a run: its logged iterations from `steady_from` to its
  target T (the `/T` of `iteration N/T`); `steady_from` defaults to
  floor(T * fraction) + 1 with fraction 0.5, i.e. the second half (iterations
  11-20 of a 20-step run, as the published Moonlight sweep averages).
* **pass**: no OOM, no non-finite step, the optimizer was initialised (a memory
  report after iteration >= 2 or an iteration >= 2 line) and at least
  `min_steady_steps` complete, finite iteration lines lie in the window. The
  default minimum is every line the window should hold (multiples of the log
  interval, inferred as the gcd of the logged iteration numbers), so a run cut
  short does not pass.
* **oom** (with its stage), **nan** (a missing `lm loss`, a nan/inf loss or grad
  norm, or a counted nan iteration), else **incomplete**.
* **peak**: `mem-max-allocated-gigabytes`, max over the ranks that print it;
  per run at its last report, and for a delta at the **matched point**: the
  latest "after K iterations" both runs reported (so a control that died after
  iteration 1 is compared at iteration 1, not against a candidate's iteration-2
  peak that includes optimizer state).
* **narrowest passing candidate**: among matched, passing runs other than the
  control whose peak is at least `min_saving_pct` (default 0.5%) below the
  control's at the matched point (any passing run when the control itself did
  not pass), the one with the smallest step time; ties go to the lower peak.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Optional

from mbridge_recompute.errors import InputError, Rejected
from mbridge_recompute.logs.runlog import MAX_ITERATIONS, RunLog

STATUSES = ("pass", "oom", "nan", "incomplete")
CONTROL_NAMES = ("empty", "[]", "control")

# what only names, places or sets the recompute of a run: everything else must be equal for two
# runs to be a matched pair (bridge-harness.md §1.4). Flags by their canonical spelling (the
# harness argv is read as the rank reads it, inputs/harness_argv.py: `-rl`, `--recompute_mod` and
# `--recompute_modules=a` are all one of these), Hydra keys by name or prefix.
_RUN_ONLY_FLAGS = ("--recompute_modules", "--recompute_num_layers", "--wandb_experiment_name", "--log_dir",
                   "--save_config_filepath", "--dryrun", "--detach")
_RUN_ONLY_KEYS = ("model.recompute_", "model.distribute_saved_activations", "logger.save_config_filepath",
                  "checkpoint.save")
# config-dump fields a matched pair must share (leaf names; parallelism, batch, sequence,
# precision, schedule, and the memory-relevant features around recompute)
MATCHED_FIELDS = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "micro_batch_size", "global_batch_size", "seq_length", "train_iters",
    "fp8", "fp8_recipe", "fp4", "bf16", "fp16", "params_dtype", "pipeline_dtype",
    "num_layers", "hidden_size", "num_moe_experts", "use_distributed_optimizer",
    "cuda_graph_impl", "cuda_graph_scope", "cpu_offloading", "fine_grained_activation_offloading",
    "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type",
)


# ---------------------------------------------------------------- per run
def log_interval(run: RunLog) -> int:
    its = [it.iteration for it in run.iterations if it.iteration > 0]
    return reduce(math.gcd, its) if its else 1


def steady_window(run: RunLog, steady_from: Optional[int], fraction: float) -> tuple:
    """(first, last) iteration of the steady window, or (None, None) without iteration lines."""
    total = run.target_iterations
    if total is None:
        return None, None
    first = steady_from if steady_from is not None else int(math.floor(total * fraction)) + 1
    return max(1, first), total


def summarize(run: RunLog, steady_from: Optional[int] = None, fraction: float = 0.5,
              min_steady: Optional[int] = None) -> dict:
    first, last = steady_window(run, steady_from, fraction)
    # one line per iteration (the last one printed: a duplicated or restarted log repeats lines)
    latest = {it.iteration: it for it in run.iterations}
    window = [it for _, it in sorted(latest.items())
              if first is not None and first <= it.iteration <= last and it.complete and it.finite]
    interval = log_interval(run)
    counted_from = first
    if run.early.count and run.iterations and first is not None:
        # the earliest iteration lines were not kept (runlog.MAX_ITERATIONS): the window is
        # judged on the lines that were, and the report says so
        counted_from = max(first, min(it.iteration for it in run.iterations))
    expected = 0 if first is None else max(0, last // interval - (counted_from - 1) // interval)
    need = min_steady if min_steady is not None else max(1, expected)
    times = [it.time_ms for it in window if it.time_ms is not None and math.isfinite(it.time_ms)]
    in_window = {it.iteration for it in window}
    paired = [st for k, st in run.step_time_at() if k in in_window]
    tflops = [st.tflops for st in paired if math.isfinite(st.tflops)]
    tflops_source = "Step Time" if tflops else None
    if not tflops:
        tflops = [it.tflops for it in window if it.tflops is not None and math.isfinite(it.tflops)]
        tflops_source = "iteration line" if tflops else None
    step_s = [st.seconds for st in paired if math.isfinite(st.seconds)]

    non_finite = run.non_finite
    notes = []
    stage = None
    if run.ooms:
        status = "oom"
        first_oom = min(run.ooms, key=lambda o: o.line)
        stage = first_oom.stage
        when = (f"of iteration {first_oom.iteration}" if first_oom.iteration is not None
                else "before any logged iteration")
        notes.append(f"OOM in {first_oom.stage} {when} (line {first_oom.line})")
    elif non_finite or run.nan_iterations:
        status = "nan"
        if non_finite:
            notes.append("non-finite loss or grad norm (a missing `lm loss` means NaN) at iteration(s) "
                         + ", ".join(map(str, non_finite[:8])))
        if run.nan_iterations:
            notes.append(f"{run.nan_iterations} nan iteration(s) counted")
    elif run.optimizer_initialised and len(window) >= need:
        status = "pass"
    else:
        status = "incomplete"
        if not run.optimizer_initialised:
            notes.append("the optimizer step never completed (no memory report after iteration 2)")
        if len(window) < need:
            notes.append(f"{len(window)} of {need} steady step(s) logged in iterations {first}-{last}")
    if run.skipped_iterations:
        notes.append(f"{run.skipped_iterations} skipped iteration(s) (loss-scale backoff or NaN skip)")
    if any(not it.complete for it in run.iterations):
        notes.append("an iteration line was cut (truncated log)")
    hstatus = (run.manifest or {}).get("status")
    if hstatus and hstatus != "ok":
        code = (run.manifest or {}).get("returncode")
        notes.append(f"the harness recorded status {hstatus!r} (returncode {code})")
    if run.replaced_bytes:
        notes.append(f"{run.replaced_bytes} undecodable byte sequence(s) replaced")
    if counted_from != first:
        notes.append(f"the steady window {first}-{last} is judged on iterations {counted_from}-{last}: "
                     f"a run keeps its last {MAX_ITERATIONS} iteration lines")
    if run.bounds_note():
        notes.append(run.bounds_note())

    hot, alloc, reserved = run.peak()
    peaks = run.per_rank_peaks()
    return {
        "name": run.name, "path": run.path, "setting": run.setting, "format": run.format,
        "status": status, "stage": stage,
        "peak_allocated_gb": alloc, "peak_reserved_gb": reserved,
        "peak_after": max(run.report_points(), default=None), "hottest_rank": hot,
        "ranks": {str(r): {"after": k, "max_allocated_gb": a, "max_reserved_gb": rv}
                  for r, (k, a, rv) in sorted(peaks.items())},
        "step_time_ms": _mean(times), "step_time_s": _mean(step_s),
        "tflops_per_gpu": _mean(tflops), "tflops_source": tflops_source,
        "steady_window": [first, last], "steady_steps": len(window), "min_steady_steps": need,
        "loss_finite": not non_finite, "non_finite_iterations": non_finite,
        "skipped_iterations": run.skipped_iterations, "nan_iterations": run.nan_iterations,
        "optimizer_initialised": run.optimizer_initialised, "completed": run.completed,
        "last_iteration": run.last_iteration, "target_iterations": run.target_iterations,
        "ooms": [o.as_dict() for o in run.ooms],
        "notes": notes,
    }


def _mean(xs: list) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


# ---------------------------------------------------------------- control & matching
def is_control(run: RunLog) -> bool:
    return run.setting == "[]" or run.name in CONTROL_NAMES


def choose_control(runs: list, name: Optional[str]) -> RunLog:
    if name is not None:
        for r in runs:
            if r.name == name:
                return r
        raise InputError("--control", f"no run named {name!r} (runs: {', '.join(r.name for r in runs)})")
    for r in runs:
        if is_control(r):
            return r
    return runs[0]


def command_settings(manifest: dict) -> dict:
    """A manifest's command line as {what it sets: [values]}, without what only names a run or
    sets its recompute: the launcher and entry script as written, then the harness flags by
    their canonical spelling and the Hydra overrides by key (inputs/harness_argv.py)."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv

    release = manifest.get("bridge_release")
    hargv = HarnessArgv.of_command(manifest["argv"], release if isinstance(release, str) else None)
    out = {"launcher": [" ".join(hargv.head)]} if hargv.head else {}
    out.update(hargv.settings(skip_flags=_RUN_ONLY_FLAGS, skip_keys=_RUN_ONLY_KEYS))
    words = [t for t in hargv.left if not any(o.token == t for o in hargv.overrides)]
    if words:
        out["other words"] = words
    return out


def match(run: RunLog, control: RunLog) -> list:
    """Reasons why `run` is not a matched comparison with `control` (empty: matched)."""
    if run is control:
        return []
    reasons = []
    ma, mb = run.manifest or {}, control.manifest or {}
    if isinstance(ma.get("argv"), list) and isinstance(mb.get("argv"), list):
        a, b = command_settings(ma), command_settings(mb)
        if a != b:
            diffs = [f"{k} {' '.join(a.get(k, ['(absent)']))} vs {' '.join(b.get(k, ['(absent)']))}"
                     for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            reasons.append("command lines differ beyond recompute: " + "; ".join(diffs) + " in the control")
    # the harness writes `git` {megatron_bridge, megatron_lm}; hand-written manifests may say `revisions`
    ra, rb = ma.get("revisions", ma.get("git")), mb.get("revisions", mb.get("git"))
    if isinstance(ra, dict) and isinstance(rb, dict):
        for k in sorted(set(ra) | set(rb)):
            if ra.get(k) != rb.get(k):
                reasons.append(f"revision of {k} differs: {ra.get(k)} vs {rb.get(k)} in the control")
    ea, eb = ma.get("env"), mb.get("env")
    if isinstance(ea, dict) and isinstance(eb, dict) and ea != eb:
        # e.g. PYTORCH_CUDA_ALLOC_CONF in one run only: the allocator, not recompute, moves the peak
        for k in sorted(set(ea) | set(eb)):
            if ea.get(k) != eb.get(k):
                reasons.append(f"environment {k} differs: {ea.get(k)} vs {eb.get(k)} in the control")
    if run.config and control.config:
        for key in sorted(set(run.config) | set(control.config)):
            if key.rsplit(".", 1)[-1] not in MATCHED_FIELDS:
                continue
            a, b = run.config.get(key, "(absent)"), control.config.get(key, "(absent)")
            if a != b:
                reasons.append(f"config {key} differs: {a} vs {b} in the control")
    if run.format != control.format and "unknown" not in (run.format, control.format):
        reasons.append(f"log formats differ: {run.format} vs {control.format}")
    ta, tb = run.target_iterations, control.target_iterations
    if ta and tb and ta != tb:
        reasons.append(f"train iterations differ: {ta} vs {tb} in the control")
    ga = {it.global_batch_size for it in run.iterations if it.global_batch_size}
    gb = {it.global_batch_size for it in control.iterations if it.global_batch_size}
    if ga and gb and ga != gb:
        reasons.append(f"global batch size differs: {sorted(ga)} vs {sorted(gb)} in the control")
    wa = {round(t.weight_optimizer_mib, 1) for t in run.theoretical}
    wb = {round(t.weight_optimizer_mib, 1) for t in control.theoretical}
    if wa and wb and wa != wb:
        # weights + optimizer do not depend on recompute: a different value means a
        # different parallel layout, precision or optimizer (theoretical_memory_utils.py:339-353)
        reasons.append(f"theoretical weight+optimizer memory differs: {sorted(wa)} vs {sorted(wb)} MiB "
                       "(parallelism, precision or optimizer differ)")
    if run.params_billions and control.params_billions and run.params_billions != control.params_billions:
        reasons.append(f"parameter count differs: {run.params_billions} vs {control.params_billions} billion")
    ka = {m.rank for m in run.memory if m.after == 1}
    kb = {m.rank for m in control.memory if m.after == 1}
    if ka and kb and ka != kb:
        reasons.append(f"different ranks report memory ({sorted(ka)} vs {sorted(kb)}): "
                       "different parallel layout")
    return reasons


# ---------------------------------------------------------------- the comparison
def compare(runs: list, control_name: Optional[str] = None, steady_from: Optional[int] = None,
            fraction: float = 0.5, min_steady: Optional[int] = None, min_saving_pct: float = 0.5) -> dict:
    if not runs:
        raise InputError("LOG", "no logs given")
    _disambiguate(runs)
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise Rejected("LOG", f"two logs share the run name {dupes[0]!r}; put each run in its own "
                                "directory or rename the logs")
    control = choose_control(runs, control_name)
    rows = []
    csum = summarize(control, steady_from, fraction, min_steady)
    for run in runs:
        row = csum if run is control else summarize(run, steady_from, fraction, min_steady)
        row["control"] = run is control
        reasons = match(run, control)
        row["matched"] = not reasons
        row["reasons"] = reasons
        _deltas(row, run, control, csum)
        rows.append(row)
    best, why = narrowest(rows, csum, min_saving_pct)
    return {
        "control": control.name,
        "control_status": csum["status"],
        "steady": {"from": steady_from, "fraction": fraction, "min_steady_steps": min_steady},
        "min_saving_pct": min_saving_pct,
        "runs": rows,
        "narrowest": best,
        "narrowest_reason": why,
        "unmatched": [r["name"] for r in rows if not r["matched"]],
    }


def _disambiguate(runs: list) -> None:
    """Runs whose logs share a stem (runs/a/log.out, runs/b/log.out) take their directory's name."""
    from pathlib import Path

    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1 and r.path and not (r.manifest or {}).get("name"):
            parent = Path(r.path).parent.name
            if parent and names.count(parent) == 0:
                r.name = parent


def _deltas(row: dict, run: RunLog, control: RunLog, csum: dict) -> None:
    common = run.report_points() & control.report_points()
    at = max(common) if common else None
    row["delta_at"] = at
    row.update(delta_peak_gb=None, delta_peak_pct=None, delta_reserved_gb=None,
               delta_time_pct=None, delta_tflops=None)
    if at is not None:
        _, a, ra = run.peak(at)
        _, c, rc = control.peak(at)
        if a is not None and c:
            row["delta_peak_gb"] = a - c
            row["delta_peak_pct"] = 100.0 * (a - c) / c
        if ra is not None and rc is not None:
            row["delta_reserved_gb"] = ra - rc
    if row["step_time_ms"] is not None and csum["step_time_ms"]:
        row["delta_time_pct"] = 100.0 * (row["step_time_ms"] - csum["step_time_ms"]) / csum["step_time_ms"]
    if row["tflops_per_gpu"] is not None and csum["tflops_per_gpu"] is not None:
        row["delta_tflops"] = row["tflops_per_gpu"] - csum["tflops_per_gpu"]


def narrowest(rows: list, csum: dict, min_saving_pct: float) -> tuple:
    """(name or None, why): the cheapest matched passing candidate that lowers the peak."""
    control_passes = csum["status"] == "pass"
    pool = []
    for r in rows:
        if r["control"] or r["status"] != "pass" or not r["matched"] or r["step_time_ms"] is None:
            continue
        if control_passes and (r["delta_peak_pct"] is None or r["delta_peak_pct"] > -min_saving_pct):
            continue
        pool.append(r)
    if not pool:
        if not any(r["status"] == "pass" and not r["control"] for r in rows):
            return None, "no candidate passed"
        return None, (f"no matched passing candidate lowers the peak by at least {min_saving_pct}% "
                      "against the control")
    best = min(pool, key=lambda r: (r["step_time_ms"], r["peak_allocated_gb"] or math.inf))
    if control_passes:
        why = (f"smallest step-time increase ({_pct(best['delta_time_pct'])}) among passing candidates "
               f"that lower the peak by >= {min_saving_pct}% ({_pct(best['delta_peak_pct'])})")
    else:
        why = f"the control did not pass ({csum['status']}); fastest passing candidate"
    return best["name"], why


def exit_code(report: dict) -> int:
    """0: a matched passing candidate exists (or the control alone passed); 1 otherwise or when any
    comparison is unmatched (its deltas are not evidence)."""
    rows = report["runs"]
    if report["unmatched"]:
        return 1
    candidates = [r for r in rows if not r["control"]]
    if not candidates:
        return 0 if rows[0]["status"] == "pass" else 1
    return 0 if any(r["status"] == "pass" for r in candidates) else 1


# ---------------------------------------------------------------- rendering
def _pct(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:+.2f}%"


def _f(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _status(r: dict) -> str:
    s = r["status"]
    if s == "oom" and r["stage"]:
        s = f"oom ({r['stage']})"
    return s + ("" if r["matched"] else " UNMATCHED")


def table_rows(report: dict) -> list:
    out = []
    for r in report["runs"]:
        out.append([r["name"] + (" (control)" if r["control"] else ""), _status(r),
                    _f(r["peak_allocated_gb"], ".3f"), _f(r["peak_reserved_gb"], ".3f"),
                    "-" if r["hottest_rank"] is None else str(r["hottest_rank"]),
                    _f(r["step_time_ms"], ".2f"), _f(r["tflops_per_gpu"], ".2f"),
                    "control" if r["control"] else _pct(r["delta_peak_pct"]),
                    "control" if r["control"] else _pct(r["delta_time_pct"]),
                    "control" if r["control"] else _f(r["delta_tflops"], "+.2f")])
    return out


HEADERS = ["run", "status", "peak alloc GB", "peak resv GB", "hot rank", "step ms", "TFLOP/s per GPU",
           "Δ peak", "Δ time", "Δ TFLOP/s"]


def _footer(report: dict) -> list:
    lines = []
    if report["narrowest"]:
        lines.append(f"narrowest passing candidate: {report['narrowest']} — {report['narrowest_reason']}")
    else:
        lines.append(f"narrowest passing candidate: none — {report['narrowest_reason']}")
    for r in report["runs"]:
        for reason in r["reasons"]:
            lines.append(f"unmatched: {r['name']}: {reason}")
        for note in r["notes"]:
            lines.append(f"note: {r['name']}: {note}")
    return lines


def render_text(report: dict) -> str:
    from mbridge_recompute.output import table, wrap_all

    r0 = next(r for r in report["runs"] if r["control"])
    head = (f"control: {report['control']} ({r0['status']}); steady window: iterations "
            f"{r0['steady_window'][0]}-{r0['steady_window'][1]}; "
            "Δ peak at the latest iteration both runs reported")
    return "\n".join(wrap_all([head]) + ["", table(HEADERS, table_rows(report), "llrrrrrrrr", breaks="+"), ""]
                     + wrap_all(_footer(report)))


def render_markdown(report: dict) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |",
             "|" + "|".join(["---", "---"] + ["---:"] * (len(HEADERS) - 2)) + "|"]
    for row in table_rows(report):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join([f"Control: `{report['control']}`", ""] + lines + [""]
                     + [f"- {line}" for line in _footer(report)])
