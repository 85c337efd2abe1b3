#!/usr/bin/env python3
"""Start-up time of the light tools: what an agent waits for on every call.

Measures wall time of whole processes (interpreter start included), N runs each:
`check --validator builtin` and `config` on the embedded default workload, and
`--help` of every script. Prints median and max per command; with --json one
object. It reports figures; it does not pass or fail.

    python3 benchmarks/startup.py            # 10 runs each
    python3 benchmarks/startup.py --runs 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TOOLS = ["plan.py", "write_config.py", "check_config.py", "run_harness.py", "compare_runs.py",
         "diagnose.py", "run_tests.py"]

COMMANDS = {
    "check --validator builtin": ["check_config.py", "--validator", "builtin", "--json"],
    "config --modules moe_act": ["write_config.py", "--modules", "moe_act", "--json"],
    **{f"{tool} --help": [tool, "--help"] for tool in TOOLS},
}


def time_command(argv: list[str], runs: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    samples, codes = [], set()
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(SCRIPTS / argv[0]), *argv[1:]], cwd=ROOT, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
        codes.add(proc.returncode)
    return {"median_s": round(statistics.median(samples), 4), "max_s": round(max(samples), 4),
            "runs": runs, "exit_codes": sorted(codes)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    results = {name: time_command(argv, args.runs) for name, argv in COMMANDS.items()}
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "results": results}, indent=2))
        return 0
    width = max(map(len, results))
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, wall time per process")
    print(f"{'command':<{width}}  {'median s':>8}  {'max s':>7}  exit")
    for name, r in results.items():
        codes = ",".join(map(str, r["exit_codes"]))
        print(f"{name:<{width}}  {r['median_s']:>8.3f}  {r['max_s']:>7.3f}  {codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
