"""`run_tests.py` judges real pytest runs by what ran, not by pytest's exit code.

Every case builds a small pytest project in a temporary directory shaped like a
Megatron-Bridge checkout of one release (`standin.make_checkout(..., tests=True)`:
the recompute test files of 0.5, 0.6 or main with the test names they have there,
and a conftest that maps exit status 5 to 0 the way Bridge's does,
tests/unit_tests/conftest.py:133-135), and runs the real tool on it as a subprocess;
timeouts and interrupts are real signals to real process groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, SCRIPTS, run_script

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
import standin  # noqa: E402

from mbridge_recompute.runs import testrunner  # noqa: E402

# the temporary projects need no third-party pytest plugin; loading them all costs seconds per run
NO_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
COMM_NODE = "test_moe_ep_overlap_rejects_moe_in_recompute_modules"


def make_bridge(root, release="main", **files):
    """A release-shaped checkout with its recompute tests; `files` replace test files' bodies."""
    repo = standin.make_checkout(root, release, tests=True)
    for rel, body in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return repo


def tool(repo, *args, env=None, timeout=120):
    proc = run_script("tests", "--repo", repo, "--json", *args, env=env if env is not None else NO_PLUGINS,
                      timeout=timeout)
    return proc, json.loads(proc.stdout)   # one JSON object on stdout; pytest's output is on stderr


def test_passing_selection_is_a_pass_counted_from_what_ran(tmp_path):
    proc, r = tool(make_bridge(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert r["verdict"] == "pass" and r["repo_kind"] == "megatron-bridge" and r["release"]["key"] == "main"
    # the node ids select one test of the comm-overlap file and one of the Qwen3.5-VL file
    assert (r["selected"], r["passed"], r["failed"], r["errors"], r["skipped"]) == (5, 5, 0, 0, 0)
    assert any(t["id"].endswith(COMM_NODE) for t in r["tests"])
    assert not any(t["id"].endswith("test_default_values") for t in r["tests"])
    assert any(a.startswith("--junitxml=") for a in r["command"]) and r["counted_by"] == "record"


@pytest.mark.parametrize("release,count", [("0.5", 2), ("0.6", 4), ("main", 5)])
def test_each_release_runs_the_recompute_tests_it_has(tmp_path, release, count):
    """0.5 has no comm-overlap recompute test (added by 890cee39b) and no r050 / Qwen3.5-VL file;
    v0.6.0's Qwen3.5-VL file asserts nothing about recompute, so it is not in the 0.6 suite."""
    proc, r = tool(make_bridge(tmp_path, release))
    assert proc.returncode == 0, proc.stderr
    assert r["release"]["key"] == release and r["complete"] is True and r["missing"] == []
    assert r["verdict"] == "pass" and r["selected"] == count
    if release == "0.6":
        assert not any("qwen35" in p for p in r["suite_paths"])


def test_a_node_id_missing_at_this_revision_is_reported_not_a_pytest_exit_4(tmp_path):
    """A 0.5 checkout judged with main's suite: the comm-overlap file exists but not the test.
    pytest would answer `ERROR: not found` with exit 4 and run nothing else at all."""
    proc, r = tool(make_bridge(tmp_path, "0.5"), "--bridge-release", "main")
    node = next(p for p in r["suite_paths"] if p.endswith(COMM_NODE))
    assert node in r["missing"] and r["missing_why"][node] == "test not defined in the file at this revision"
    assert node not in r["command"] and r["returncode"] == 0
    assert r["passed"] == 2 and r["complete"] is False and proc.returncode == 1
    assert f"MISSING at this revision: {node} (test not defined" in " ".join(run_script(
        "tests", "--repo", tmp_path, "--bridge-release", "main", env=NO_PLUGINS).stdout.split())


def test_a_node_id_pytest_cannot_find_is_a_fail_that_names_it(tmp_path):
    repo = make_bridge(tmp_path, "0.6")
    proc, r = tool(repo, "--", f"{standin.PRECEDENCE}::test_not_there")
    assert r["returncode"] == 4 and r["verdict"] == "fail" and proc.returncode == 1
    assert any("test_not_there" in p for p in r["not_found"])


def test_zero_selected_is_no_tests_and_exit_1_even_when_pytest_exits_0(tmp_path):
    proc, r = tool(make_bridge(tmp_path), "-k", "nothing_matches")
    assert r["returncode"] == 0          # the conftest hid pytest's exit 5
    assert r["verdict"] == "no-tests" and r["selected"] == 0 and r["deselected"] == 5
    assert proc.returncode == 1


def test_a_failing_test_is_a_fail(tmp_path):
    proc, r = tool(make_bridge(tmp_path, **{standin.PEFT: "def test_patch():\n    assert False\n"}))
    assert proc.returncode == 1
    assert r["verdict"] == "fail" and r["failed"] == 1 and r["passed"] == 4


def test_a_collection_error_is_a_fail_with_the_error_counted(tmp_path):
    proc, r = tool(make_bridge(tmp_path, **{standin.THEORY: "import module_that_does_not_exist\n"}))
    assert proc.returncode == 1
    assert r["verdict"] == "fail" and r["errors"] == 1
    assert r["passed"] == 4   # the other files still ran (--continue-on-collection-errors)


SKIPPED = "import pytest\n\n@pytest.mark.skip(reason='needs a GPU')\ndef test_{name}():\n    pass\n"


def _all_skipped(tmp_path, release="0.5", conftest_extra=""):
    files = {standin.THEORY: SKIPPED.format(name="theory"), standin.PEFT: SKIPPED.format(name="peft")}
    repo = make_bridge(tmp_path, release, **files)
    if conftest_extra:
        conftest = repo / standin.UT / "conftest.py"
        conftest.write_text(conftest.read_text() + conftest_extra)
    return repo


def test_all_skipped_is_no_tests_because_nothing_was_proved(tmp_path):
    proc, r = tool(_all_skipped(tmp_path))
    assert r["returncode"] == 0 and r["skipped"] == 2 and r["selected"] == 2
    assert r["verdict"] == "no-tests" and proc.returncode == 1


REWRITE_JUNIT = textwrap.dedent("""
    import re


    def pytest_unconfigure(config):
        path = getattr(config.option, "xmlpath", None)
        if path:
            with open(path) as fh:
                text = fh.read()
            text = re.sub(r"<skipped[^>]*/>|<skipped[^>]*>.*?</skipped>", "", text, flags=re.S)
            text = re.sub(r'skipped="\\\\d+"', 'skipped="0"', text)
            with open(path, "w") as fh:
                fh.write(text)
""")


def test_a_conftest_that_rewrites_the_junit_file_cannot_turn_all_skipped_into_a_pass(tmp_path):
    proc, r = tool(_all_skipped(tmp_path, conftest_extra=REWRITE_JUNIT))
    assert r["junit"]["passed"] == 2                 # the rewritten junit file claims two passes ...
    assert r["counted_by"] == "record" and r["junit_disagrees"] is True
    assert r["verdict"] == "no-tests" and proc.returncode == 1      # ... the record says nothing ran


def test_junit_counts_that_are_not_numbers_are_not_a_traceback(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite tests="abc" failures="-1" errors="1e9999" skipped="x">'
                     '</testsuite></testsuites>')
    c = testrunner.read_junit(junit)
    assert (c.tests, c.failures, c.errors, c.skipped) == (0, 0, 0, 0) and c.junit_found
    junit.write_text('<testsuite tests="abc"><testcase classname="a" name="t"/><testcase name="u">'
                     '<skipped/></testcase></testsuite>')
    c = testrunner.read_junit(junit)
    assert (c.tests, c.skipped, c.passed) == (2, 1, 1)
    junit.write_text("<" * 5000)
    assert testrunner.read_junit(junit).junit_found is False


def test_suite_files_missing_at_this_revision_are_reported_not_run_as_zero(tmp_path):
    repo = make_bridge(tmp_path)
    (repo / standin.PEFT).unlink()
    proc, r = tool(repo)
    assert r["missing"] == [standin.PEFT] and r["complete"] is False
    assert r["missing_why"][standin.PEFT] == "file not found at this revision"
    assert r["verdict"] == "pass" and proc.returncode == 1   # the rest ran, but the suite is incomplete


def test_suite_with_every_file_missing_is_no_tests(tmp_path):
    repo = tmp_path / "bridge"
    (repo / "src" / "megatron" / "bridge").mkdir(parents=True)
    proc, r = tool(repo)
    assert r["verdict"] == "no-tests" and r["returncode"] is None and len(r["missing"]) == 5
    assert proc.returncode == 1


def test_suite_keyword_and_user_keyword_are_combined(tmp_path):
    precedence = textwrap.dedent("""
        class TestRecomputePrecedence:
            def test_A_recipe_default(self):
                pass
            def test_D_hydra_disables(self):
                pass
        class TestOther:
            def test_unrelated(self):
                pass
    """)
    repo = make_bridge(tmp_path, **{standin.PRECEDENCE: precedence})
    proc, r = tool(repo, "--suite", "precedence", "-k", "test_D")
    assert r["command"][r["command"].index("-k") + 1] == "(recompute or FullChain) and (test_D)"
    assert r["verdict"] == "pass" and r["selected"] == 1 and proc.returncode == 0


def test_unknown_suite_and_unknown_checkout_are_unreadable_input(tmp_path):
    repo = make_bridge(tmp_path / "b")
    proc = run_script("tests", "--repo", repo, "--suite", "moe")
    assert proc.returncode == 2 and "--suite" in proc.stderr and "core" in proc.stderr
    proc = run_script("tests", "--repo", tmp_path / "nothing-here", "--json")
    assert proc.returncode == 2 and "--repo" in proc.stderr
    assert json.loads(proc.stdout)["error"]["field"] == "--repo"


def test_an_empty_repo_path_is_unreadable_input_not_this_package(tmp_path):
    """`--repo ''` used to resolve to the current directory and run this package's own suite."""
    proc = run_script("tests", "--repo", "", cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr == "error: --repo: is empty\n"


def test_megatron_lm_checkout_is_detected_with_its_own_suites(tmp_path):
    for d in ("megatron/core", "megatron/training"):
        (tmp_path / d).mkdir(parents=True)
    proc, r = tool(tmp_path)
    assert r["repo_kind"] == "megatron-lm" and r["suite"] == "core" and r["release"] is None
    assert "tests/unit_tests/transformer/test_transformer_block.py" in r["missing"]
    assert r["verdict"] == "no-tests" and proc.returncode == 1


def test_uv_checkout_runs_through_uv_when_uv_is_on_path(tmp_path):
    """A stand-in `uv` on PATH records its argv: uv itself is not installed here."""
    repo = make_bridge(tmp_path / "b")
    (repo / "uv.lock").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv-argv"
    uv = bin_dir / "uv"
    uv.write_text(f"#!/bin/sh\necho \"$@\" > {log}\nexit 5\n")
    uv.chmod(0o755)
    proc = run_script("tests", "--repo", repo, "--json",
                      env={**NO_PLUGINS, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    r = json.loads(proc.stdout)
    assert r["command"][:6] == [str(uv), "run", "--no-sync", "python", "-m", "pytest"]
    assert log.read_text().startswith("run --no-sync python -m pytest")
    assert r["verdict"] == "no-tests" and proc.returncode == 1


# a test that leaves a subprocess holding pytest's stdout open (a server, a stuck worker)
HOLDER = textwrap.dedent("""
    import os, subprocess, sys, time


    def test_{name}():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.environ["HOLDER_PIDFILE"], "w") as fh:
            fh.write(str(child.pid))
        time.sleep({sleep})
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, OSError):
        return False


def test_timeout_ends_pytest_and_a_child_that_holds_its_output(tmp_path):
    """--timeout 3 used to kill pytest alone; the child kept the stdout pipe open and the tool
    never returned."""
    pidfile = tmp_path / "holder.pid"
    repo = make_bridge(tmp_path / "b", "0.5", **{standin.PEFT: HOLDER.format(name="hold", sleep=300)})
    t0 = time.monotonic()
    proc, r = tool(repo, "--timeout", "3", env={**NO_PLUGINS, "HOLDER_PIDFILE": str(pidfile)}, timeout=60)
    assert time.monotonic() - t0 < 30
    assert r["timed_out"] is True and r["verdict"] == "fail" and proc.returncode == 1
    assert r["ended_by"] in ("SIGTERM", "SIGKILL") and not _alive(int(pidfile.read_text()))


def test_a_child_left_behind_by_a_passing_test_does_not_hang_the_tool(tmp_path):
    pidfile = tmp_path / "holder.pid"
    repo = make_bridge(tmp_path / "b", "0.5", **{standin.PEFT: HOLDER.format(name="leave", sleep=0)})
    t0 = time.monotonic()
    proc, r = tool(repo, env={**NO_PLUGINS, "HOLDER_PIDFILE": str(pidfile)}, timeout=60)
    assert time.monotonic() - t0 < 30
    assert r["verdict"] == "pass" and r["ended_by"] == "SIGTERM" and proc.returncode == 0
    assert not _alive(int(pidfile.read_text()))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_pytest_and_its_children_and_still_prints_the_report(tmp_path, sig):
    pidfile = tmp_path / "holder.pid"
    repo = make_bridge(tmp_path / "b", "0.5", **{standin.PEFT: HOLDER.format(name="hold", sleep=300)})
    env = {**os.environ, **NO_PLUGINS, "HOLDER_PIDFILE": str(pidfile)}
    env.pop("PYTHONPATH", None)
    runner = subprocess.Popen([sys.executable, str(SCRIPTS / "run_tests.py"), "--repo", str(repo), "--json"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the test never started"
        time.sleep(0.1)
    runner.send_signal(sig)
    stdout, _ = runner.communicate(timeout=60)
    r = json.loads(stdout)
    assert r["interrupted"] is True and r["signal"] == sig.name and r["verdict"] == "fail"
    assert runner.returncode == 1 and not _alive(int(pidfile.read_text()))


def test_this_packages_own_tests_run_with_a_narrow_selection():
    """Selects one test of a file that does not call run_tests itself, so there is no recursion."""
    proc, r = tool(ROOT, "-k", "test_harness_build and duplicate_candidate_is_refused", env={})
    assert r["repo_kind"] == "mbridge-recompute"
    assert r["verdict"] == "pass" and r["selected"] == 1 and r["passed"] == 1, proc.stderr
    assert proc.returncode == 0
