"""`compare`: run logs -> a matched comparison table against the control."""

from __future__ import annotations

import argparse

from mbridge_recompute.errors import InputError

DESCRIPTION = ("Parse Bridge / Megatron-LM run logs and compare each run against the matched control: "
               "per-rank peak memory, steady-state step time and TFLOP/s/GPU, loss finiteness, and a "
               "status per the measurement contract (pass / oom / nan / incomplete).")

EPILOG = """\
runs and the control:
  A run is named after its log file's stem; a harness run directory (RUN/log.txt +
  RUN/manifest.json) is named by the manifest's name, else the directory. The control
  is --control NAME, else the run whose manifest setting is '[]' (selective, no
  modules) or whose name is 'empty', else the first log.

definitions:
  steady window  iterations floor(T*fraction)+1 .. T of the run's target T
                 (--steady-fraction, default 0.5 = the second half), or --steady-from N
  pass           optimizer initialised (memory report after iteration >= 2, or an
                 iteration >= 2 line) and at least --min-steady-steps finite steps in
                 the window (default: every step the window should hold)
  nan            a missing `lm loss` (Bridge omits a NaN loss), nan/inf loss or grad norm
  peak           mem-max-allocated-gigabytes (decimal GB), max over ranks; deltas are
                 taken at the latest 'after K iterations' both runs reported
  narrowest      the matched passing candidate with the smallest step time among those
                 whose peak is at least --min-saving-pct below the control's
  matched        manifests' argv equal apart from recompute/naming flags, equal
                 revisions (`git` or `revisions`) and environment overrides (`env`);
                 equal parallelism, batch, sequence, precision and schedule fields in
                 the ConfigContainer.yaml beside each log (when the harness wrote one);
                 from the logs: train iterations, global batch size, theoretical
                 weight+optimizer memory, parameter count, reporting ranks

exit status:
  0  the table was built and a matched candidate passed (or a lone control passed)
  1  no candidate passed, or a comparison is unmatched (its deltas are not evidence)
  2  a log is unreadable or an option is wrong
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="run logs (or harness run directories)")
    p.add_argument("--control", metavar="NAME", help="name of the control run")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steady-from", type=int, metavar="N", help="first iteration of the steady window")
    g.add_argument("--steady-fraction", type=float, default=0.5, metavar="F",
                   help="skip this fraction of the target iterations (default 0.5)")
    p.add_argument("--min-steady-steps", type=int, metavar="N",
                   help="finite steady steps a pass needs (default: all the window should hold)")
    p.add_argument("--min-saving-pct", type=float, default=0.5, metavar="P",
                   help="peak reduction a candidate needs to count as lowering the peak (default 0.5)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--markdown", action="store_true", help="print a markdown table")


def run(args) -> int:
    from mbridge_recompute.logs import compare
    from mbridge_recompute.logs.rundir import RunDir
    from mbridge_recompute.output import emit

    if args.steady_from is not None and args.steady_from < 1:
        raise InputError("--steady-from", "must be >= 1")
    if not 0.0 <= args.steady_fraction < 1.0:
        raise InputError("--steady-fraction", "must be in [0, 1)")
    if args.min_steady_steps is not None and args.min_steady_steps < 1:
        raise InputError("--min-steady-steps", "must be >= 1")
    if not 0.0 <= args.min_saving_pct < 100.0:   # written so that nan fails too
        raise InputError("--min-saving-pct", "must be in [0, 100)")
    runs = [RunDir(a).parse() for a in args.logs]
    report = compare.compare(runs, args.control, args.steady_from, args.steady_fraction,
                             args.min_steady_steps, args.min_saving_pct)
    if args.markdown:
        emit(report, False, compare.render_markdown)
    else:
        emit(report, args.json, compare.render_text)
    return compare.exit_code(report)
