"""`tests`: run the recompute-focused tests of a checkout and judge them by what ran."""

from __future__ import annotations

import argparse
import sys

from mbridge_recompute.errors import EXIT_OK, EXIT_PROBLEM, InputError
from mbridge_recompute.output import emit, table

DESCRIPTION = """\
Run the recompute-focused tests of a Megatron-Bridge checkout (its release -- 0.5,
0.6 or main -- read from its files picks the tests that exist there), a Megatron-LM
checkout or this package (detected from the layout), count what ran, and judge:
'pass' only when at least one test ran and none failed or errored. Zero selected
(or all skipped) is 'no-tests', a failure, even when pytest exits 0 (Bridge's
conftest maps exit 5 to 0). A suite entry missing at this revision is reported and
left out, never run as pytest's exit 4."""

EPILOG = """\
suites:
  megatron-bridge  core (default, CPU; per release), precedence (needs nemo_run and the DeepSeek-V3
                   HF config), gpu (TE)
  megatron-lm      core (default; GPU + TE), mla (GPU + TE), moe (1 GPU), moe-layer (8 GPUs)
  mbridge-recompute all (this package's tests/)

examples:
  run_tests.py --repo ~/Megatron-Bridge
  run_tests.py --repo ~/Megatron-Bridge --suite precedence --json
  run_tests.py --repo . -k uniform -- -x

exit codes: 0 pass; 1 fail or no-tests (or a suite entry missing at this revision, a timeout,
an interrupt); 2 unreadable input (no such checkout, an unknown suite, a malformed option)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mbridge_recompute.runs.bridge import keys as bridge_keys

    p.add_argument("--repo", required=True, help="checkout to test")
    p.add_argument("--suite", help="built-in selection (default: the first listed for the checkout kind)")
    p.add_argument("--bridge-release", choices=bridge_keys(),
                   help="the Bridge release whose tests to run (default: read from the checkout)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="narrow further with a pytest -k expression")
    p.add_argument("--runner", choices=["auto", "uv", "python"], default="auto",
                   help="auto: 'uv run --no-sync python -m pytest' when the checkout has uv.lock and uv is "
                        "on PATH, else this interpreter's pytest")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="kill pytest after this long")
    p.add_argument("--json", action="store_true", help="print one JSON object (pytest output goes to stderr)")
    p.add_argument("extra", nargs="*", metavar="-- PYTEST_ARGS", help="extra pytest arguments, after '--'")


def run(args) -> int:
    from mbridge_recompute.runs import testrunner

    # `not 0 < x < inf` so that nan and inf fail too (argparse's float() reads both)
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise InputError("--timeout", "must be > 0 seconds (and finite)")

    def echo(line: str) -> None:
        sys.stderr.write(line + "\n")

    report = testrunner.run_tests(args.repo, args.suite, args.keyword, args.extra,
                                  runner=args.runner, timeout=args.timeout, echo=echo,
                                  release=args.bridge_release)
    emit(report, args.json, _text)
    return EXIT_OK if report["verdict"] == "pass" and report["complete"] else EXIT_PROBLEM


def _text(r: dict) -> str:
    from mbridge_recompute.output import shell_lines, wrap_all

    head = [f"{r['repo_kind']} checkout {r['repo']}, suite {r['suite']} (needs: {r['needs']})"]
    if r.get("release"):
        head.append(f"Bridge release: {r['release']['key'] or 'unknown'} ({r['release']['how']})")
    lines = wrap_all(head) + ["command:"] + shell_lines(r["command"] or [], "  ", "    ")
    found = [f"MISSING at this revision: {p} ({r['missing_why'].get(p, 'not found')})" for p in r["missing"]]
    found += [f"NOT FOUND by pytest: {p}" for p in r.get("not_found", [])]
    lines += wrap_all(found)
    if r["tests"]:
        lines.append("")
        lines.append(table(["test", "outcome"], [[t["id"], t["outcome"]] for t in r["tests"]],
                           breaks=("::", "/", "[")))
    tail = ["", f"selected {r['selected']}  passed {r['passed']}  failed {r['failed']}  "
                f"errors {r['errors']}  skipped {r['skipped']}  deselected {r['deselected']}  "
                f"pytest exit {r['returncode']}"]
    if r.get("timed_out"):
        tail.append(f"timed out: pytest's process group was ended ({r['ended_by']})")
    if r.get("interrupted"):
        tail.append(f"interrupted by {r['signal']}: pytest's process group was ended ({r['ended_by']})")
    if r.get("junit_disagrees"):
        tail.append("note: the junit report disagrees with what the run recorded; the record is used")
    why = {"pass": "at least one test ran, none failed",
           "fail": "a test failed or errored, or pytest ended abnormally",
           "no-tests": "nothing ran (zero selected, or every selected test skipped): not a pass"}
    tail.append(f"verdict: {r['verdict']} ({why[r['verdict']]})")
    if not r["complete"]:
        tail.append("incomplete: part of the suite is missing at this revision")
    return "\n".join(lines + wrap_all(tail))
