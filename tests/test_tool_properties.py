"""Every tool, driven with arbitrary candidates, --set values, argument lists and run directories,
keeps the command-line contract:

* the exit status is 0, 1 or 2;
* with --json, stdout is exactly one JSON object, whatever the exit;
* no traceback;
* no file is written anywhere but the output the command asked for;
* nothing is imported from the current directory (a directory holding `megatron/`, `torch/`,
  `transformer_engine/`, `yaml.py` and a recipe module that each leave a mark when imported).

Most examples run in-process through `cli.main` (the entry point every script calls) from a
hostile current directory; whether anything is imported from there is asked of real `python -m
mbridge_recompute` processes (which put that directory first on sys.path) for a sample of cases.
Hypothesis examples are bounded so the whole file stays within a minute or two.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbridge_recompute import cli

from conftest import EXAMPLES, ROOT, SCRIPTS

LOGS = ROOT / "tests" / "fixtures" / "logs"
FAST = settings(max_examples=int(os.environ.get("MBR_TOOL_EXAMPLES", "30")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PLANTED = {
    "megatron/__init__.py": "", "megatron/training/__init__.py": "",
    "megatron/training/arguments.py": "MARK",
    "megatron/core/__init__.py": "MARK",
    "torch/__init__.py": "MARK", "transformer_engine/__init__.py": "MARK", "yaml.py": "MARK",
    "jinja2.py": "MARK", "evil.py": "MARK", "sitecustomize.py": "MARK",
}


def _plant(cwd: Path, marks: Path) -> None:
    for rel, body in PLANTED.items():
        path = cwd / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if body == "MARK":
            mark = rel.replace("/", "_")
            body = (f"import pathlib\npathlib.Path({str(marks)!r}, {mark!r}).write_text('x')\n"
                    "raise ImportError('a planted module')\n")
        path.write_text(body)


def _tree(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """(a hostile cwd, the marks directory, a run directory, a workload file)."""
    base = tmp_path_factory.mktemp("sandbox")
    cwd, marks = base / "cwd", base / "marks"
    cwd.mkdir()
    marks.mkdir()
    _plant(cwd, marks)
    return cwd, marks


def _invoke(argv: list, cwd: Path) -> tuple:
    """(exit code, stdout, stderr) of one in-process run from `cwd`."""
    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main(argv)
                code = 0
            except SystemExit as done:
                code = done.code
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
    return code, out.getvalue(), err.getvalue()


def _judge(argv: list, code, out: str, err: str) -> None:
    assert code in (0, 1, 2), (argv, code, err[-800:])
    assert "Traceback" not in err, (argv, err[-1500:])
    if "--json" in argv and (argv.index("--json") < argv.index("--") if "--" in argv else True):
        try:
            json.loads(out)
        except ValueError as exc:
            raise AssertionError(f"not one JSON object: {argv}\n{out[:800]}\n{err[-400:]}") from exc


def _run(argv: list, sandbox, output: Path | None = None) -> tuple:
    cwd, marks = sandbox
    before = _tree(cwd)
    code, out, err = _invoke(argv, cwd)
    _judge(argv, code, out, err)
    after = _tree(cwd)
    allowed = {str(output.relative_to(cwd))} if output is not None else set()
    assert after - before <= allowed, (argv, sorted(after - before - allowed))
    assert not list(marks.iterdir()), (argv, sorted(p.name for p in marks.iterdir()))
    if output is not None and output.exists():
        output.unlink()
    return code, out, err


# ------------------------------------------------------------------ generators
LABELS = ["core_attn", "mlp", "moe_act", "layernorm", "moe", "shared_experts", "mla_up_proj",
          "gdn_norm_out", "not_a_label"]
FIELDS = ["virtual_pipeline_model_parallel_size", "context_parallel_size", "offload_modules",
          "fine_grained_activation_offloading", "use_distributed_optimizer",
          "pipeline_model_parallel_layout", "experimental_attention_variant", "position_embedding_type",
          "recompute_granularity", "tensor_model_parallel_size", "num_layers", "gpu_memory_gb",
          "not_a_field", ""]
junk = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
values = st.one_of(st.sampled_from(["1", "2", "0", "-1", "true", "null", "[]", "moe_act", "moe_act+mlp",
                                    "1e308", "0.5", "Et*3|(tt|)*6tmL", "gdn", "x\ny", "'", "\"", "\\",
                                    "@", "="]),
                   st.integers(-10, 10**12).map(str), junk)
recompute = st.one_of(st.sampled_from(["[]", "none", "uniform:2", "block:1", "block:0", "uniform:x",
                                       "full:1", "[moe_act]", ""]),
                      st.lists(st.sampled_from(LABELS), min_size=1, max_size=3).map(",".join), junk)
changes = st.lists(st.tuples(st.sampled_from(FIELDS), values).map(lambda fv: f"@{fv[0]}={fv[1]}"), max_size=2)
candidates = st.tuples(recompute, changes).map(lambda rc: rc[0] + "".join(rc[1]))
set_keys = st.sampled_from(["model.num_layers", "model.hidden_size", "model.recompute_modules",
                            "model.recompute_granularity", "model.tensor_model_parallel_size",
                            "model.cuda_graph_impl", "model.offload_modules", "train.micro_batch_size",
                            "cluster.gpu_memory_gb", "cluster.num_gpus", "model.not_a_field", "nosection",
                            "model.moe_layer_freq", "model.experimental_attention_variant", ""])
set_values = st.one_of(values, st.sampled_from(["[mlp]", "[moe_act, mlp]", "{a: 1}",
                                                "!!python/name:os.system",
                                                "&a [*a]", "[" * 50, "9" * 5000]))
sets = st.lists(st.tuples(set_keys, set_values).map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=3)


def _with_sets(argv: list, given_sets: list) -> list:
    for s in given_sets:
        argv += ["--set", s]
    return argv


# ------------------------------------------------------------------ the properties, tool by tool
@FAST
@given(candidate=candidates, fmt=st.sampled_from(["python", "yaml", "overrides", "harness", "mlm"]),
       write=st.booleans(), given_sets=sets)
def test_config_keeps_the_contract_for_any_candidate_and_set(sandbox, candidate, fmt, write, given_sets):
    cwd, _ = sandbox
    out = cwd / "snippet.out" if write else None
    argv = _with_sets(["config", str(EXAMPLES / "moonlight_16b.yaml"), "--candidate", candidate,
                       "--format", fmt, "--json"], given_sets)
    if out is not None:
        argv += ["--output", str(out)]
    _run(argv, sandbox, out)


@FAST
@given(given_sets=sets, extra=st.lists(st.sampled_from(["--alternatives", "--per-rank", "--top", "2", "--top",
                                                         "0", "--free-gb", "1", "--budget-gb", "nan",
                                                         "--measured-peak-gb", "40", "--measured-setting",
                                                         "moe_act", "--rank", "0", "--mcore-version", "0.19",
                                                         "--mcore-version", "9.9", "--wide", "--bogus"]),
                                    max_size=4),
       measured=candidates)
def test_plan_keeps_the_contract_for_any_set_and_option(sandbox, given_sets, extra, measured):
    argv = _with_sets(["plan", "--json", *extra], given_sets)
    at = argv.index("--measured-setting") + 1 if "--measured-setting" in argv else None
    if at is not None and at < len(argv):
        argv[at] = measured
    _run(argv, sandbox)


@FAST
@given(given_sets=sets, validator=st.sampled_from(["builtin"]), candidate=candidates)
def test_check_keeps_the_contract_for_any_set(sandbox, given_sets, validator, candidate):
    _run(_with_sets(["check", str(EXAMPLES / "nemotron_3_nano.yaml"), "--validator", validator, "--json"],
                    given_sets), sandbox)


harness_tokens = st.sampled_from(["-m", "llama", "-mr", "llama3_8b", "-ng", "8", "-gb", "32", "-sl", "4096",
                                  "--recompute_mod", "moe_act", "-rl", "2", "--use_recipes", "-d",
                                  "model.recompute_modules=[]", "+train.x=1", "stray", "--", "-cp", "2",
                                  "--global_b", "64", "-vp", "--num_gpus=8", "-dm", "x,y", "", "'a b'"])


@FAST
@given(cands=st.lists(candidates, min_size=1, max_size=3), tail=st.lists(harness_tokens, max_size=12),
       release=st.sampled_from([[], ["--bridge-release", "0.5"], ["--bridge-release", "main"]]))
def test_harness_keeps_the_contract_for_any_candidates_and_argument_list(sandbox, cands, tail, release):
    cwd, _ = sandbox
    _run(["harness", "--candidates", *cands, *release, "--out", str(cwd / "runs"), "--json", "--",
          "-m", "llama", "-mr", "llama3_8b", "-ng", "8", "-gb", "32", "-sl", "4096", *tail], sandbox)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=10))
trees = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), kids, max_size=3)),
                     max_leaves=12)
manifests = st.one_of(st.none(), st.dictionaries(st.sampled_from(["name", "argv", "setting", "env", "status",
                                                                  "returncode", "bridge_release",
                                                                  "recompute_tokens"]), trees, max_size=4),
                      st.fixed_dictionaries({"argv": st.lists(harness_tokens, max_size=10)}))
dumps = st.one_of(st.none(), st.dictionaries(st.sampled_from(["model", "train"]),
                                             st.dictionaries(st.sampled_from(
                                                 ["recompute_granularity", "recompute_modules",
                                                  "recompute_method",
                                                  "recompute_num_layers", "num_layers", "hidden_size",
                                                  "num_attention_heads"]), trees, max_size=4), max_size=2))
logs = st.sampled_from(["pass.log", "oom_backward.log", "oom_fragmentation.log", "nan_grad_norm.log",
                        "megatron_lm.log", "non_utf8.log", "interleaved_torchrun.log", None])


def _make_run(root: Path, name: str, log, manifest, dump) -> Path:
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    if log is None:
        (d / "log.txt").write_bytes(b"\x00\xffjunk\r\n" * 3)
    else:
        shutil.copy(LOGS / log, d / "log.txt")
    if manifest is not None:
        (d / "manifest.json").write_text(json.dumps(manifest, default=str))
    if dump is not None:
        import yaml

        (d / "ConfigContainer.yaml").write_text(yaml.safe_dump(dump))
    return d


@FAST
@given(log=logs, manifest=manifests, dump=dumps, tool=st.sampled_from(["check", "compare", "diagnose"]))
def test_run_readers_keep_the_contract_for_any_run_directory(tmp_path_factory, sandbox, log, manifest,
                                                            dump, tool):
    root = tmp_path_factory.mktemp("runs", numbered=True)
    d = _make_run(root, "run", log, manifest, dump)
    control = _make_run(root, "empty", "pass.log", None, None)
    argv = {"check": ["check", "--run", str(d), "--validator", "builtin", "--json"],
            "compare": ["compare", str(control), str(d), "--json"],
            "diagnose": ["diagnose", str(d), "--json"]}[tool]
    before = _tree(root)
    _run(argv, sandbox)
    assert _tree(root) == before, "a reader wrote into the run directories"


@FAST
@given(argv=st.lists(st.sampled_from(["plan", "config", "check", "harness", "compare", "diagnose", "tests",
                                      "--json", "--help", "--version", "--wide", "--model", "llama3-8b", "",
                                      "--set", "x", "--candidate", "[]", "--run", "-", "--repo",
                                      "/nonexistent",
                                      "--", "-h", "--bogus", "moe_act"]), max_size=6))
def test_any_argument_list_keeps_the_contract(sandbox, argv):
    if "tests" in argv[:1] and "--repo" not in argv:
        argv = argv + ["--repo", "/nonexistent"]          # never start pytest on this checkout here
    _run(argv, sandbox)


# ------------------------------------------------------------------ the same, as real processes
SUBPROCESS_CASES = [
    ["plan", "--json"], ["plan", "--mlm-args", "--", "--num-layers", "4", "--hidden-size", "256",
                         "--num-attention-heads", "4", "--json"],
    ["config", "--candidate", "moe_act@virtual_pipeline_model_parallel_size=2", "--json"],
    ["check", "--validator", "builtin", "--json"], ["check", "--json"],
    ["compare", str(EXAMPLES / "logs" / "moonlight16b" / "empty"),
     str(EXAMPLES / "logs" / "moonlight16b" / "moe_act"), "--json"],
    ["diagnose", str(EXAMPLES / "logs" / "oom" / "backward.log"), "--json"],
    ["harness", "--candidates", "moe_act", "--json", "--", "-m", "x", "-mr", "y", "-ng", "8", "-gb", "8",
     "-sl", "4096"],
    ["tests", "--repo", "/nonexistent", "--json"], ["--json"], ["plan", "--help", "--json"],
]


@pytest.mark.parametrize("argv", SUBPROCESS_CASES, ids=lambda a: " ".join(a)[:40])
def test_python_m_from_a_hostile_directory_imports_nothing_from_it(sandbox, argv):
    cwd, marks = sandbox
    before = _tree(cwd)
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    proc = subprocess.run([sys.executable, "-m", "mbridge_recompute", *argv], cwd=cwd, env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    _judge(argv, proc.returncode, proc.stdout, proc.stderr)
    assert _tree(cwd) == before, sorted(_tree(cwd) - before)
    assert not list(marks.iterdir()), sorted(p.name for p in marks.iterdir())
