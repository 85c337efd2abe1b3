"""Hostile input on the tools' surfaces: output targets, snippets, run directories, the harness
argument list, the command-line contract and the test runner's process cleanup.

Each test is named after the case it reproduces and runs the real scripts as subprocesses.
"""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from conftest import run_script


def _one_json(stdout: str) -> dict:
    """The single JSON object a --json run prints (json.loads refuses trailing data)."""
    return json.loads(stdout)


# ------------------------------------------------------------------ output targets
@pytest.mark.parametrize("force", [False, True])
def test_output_never_replaces_a_fifo_even_with_force(tmp_path, force):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    args = ["--modules", "mlp", "--output", str(fifo)] + (["--force"] if force else [])
    r = run_script("config", *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and "--output" in r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"


def test_output_never_replaces_a_socket_even_with_force(tmp_path):
    path = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
        r = run_script("config", "--modules", "mlp", "--format", "yaml", "--output", str(path),
                       "--force", "--json", timeout=60)
        assert r.returncode == 2
        assert _one_json(r.stdout)["error"]["field"] == "--output"
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "the socket was replaced"
    finally:
        sock.close()


def test_plot_never_replaces_a_fifo_even_with_force(tmp_path):
    fifo = tmp_path / "f.png"
    os.mkfifo(fifo)
    r = run_script("plan", "--plot", str(fifo), "--force", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--plot" in r.stderr and "not a regular file" in r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_force_still_replaces_a_regular_file(tmp_path):
    target = tmp_path / "r.py"
    target.write_text("old\n")
    r = run_script("config", "--modules", "mlp", "--output", str(target), "--force", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "recompute_modules" in target.read_text()
