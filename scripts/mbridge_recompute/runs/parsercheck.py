"""Parse built harness argv with the checkout's own argument parser, when it imports.

Bridge's `scripts/performance/argument_parser.py` imports `nemo_run` at module
top (`argument_parser.py:21`), so outside the NeMo container it usually cannot
be imported; the caller then says the argv was not parser-checked. The import
happens in a subprocess so that nothing of the checkout enters this process.

The rank scripts call `parse_known_args` and hand unknown arguments to Hydra
(`run_script.py`, flat path), so the check is: parsing succeeds, every unknown
argument is a `key=value` override, and the recompute flags parse to what the
candidate means.

Importing the checkout's module is the only thing the tools do with its code, and it must
leave the checkout as it was: the child runs with `-B` and `PYTHONDONTWRITEBYTECODE=1` (no
`__pycache__` appears in `scripts/performance/`), from a temporary directory, and only on
`--launch` or an explicit `--parser-check` (a dry run imports nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from mbridge_recompute.runs.harness import ARGUMENT_PARSER, PlannedRun, harness_tail

# Runs inside the checkout's interpreter: reads [[args...], ...] on stdin, prints one JSON line.
_PROBE = r"""
import json, sys, io, contextlib
sys.path.insert(0, sys.argv[1])
try:
    import argument_parser as ap
    parser = ap.parse_cli_args()
except BaseException as exc:  # ImportError, or anything the module does at import
    print(json.dumps({"importable": False, "reason": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
results = []
for args in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns, unknown = parser.parse_known_args(args)
    except SystemExit:
        results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:] or ["argparse exit"]})
        continue
    ns = vars(ns)
    results.append({"ok": True, "unknown": unknown,
                    "recompute_modules": ns.get("recompute_modules"),
                    "recompute_num_layers": ns.get("recompute_num_layers"),
                    "global_batch_size": ns.get("global_batch_size"),
                    "seq_length": ns.get("seq_length")})
print(json.dumps({"importable": True, "results": results}))
"""


def check_runs(repo: str, runs: Sequence[PlannedRun], python: str = sys.executable,
               timeout: float = 120) -> dict:
    """{"checked": bool, "reason": str, "runs": {name: {"ok", "problems", ...}}}."""
    perf_dir = Path(repo) / Path(ARGUMENT_PARSER).parent
    if not (Path(repo) / ARGUMENT_PARSER).is_file():
        return {"checked": False, "reason": f"{ARGUMENT_PARSER} not found in the checkout", "runs": {}}
    tails = [harness_tail(r) for r in runs]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        with tempfile.TemporaryDirectory(prefix="mbridge-recompute-parser-") as cwd:
            proc = subprocess.run([python, "-B", "-c", _PROBE, str(perf_dir)], input=json.dumps(tails),
                                  capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout,
                                  errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"checked": False, "reason": f"parser probe did not run: {exc}", "runs": {}}
    try:
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(reply, dict) or not isinstance(reply.get("results", []), list):
            raise ValueError("not the probe's reply")
    except (IndexError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"checked": False, "reason": f"parser probe failed: {tail[0]}", "runs": {}}
    if not reply.get("importable"):
        return {"checked": False, "reason": reply.get("reason", "not importable"), "runs": {}}
    out = {}
    for run, res in zip(runs, reply["results"]):
        out[run.name] = _judge(run, res)
    return {"checked": True, "reason": "", "runs": out}


def _judge(run: PlannedRun, res: dict) -> dict:
    if not isinstance(res, dict) or not res.get("ok"):
        error = res.get("error", []) if isinstance(res, dict) else []
        return {"ok": False, "problems": [f"argparse rejected the argv: {' '.join(map(str, error))}"]}
    problems = []
    stray = [u for u in res["unknown"] if "=" not in u]
    if stray:
        # unknown args go to Hydra, whose override grammar needs key=value
        problems.append(f"unknown arguments that are not key=value overrides: {stray}")
    s = run.setting
    expect_mods = None
    expect_rl = None
    toks = run.recompute_tokens
    if "--recompute_modules" in toks:
        expect_mods = list(s.modules)
    if "-rl" in toks:
        expect_rl = s.num_layers
    if res.get("recompute_modules") != expect_mods:
        problems.append(f"recompute_modules parsed as {res.get('recompute_modules')!r}, "
                        f"expected {expect_mods!r}")
    if res.get("recompute_num_layers") != expect_rl:
        problems.append(f"recompute_num_layers parsed as {res.get('recompute_num_layers')!r}, "
                        f"expected {expect_rl!r}")
    if res.get("global_batch_size") is None and not any(u.lstrip("+").startswith("train.global_batch_size=")
                                                        for u in res["unknown"]):
        problems.append("global_batch_size is not pinned")
    if res.get("seq_length") is None:
        problems.append("seq_length is not pinned")
    return {"ok": not problems, "problems": problems, "unknown": res["unknown"]}
