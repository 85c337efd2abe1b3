"""Run the recompute-focused tests of a checkout and judge them by what really ran.

The exit code of pytest alone proves nothing here: Bridge's (and Megatron-LM's)
unit-test conftest rewrites pytest exit status 5, "no tests collected", to 0
(`tests/unit_tests/conftest.py:133-135` @ Bridge 067f987;
`MLM: tests/unit_tests/conftest.py:52-54`), and a `-k` that matches no test name
"passes" vacuously (`-k recompute` on `tests/unit_tests/training/test_config.py`
has never selected a test). So every run writes `--junitxml` and the verdict is
counted from it:

* `pass`     at least one test ran (not skipped) and none failed or errored;
* `no-tests` nothing ran: zero selected, or every selected test skipped (a run
             in which every test skipped proved nothing, so it is judged like an
             empty selection); this is a failure (exit 1);
* `fail`     any failure or error (collection errors count as errors), or pytest
             ended abnormally.

Selections are node ids / files that really exercise recompute at the
referenced revisions (Bridge 067f987, Megatron-LM pinned 2a75ac12).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from mbridge_recompute.errors import InputError

BRIDGE, MLM, PACKAGE = "megatron-bridge", "megatron-lm", "mbridge-recompute"


@dataclass(frozen=True)
class Suite:
    name: str
    paths: tuple              # files or node ids, relative to the checkout root
    keyword: Optional[str]    # a -k expression, or None
    needs: str                # what the environment must provide, for the reader


SUITES = {
    BRIDGE: {
        # CPU-capable and offline-safe (bridge-harness.md §3.2/§3.3)
        "core": Suite("core", (
            "tests/unit_tests/training/test_comm_overlap.py::TestMegatronCommOverlapConfig::"
            "test_moe_ep_overlap_rejects_moe_in_recompute_modules",
            "tests/unit_tests/training/utils/test_theoretical_memory_utils.py",
            "tests/unit_tests/peft/test_recompute.py",
            "tests/unit_tests/recipes/test_r050_perf_recipe_ports.py",
            "tests/unit_tests/scripts/performance/test_qwen35_vl_workload_base_configs.py",
        ), None, "torch + megatron-core (tests/unit_tests/conftest.py imports both); CPU"),
        # argparse > Hydra > recipe for recompute (test_override_precedence.py:150-229,476-506)
        "precedence": Suite("precedence", ("tests/unit_tests/recipes/test_override_precedence.py",),
                            "recompute or FullChain",
                            "the DeepSeek-V3 HF config reachable or cached"),
        # full recompute forward/backward through a TE layer spec (test_transformer_block.py:150-200)
        "gpu": Suite("gpu", ("tests/unit_tests/models/qwen_vl/modelling_qwen3_vl/test_transformer_block.py",),
                     "checkpointed", "Transformer Engine; a GPU preferred"),
    },
    MLM: {
        # full block/uniform + selective checkpointing, core_attn, checkpoint primitives. They build
        # Transformer Engine layer specs (without TE: "TESpecProvider ... 'NoneType' object is not
        # callable"; test_random's checkpoint cases reach TE's FP8GlobalStateManager), and
        # test_checkpoint_without_output_view_sharing_regression needs 2 ranks (seen at MLM 2a75ac12,
        # torch 2.11, one H200, no TE: 0 passed, 3 failed, 11 errors).
        "core": Suite("core", (
            "tests/unit_tests/transformer/test_transformer_block.py",
            "tests/unit_tests/transformer/test_attention.py",
            "tests/unit_tests/tensor_parallel/test_random.py",
        ), "checkpoint or recompute", "a GPU + NCCL + Transformer Engine; 2 ranks for one test_random case"),
        # MLA checkpointed forward and up-proj recompute; without Transformer Engine this module
        # fails to collect (seen with torch 2.11 on one H200), so it is not part of core
        "mla": Suite("mla", ("tests/unit_tests/transformer/test_multi_latent_attention.py",),
                     "checkpointed or up_proj_recomputed", "one GPU + Transformer Engine"),
        # MoE recompute memory saving (skips without CUDA); needs no TE: 3 passed on one H200
        "moe": Suite("moe", ("tests/unit_tests/transformer/moe/test_moe_recompute_memory.py",), None,
                     "one GPU"),
        # the MoE layer recompute class: its tp4/ep2 cases need 8 ranks, FP8 cases need TE (one H200,
        # no TE: 11 passed, 8 failed on world size 1, 16 skipped)
        "moe-layer": Suite("moe-layer", ("tests/unit_tests/transformer/moe/test_moe_layer.py",), "Recompute",
                           "8 GPUs: torchrun --nproc_per_node 8 -m pytest; Transformer Engine for FP8"),
    },
    PACKAGE: {
        "all": Suite("all", ("tests",), None, "this package's test extra"),
    },
}
DEFAULT_SUITE = {BRIDGE: "core", MLM: "core", PACKAGE: "all"}


def repo_kind(repo: Path) -> str:
    """Which kind of checkout `repo` is; InputError when none."""
    if (repo / "scripts" / "mbridge_recompute").is_dir():
        return PACKAGE
    if (repo / "src" / "megatron" / "bridge").is_dir():
        return BRIDGE
    if (repo / "megatron" / "core").is_dir() and (repo / "megatron" / "training").is_dir():
        return MLM
    raise InputError("--repo", f"{repo} is not a Megatron-Bridge checkout (src/megatron/bridge), a Megatron-LM "
                               "checkout (megatron/core + megatron/training) or this package "
                               "(scripts/mbridge_recompute)")


def pick_suite(kind: str, name: Optional[str]) -> Suite:
    suites = SUITES[kind]
    name = name or DEFAULT_SUITE[kind]
    if name not in suites:
        raise InputError("--suite", f"{name!r} is not a suite for a {kind} checkout; choose one of "
                                    f"{', '.join(suites)}")
    return suites[name]


def missing_paths(repo: Path, suite: Suite) -> list:
    return [p for p in suite.paths if not (repo / p.split("::", 1)[0]).exists()]


def runner_prefix(repo: Path, runner: str = "auto") -> list:
    """`uv run --no-sync python -m pytest` for a uv checkout, else this interpreter's pytest.

    Bridge's testing guide says to use `uv run python -m pytest`, never bare
    pytest; `--no-sync` (as Megatron-LM CI runs it, `run_ci_test.sh:132-185`)
    keeps uv from re-resolving the container's environment.
    """
    uv = shutil.which("uv")
    if runner == "uv" or (runner == "auto" and (repo / "uv.lock").is_file() and uv):
        if not uv:
            raise InputError("--runner", "uv is not on PATH")
        return [uv, "run", "--no-sync", "python", "-m", "pytest"]
    return [sys.executable, "-m", "pytest"]


def combine_keywords(suite_k: Optional[str], user_k: Optional[str]) -> Optional[str]:
    if suite_k and user_k:
        return f"({suite_k}) and ({user_k})"
    return suite_k or user_k


def build_command(prefix: Sequence[str], paths: Sequence[str], keyword: Optional[str], junit: str,
                  extra: Sequence[str]) -> list:
    # --continue-on-collection-errors: one module that cannot be imported (a missing optional
    # dependency) would otherwise stop the session with zero tests run; its errors are still
    # counted, so the verdict stays "fail", but the report shows what the rest did
    cmd = [*prefix, "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit2",
           "--continue-on-collection-errors"]
    if keyword:
        cmd += ["-k", keyword]
    return [*cmd, *extra, *paths]


@dataclass
class Counts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    cases: list = field(default_factory=list)   # [{"id", "outcome"}]
    junit_found: bool = False


def read_junit(path: Path) -> Counts:
    """Counts from a pytest junit XML (xunit2). Missing or unreadable file -> junit_found False."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return Counts()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    c = Counts(junit_found=True)
    for s in suites:
        c.tests += int(s.get("tests", 0))
        c.failures += int(s.get("failures", 0))
        c.errors += int(s.get("errors", 0))
        c.skipped += int(s.get("skipped", 0))
        for case in s.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    break
            cls, name = case.get("classname", ""), case.get("name", "")
            c.cases.append({"id": f"{cls}::{name}" if cls else name, "outcome": outcome})
    return c


def verdict(c: Counts, returncode: Optional[int]) -> str:
    if c.failures or c.errors:
        return "fail"
    ran = c.tests - c.skipped
    if not c.junit_found:
        # pytest never got as far as writing a report: 5 means nothing collected
        return "no-tests" if returncode == 5 else "fail"
    if ran <= 0:
        return "no-tests"
    if returncode not in (0, 5):
        return "fail"   # e.g. an internal error or a failing session hook after the tests
    return "pass"


_DESELECTED = re.compile(r"(\d+) deselected")


def run_tests(repo: str, suite_name: Optional[str] = None, keyword: Optional[str] = None,
              extra: Sequence[str] = (), runner: str = "auto", timeout: Optional[float] = None,
              echo: Callable[[str], None] = lambda line: None) -> dict:
    """Run one suite and return the report (see module doc for the verdict)."""
    root = Path(repo).expanduser().resolve()
    if not root.is_dir():
        raise InputError("--repo", f"{repo} is not a directory")
    kind = repo_kind(root)
    suite = pick_suite(kind, suite_name)
    missing = missing_paths(root, suite)
    present = [p for p in suite.paths if p not in missing]
    prefix = runner_prefix(root, runner)
    k = combine_keywords(suite.keyword, keyword)
    report = {"verdict": "no-tests", "selected": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
              "deselected": None, "command": None, "returncode": None, "repo_kind": kind, "repo": str(root),
              "suite": suite.name, "suite_paths": list(suite.paths), "missing": missing,
              "complete": not missing, "needs": suite.needs, "tests": []}
    with tempfile.TemporaryDirectory(prefix="mbridge-recompute-tests-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = build_command(prefix, present, k, str(junit), extra)
        report["command"] = cmd
        if not present:
            # every file of the suite is absent at this revision: nothing to run, and that is a failure
            return report
        env = dict(os.environ)
        if kind == PACKAGE:
            env.pop("PYTHONPATH", None)
        output = []
        try:
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as exc:
            raise InputError("--runner", f"cannot start {cmd[0]}: {exc.strerror}") from None
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:
                output.append(line)
                echo(line.rstrip("\n"))
            proc.wait()
        finally:
            if timer:
                timer.cancel()
        report["returncode"] = proc.returncode
        report["timed_out"] = bool(timeout) and proc.returncode is not None and proc.returncode < 0
        counts = read_junit(junit)
    m = None
    for line in reversed(output[-20:]):
        m = _DESELECTED.search(line)
        if m:
            break
    report.update(selected=counts.tests, failed=counts.failures, errors=counts.errors, skipped=counts.skipped,
                  passed=max(counts.tests - counts.failures - counts.errors - counts.skipped, 0),
                  deselected=int(m.group(1)) if m else 0, tests=counts.cases,
                  verdict=verdict(counts, report["returncode"]))
    return report
