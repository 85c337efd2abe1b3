"""`tune`: from an estimate to the cheapest recompute setting that passes, in few runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError, Rejected

TAIL = "passthrough"      # cli.py: the arguments after a bare -- are the harness's
DEFAULT_ITERATIONS = 12
MAX_RUNS = 64

USAGE = """\
%(prog)s [WORKLOAD.yaml] [--repo DIR] [--launch] [options] -- HARNESS_ARGS
       %(prog)s --from TUNE.json [--plot FILE.png | --no-plot] [--json]"""

DESCRIPTION = """\
Close the loop: plan the workload, run its current setting (or the [] control
when it recomputes nothing) through Megatron Bridge's performance harness for a
few iterations, read per-rank peaks, the OOM point and the step time, calibrate
per rank, re-plan, run the cheapest setting predicted to fit, compare it with
the baseline under the measurement contract, recalibrate from every run, and
stop when a run passed and nothing cheaper is predicted to pass (or the run
budget is spent). The answer: the setting, its measured peak per rank and step
time, and its config in every format. Every decision, run and calibration goes
to tune.json in --out; the same command resumes. A dry run (the default) prints
the decision procedure and the first runs' exact commands; --launch runs them.
HARNESS_ARGS, after '--', are the Bridge harness arguments every run gets, as
run_harness.py takes them."""

EPILOG = """\
examples:
  tune.py examples/moonlight_16b.yaml --repo ~/Megatron-Bridge --free-gb 0.5 \\
      -- -m deepseek -mr moonlight_16b -ng 8 -g h100 -c bf16 -tp 2 -ep 8 -gb 4 -sl 4096
  tune.py examples/nemotron_3_nano.yaml --repo ~/Megatron-Bridge --launcher slurm --launch \\
      --out runs/n3nano -- -m nemotronh -mr nemotron_3_nano -ng 16 -g h100 -gb 16 -sl 8192 -a ACCT -p PART
  tune.py --from runs/n3nano/tune.json --plot n3nano.png     # the history: table and plot

exit codes: 0 a run passed (the answer), or a dry run was built; 1 the tune stopped
without an answer (nothing predicted to fit, the run budget spent, a failure recompute
cannot fix, an unmatched comparison, an interrupted run: re-run to resume), or the
sweep is refused (as run_harness.py refuses it; tune.json of another command in
--out); 2 unreadable input (a workload, an option, a tune.json; matplotlib missing
for the plot)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mbridge_recompute.inputs.loading import add_workload_arguments
    from mbridge_recompute.runs.bridge import keys as bridge_keys

    add_workload_arguments(p, mlm_args=False)
    p.set_defaults(passthrough=[])
    p.add_argument("--repo",
                   help="Megatron-Bridge checkout (the runs start from its root; --launch needs it)")
    p.add_argument("--launcher", choices=["local", "slurm"], default="local",
                   help="local: torchrun on this node (default); slurm: Bridge's setup_experiment.py, "
                        "waiting for each job (--detach false) and reading its log under -l")
    p.add_argument("--budget-gb", type=float, metavar="GB",
                   help="per-GPU memory budget, decimal GB (default: the plan's, the GPU less headroom)")
    p.add_argument("--free-gb", type=float, metavar="GB",
                   help="also ask each answer to free this much peak memory against the baseline")
    p.add_argument("--max-runs", type=int, default=6, metavar="N",
                   help="at most this many runs, the baseline included (default: %(default)s)")
    p.add_argument("--iterations", type=int, metavar="K",
                   help=f"training iterations per run, as -ms K (default: the harness arguments' -ms, "
                        f"else {DEFAULT_ITERATIONS})")
    p.add_argument("--candidates", nargs="+", metavar="CANDIDATE",
                   help="consider only these settings ('moe_act', 'layernorm,moe_act', 'block:2', ...); "
                        "default: every setting the plan searches")
    p.add_argument("--out", default="recompute-tune",
                   help="the run root: tune.json and one run directory per run (default: %(default)s)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the procedure and the first runs (default)")
    mode.add_argument("--launch", action="store_true", help="run the loop")
    mode.add_argument("--from", dest="from_", metavar="TUNE.json",
                      help="print a tune's history as a table and write its plot (--plot)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="with --from: where the plot goes (default: tune.png beside tune.json; "
                        "needs matplotlib, the 'plot' extra)")
    p.add_argument("--no-plot", action="store_true", help="with --from: the table only")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="end a run after this long")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                   help="after SIGTERM, wait this long before SIGKILL (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="reuse non-empty run directories (only this tool's files are replaced); with "
                        "--plot, overwrite the file")
    p.add_argument("--no-parser-check", action="store_true",
                   help="do not parse each argv with the checkout's argument_parser.py before it runs")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable)")
    p.add_argument("--gbs", type=int, help="pin -gb when the harness arguments lack it")
    p.add_argument("--seq", type=int, help="pin -sl when the harness arguments lack it")
    p.add_argument("--bridge-release", choices=bridge_keys(),
                   help="the Bridge release to build for (default: read from the checkout)")
    p.add_argument("--name-prefix", default="tune",
                   help="prefix of each run's -wdj name (default: %(default)s)")
    p.add_argument("--python", default="python", help="interpreter for setup_experiment.py (slurm)")
    p.add_argument("--torchrun", default="torchrun", help="torchrun executable (local)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


# ------------------------------------------------------------------ checks

def _check_numbers(args) -> None:
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise InputError("--timeout", "must be > 0 seconds (and finite)")
    if not 0 <= args.grace < float("inf"):
        raise InputError("--grace", "must be >= 0 seconds (and finite)")
    if not 1 <= args.max_runs <= MAX_RUNS:
        raise InputError("--max-runs", f"must be 1 to {MAX_RUNS}, got {args.max_runs}")
    if args.iterations is not None and not 3 <= args.iterations <= 100_000:
        raise InputError("--iterations", "must be at least 3 (iteration 1, then a steady window) "
                                         f"and at most 100000, got {args.iterations}")
    for name in ("budget_gb", "free_gb"):
        value = getattr(args, name)
        if value is not None and not 0 < value < float("inf"):
            raise InputError(f"--{name.replace('_', '-')}",
                             f"must be a positive, finite number of GB, got {value}")
    if not args.out.strip():
        raise InputError("--out", "is empty")


def harness_arguments(args) -> tuple:
    """(the harness arguments every run gets, notes): -ms from --iterations; on Slurm the job
    is waited for (--detach false) and its log kept under -l (the run root's nemo-run/)."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv

    def value(name: str):
        return HarnessArgv.parse(passthrough, args.bridge_release or "main").value(name)

    passthrough = list(args.passthrough)
    notes = []
    ms = value("--max_steps")
    if args.iterations is not None:
        if ms is not None and ms != str(args.iterations):
            raise Rejected("--iterations", f"also given as -ms {ms} in the harness arguments; give it once")
        if ms is None:
            passthrough += ["-ms", str(args.iterations)]
    elif ms is None:
        passthrough += ["-ms", str(DEFAULT_ITERATIONS)]
        notes.append(f"-ms {DEFAULT_ITERATIONS}: each run trains {DEFAULT_ITERATIONS} iterations "
                     "(--iterations K)")
    if args.launcher == "slurm":
        detach = value("--detach")
        if detach is None:
            passthrough += ["--detach", "false"]
        elif detach.lower() not in ("false", "0", "no"):
            raise Rejected("--detach", f"{detach}: tune reads each job's log when it ends, so "
                                       "setup_experiment.py must wait for it (--detach false)")
        if value("--log_dir") is None:
            log_dir = Path(args.out).expanduser().resolve() / "nemo-run"
            passthrough += ["-l", str(log_dir)]
            notes.append(f"-l {log_dir}: nemo-run keeps each job's log there, where tune reads it")
    return passthrough, notes


def _inside_skill(out: Path) -> bool:
    from mbridge_recompute.commands.harness import _inside_skill as inside

    return inside(out)


def _env(pairs) -> dict:
    from mbridge_recompute.commands.harness import _env as env

    return env(pairs)


# ------------------------------------------------------------------ run

def run(args) -> int:
    if args.from_:
        return _history(args)
    from mbridge_recompute.inputs.loading import has_workload, load_from_args
    from mbridge_recompute.output import emit
    from mbridge_recompute.runs import procgroup
    from mbridge_recompute.tune import history
    from mbridge_recompute.tune import state as store
    from mbridge_recompute.tune.loop import Options, Tuner, check_passthrough_matches

    _check_numbers(args)
    if args.plot or args.no_plot:
        raise InputError("--plot", "goes with --from TUNE.json")
    if not has_workload(args):
        raise InputError("WORKLOAD", "give the workload to tune (a workload file, --model, --hf-config, "
                                     "--recipe or --set)")
    release = args.release             # resolved once, by the command line (cli._run)
    w = load_from_args(args, release, default=False)
    if not args.passthrough:
        raise Rejected("harness arguments", "give the Bridge harness arguments after '--' (e.g. -- -m llama "
                                            "-mr llama3_8b -g h100 -ng 8 -gb 128 -sl 8192)")
    root = Path(args.out).expanduser().resolve()
    if args.launch and _inside_skill(root):
        raise InputError("--out", f"{root} is inside the installed skill; runs belong in your project: "
                                  "run from there, or give --out DIR")
    passthrough, notes = harness_arguments(args)
    notes += check_passthrough_matches(w, passthrough)
    if args.candidates:
        from mbridge_recompute.runs.harness import parse_candidates

        parse_candidates(args.candidates, "--candidates")       # known labels, none twice
    opts = Options(w=w, release=release, workload=args.workload or args.model or args.hf_config or "--set",
                   root=root, repo=args.repo, launcher=args.launcher, passthrough=passthrough,
                   budget_gb=args.budget_gb, free_gb=args.free_gb, max_runs=args.max_runs,
                   allowed=list(args.candidates) if args.candidates else None, gbs=args.gbs, seq=args.seq,
                   env=_env(args.env), name_prefix=args.name_prefix, python=args.python,
                   torchrun=args.torchrun, bridge_release=args.bridge_release, timeout=args.timeout,
                   grace=args.grace, force=args.force, parser_check=not args.no_parser_check)
    tuner = Tuner(opts, progress=_progress)     # Rejected: no run of this workload can start
    path = root / store.FILE
    if path.exists():
        st = store.load(path, "--out")
        store.check_same_command(st, tuner.fingerprint(), path)
    else:
        st = tuner.new_state()
        if args.launch:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError("--out", f"cannot create {root}: {exc.strerror or exc}") from None
            st.save(root)
    with procgroup.SignalGuard() as guard:
        tuner.run(st, launch=args.launch, guard=guard)
    report = history.report(st, tuner, "launch" if args.launch else "dry-run", notes)
    emit(report, args.json, history.render_text)
    if not args.launch:
        return EXIT_OK
    return EXIT_OK if st.answer else EXIT_PROBLEM


def _history(args) -> int:
    from mbridge_recompute import files
    from mbridge_recompute.output import emit
    from mbridge_recompute.tune import history
    from mbridge_recompute.tune import state as store

    if args.launch or args.passthrough:
        raise InputError("--from", "reads a finished or paused tune; it launches nothing (drop --launch "
                                   "and the harness arguments)")
    path = Path(args.from_).expanduser()
    st = store.load(path)
    plot_path = None
    if not args.no_plot:
        plot_path = Path(args.plot).expanduser() if args.plot else path.parent / "tune.png"
        files.check_target(plot_path, args.force, "--plot", (".png",))
        history.require_matplotlib()
    report = history.history_report(st, str(path))
    if plot_path is not None:
        report["plot"] = history.plot(st, plot_path, args.force)
    emit(report, args.json, history.render_history)
    return EXIT_OK if st.answer else EXIT_PROBLEM


def _progress(line: str) -> None:
    from mbridge_recompute.runs.launch import stderr_progress

    stderr_progress(line)
