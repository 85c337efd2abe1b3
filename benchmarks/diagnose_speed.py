"""How long `diagnose` takes on a very large log of many short tracebacks.

Writes a log of N short Python tracebacks (default 1.2 million, about 200 MB: a crash loop
restarted by a supervisor, or one rank's retry loop) plus one OOM near the end, then runs
`scripts/diagnose.py LOG --json` as a subprocess and prints the wall time, the child's peak
RSS and what the report found. A figure, not a pass/fail test.

    .venv/bin/python benchmarks/diagnose_speed.py [--tracebacks 1200000] [--repeat 1]
    .venv/bin/python benchmarks/diagnose_speed.py --scripts /other/checkout/scripts   # compare
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRACEBACK = ('Traceback (most recent call last):\n'
             '  File "/opt/train/loop.py", line {line}, in step\n'
             '    batch = next(it)\n'
             'ValueError: bad record {n} in shard {shard} of /data/corpus/train\n')
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
       "capacity of 79.11 GiB of which 1.20 GiB is free. Of the allocated memory 70.10 GiB is "
       "allocated by PyTorch, and 5.30 GiB is reserved by PyTorch but unallocated.\n")


def write_log(path: Path, n: int) -> int:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(TRACEBACK.format(line=100 + i % 900, n=i, shard=i % 64))
            if i == n - 10:
                fh.write(OOM)
    return path.stat().st_size


def run_once(scripts: Path, log: Path) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(scripts / "diagnose.py"), str(log), "--json"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    try:
        kinds = [f["kind"] for f in json.loads(proc.stdout)["findings"]]
    except (json.JSONDecodeError, KeyError):
        kinds = [f"no report: {proc.stderr.strip()[-200:]}"]
    return {"rc": proc.returncode, "wall_s": round(wall, 2), "peak_rss_mib": round(rss), "kinds": kinds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracebacks", type=int, default=1_200_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--scripts", type=Path, default=ROOT / "scripts", help="the scripts/ directory to time")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="diagnose-speed-") as tmp:
        log = Path(tmp) / "many_tracebacks.log"
        size = write_log(log, args.tracebacks)
        print(f"log: {args.tracebacks} tracebacks, {size / 1e6:.0f} MB")
        for i in range(args.repeat):
            print(json.dumps({"run": i + 1, **run_once(args.scripts, log)}))


if __name__ == "__main__":
    main()
