"""The Megatron Bridge 0.6.2 environment the tests run real Bridge code in.

tests/envs/build.sh builds it (Python 3.12, megatron-core 0.19.2, megatron-bridge 0.6.2 and the
packages its config, recipe and override modules import) and names it in
$MBR_ENVS/envs.json as "bridge-0.6.2". Transformer Engine cannot exist on a machine without
CUDA, so the stand-in under tests/standins/ (import-only, see its docstring) is on that path;
this checkout's copy is used, whatever checkout built the environment.

Recipes read their model's Hugging Face config.json; `hf_cache(dir)` writes the facts in
tests/fixtures/hf_configs/ into a local cache the Hub client reads offline.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS

ENVS = Path(os.environ.get("MBR_ENVS", Path.home() / ".cache" / "mbridge-recompute" / "envs"))
HF_FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
STANDINS = ROOT / "tests" / "standins"
REVISION = "0" * 40   # any 40-hex name; refs/main only has to name it


def bridge_env() -> dict:
    manifest = ENVS / "envs.json"
    if not manifest.exists():
        pytest.fail(f"no per-release environments at {ENVS}: run `bash tests/envs/build.sh`")
    env = json.loads(manifest.read_text()).get("bridge-0.6.2")
    if env is None:
        pytest.fail(f"{manifest} has no bridge-0.6.2 environment: run `bash tests/envs/build.sh`")
    # this checkout's stand-in, not the one of the checkout that built the environment
    parts = [p for p in env["pythonpath"].split(os.pathsep) if p and not p.endswith("tests/standins")]
    return {"python": env["python"], "pythonpath": os.pathsep.join([*parts, str(STANDINS)])}


def hf_cache(home: Path) -> Path:
    """Write every fixture config.json into an offline Hub cache under `home`; returns `home`."""
    for path in sorted(HF_FIXTURES.glob("*.json")):
        entry = json.loads(path.read_text())
        repo = home / "hub" / ("models--" + entry["repo"].replace("/", "--"))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
        # a recipe that pins a revision looks for that snapshot (e.g. qwen3_moe.py:29 @ 0.6.2)
        for revision in [REVISION, *entry.get("revisions", [])]:
            snapshot = repo / "snapshots" / revision
            snapshot.mkdir(parents=True, exist_ok=True)
            (snapshot / "config.json").write_text(json.dumps(entry["config"], indent=1))
    return home


def run_in_bridge(args: list, hf_home: Path, *, cwd=None, timeout: float = 900,
                  extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python ARGS` in the Bridge environment with this checkout's scripts/ first on the path,
    offline against the cache at `hf_home`."""
    spec = bridge_env()
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(SCRIPTS), spec["pythonpath"]]),
               HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               MEGATRON_CONFIG_LOCK_DIR=str(hf_home / "locks"), PYTHONWARNINGS="ignore")
    env.update(extra_env or {})
    return subprocess.run([spec["python"], *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT, stdin=subprocess.DEVNULL, timeout=timeout)
