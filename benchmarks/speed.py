"""How fast `plan` answers on a DeepSeek-V3-sized workload with the full candidate search.

Runs `scripts/plan.py --model deepseek-v3 --json` as a subprocess
(61 layers, MLA + MoE, PP 16 as 4 + 14 x 4 + 1, EP 64, TP 2) several times and prints
wall time, the child's peak RSS (resource.getrusage(RUSAGE_CHILDREN)), how many
candidates were searched, and whether torch was imported; side by side, the wall time of a
bare `python -c "import megatron.core.transformer.transformer_config"` in the same
interpreter, run as many times. A figure, not a pass/fail test; the targets are under 1 s and
under 0.2x that bare import; with --alternatives, under 2 s.

Then the search cost on deep stages (the full-recompute candidates once grew with the
layers of one pipeline stage and each was priced in O(layers)): 1000 and 4000 layers on one
stage, 1000 with --alternatives, and 10 000 layers at PP 100 with --alternatives, each the
child's CPU seconds (user + system) and wall time, killed at --deep-timeout.

    .venv/bin/python benchmarks/speed.py [--repeat 5] [--scripts DIR] [--deep-timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# DeepSeek-V3 on 1024 GPUs: the catalog's cited recipe layout (TP 2, PP 16, EP 64): 4 layers on
# the first stage, 1 on the last, 4 on each of the 14 middle stages. (With VPP 2 the 61 layers
# cannot be split by first/last stage counts: megatron-core needs every stage's count to be a
# multiple of VPP, and 61 is odd.)
WORKLOAD_ARGS = ["--model", "deepseek-v3"]

# Wraps the real script: reports, at exit, whether torch or megatron got imported.
PROBE = (
    "import atexit, runpy, sys\n"
    "def _report():\n"
    "    sys.stderr.write('IMPORTED torch=%s megatron=%s\\n' % ('torch' in sys.modules, "
    "any(m.startswith('megatron') for m in sys.modules)))\n"
    "atexit.register(_report)\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


SCRIPTS = ROOT / "scripts"


def _stage(layers: int, pp: str = "") -> str:
    return (f"model:\n  num_layers: {layers}\n  hidden_size: 1024\n  num_attention_heads: 16\n"
            + pp)


# (what, workload YAML, extra plan arguments)
DEEP = [
    ("1000 layers, one stage", _stage(1000), []),
    ("4000 layers, one stage", _stage(4000), []),
    ("1000 layers, one stage, --alternatives", _stage(1000), ["--alternatives"]),
    ("10 000 layers at PP 100, --alternatives",
     _stage(10000, "  pipeline_model_parallel_size: 100\ncluster: {num_gpus: 100}\n"), ["--alternatives"]),
]


def deep_once(yaml_text: str, extra: list[str], timeout: float) -> dict:
    """One plan of a deep workload: the child's CPU and wall seconds, or the timeout."""
    import tempfile

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(yaml_text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(SCRIPTS / "plan.py"), f.name, *extra, "--json"],
                              capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=timeout)
        rc = proc.returncode
        cands = len(json.loads(proc.stdout).get("candidates", [])) if rc in (0, 1) else None
    except subprocess.TimeoutExpired:
        rc, cands = None, None
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.unlink(f.name)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"rc": rc, "wall_s": wall, "cpu_s": cpu, "candidates": cands}


def run_once(extra: list[str]) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, str(SCRIPTS / "plan.py"),
                           *WORKLOAD_ARGS, *extra, "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # max over children so far
    imported = next((ln for ln in proc.stderr.splitlines() if ln.startswith("IMPORTED")), "IMPORTED ?")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {}
    return {"rc": proc.returncode, "wall_s": wall, "peak_rss_mib": rss_kib / 1024,
            "rss_grew": rss_kib > before, "imported": imported.split(" ", 1)[1],
            "candidates": len(report.get("candidates", [])), "frontier": len(report.get("frontier", [])),
            "recommendation": (report.get("recommendation") or {}).get("name"),
            "stderr_tail": proc.stderr.strip().splitlines()[-3:] if proc.returncode not in (0, 1) else []}


BARE_IMPORT = "import megatron.core.transformer.transformer_config"


def bare_import_s() -> float | None:
    """Wall time of the interpreter importing megatron-core's TransformerConfig alone (None if
    megatron-core is not installed in this interpreter)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", BARE_IMPORT], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return wall if proc.returncode == 0 else None


def import_breakdown(top: int = 6) -> list[tuple[str, float]]:
    """Cumulative import time (ms) of the heaviest top-level modules, from `python -X importtime`."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPTS / "plan.py"),
                           *WORKLOAD_ARGS, "--json"], capture_output=True, text=True, cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL)
    cumulative = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = (x.strip() for x in line[len("import time:"):].split("|"))
        if not cum.isdigit():
            continue
        depth = len(name) - len(name.lstrip())
        if depth <= 2:                        # top-level imports and their direct children
            cumulative[name.strip()] = max(cumulative.get(name.strip(), 0), int(cum) / 1000)
    return sorted(cumulative.items(), key=lambda kv: -kv[1])[:top]


def main(argv=None) -> int:
    global SCRIPTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scripts", type=Path, default=SCRIPTS,
                    help="the scripts/ folder to time (another checkout's, for a before/after)")
    ap.add_argument("--deep-timeout", type=float, default=300.0)
    ap.add_argument("--deep-only", action="store_true", help="only the deep-stage search cost")
    args = ap.parse_args(argv)
    SCRIPTS = args.scripts.resolve()
    if args.deep_only:
        deep(args.deep_timeout)
        return 0
    runs = [run_once([]) for _ in range(max(1, args.repeat))]
    first = runs[0]
    if first["rc"] not in (0, 1):
        print("plan failed:", *first["stderr_tail"], sep="\n  ")
        return 1
    walls = [r["wall_s"] for r in runs]
    bare = [b for b in (bare_import_s() for _ in range(max(1, args.repeat))) if b is not None]
    print("plan on DeepSeek-V3 (the catalog's recipe layout: 61 layers, TP2 PP16 EP64), full "
          "candidate search")
    print(f"  runs: {len(runs)}, exit code {first['rc']}")
    print(f"  wall time: median {statistics.median(walls):.3f} s, min {min(walls):.3f} s, "
          f"max {max(walls):.3f} s (process start to exit, incl. interpreter start-up)")
    print(f"  peak RSS of the plan process: {max(r['peak_rss_mib'] for r in runs):.1f} MiB")
    print(f"  candidates searched: {first['candidates']}, on the frontier: {first['frontier']}, "
          f"recommended: {first['recommendation']}")
    print(f"  imported: {first['imported']}")
    alt = [run_once(["--alternatives"]) for _ in range(max(1, args.repeat))]
    alt_walls = [r["wall_s"] for r in alt]
    print(f"  with --alternatives (VPP, layout, CP, offloading beside recompute): median "
          f"{statistics.median(alt_walls):.3f} s, max {max(alt_walls):.3f} s, "
          f"{alt[0]['candidates']} candidates (target < 2 s)")
    if bare:
        ratio = statistics.median(walls) / statistics.median(bare)
        print(f"  side by side, `python -c \"{BARE_IMPORT}\"`: median {statistics.median(bare):.3f} s "
              f"(min {min(bare):.3f} s); plan / bare import = {ratio:.2f} (target < 0.2)")
    else:
        print("  bare import: megatron-core is not installed in this interpreter")
    print("  heaviest imports (cumulative ms, one run): "
          + ", ".join(f"{name} {ms:.0f}" for name, ms in import_breakdown()))
    deep(args.deep_timeout)
    return 0


def deep(timeout: float) -> None:
    print(f"search cost on deep stages ({SCRIPTS}; one run each, killed after {timeout:g} s):")
    for what, text, extra in DEEP:
        r = deep_once(text, extra, timeout)
        if r["rc"] is None:
            print(f"  {what}: > {timeout:g} s wall (killed), {r['cpu_s']:.1f} s CPU by then")
        else:
            print(f"  {what}: {r['cpu_s']:.2f} s CPU, {r['wall_s']:.2f} s wall, exit {r['rc']}, "
                  f"{r['candidates']} candidates")


if __name__ == "__main__":
    sys.exit(main())
