"""Every tool, driven with arbitrary candidates, --set values, argument lists and run directories,
keeps the command-line contract:

* the exit status is 0, 1 or 2;
* with --json, stdout is exactly one JSON object, whatever the exit;
* no traceback;
* no file is written anywhere but the output the command asked for;
* nothing is imported from the current directory (a directory holding `megatron/`, `torch/`,
  `transformer_engine/`, `yaml.py` and a recipe module that each leave a mark when imported);
* `tune`, only ever as a dry run, writes nothing anywhere (the current directory, the checkout,
  the skill, $HOME, $TMPDIR, beside its --out) except, if at all, under its --out.

Most examples run in-process through `cli.main` (the entry point every script calls) from a
hostile current directory; whether anything is imported from there is asked of real `python -m
mbridge_recompute` processes (which put that directory first on sys.path) for a sample of cases.
Hypothesis examples are bounded so the whole file stays within a minute or two.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import stat
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


# ------------------------------------------------------------------ tune: dry runs only
TUNE_HARNESS = ["-m", "deepseek", "-mr", "moonlight_16b", "-ng", "8", "-g", "h100", "-c", "bf16", "-tp", "2",
                "-pp", "1", "-cp", "1", "-ep", "8", "-mb", "1", "-gb", "4", "-sl", "4096"]
tune_options = st.sampled_from([
    ("--free-gb", "0.5"), ("--free-gb", "-1"), ("--budget-gb", "70"), ("--budget-gb", "nan"),
    ("--max-runs", "2"), ("--max-runs", "0"), ("--iterations", "20"), ("--iterations", "2"),
    ("--launcher", "slurm"), ("--launcher", "ssh"), ("--bridge-release", "0.5"), ("--bridge-release", "main"),
    ("--no-parser-check",), ("--force",), ("--env", "A=1"), ("--env", "=x"), ("--gbs", "8"),
    ("--seq", "4096"), ("--timeout", "0"), ("--timeout", "60"), ("--grace", "5"), ("--name-prefix", "t"),
    ("--name-prefix", "../x"), ("--python", "python"), ("--dry-run",), ("--no-plot",), ("--plot", "x.png"),
    ("--mcore-version", "0.19"), ("--model", "llama3-8b"), ("--wide",), ("--bogus",), ("--free-gb",)])
OUT_NUMBERS = itertools.count()
# what the skill's own tree holds besides its files (caches, the environment of a checkout)
NOT_THE_SKILLS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}


def _files(root: Path, skip: frozenset | set = frozenset()) -> dict:
    """Every entry under `root` with its kind, size and modification time: a write shows."""
    found = {}
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in dirs + names:
            path = Path(top, name)
            st_ = path.lstat()
            found[str(path.relative_to(root))] = (stat.S_IFMT(st_.st_mode), st_.st_size, st_.st_mtime_ns)
    return found


def _never_launch(tokens: list) -> list:
    """The tokens without any argparse could read as --launch (an abbreviation included)."""
    def launch(t: str) -> bool:
        flag = t.split("=", 1)[0]
        return len(flag) > 3 and flag.startswith("--") and "--launch".startswith(flag)
    return [t for t in tokens if not launch(t)]


@contextlib.contextmanager
def _home_and_tmp(home: Path, tmp: Path):
    """$HOME and $TMPDIR (and tempfile's cached directory) pointed at watched directories."""
    import tempfile

    saved, cached = {k: os.environ.get(k) for k in ("HOME", "TMPDIR")}, tempfile.tempdir
    os.environ.update(HOME=str(home), TMPDIR=str(tmp))
    tempfile.tempdir = None
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = cached


@pytest.fixture(scope="module")
def tune_ground(tmp_path_factory):
    """(the replay checkout, a bare stand-in directory, where outs go, $HOME, $TMPDIR)."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
    import replay

    base = tmp_path_factory.mktemp("tune")
    repo = replay.make_replay_checkout(base / "bridge")
    bare = base / "bare"
    (bare / "src" / "megatron" / "bridge").mkdir(parents=True)
    dirs = [base / n for n in ("outs", "home", "tmp")]
    for d in dirs:
        d.mkdir()
    return repo, bare, *dirs


def _tune(argv_head: list, tail: list, sandbox, ground, out: Path | None) -> tuple:
    """One tune dry run, in-process from the hostile directory: the contract, and no write
    anywhere watched but under `out` (default: the current directory's recompute-tune)."""
    cwd, marks = sandbox
    repo, bare, outs, home, tmp = ground
    argv = ["tune", *_never_launch(argv_head), "--json", "--", *TUNE_HARNESS, *tail]
    out = out or cwd / "recompute-tune"
    roots = {cwd: frozenset(), repo: frozenset(), bare: frozenset(), outs: frozenset(), home: frozenset(),
             tmp: frozenset(), ROOT: NOT_THE_SKILLS}
    before = {r: _files(r, skip) for r, skip in roots.items()}
    with _home_and_tmp(home, tmp):
        code, stdout, err = _invoke(argv, cwd)
    _judge(argv, code, stdout, err)
    if code == 0:
        assert json.loads(stdout)["mode"] == "dry-run", (argv, stdout[:300])
    for root, skip in roots.items():
        after = _files(root, skip)
        changed = {k for k in before[root].keys() | after.keys() if before[root].get(k) != after.get(k)}
        written = {k for k in changed if not (root / k).is_relative_to(out)}
        assert not written, (argv, str(root), sorted(written))
    assert not list(marks.iterdir()), (argv, sorted(p.name for p in marks.iterdir()))
    return code, stdout, err


def test_a_tune_dry_run_of_the_replay_checkout_plans_its_first_run_and_writes_nothing(sandbox, tune_ground):
    repo, _, outs, _, _ = tune_ground
    out = outs / "plain"
    code, stdout, _ = _tune([str(EXAMPLES / "moonlight_16b.yaml"), "--repo", str(repo), "--out", str(out)],
                            [], sandbox, tune_ground, out)
    report = json.loads(stdout)
    assert code == 0 and report["repo"] == str(repo) and report["next"][0]["candidate"] == "[]"
    assert not out.exists()


@FAST
@given(cands=st.one_of(st.just([]), st.lists(candidates, min_size=1, max_size=3)),
       given_sets=st.one_of(st.just([]), sets),
       tail=st.one_of(st.just([]), st.lists(harness_tokens, max_size=8)),
       extra=st.lists(tune_options, max_size=3).map(lambda groups: [t for g in groups for t in g]),
       repo=st.sampled_from(["replay", "bare", "none"]),
       where=st.sampled_from(["fresh", "default", "empty", "junk tune.json"]))
def test_tune_dry_run_keeps_the_contract_for_any_candidates_sets_and_argument_list(
        sandbox, tune_ground, cands, given_sets, tail, extra, repo, where):
    checkout, bare, outs, _, _ = tune_ground
    head = [str(EXAMPLES / "moonlight_16b.yaml"), *extra]
    head += {"replay": ["--repo", str(checkout)], "bare": ["--repo", str(bare)], "none": []}[repo]
    head += ["--candidates", *cands] if cands else []
    head = _with_sets(head, given_sets)
    out = None
    if where != "default":
        out = outs / f"out{next(OUT_NUMBERS)}"            # a name no earlier example used
        head += ["--out", str(out)]
        if where != "fresh":
            out.mkdir()
        if where == "junk tune.json":
            (out / "tune.json").write_text('{"version": 1, "runs": [1, {"a": null}]}')
    try:
        _tune(head, tail, sandbox, tune_ground, out)
    finally:
        shutil.rmtree(out if out is not None else sandbox[0] / "recompute-tune", ignore_errors=True)


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
    ["tune", str(EXAMPLES / "moonlight_16b.yaml"), "--json", "--", *TUNE_HARNESS],
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
