"""Run the recompute-focused tests of a checkout and judge them by what really ran.

The exit code of pytest alone proves nothing here: Bridge's (and Megatron-LM's)
unit-test conftest rewrites pytest exit status 5, "no tests collected", to 0
(`tests/unit_tests/conftest.py:133-135` @ Bridge 067f987;
`MLM: tests/unit_tests/conftest.py:52-54`), and a `-k` that matches no test name
"passes" vacuously (`-k recompute` on `tests/unit_tests/training/test_config.py`
has never selected a test). So every run is counted from two sources: a tiny pytest
plugin of this package that records each test's outcome as it is reported (the count
the verdict uses), and pytest's `--junitxml` report (kept beside it; a conftest that
rewrites the junit file cannot turn a run into a pass). The verdict:

* `pass`     at least one test ran (not skipped) and none failed or errored;
* `no-tests` nothing ran: zero selected, or every selected test skipped (a run
             in which every test skipped proved nothing, so it is judged like an
             empty selection); this is a failure (exit 1);
* `fail`     any failure or error (collection errors count as errors), pytest
             ended abnormally, timed out or was interrupted.

Selections are per Bridge release (`runs/bridge.py`: the node ids that exist at 0.5,
0.6 and main). Before pytest starts, every node id is looked up in its file (parsed,
never imported): one that is not there is reported as missing and left out, instead of
pytest's exit 4 ("not found"), which would also stop every other path of the suite.

pytest runs in its own process group with its output in a file (not a pipe a
grandchild could hold open forever): on --timeout, SIGINT, SIGTERM or SIGHUP the
whole group is ended and the report is still printed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from mbridge_recompute.errors import InputError
from mbridge_recompute.runs import bridge, procgroup
from mbridge_recompute.runs.bridge import Suite

BRIDGE, MLM, PACKAGE = "megatron-bridge", "megatron-lm", "mbridge-recompute"
GRACE = 5.0                       # seconds between SIGTERM and SIGKILL for pytest's group
RECORD_ENV = "MBRIDGE_RECOMPUTE_TEST_RECORD"
PLUGIN = "mbridge_recompute_test_record"

# Runs inside pytest (loaded with -p): one JSON line per report, as it happens.
_PLUGIN_SOURCE = f'''
import json, os
_PATH = os.environ.get("{RECORD_ENV}")


def _write(row):
    if _PATH:
        with open(_PATH, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\\n")


def pytest_runtest_logreport(report):
    _write([report.nodeid, report.when, report.outcome])


def pytest_collectreport(report):
    if report.failed:
        _write([report.nodeid, "collect", "failed"])
'''


SUITES = {
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
        # MoE recompute memory saving (skips without CUDA); needs no TE: 3 passed on one H200.
        # The file exists at the Megatron-LM main pin (2a75ac12), not at the 0.5/0.6 pins.
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
    raise InputError("--repo", f"{repo} is not a Megatron-Bridge checkout (src/megatron/bridge), a "
                               "Megatron-LM checkout (megatron/core + megatron/training) or this package "
                               "(scripts/mbridge_recompute)")


def pick_suite(kind: str, name: Optional[str], release_key: Optional[str] = None) -> Suite:
    suites = (bridge.release(release_key) if release_key else bridge.newest()).suites if kind == BRIDGE \
        else SUITES[kind]
    name = name or DEFAULT_SUITE[kind]
    if name not in suites:
        raise InputError("--suite", f"{name!r} is not a suite for a {kind} checkout; choose one of "
                                    f"{', '.join(suites)}")
    return suites[name]


def _defined(tree: ast.Module, parts: list) -> bool:
    """Whether `Class::test` / `test` (parametrised ids stripped) is defined in a parsed file."""
    body = tree.body
    for i, part in enumerate(parts):
        name = part.split("[", 1)[0]
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if i == len(parts) - 1 else (ast.ClassDef,)
        hit = next((n for n in body if isinstance(n, kinds + (ast.ClassDef,)) and n.name == name), None)
        if hit is None:
            return False
        body = getattr(hit, "body", [])
    return True


def missing_paths(repo: Path, suite: Suite) -> dict:
    """{path or node id: why it cannot run here} for the suite entries absent at this checkout.

    A node id's function is looked up in its file's syntax tree: the file is read, never
    imported (pytest would stop the whole session with exit 4 on a missing one).
    """
    out = {}
    for p in suite.paths:
        file, _, rest = p.partition("::")
        path = repo / file
        if not path.exists():
            out[p] = "file not found at this revision"
            continue
        if not rest:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError, OSError, RecursionError):
            continue                          # pytest will say what is wrong with the file
        if not _defined(tree, rest.split("::")):
            out[p] = "test not defined in the file at this revision"
    return out


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
    cmd = [*prefix, "-p", "no:cacheprovider", "-p", PLUGIN, f"--junitxml={junit}",
           "-o", "junit_family=xunit2", "--continue-on-collection-errors"]
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
    source: str = "none"                        # "record", "junit" or "none"

    @property
    def passed(self) -> int:
        return max(self.tests - self.failures - self.errors - self.skipped, 0)

    def as_dict(self) -> dict:
        return {"source": self.source, "tests": self.tests, "passed": self.passed, "failures": self.failures,
                "errors": self.errors, "skipped": self.skipped}


def _count(text: Optional[str]) -> int:
    """A junit count attribute; anything but a small non-negative integer counts as 0."""
    text = (text or "").strip()
    return int(text) if text.isdigit() and len(text) <= 9 else 0


def read_junit(path: Path) -> Counts:
    """Counts from a pytest junit XML (xunit2), by its testcases (the suite attributes are only a
    fallback). Missing or unreadable file -> junit_found False."""
    try:
        if path.stat().st_size > 256 * 2**20:
            return Counts()
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError, RecursionError, ValueError):
        return Counts()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    c = Counts(junit_found=True, source="junit")
    attr = Counts()
    for s in suites:
        attr.tests += _count(s.get("tests"))
        attr.failures += _count(s.get("failures"))
        attr.errors += _count(s.get("errors"))
        attr.skipped += _count(s.get("skipped"))
        for case in s.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    break
            cls, name = case.get("classname", ""), case.get("name", "")
            c.cases.append({"id": f"{cls}::{name}" if cls else name, "outcome": outcome})
    if c.cases:
        c.tests = len(c.cases)
        for case in c.cases:
            c.failures += case["outcome"] == "failed"
            c.errors += case["outcome"] == "error"
            c.skipped += case["outcome"] == "skipped"
    else:
        c.tests, c.failures, c.errors, c.skipped = attr.tests, attr.failures, attr.errors, attr.skipped
    return c


def read_record(path: Path) -> Optional[Counts]:
    """Counts from this package's pytest plugin record; None when the plugin wrote nothing."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    tests: dict = {}
    collect_errors = 0
    for line in lines:
        try:
            nodeid, when, outcome = json.loads(line)
        except (ValueError, TypeError):
            continue
        if when == "collect":
            collect_errors += 1
            continue
        t = tests.setdefault(nodeid, {"call": None, "failed_call": False, "error": False, "skipped": False})
        if outcome == "failed":
            if when == "call":
                t["failed_call"] = True
            else:
                t["error"] = True
        elif outcome == "skipped":
            t["skipped"] = True
        elif when == "call":
            t["call"] = outcome
    c = Counts(source="record")
    for nodeid, t in tests.items():
        outcome = ("failed" if t["failed_call"] else "error" if t["error"] else
                   "skipped" if t["skipped"] else "passed" if t["call"] == "passed" else "error")
        c.cases.append({"id": nodeid, "outcome": outcome})
    c.tests = len(c.cases) + collect_errors
    c.failures = sum(x["outcome"] == "failed" for x in c.cases)
    c.errors = sum(x["outcome"] == "error" for x in c.cases) + collect_errors
    c.skipped = sum(x["outcome"] == "skipped" for x in c.cases)
    return c


def verdict(c: Counts, returncode: Optional[int]) -> str:
    if c.failures or c.errors:
        return "fail"
    ran = c.tests - c.skipped
    if c.source == "none":
        # pytest never got as far as reporting: 5 means nothing collected
        return "no-tests" if returncode == 5 else "fail"
    if ran <= 0:
        return "no-tests"
    if returncode not in (0, 5):
        return "fail"   # e.g. an internal error or a failing session hook after the tests
    return "pass"


_DESELECTED = re.compile(r"(\d{1,9}) deselected")
_NOT_FOUND = re.compile(r"^ERROR: (?:file or directory )?not found: (.+)$", re.M)
_ECHO_CHUNK = 1 << 16


def _tail(path: Path, pos: int, echo: Callable[[str], None], partial: str) -> tuple:
    """Echo the complete lines written to `path` since `pos`; (new pos, unfinished line)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(pos)
            data = fh.read(_ECHO_CHUNK * 16)
    except OSError:
        return pos, partial
    if not data:
        return pos, partial
    text = partial + data.decode("utf-8", errors="replace")
    *lines, partial = text.split("\n")
    for line in lines:
        echo(line)
    return pos + len(data), partial


def run_tests(repo: str, suite_name: Optional[str] = None, keyword: Optional[str] = None,
              extra: Sequence[str] = (), runner: str = "auto", timeout: Optional[float] = None,
              echo: Callable[[str], None] = lambda line: None, release: Optional[str] = None) -> dict:
    """Run one suite and return the report (see module doc for the verdict)."""
    if not str(repo).strip():
        raise InputError("--repo", "is empty")
    root = Path(repo).expanduser().resolve()
    if not root.is_dir():
        raise InputError("--repo", f"{repo} is not a directory")
    kind = repo_kind(root)
    det = bridge.detect(root, release) if kind == BRIDGE else None
    suite = pick_suite(kind, suite_name, det.key if det else None)
    missing = missing_paths(root, suite)
    present = [p for p in suite.paths if p not in missing]
    prefix = runner_prefix(root, runner)
    k = combine_keywords(suite.keyword, keyword)
    report = {"verdict": "no-tests", "selected": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
              "deselected": None, "command": None, "returncode": None, "repo_kind": kind, "repo": str(root),
              "release": det.to_dict() if det else None,
              "suite": suite.name, "suite_paths": list(suite.paths), "suite_why": suite.why,
              "missing": list(missing), "missing_why": missing, "not_found": [],
              "complete": not missing, "needs": suite.needs, "tests": [], "timed_out": False,
              "interrupted": False, "signal": None, "ended_by": None, "junit": None, "counted_by": None}
    with tempfile.TemporaryDirectory(prefix="mbridge-recompute-tests-") as tmp:
        tmpd = Path(tmp)
        junit, record, out_file = tmpd / "junit.xml", tmpd / "record.jsonl", tmpd / "pytest-output.txt"
        (tmpd / f"{PLUGIN}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
        cmd = build_command(prefix, present, k, str(junit), extra)
        report["command"] = cmd
        if not present:
            # every entry of the suite is absent at this revision: nothing to run, and that is a failure
            return report
        env = dict(os.environ)
        # the plugin's directory on the path; this package's own tests find their code themselves
        keep = [] if kind == PACKAGE else [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([tmp, *keep])
        env[RECORD_ENV] = str(record)
        env["PYTHONDONTWRITEBYTECODE"] = env.get("PYTHONDONTWRITEBYTECODE", "1")
        with procgroup.SignalGuard() as guard, open(out_file, "wb") as out:
            procgroup.become_subreaper()
            before = procgroup.children()
            try:
                proc = procgroup.start(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
            except OSError as exc:
                raise InputError("--runner", f"cannot start {cmd[0]}: {exc.strerror}") from None
            deadline = time.monotonic() + timeout if timeout else None
            pos, partial = 0, ""
            try:
                with guard.armed():
                    while proc.poll() is None:
                        if deadline is not None and time.monotonic() >= deadline:
                            report["timed_out"] = True
                            break
                        try:
                            proc.wait(timeout=0.1)
                        except subprocess.TimeoutExpired:
                            pass
                        pos, partial = _tail(out_file, pos, echo, partial)
            except procgroup.Terminated as sig:
                report.update(interrupted=True, signal=sig.name)
            report["ended_by"], orphans = procgroup.wind_up(
                proc, before, GRACE, report["timed_out"] or report["interrupted"])
            if orphans:
                report["orphans_ended"] = len(orphans)
            pos, partial = _tail(out_file, pos, echo, partial)
            if partial:
                echo(partial)
        report["returncode"] = proc.returncode
        output = out_file.read_bytes()[-(1 << 20):].decode("utf-8", errors="replace")
        jcounts = read_junit(junit)
        rcounts = read_record(record)
    counts = rcounts if rcounts is not None else jcounts
    report["counted_by"] = counts.source
    report["junit"] = jcounts.as_dict() if jcounts.junit_found else None
    report["not_found"] = _NOT_FOUND.findall(output)
    m = None
    for line in reversed(output.splitlines()[-20:]):
        m = _DESELECTED.search(line)
        if m:
            break
    v = verdict(counts, report["returncode"])
    if report["timed_out"] or report["interrupted"] or report["not_found"]:
        v = "fail"
    report.update(selected=counts.tests, failed=counts.failures, errors=counts.errors, skipped=counts.skipped,
                  passed=counts.passed, deselected=int(m.group(1)) if m else 0, tests=counts.cases,
                  verdict=v)
    if jcounts.junit_found and rcounts is not None and (jcounts.tests, jcounts.passed) != (rcounts.tests,
                                                                                          rcounts.passed):
        report["junit_disagrees"] = True
    return report
