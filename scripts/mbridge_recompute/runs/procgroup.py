"""Child process groups that always end: on timeout, on SIGINT / SIGTERM / SIGHUP, and after
the child's own normal exit.

Every child (a torchrun with its ranks, a pytest with its workers) starts in a new session, so
it and everything it spawns share one process group that `killpg` can reach: SIGTERM first, then
SIGKILL after a grace period. A child in its own session does not get the terminal's SIGHUP, so
when this tool is hung up on it must end the group itself; and a leader that exits normally can
leave members behind (a data-loader worker, a test's subprocess) that would otherwise hold GPUs
or a pipe open forever.

A process that leaves the group -- a test that calls `setsid`, a daemon that double-forks -- is
out of reach of `killpg`. So before the first child starts, this tool makes itself the child
subreaper of everything it starts (`prctl(PR_SET_CHILD_SUBREAPER)`, Linux >= 3.4, through
ctypes): an orphaned descendant is then re-parented to this tool instead of init, and
`end_orphans` ends (and reaps) every such process once the child is done. A subreaper, not a
cgroup: it needs no privilege, no writable cgroup tree and no systemd (none of which a user's
shell, a container or a CI runner reliably has), and it catches every descendant whatever session
or group it moved to. What it cannot catch: a process handed to another service (systemd-run, a
container runtime), and anything while its own parent is still alive (it is re-parented, and so
found, only when that parent ends; `end_orphans` repeats until none is left). Where the system
has no such call (not Linux), only the process group is ended.

Signals are turned into an exception only while the tool waits on a child (`SignalGuard.armed`);
one that arrives elsewhere -- while a manifest is being written, while a group is being ended -- is
held and acted on at the next safe point, so a record is never left half-written.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

HANDLED = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Terminated(Exception):
    """A signal asked this tool to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class SignalGuard:
    """SIGINT, SIGTERM and SIGHUP, held until the tool is at a point where it can stop cleanly."""

    def __init__(self):
        self.pending: Optional[int] = None
        self._armed = False
        self._previous: dict = {}

    def _handler(self, signum, frame):
        if self.pending is None:
            self.pending = signum
        if self._armed:
            self._armed = False          # a second signal while ending the group only records
            raise Terminated(signum)

    def __enter__(self) -> "SignalGuard":
        for s in HANDLED:
            try:
                self._previous[s] = signal.signal(s, self._handler)
            except (ValueError, OSError):  # not the main thread: leave the defaults
                pass
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()

    @contextmanager
    def armed(self):
        """Inside: a signal raises `Terminated` at once (a held one too)."""
        if self.pending is not None:
            raise Terminated(self.pending)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @property
    def signal_name(self) -> Optional[str]:
        return signal.Signals(self.pending).name if self.pending is not None else None


PR_SET_CHILD_SUBREAPER = 36          # linux/prctl.h
_SUBREAPER: Optional[bool] = None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the OS cannot."""
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _SUBREAPER = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                pass
    return _SUBREAPER


def start(argv: list, **kw) -> subprocess.Popen:
    """`Popen` in a new session (its own process group), stdin closed unless given; this process
    becomes the subreaper of whatever it starts."""
    become_subreaper()
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(argv, start_new_session=True, **kw)


def children() -> set:
    """The pids whose parent is this process (from /proc; empty where there is none)."""
    me, out = str(os.getpid()), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == me:
            out.add(int(stat.parent.name))
    return out


def end_orphans(before: set, grace: float, limit: float = 30.0) -> list:
    """End every process re-parented to this tool since `before` (its children then) was taken:
    what a finished child left behind outside its group. SIGTERM, SIGKILL after `grace`, then reap;
    repeated while ending one re-parents its own children here. Returns the pids ended."""
    if not _SUBREAPER:
        return []
    ended: list = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        orphans = children() - set(before)
        if not orphans:
            break
        ended += sorted(orphans)
        for pid in orphans:
            _signal(pid, signal.SIGTERM)
        until = time.monotonic() + grace
        while orphans and time.monotonic() < until:
            orphans = {pid for pid in orphans if not _reaped(pid)}
            if orphans:
                time.sleep(0.02)
        for pid in orphans:
            _signal(pid, signal.SIGKILL)
        for pid in orphans:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return ended


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group `pgid`."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
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


def end_group(proc: subprocess.Popen, grace: float) -> str:
    """SIGTERM the child's process group, SIGKILL what is left after `grace` seconds.

    Returns "SIGTERM" when the whole group was gone within the grace period, "SIGKILL" when it
    had to be killed, "already-exited" when nothing of it was left to signal.
    """
    pgid = proc.pid
    if proc.poll() is not None and not group_alive(pgid):
        return "already-exited"
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return "already-exited"
    deadline = time.monotonic() + grace
    how = "SIGKILL"
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not group_alive(pgid):
            how = "SIGTERM"
            break
        time.sleep(0.05)
    if how == "SIGKILL":
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    # members killed by SIGKILL are reaped by init; wait until none is left running
    until = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < until:
        time.sleep(0.02)
    return how


def end_leftovers(proc: subprocess.Popen, grace: float) -> Optional[str]:
    """After the leader exited on its own: end what it left running in its group (None: nothing)."""
    if not group_alive(proc.pid):
        return None
    return end_group(proc, grace)


def wind_up(proc: subprocess.Popen, before: set, grace: float, stopped: bool) -> tuple:
    """(how the group was ended, the orphans ended) once a leader is done: a leader that was
    stopped (timed out, signalled) takes its whole group with it; one that exited leaves only
    what stayed in its group (a stuck worker, a test's stray subprocess). Either way, what left
    the group (setsid, a double fork) and was re-parented here goes as well."""
    ended = end_group(proc, grace) if stopped else end_leftovers(proc, grace)
    return ended, end_orphans(before, grace)
