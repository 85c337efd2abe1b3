"""`diagnose`: classify an OOM or a recompute error from a log or a message."""

from __future__ import annotations

import argparse

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError

DESCRIPTION = ("Classify a failed run from its log (or one pasted message): allocator fragmentation, "
               "activation pressure, static/optimizer-state memory, or a recompute configuration / runtime "
               "error, each with its evidence, the next action and the upstream source line.")

EPILOG = """\
kinds:
  fragmentation  reserved-but-unallocated >= the failed request (or max reserved >= 1.10 x
                 max allocated): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first
  static         OOM while building the model/optimizer or in an optimizer step (the
                 first one creates Adam's state): recompute will not help (distributed
                 optimizer, more DP/PP/EP, precision-aware optimizer, ...)
  activations    OOM in a forward or backward: run plan.py for a recompute boundary
  config         a configuration rule (card constraint id and its fix)
  runtime        a failure raised while training (missing Transformer Engine, uniform
                 recompute index error, MoE TP without SP, ...)
  config         also the harness command line: argparse's "unrecognized arguments",
                 "invalid choice", "expected one argument"; Hydra's "Error parsing
                 override 'X'" (a space-separated second label); a list flag given twice;
                 -rl beside --recompute_modules (the fix is to drop -rl)
  unknown        an exception this tool does not recognise

exit status:
  0  at least one finding explains a failure
  1  nothing recognisable (warnings and unknown exceptions alone do not count)
  2  the log cannot be read (missing, empty, not a regular file) or no input was given

Only what the text shows is stated: an OOM with no iteration logged before it has no
iteration number, and a rank is named only when a launcher prefix gives one.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="?", metavar="LOG",
                   help="training log, a harness run directory (its log.txt), or '-' for stdin")
    p.add_argument("--message", metavar="TEXT", help="an error message or traceback to classify")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    import sys

    from mbridge_recompute.logs import diagnose, runlog
    from mbridge_recompute.logs.rundir import RunDir
    from mbridge_recompute.output import emit

    if args.log is None and args.message is None:
        raise InputError("LOG", "give a log file, '-' for stdin, or --message TEXT")
    then = []
    if args.message is not None:
        if not args.message.strip():
            raise InputError("--message", "is empty")
        then = args.message.rstrip("\n").split("\n")
    scan = diagnose.LineScan()
    if args.log == "-":
        run_ = runlog.parse_stream(sys.stdin.buffer, "stdin", "stdin", "stdin", scan, then)
    elif args.log is not None:
        # a harness run directory: its manifest's argv tells what the run was started with
        run_ = RunDir(args.log).parse(scan, name=args.log, then=then, with_config=False)
        run_.path = run_.name = args.log
    else:
        run_ = runlog.parse_lines_into(then, "message", "message", scan)
    report = diagnose.diagnose(run_)
    emit(report, args.json, diagnose.render_text)
    return EXIT_OK if report["explained"] else EXIT_PROBLEM
