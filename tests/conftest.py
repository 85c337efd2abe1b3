"""Shared helpers: run the real scripts as subprocesses, find the repo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
EXAMPLES = ROOT / "examples"

# the package is importable in-process too (an installed skill works without pip)
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

# the tools under tests/tools (generators, add_release, the mirror paths) import as top-level modules
if str(ROOT / "tests" / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests" / "tools"))


def need_mirror(name: str, *revs: str) -> None:
    """Fail (never skip) the calling test when the git mirror `name` ('Megatron-LM' or 'Megatron
    Bridge', tests/tools/mirrors.py) is absent or lacks a revision in `revs`: what it reads
    exists in no package."""
    from mirrors import missing

    why = missing(name, *revs)
    if why:
        pytest.fail(why, pytrace=False)


SCRIPT_OF = {
    "plan": "plan.py", "config": "write_config.py", "check": "check_config.py",
    "harness": "run_harness.py", "compare": "compare_runs.py", "diagnose": "diagnose.py",
    "tests": "run_tests.py", "tune": "tune.py",
}


def run_script(tool: str, *args: str, cwd: str | os.PathLike | None = None,
               env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `scripts/<tool>.py ARGS` exactly as an agent would."""
    full_env = dict(os.environ)
    full_env.pop("PYTHONPATH", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, str(SCRIPTS / SCRIPT_OF[tool]), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or ROOT, env=full_env,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def run_in_process(*argv) -> tuple:
    """(exit code, stdout, stderr) of one tool run in-process, as its script runs it."""
    import contextlib
    import io

    from mbridge_recompute.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            return exc.code, out.getvalue(), err.getvalue()
    return None, out.getvalue(), err.getvalue()


@pytest.fixture
def run_tool():
    return run_script
