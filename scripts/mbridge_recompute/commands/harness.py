"""`harness`: build (default, --dry-run) or launch (--launch) a matched recompute sweep."""

from __future__ import annotations

import argparse
from pathlib import Path

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mbridge_recompute.output import emit, quote_overrides, shell_line, table

DESCRIPTION = """\
Build a matched sweep of Megatron Bridge's performance harness: one run per
recompute candidate, everything else identical. The Bridge harness arguments
after '--' are passed unchanged to every run; only the recompute tokens, the
run name (-wdj) and the config dump path differ. The checkout's Bridge release
(0.5, 0.6 or main) is read from its files and decides the entry point and flags.
Prints the exact argv of every run (default, --dry-run: nothing is imported from
or written to the checkout); --launch runs them one after another."""

EPILOG = """\
candidates: '[]' (selective, empty list: the matched control, added unless --no-control),
'core_attn', 'layernorm,moe_act' (one comma-separated token), 'uniform:N', 'block:N', 'none'.

examples:
  run_harness.py --repo ~/Megatron-Bridge --candidates core_attn moe_act layernorm,moe_act \\
      -- -m deepseek -mr moonlight_16b -ng 8 -g h100 -c bf16 -gb 64 -sl 4096 -ms 20
  run_harness.py --repo ~/Megatron-Bridge --from-plan plan.json --json \\
      -- -m llama -mr llama3_8b -ng 8 -g h100 -gb 128 -sl 8192
  run_harness.py --repo ~/Megatron-Bridge --candidates block:4 --launch --out runs/llama --timeout 3600 -- ...
  run_harness.py --bridge-release 0.5 --candidates moe_act -- ...   # no checkout: print only

exit codes: 0 every run built (and, with --launch, exited 0); 1 the sweep is refused (a
harness argument the release rejects or that fights the sweep, a missing -gb/-sl/-ng, a
candidate given twice), a run failed, timed out or was interrupted, or the checkout's
parser rejected an argv; 2 unreadable input (a missing checkout or plan file, an unknown
label, a malformed option)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mbridge_recompute.runs.bridge import keys as bridge_keys

    p.add_argument("--repo", help="Megatron-Bridge checkout (the runs start from its root); a dry run "
                                  "without it prints the argv and says what it could not check")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--candidates", nargs="+", metavar="CANDIDATE", help="recompute settings to sweep")
    src.add_argument("--from-plan", metavar="PLAN.json",
                     help="take the candidates a `plan --json` report proposes (its harness_candidates; "
                          "without them, its frontier and recommendation)")
    p.add_argument("--no-control", action="store_true",
                   help="do not add the '[]' control run (it is added to --candidates and --from-plan)")
    p.add_argument("--bridge-release", choices=bridge_keys(),
                   help="the Bridge release to build for (default: read from the checkout)")
    p.add_argument("--launcher", choices=["local", "slurm"], default="local",
                   help="local: torchrun on this node (default); slurm: Bridge's setup_experiment.py")
    p.add_argument("--gbs", type=int, help="pin global batch size (-gb) when the harness arguments lack it")
    p.add_argument("--seq", type=int, help="pin sequence length (-sl) when the harness arguments lack it")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable)")
    p.add_argument("--out", default="recompute-runs",
                   help="directory for the run directories, relative to where you run the tool "
                        "(default: %(default)s)")
    p.add_argument("--name-prefix", default="recompute",
                   help="prefix of each run's -wdj name (default: %(default)s)")
    p.add_argument("--python", default="python", help="interpreter for setup_experiment.py (slurm launcher)")
    p.add_argument("--torchrun", default="torchrun", help="torchrun executable (local launcher)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the runs (default)")
    mode.add_argument("--launch", action="store_true", help="run them, one after another")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="end a run after this long (with --launch)")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                   help="after SIGTERM, wait this long before SIGKILL (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="reuse non-empty run directories")
    check = p.add_mutually_exclusive_group()
    check.add_argument("--parser-check", action="store_true",
                       help="in a dry run too, parse each argv with the checkout's argument_parser.py "
                            "(imports it in a child process, bytecode writing off)")
    check.add_argument("--no-parser-check", action="store_true",
                       help="with --launch: do not parse the argv with the checkout's argument_parser.py")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("passthrough", nargs="*", metavar="-- HARNESS_ARGS",
                   help="Bridge harness arguments, after '--', identical for every run")


def _env(pairs) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise InputError("--env", f"{pair[:80]!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _skill_root() -> Path:
    """The installed skill's directory, or the package when pip-installed."""
    from mbridge_recompute import SKILL_ROOT

    return SKILL_ROOT or Path(__file__).resolve().parents[1]


def _inside_skill(out: Path) -> bool:
    root = _skill_root()
    try:
        out.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def run(args) -> int:
    # light start: nothing heavy is imported anywhere on this path
    from mbridge_recompute.runs import harness, parsercheck

    # `not 0 < x < inf` so that nan and inf fail too (argparse's float() reads both)
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise InputError("--timeout", "must be > 0 seconds (and finite)")
    if not 0 <= args.grace < float("inf"):
        raise InputError("--grace", "must be >= 0 seconds (and finite)")
    if not args.out.strip():
        raise InputError("--out", "is empty")
    out = Path(args.out).expanduser().resolve()
    if args.launch and _inside_skill(out):
        raise InputError("--out", f"{out} is inside the installed skill ({_skill_root()}); runs belong in "
                                  "your project: run from there, or give --out DIR")
    notes: list = []
    if args.from_plan:
        settings = harness.candidates_from_plan(args.from_plan, with_control=not args.no_control, notes=notes)
    else:
        settings = harness._with_control(harness.parse_candidates(args.candidates), not args.no_control,
                                         "--candidates", notes, explicit=True)
    sweep = harness.build_sweep(args.repo, settings, args.passthrough, out_dir=str(out),
                                launcher=args.launcher, gbs=args.gbs, seq=args.seq, env=_env(args.env),
                                name_prefix=args.name_prefix, python=args.python, torchrun=args.torchrun,
                                launch=args.launch, release=args.bridge_release)
    if not args.launch and _inside_skill(out):
        notes.append(f"--out {out} is inside the installed skill; --launch refuses it: run from your "
                     "project or give --out DIR")
    want_check = (args.launch and not args.no_parser_check) or args.parser_check
    if sweep.repo is None:
        check = {"checked": False, "reason": "no checkout (--repo)", "runs": {}}
    elif not want_check:
        reason = "--no-parser-check" if args.no_parser_check else \
            "a dry run imports nothing from the checkout (pass --parser-check to parse the argv with it)"
        check = {"checked": False, "reason": reason, "runs": {}}
    else:
        check = parsercheck.check_runs(sweep.repo, sweep.runs)
    rejected = {n: r["problems"] for n, r in check["runs"].items() if not r["ok"]}

    det = sweep.release
    report = {"mode": "launch" if args.launch else "dry-run", "repo": sweep.repo, "launcher": sweep.launcher,
              "release": det.to_dict() if det else None,
              "passthrough": sweep.passthrough,
              "parser_check": {"checked": check["checked"], "reason": check["reason"],
                               "problems": rejected},
              "unchecked": list(sweep.unchecked),
              "notes": notes + list(sweep.notes), "runs": [r.as_dict() for r in sweep.runs]}
    for r, planned in zip(report["runs"], sweep.runs):
        r["display"] = harness.display(planned)

    if rejected:
        report["ok"] = False
        emit(report, args.json, _text)
        return EXIT_PROBLEM
    if not args.launch:
        report["ok"] = True
        emit(report, args.json, _text)
        return EXIT_OK

    from mbridge_recompute.runs import launch
    launch.prepare_run_dirs(sweep, args.force)
    if not check["checked"]:
        launch.stderr_progress(f"argv not parser-checked ({check['reason']})")
    manifests = launch.launch_sweep(sweep, timeout=args.timeout, grace=args.grace, parser_check=check,
                                    progress=launch.stderr_progress)
    by_name = {m["name"]: m for m in manifests}
    for r in report["runs"]:
        m = by_name.get(r["name"])
        r["status"] = m["status"] if m else "not-run"
        for key in ("returncode", "timed_out", "interrupted", "ended_by", "leftover", "started_at",
                    "ended_at", "duration_s", "log"):
            r[key] = m.get(key) if m else None
        r["manifest"] = f"{r['run_dir']}/{launch.MANIFEST}" if m else None
    logs = [r["log"] for r in report["runs"] if r.get("log")]
    report["next"] = shell_line(["python3", "scripts/compare_runs.py", *logs]) if logs else None
    report["ok"] = len(manifests) == len(sweep.runs) and all(m["returncode"] == 0 and m["status"] == "ok"
                                                             for m in manifests)
    emit(report, args.json, _text)
    return EXIT_OK if report["ok"] else EXIT_PROBLEM


def _text(report: dict) -> str:
    import shlex

    from mbridge_recompute.output import shell_lines, shell_token, wrap_all

    lines = [f"{report['mode']}: {len(report['runs'])} runs, launcher {report['launcher']}, "
             f"repo {report['repo'] or '(none)'}"]
    rel = report.get("release")
    if rel:
        lines.append(f"Bridge release: {rel['key'] or 'unknown'} ({rel['how']})")
    pc = report["parser_check"]
    if pc["checked"]:
        lines.append("argv parser-checked with the checkout's scripts/performance/argument_parser.py"
                     + ("" if not pc["problems"] else ": REJECTED"))
        for name, probs in pc["problems"].items():
            lines += [f"  {name}: {p}" for p in probs]
    else:
        lines.append(f"argv NOT parser-checked: {pc['reason']}")
    for item in report.get("unchecked", []):
        lines.append(f"not checked: {item}")
    for note in report["notes"]:
        lines.append(f"note: {quote_overrides(note)}")
    lines = wrap_all(lines)
    if report["mode"] == "launch":
        lines.append("")
        lines.append(table(["run", "candidate", "status", "exit", "seconds", "run dir"],
                           [[r["name"], r["candidate"], r["status"], r["returncode"], r["duration_s"],
                             r["run_dir"]] for r in report["runs"]], "llllrl", breaks="/"))
        if report.get("next"):
            lines += ["", "compare:"] + shell_lines(shlex.split(report["next"]), "  ", "    ")
    else:
        for r in report["runs"]:
            # the one-line form is the JSON's `display`; the text continues it with backslashes
            head = (["cd", shell_token(r["cwd"]), "&&"] if r.get("cwd") else []) \
                + [f"{k}={shell_token(v)}" for k, v in (r.get("env") or {}).items()]
            lines += ["", f"# {r['name']}: {r['candidate']}"] + shell_lines(r["argv"], "", "  ", head=head)
    return "\n".join(lines)
