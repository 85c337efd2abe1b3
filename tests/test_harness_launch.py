"""`harness --launch` end to end against a STAND-IN harness.

A GPU training job cannot run here, so a temporary checkout holds the stand-in
harness of tests/fixtures/harness (`standin.make_checkout`, shaped like a Bridge
release: a rank entry point that applies the flat-path override precedence,
validates recompute like Megatron-Core, writes its config and a Bridge-format log
whose numbers depend on the candidate) and a stand-in `torchrun` on PATH that
starts N ranks. Everything else is real: the tool runs as a subprocess, starts
real process groups, and is timed out, interrupted and hung up on with real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SCRIPTS, run_script

FIXTURES = ROOT / "tests" / "fixtures" / "harness"
sys.path.insert(0, str(FIXTURES))
import standin as checkouts  # noqa: E402

PINNED = ["-m", "deepseek", "-mr", "moonlight_16b", "-ng", "2", "-g", "h100", "-c", "bf16",
          "-gb", "16", "-sl", "4096", "-ms", "4"]


def _torchrun_env(tmp_path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    torchrun = bin_dir / "torchrun"
    body = (FIXTURES / "torchrun").read_text().split("\n", 1)[1]
    torchrun.write_text(f"#!{sys.executable}\n{body}")
    torchrun.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def standin(tmp_path):
    """(checkout, env, head): a main-shaped git checkout, and PATH with the stand-in torchrun."""
    repo = checkouts.make_checkout(tmp_path / "bridge", "main", git=True)
    (repo / "3rdparty" / "Megatron-LM").mkdir(parents=True)   # an uninitialised submodule dir
    return repo, _torchrun_env(tmp_path), checkouts.head(repo)


def launch(repo, env, out, *candidates, extra=(), extra_env=None, timeout=120):
    return run_script("harness", "--repo", repo, "--launch", "--json", "--out", out, "--candidates",
                      *candidates, *extra, "--", *PINNED, env={**env, **(extra_env or {})}, timeout=timeout)


def manifest(out, name):
    return json.loads((out / name / "manifest.json").read_text())


def test_launch_writes_run_dirs_manifests_and_bridge_format_logs(standin, tmp_path):
    repo, env, head = standin
    out = tmp_path / "runs"
    proc = launch(repo, env, out, "[]", "core_attn", "layernorm,moe_act", "block:2")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["parser_check"]["checked"] is True
    peaks = {}
    for r in report["runs"]:
        d = out / r["name"]
        m = manifest(out, r["name"])
        assert m["status"] == "ok" and m["returncode"] == 0
        assert m["timed_out"] is False and m["interrupted"] is False
        assert m["argv"] == r["argv"] and m["env"]["PYTHONPATH"].split(os.pathsep)[0] == "src"
        assert m["revisions"] == {"megatron_bridge": head, "megatron_lm": "unknown"}
        assert m["setting"] == r["setting"] and m["started_at"] <= m["ended_at"]
        log = (d / "log.txt").read_text()
        assert "[after training is done]" in log and "MODEL_TFLOP/s/GPU" in log
        # the stand-in rank wrote what the argv made of the recipe (full/block/5)
        cfg = json.loads((d / "ConfigContainer.yaml").read_text())["model"]
        assert cfg["recompute_granularity"] == r["setting"]["recompute_granularity"]
        assert cfg["recompute_method"] == r["setting"]["recompute_method"]
        peaks[r["name"]] = max(float(line.split("mem-max-allocated-gigabytes: ")[1].split(" ")[0])
                               for line in log.splitlines() if "mem-max-allocated-gigabytes" in line)
    # numbers depend on the candidate: the control holds the most, full recompute the least
    assert peaks["empty"] > peaks["core_attn"] > peaks["layernorm+moe_act"] > peaks["block2"]


def test_launch_refuses_a_non_empty_run_dir_without_force(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    (out / "empty").mkdir(parents=True)
    (out / "empty" / "notes.txt").write_text("mine")
    proc = launch(repo, env, out, "[]")
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert not (out / "empty" / "log.txt").exists()
    proc = launch(repo, env, out, "[]", extra=("--force",))
    assert proc.returncode == 0, proc.stderr
    assert (out / "empty" / "notes.txt").read_text() == "mine"   # --force only replaces our own files


def test_launch_into_an_out_dir_below_a_file_is_bad_input(standin, tmp_path):
    repo, env, _ = standin
    (tmp_path / "a_file").write_text("user data")
    proc = launch(repo, env, tmp_path / "a_file" / "runs", "[]")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --out: cannot create")
    assert "Traceback" not in proc.stderr and (tmp_path / "a_file").read_text() == "user data"


def test_failed_run_makes_exit_1_and_the_sweep_goes_on(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    # the control needs 60 GB: with 55 GB of "HBM" it runs out of memory; layernorm+moe_act (52) fits
    proc = launch(repo, env, out, "[]", "layernorm,moe_act", extra_env={"STANDIN_HBM_GB": "55"})
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    status = {r["name"]: r["status"] for r in report["runs"]}
    assert status == {"empty": "failed", "layernorm+moe_act": "ok"}
    assert "CUDA out of memory" in (out / "empty" / "log.txt").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_timeout_ends_the_process_group_and_is_recorded(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    pidfile = tmp_path / "pids"
    t0 = time.monotonic()
    proc = launch(repo, env, out, "[]", extra=("--timeout", "3", "--grace", "1"),
                  extra_env={"STANDIN_SLEEP": "60", "STANDIN_PIDFILE": str(pidfile)})
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    m = manifest(out, "empty")
    assert m["timed_out"] is True and m["interrupted"] is False and m["status"] == "timed-out"
    assert m["ended_by"] == "SIGTERM" and m["returncode"] != 0
    rank_pid, grandchild = map(int, pidfile.read_text().split())
    assert not _alive(rank_pid) and not _alive(grandchild)


def test_child_that_ignores_sigterm_is_killed_after_the_grace_period(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    proc = launch(repo, env, out, "[]", extra=("--timeout", "3", "--grace", "1"),
                  extra_env={"STANDIN_SLEEP": "60", "STANDIN_IGNORE_TERM": "1"})
    assert proc.returncode == 1
    m = manifest(out, "empty")
    assert m["timed_out"] is True and m["ended_by"] == "SIGKILL"


def _start_tool(repo, env, out, pidfile, *candidates, extra_env=None):
    full_env = {**os.environ, **env, "STANDIN_SLEEP": "60", "STANDIN_PIDFILE": str(pidfile),
                **(extra_env or {})}
    full_env.pop("PYTHONPATH", None)
    tool = subprocess.Popen([sys.executable, str(SCRIPTS / "run_harness.py"), "--repo", str(repo), "--launch",
                             "--json", "--out", str(out), "--grace", "2", "--candidates", *candidates,
                             "--", *PINNED], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the stand-in rank never started"
        time.sleep(0.1)
    return tool


def test_interrupt_ends_the_child_group_records_it_and_stops_the_sweep(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    pidfile = tmp_path / "pids"
    tool = _start_tool(repo, env, out, pidfile, "[]", "core_attn")
    tool.send_signal(signal.SIGINT)
    stdout, stderr = tool.communicate(timeout=30)
    assert tool.returncode == 1, stderr
    m = manifest(out, "empty")
    assert m["interrupted"] is True and m["status"] == "interrupted" and m["ended_at"]
    rank_pid, grandchild = map(int, pidfile.read_text().split())
    assert not _alive(rank_pid) and not _alive(grandchild)
    # the sweep stopped: the second run never started
    assert not (out / "core_attn" / "manifest.json").exists()
    report = json.loads(stdout)
    assert [r["status"] for r in report["runs"]] == ["interrupted", "not-run"]


def test_compare_reads_the_logs_the_sweep_wrote(standin, tmp_path):
    repo, env, _ = standin
    out = tmp_path / "runs"
    proc = launch(repo, env, out, "[]", "moe_act", "uniform:1")
    assert proc.returncode == 0, proc.stderr
    cmp = run_script("compare", *[out / n / "log.txt" for n in ("empty", "moe_act", "uniform1")], "--json")
    assert cmp.returncode in (0, 1), cmp.stderr
    rows = {r["name"]: r for r in json.loads(cmp.stdout)["runs"]}
    assert set(rows) == {"empty", "moe_act", "uniform1"}
    assert all(r["status"] == "pass" for r in rows.values())
    # the stand-in's peaks: 60 GB control, 54 GB moe_act, 30.1 GB full (rank 0, after iteration 2)
    assert rows["empty"]["peak_allocated_gb"] == pytest.approx(60.0)
    assert rows["moe_act"]["peak_allocated_gb"] == pytest.approx(54.0)
    assert rows["uniform1"]["peak_allocated_gb"] == pytest.approx(30.1)


def test_revisions_read_each_repository_itself_never_the_parents_head(tmp_path):
    from mbridge_recompute.runs.launch import revisions

    repo = tmp_path / "bridge"
    sub = repo / "3rdparty" / "Megatron-LM"
    sub.mkdir(parents=True)
    heads = {}
    for path in (sub, repo):
        git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", str(path)], check=True)
        heads[path] = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True,
                                     text=True).stdout.strip()
    assert revisions(str(repo)) == {"megatron_bridge": heads[repo], "megatron_lm": heads[sub]}
    assert revisions(str(tmp_path / "not-a-repo")) == {"megatron_bridge": "unknown", "megatron_lm": "unknown"}


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_hangup_or_terminate_ends_the_run_group_and_records_it(standin, tmp_path, sig):
    """SIGHUP (the terminal closed) used to kill the tool but not the run, whose manifest stayed
    `running`: the run is in its own session and never sees the terminal's hangup."""
    repo, env, _ = standin
    out, pidfile = tmp_path / "runs", tmp_path / "pids"
    tool = _start_tool(repo, env, out, pidfile, "[]", "core_attn")
    tool.send_signal(sig)
    stdout, stderr = tool.communicate(timeout=30)
    assert tool.returncode == 1, stderr
    m = manifest(out, "empty")
    assert m["status"] == "interrupted" and m["signal"] == sig.name
    assert m["ended_by"] in ("SIGTERM", "SIGKILL")
    rank_pid, grandchild = map(int, pidfile.read_text().split())
    assert not _alive(rank_pid) and not _alive(grandchild)
    report = json.loads(stdout)
    assert [r["status"] for r in report["runs"]] == ["interrupted", "not-run"]


def test_processes_a_run_leaves_behind_after_a_normal_exit_are_ended(standin, tmp_path):
    repo, env, _ = standin
    out, pidfile = tmp_path / "runs", tmp_path / "leftover"
    proc = launch(repo, env, out, "[]", extra=("--grace", "2"),
                  extra_env={"STANDIN_LEFTOVER_PIDFILE": str(pidfile)})
    assert proc.returncode == 0, proc.stderr
    m = manifest(out, "empty")
    assert m["status"] == "ok" and m["leftover"] == "SIGTERM"
    assert not _alive(int(pidfile.read_text()))


def test_a_normal_run_records_no_leftover(standin, tmp_path):
    repo, env, _ = standin
    assert launch(repo, env, tmp_path / "runs", "[]").returncode == 0
    assert manifest(tmp_path / "runs", "empty")["leftover"] is None


def test_links_planted_in_a_run_dir_are_never_followed(standin, tmp_path):
    """`--force` reuses a run dir: a link at manifest.json.tmp (the old temporary name), manifest.json
    or log.txt must not redirect what the tool writes."""
    repo, env, _ = standin
    out = tmp_path / "runs"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    d = out / "empty"
    d.mkdir(parents=True)
    for name in ("manifest.json.tmp", "manifest.json", "log.txt"):
        (d / name).symlink_to(victim)
    proc = launch(repo, env, out, "[]", extra=("--force",))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious"
    assert not (d / "manifest.json").is_symlink() and not (d / "log.txt").is_symlink()
    assert manifest(out, "empty")["status"] == "ok"


@pytest.mark.parametrize("release", checkouts.RELEASES)
def test_each_release_launches_through_its_own_entry_point(tmp_path, release):
    """At 0.5 the rank script is run_script.py and -sl does not set the model's sequence length: the
    stand-in 0.5 rank fails the model/dataset sequence-length assertion unless the sweep pins it."""
    repo = checkouts.make_checkout(tmp_path / "bridge", release)
    env = _torchrun_env(tmp_path)
    pinned = [t if t != "4096" else "8192" for t in PINNED]
    proc = run_script("harness", "--repo", repo, "--launch", "--json", "--out", tmp_path / "runs",
                      "--candidates", "[]", "--", *pinned, env=env)
    assert proc.returncode == 0, proc.stderr
    m = manifest(tmp_path / "runs", "empty")
    assert m["bridge_release"] == release and m["status"] == "ok"
    cfg = json.loads((tmp_path / "runs" / "empty" / "ConfigContainer.yaml").read_text())
    assert cfg["release"] == release and cfg["model"]["seq_length"] == 8192
    if release == "0.5":
        # the same run without the Hydra pin: what a plain -sl does on 0.5
        argv = [a for a in m["argv"] if a != "model.seq_length=8192"]
        rank = subprocess.run([sys.executable, *argv[3:]], cwd=repo, capture_output=True, text=True,
                              env={**os.environ, **env, "PYTHONPATH": "src"})
        assert rank.returncode == 1 and "sequence length configuration" in rank.stdout
