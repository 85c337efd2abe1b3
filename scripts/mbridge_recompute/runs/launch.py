"""Run a built sweep, one run after another, each into its own run directory.

Every run gets `log.txt` (stdout and stderr of the whole process group) and
`manifest.json` (argv, environment overrides, candidate, git revisions, times,
exit status, timed_out / interrupted, how the group was ended). The manifest is
written before the process starts and rewritten when it ends, so a crash of this
tool still leaves a record of what was started. Both are created without following
a link planted at their path (`files.write` replaces atomically; the log is created
exclusively after the run dir was cleared of our own files).

Processes are started from an argv list (never a shell string) in a new session, so
that the whole group (torchrun and its ranks) can be ended: on timeout, on SIGINT,
SIGTERM or SIGHUP to this tool (`runs/procgroup.py`), and after a normal exit when the
leader left members behind (`leftover` in the manifest). SIGTERM first, SIGKILL after
the grace period.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from mbridge_recompute import files
from mbridge_recompute.errors import InputError
from mbridge_recompute.logs.runlog import CONFIG_DUMP, LOG, MANIFEST
from mbridge_recompute.runs import procgroup
from mbridge_recompute.runs.harness import PlannedRun, Sweep

OUR_FILES = (LOG, MANIFEST, CONFIG_DUMP)


def git_revision(path: Path) -> str:
    """`git rev-parse HEAD` of the repository rooted exactly at `path`, else "unknown".

    An uninitialised submodule directory is not a repository of its own; asking
    git there would answer with the parent's HEAD, so the top level must match.
    """
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != path.resolve():
            return "unknown"
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
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
        if d.is_symlink():
            raise InputError("--out", f"{d} is a symbolic link; give a real directory")
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
            (d / name).unlink(missing_ok=True)      # a link is removed itself, never followed


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_manifest(run_dir: Path, manifest: dict) -> None:
    files.write(run_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n", force=True, field="--out")


def launch_run(run: PlannedRun, base_manifest: dict, timeout: Optional[float], grace: float,
               guard: procgroup.SignalGuard) -> dict:
    run_dir = Path(run.run_dir)
    env = dict(os.environ)
    overrides = dict(run.env)
    if "PYTHONPATH" in overrides and env.get("PYTHONPATH"):
        # keep the caller's path after the checkout's src/
        overrides["PYTHONPATH"] = f"{overrides['PYTHONPATH']}{os.pathsep}{env['PYTHONPATH']}"
    env.update(overrides)
    manifest = {**base_manifest, "name": run.name, "candidate": run.setting.describe(),
                "setting": run.setting.as_fields(), "argv": list(run.argv), "cwd": run.cwd,
                "recompute_tokens": list(run.recompute_tokens),
                "env": overrides, "log": str(run_dir / LOG), "started_at": _now(), "ended_at": None,
                "duration_s": None, "returncode": None, "timed_out": False, "interrupted": False,
                "signal": None, "ended_by": None, "leftover": None, "status": "running"}
    _write_manifest(run_dir, manifest)
    t0 = time.monotonic()
    with files.create_exclusive(run_dir / LOG, "--out") as log:
        procgroup.become_subreaper()
        before = procgroup.children()
        try:
            proc = procgroup.start(run.argv, cwd=run.cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            manifest.update(ended_at=_now(), duration_s=0.0, status="not-started",
                            error=f"{type(exc).__name__}: {exc}", returncode=None)
            _write_manifest(run_dir, manifest)
            return manifest
        try:
            with guard.armed():
                proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            manifest["timed_out"] = True
        except procgroup.Terminated as sig:
            manifest.update(interrupted=True, signal=sig.name)
        stopped = manifest["timed_out"] or manifest["interrupted"]
        ended, orphans = procgroup.wind_up(proc, before, grace, stopped)
        manifest["ended_by" if stopped else "leftover"] = ended
        if orphans:
            manifest["orphans_ended"] = len(orphans)
    manifest.update(ended_at=_now(), duration_s=round(time.monotonic() - t0, 3), returncode=proc.returncode)
    manifest["status"] = ("timed-out" if manifest["timed_out"] else "interrupted" if manifest["interrupted"]
                          else "ok" if proc.returncode == 0 else "failed")
    _write_manifest(run_dir, manifest)
    return manifest


def launch_sweep(sweep: Sweep, *, timeout: Optional[float], grace: float, parser_check: dict,
                 progress: Callable[[str], None]) -> list:
    """Run every run in order; stop after a signal. Returns the manifests of the runs started."""
    det = sweep.release
    base = {"repo": sweep.repo, "launcher": sweep.launcher, "revisions": revisions(sweep.repo),
            "bridge_release": det.key if det else None, "passthrough": list(sweep.passthrough),
            "parser_checked": bool(parser_check.get("checked"))}
    manifests = []
    with procgroup.SignalGuard() as guard:
        for i, run in enumerate(sweep.runs, 1):
            if guard.pending is not None:
                progress(f"{guard.signal_name} between runs: the sweep stops here")
                break
            progress(f"[{i}/{len(sweep.runs)}] {run.name}: {run.setting.describe()} -> {run.run_dir}")
            m = launch_run(run, base, timeout, grace, guard)
            manifests.append(m)
            progress(f"[{i}/{len(sweep.runs)}] {run.name}: {m['status']} (exit {m['returncode']}, "
                     f"{m['duration_s']} s)" + (f"; processes it left behind were ended ({m['leftover']})"
                                                if m.get("leftover") else ""))
            if m["interrupted"]:
                progress(f"{m['signal']}: the sweep stops here")
                break
    return manifests


def stderr_progress(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:       # the terminal went away (SIGHUP): the manifests still say what happened
        pass
