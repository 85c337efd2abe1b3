"""`run_tests.py` judges real pytest runs by what ran, not by pytest's exit code.

Every case builds a small pytest project in a temporary directory shaped like a
Megatron-Bridge checkout (src/megatron/bridge plus the files of the suite), with
a conftest that maps exit status 5 to 0 the way Bridge's does
(tests/unit_tests/conftest.py:133-135), and runs the real tool on it.
"""

from __future__ import annotations

import json
import textwrap

from conftest import ROOT, run_script

CORE = "tests/unit_tests/training/utils/test_theoretical_memory_utils.py"
PEFT = "tests/unit_tests/peft/test_recompute.py"
COMM = "tests/unit_tests/training/test_comm_overlap.py"
OTHER_CORE = ("tests/unit_tests/recipes/test_r050_perf_recipe_ports.py",
              "tests/unit_tests/scripts/performance/test_qwen35_vl_workload_base_configs.py")

EXIT5_IS_0 = textwrap.dedent("""
    def pytest_sessionfinish(session, exitstatus):
        if exitstatus == 5:
            session.exitstatus = 0
""")
PASSING = "def test_report_prints_megabytes():\n    assert 1 + 1 == 2\n"
COMM_OK = textwrap.dedent("""
    class TestMegatronCommOverlapConfig:
        def test_moe_ep_overlap_rejects_moe_in_recompute_modules(self):
            assert "moe" in ["moe"]
        def test_unrelated(self):
            assert True
""")


def make_bridge(root, files: dict):
    (root / "src" / "megatron" / "bridge").mkdir(parents=True)
    (root / "tests" / "unit_tests").mkdir(parents=True)
    (root / "tests" / "unit_tests" / "conftest.py").write_text(EXIT5_IS_0)
    for rel, body in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    return root


def full_core(**override):
    files = {CORE: PASSING, PEFT: PASSING, COMM: COMM_OK, **{p: PASSING for p in OTHER_CORE}}
    files.update(override)
    return files


# the temporary projects need no third-party pytest plugin; loading them all costs seconds per run
NO_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def tool(repo, *args, env=None):
    proc = run_script("tests", "--repo", repo, "--json", *args, env=env if env is not None else NO_PLUGINS)
    return proc, json.loads(proc.stdout)   # one JSON object on stdout; pytest's output is on stderr


def test_passing_selection_is_a_pass_counted_from_junit(tmp_path):
    proc, r = tool(make_bridge(tmp_path, full_core()))
    assert proc.returncode == 0
    assert r["verdict"] == "pass" and r["repo_kind"] == "megatron-bridge"
    # the node id selects one of the two tests in the comm-overlap file
    assert (r["selected"], r["passed"], r["failed"], r["errors"], r["skipped"]) == (5, 5, 0, 0, 0)
    assert any(t["id"].endswith("test_moe_ep_overlap_rejects_moe_in_recompute_modules") for t in r["tests"])
    assert not any(t["id"].endswith("test_unrelated") for t in r["tests"])
    assert any(a.startswith("--junitxml=") for a in r["command"])


def test_zero_selected_is_no_tests_and_exit_1_even_when_pytest_exits_0(tmp_path):
    proc, r = tool(make_bridge(tmp_path, full_core()), "-k", "nothing_matches")
    assert r["returncode"] == 0          # the conftest hid pytest's exit 5
    assert r["verdict"] == "no-tests" and r["selected"] == 0 and r["deselected"] == 5
    assert proc.returncode == 1


def test_a_failing_test_is_a_fail(tmp_path):
    proc, r = tool(make_bridge(tmp_path, full_core(**{PEFT: "def test_patch():\n    assert False\n"})))
    assert proc.returncode == 1
    assert r["verdict"] == "fail" and r["failed"] == 1 and r["passed"] == 4


def test_a_collection_error_is_a_fail_with_the_error_counted(tmp_path):
    proc, r = tool(make_bridge(tmp_path, full_core(**{CORE: "import module_that_does_not_exist\n"})))
    assert proc.returncode == 1
    assert r["verdict"] == "fail" and r["errors"] == 1
    assert r["passed"] == 4   # the other files still ran (--continue-on-collection-errors)


def test_all_skipped_is_no_tests_because_nothing_was_proved(tmp_path):
    skipped = "import pytest\n\n@pytest.mark.skip(reason='needs a GPU')\ndef test_gpu():\n    pass\n"
    files = {p: skipped for p in (CORE, PEFT, *OTHER_CORE)}
    files[COMM] = ("import pytest\n\nclass TestMegatronCommOverlapConfig:\n"
                   "    @pytest.mark.skip(reason='needs a GPU')\n"
                   "    def test_moe_ep_overlap_rejects_moe_in_recompute_modules(self):\n        pass\n")
    proc, r = tool(make_bridge(tmp_path, files))
    assert r["returncode"] == 0 and r["skipped"] == 5 and r["selected"] == 5
    assert r["verdict"] == "no-tests" and proc.returncode == 1


def test_suite_files_missing_at_this_revision_are_reported_not_run_as_zero(tmp_path):
    files = full_core()
    del files[PEFT]
    proc, r = tool(make_bridge(tmp_path, files))
    assert r["missing"] == [PEFT] and r["complete"] is False
    assert r["verdict"] == "pass" and proc.returncode == 1   # the rest ran, but the suite is incomplete


def test_suite_with_every_file_missing_is_no_tests(tmp_path):
    proc, r = tool(make_bridge(tmp_path, {}))
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
    repo = make_bridge(tmp_path, {"tests/unit_tests/recipes/test_override_precedence.py": precedence})
    proc, r = tool(repo, "--suite", "precedence", "-k", "test_D")
    assert r["command"][r["command"].index("-k") + 1] == "(recompute or FullChain) and (test_D)"
    assert r["verdict"] == "pass" and r["selected"] == 1 and proc.returncode == 0


def test_unknown_suite_and_unknown_checkout_are_bad_input(tmp_path):
    repo = make_bridge(tmp_path / "b", full_core())
    proc = run_script("tests", "--repo", repo, "--suite", "moe")
    assert proc.returncode == 2 and "--suite" in proc.stderr and "core" in proc.stderr
    proc = run_script("tests", "--repo", tmp_path / "nothing-here")
    assert proc.returncode == 2 and "--repo" in proc.stderr


def test_megatron_lm_checkout_is_detected_with_its_own_suites(tmp_path):
    for d in ("megatron/core", "megatron/training"):
        (tmp_path / d).mkdir(parents=True)
    proc, r = tool(tmp_path)
    assert r["repo_kind"] == "megatron-lm" and r["suite"] == "core"
    assert "tests/unit_tests/transformer/test_transformer_block.py" in r["missing"]
    assert r["verdict"] == "no-tests" and proc.returncode == 1


def test_uv_checkout_runs_through_uv_when_uv_is_on_path(tmp_path):
    """A stand-in `uv` on PATH records its argv: uv itself is not installed here."""
    repo = make_bridge(tmp_path / "b", full_core())
    (repo / "uv.lock").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv-argv"
    uv = bin_dir / "uv"
    uv.write_text(f"#!/bin/sh\necho \"$@\" > {log}\nexit 5\n")
    uv.chmod(0o755)
    import os
    proc = run_script("tests", "--repo", repo, "--json",
                      env={**NO_PLUGINS, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    r = json.loads(proc.stdout)
    assert r["command"][:6] == [str(uv), "run", "--no-sync", "python", "-m", "pytest"]
    assert log.read_text().startswith("run --no-sync python -m pytest")
    assert r["verdict"] == "no-tests" and proc.returncode == 1


def test_this_packages_own_tests_run_with_a_narrow_selection():
    """Selects one test of a file that does not call run_tests itself, so there is no recursion."""
    proc, r = tool(ROOT, "-k", "test_harness_build and duplicate_candidate_is_refused", env={})
    assert r["repo_kind"] == "mbridge-recompute"
    assert r["verdict"] == "pass" and r["selected"] == 1 and r["passed"] == 1, proc.stderr
    assert proc.returncode == 0
