"""Run a built sweep, one run after another, each into its own run directory.

Every run gets `log.txt` (stdout and stderr of the whole process group) and
`manifest.json` (argv, environment overrides, candidate, git revisions, times,
exit status, timed_out / interrupted). The manifest is written before the
process starts and rewritten when it ends, so a crash of this tool still leaves
a record of what was started.

Processes are started from an argv list (never a shell string) in a new
session, so that a timeout or Ctrl-C can end the whole group (torchrun and its
ranks): SIGTERM first, SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.logs.runlog import CONFIG_DUMP, LOG, MANIFEST
from mbridge_recompute.runs.harness import PlannedRun, Sweep

OUR_FILES = (LOG, MANIFEST, CONFIG_DUMP)


def git_revision(path: Path) -> str:
    """`git rev-parse HEAD` of the repository rooted exactly at `path`, else "unknown".

    An uninitialised submodule directory is not a repository of its own; asking
    git there would answer with the parent's HEAD, so the top level must match.
    """
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=30)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != path.resolve():
            return "unknown"
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() if head.returncode == 0 else "unknown"


def revisions(repo: str) -> dict:
    root = Path(repo)
    return {"megatron_bridge": git_revision(root),
            "megatron_lm": git_revision(root / "3rdparty" / "Megatron-LM")}


def prepare_run_dirs(sweep: Sweep, force: bool) -> None:
    """Refuse to reuse a non-empty run dir unless --force; with --force only our own files go."""
    for run in sweep.runs:
        d = Path(run.run_dir)
        if d.exists() and not d.is_dir():
            raise InputError("--out", f"{d} exists and is not a directory")
        if d.is_dir() and any(d.iterdir()):
            if not force:
                raise InputError("--out", f"run dir {d} is not empty (use --force to reuse it)")
    for run in sweep.runs:
        d = Path(run.run_dir)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:   # a parent that is a file, a read-only directory
            raise InputError("--out", f"cannot create {d}: {exc.strerror or exc}") from None
        for name in OUR_FILES:
            (d / name).unlink(missing_ok=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_manifest(run_dir: Path, manifest: dict) -> None:
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, run_dir / MANIFEST)


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group `pgid`."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after "(comm)": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _end_group(proc: subprocess.Popen, grace: float) -> str:
    """SIGTERM the child's process group, SIGKILL what is left after `grace` seconds.

    Returns "SIGTERM" when the whole group (torchrun and every rank) was gone
    within the grace period, else "SIGKILL".
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return "already-exited"
    deadline = time.monotonic() + grace
    how = "SIGKILL"
    try:
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_alive(proc.pid):
                how = "SIGTERM"
                break
            time.sleep(0.05)
    except (KeyboardInterrupt, _Terminated):
        pass  # a second Ctrl-C while waiting only makes the end quicker
    if how == "SIGKILL":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    return how


class _Terminated(Exception):
    """SIGTERM to this tool: handled like Ctrl-C."""


def launch_run(run: PlannedRun, base_manifest: dict, timeout: Optional[float], grace: float) -> dict:
    run_dir = Path(run.run_dir)
    env = dict(os.environ)
    overrides = dict(run.env)
    if "PYTHONPATH" in overrides and env.get("PYTHONPATH"):
        # keep the caller's path after the checkout's src/
        overrides["PYTHONPATH"] = f"{overrides['PYTHONPATH']}{os.pathsep}{env['PYTHONPATH']}"
    env.update(overrides)
    manifest = {**base_manifest, "name": run.name, "candidate": run.setting.describe(),
                "setting": run.setting.as_fields(), "argv": list(run.argv), "cwd": run.cwd,
                "env": overrides, "log": str(run_dir / LOG), "started_at": _now(), "ended_at": None,
                "duration_s": None, "returncode": None, "timed_out": False, "interrupted": False,
                "ended_by": None, "status": "running"}
    _write_manifest(run_dir, manifest)
    t0 = time.monotonic()
    with open(run_dir / LOG, "wb") as log:
        try:
            proc = subprocess.Popen(run.argv, cwd=run.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            manifest.update(ended_at=_now(), duration_s=0.0, status="not-started",
                            error=f"{type(exc).__name__}: {exc}", returncode=None)
            _write_manifest(run_dir, manifest)
            return manifest
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            manifest["timed_out"] = True
            manifest["ended_by"] = _end_group(proc, grace)
        except (KeyboardInterrupt, _Terminated):
            manifest["interrupted"] = True
            manifest["ended_by"] = _end_group(proc, grace)
    manifest.update(ended_at=_now(), duration_s=round(time.monotonic() - t0, 3), returncode=proc.returncode)
    manifest["status"] = ("timed-out" if manifest["timed_out"] else "interrupted" if manifest["interrupted"]
                          else "ok" if proc.returncode == 0 else "failed")
    _write_manifest(run_dir, manifest)
    return manifest


def launch_sweep(sweep: Sweep, *, timeout: Optional[float], grace: float, parser_check: dict,
                 progress: Callable[[str], None]) -> list:
    """Run every run in order; stop after an interrupt. Returns the manifests of the runs started."""
    base = {"repo": sweep.repo, "launcher": sweep.launcher, "revisions": revisions(sweep.repo),
            "passthrough": list(sweep.passthrough), "parser_checked": bool(parser_check.get("checked"))}
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise _Terminated()

    if previous is not None:
        signal.signal(signal.SIGTERM, on_term)
    manifests = []
    try:
        for i, run in enumerate(sweep.runs, 1):
            progress(f"[{i}/{len(sweep.runs)}] {run.name}: {run.setting.describe()} -> {run.run_dir}")
            m = launch_run(run, base, timeout, grace)
            manifests.append(m)
            progress(f"[{i}/{len(sweep.runs)}] {run.name}: {m['status']} (exit {m['returncode']}, "
                     f"{m['duration_s']} s)")
            if m["interrupted"]:
                progress("interrupted: the sweep stops here")
                break
    except (KeyboardInterrupt, _Terminated):
        # between two runs (no child to end): stop, and report what ran
        progress("interrupted between runs: the sweep stops here")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return manifests


def stderr_progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
