"""Hostile input on the tools' surfaces: output targets, snippets, run directories, the harness
argument list, the command-line contract and the test runner's process cleanup.

A test named test_hostile_N_ reproduces problem #N of the hostile-input record (their titles:
tests/fixtures/hostile_r3_problems.txt); the others are cases found beside them. They run the real
scripts as subprocesses, except where a count of file opens needs the tool in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, run_script


def _one_json(stdout: str) -> dict:
    """The single JSON object a --json run prints (json.loads refuses trailing data)."""
    return json.loads(stdout)


# ------------------------------------------------------------------ output targets
@pytest.mark.parametrize("force", [False, True])
def test_hostile_1_output_never_replaces_a_fifo_even_with_force(tmp_path, force):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    args = ["--modules", "mlp", "--output", str(fifo)] + (["--force"] if force else [])
    r = run_script("config", *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and "--output" in r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"


def test_hostile_1_output_never_replaces_a_socket_even_with_force(tmp_path, monkeypatch):
    path = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX)
    try:
        monkeypatch.chdir(tmp_path)         # bound by a relative name: a socket path holds 107 bytes
        sock.bind("s")
        r = run_script("config", "--modules", "mlp", "--format", "yaml", "--output", str(path),
                       "--force", "--json", timeout=60)
        assert r.returncode == 2
        assert _one_json(r.stdout)["error"]["field"] == "--output"
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "the socket was replaced"
    finally:
        sock.close()


def test_hostile_1_plot_never_replaces_a_fifo_even_with_force(tmp_path):
    fifo = tmp_path / "f.png"
    os.mkfifo(fifo)
    r = run_script("plan", "--plot", str(fifo), "--force", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--plot" in r.stderr and "not a regular file" in r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_hostile_1_force_still_replaces_a_regular_file(tmp_path):
    target = tmp_path / "r.py"
    target.write_text("old\n")
    r = run_script("config", "--modules", "mlp", "--output", str(target), "--force", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "recompute_modules" in target.read_text()


# ------------------------------------------------------------------ one reader for every file
LOGS = ROOT / "tests" / "fixtures" / "logs"
DUMP = "model:\n  recompute_granularity: selective\n  recompute_modules: [moe_act]\n"


def _run_dir(tmp_path, name="run", dump=None, manifest=None, log=None) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    if log is None:
        shutil.copy(LOGS / "pass.log", d / "log.txt")
    else:
        (d / "log.txt").write_bytes(log if isinstance(log, bytes) else log.encode())
    for fname, body in (("ConfigContainer.yaml", dump), ("manifest.json", manifest)):
        if body is not None:
            (d / fname).write_bytes(body if isinstance(body, bytes) else body.encode())
    return d


def _exit_codes(d: Path, tools=("check", "compare", "diagnose")) -> dict:
    out = {}
    for tool in tools:
        args = {"check": ["--run", d], "compare": [d], "diagnose": [d]}[tool]
        r = run_script(tool, *args, "--json", timeout=120)
        assert "Traceback" not in r.stderr, r.stderr[-800:]
        _one_json(r.stdout)
        out[tool] = (r.returncode, r.stderr.strip())
    return out


@pytest.mark.parametrize("case,dump,refused", [
    ("duplicate key", DUMP + "  recompute_modules: [mlp]\n", "given twice"),
    ("python tag", DUMP + "  params_dtype: !!python/name:torch.bfloat16 ''\n", "Python tag"),
    ("5 MiB", DUMP + "  note: '" + "x" * (5 * 1024 * 1024) + "'\n", "bytes, more than"),
    ("UTF-8 BOM", "\ufeff" + DUMP, None),
])
def test_a_config_dump_is_read_or_refused_alike_by_check_run_and_compare(tmp_path, case, dump, refused):
    codes = _exit_codes(_run_dir(tmp_path, dump=dump), tools=("check", "compare"))
    for tool, (code, err) in codes.items():
        if refused:
            assert code == 2 and refused in err and "ConfigContainer.yaml" in err, (tool, case, err)
        else:
            assert code in (0, 1), (tool, case, err)


@pytest.mark.parametrize("case,manifest,refused", [
    ("duplicate key", '{"name": "a", "name": "b"}', "twice"),
    ("5 MiB", json.dumps({"name": "a", "note": "x" * (5 * 1024 * 1024)}), "bytes, more than"),
    ("lone surrogate", '{"name": "\\ud800"}', "surrogate"),
    ("UTF-8 BOM", "\ufeff" + json.dumps({"name": "a"}), None),
])
def test_a_manifest_is_read_or_refused_alike_by_check_run_compare_and_diagnose(tmp_path, case, manifest,
                                                                               refused):
    codes = _exit_codes(_run_dir(tmp_path, manifest=manifest))
    for tool, (code, err) in codes.items():
        if refused:
            assert code == 2 and refused in err and "manifest.json" in err, (tool, case, err)
        else:
            assert code in (0, 1), (tool, case, err)


def test_hostile_33_duplicate_keys_in_a_manifest_are_refused(tmp_path):
    r = run_script("compare", _run_dir(tmp_path, manifest='{"name": "a", "name": "b"}'), "--json")
    assert r.returncode == 2 and "'name' twice" in r.stderr


@pytest.mark.parametrize("fmt", [[], ["--markdown"]])
def test_hostile_12_a_lone_surrogate_in_a_manifest_is_refused_not_a_traceback(tmp_path, fmt):
    log = (EXAMPLES / "logs" / "nemotron3nano" / "moe_act" / "log.txt").read_bytes()
    a = _run_dir(tmp_path, "a", manifest='{"name": "\\ud800"}', log=log)
    r = run_script("compare", a, EXAMPLES / "logs" / "nemotron3nano" / "empty", *fmt)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "surrogate" in r.stderr


def test_a_workload_and_a_config_json_with_a_utf8_bom_are_read(tmp_path):
    w = tmp_path / "w.yaml"
    w.write_text("\ufeffmodel:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n",
                 encoding="utf-8")
    assert run_script("check", w, "--validator", "builtin").returncode == 0
    hf = tmp_path / "config.json"
    config = json.loads((ROOT / "tests/fixtures/hf_configs/meta-llama--Meta-Llama-3-8B.json").read_text())
    hf.write_text("\ufeff" + json.dumps(config["config"]), encoding="utf-8")
    r = run_script("plan", "--hf-config", hf, "--json")
    assert r.returncode in (0, 1), r.stderr


@pytest.mark.parametrize("planted", ["link to /dev/zero", "fifo", "directory", "link to nothing",
                                     "not a mapping"])
@pytest.mark.parametrize("name", ["ConfigContainer.yaml", "manifest.json"])
def test_hostile_32_a_planted_dump_or_manifest_is_refused_not_taken_for_absent(tmp_path, planted, name):
    d = _run_dir(tmp_path)
    target = d / name
    if planted == "link to /dev/zero":
        target.symlink_to("/dev/zero")
    elif planted == "fifo":
        os.mkfifo(target)
    elif planted == "directory":
        target.mkdir()
    elif planted == "link to nothing":
        target.symlink_to(tmp_path / "nowhere")
    else:
        target.write_text("[1, 2]\n")
    tools = ("check", "compare") if name == "ConfigContainer.yaml" else ("check", "compare", "diagnose")
    for tool, (code, err) in _exit_codes(d, tools).items():
        assert code == 2 and name in err, (tool, planted, err)


@pytest.mark.parametrize("model", [
    "  recompute_granularity: {a: 1}\n", "  recompute_modules: 5\n", "  recompute_modules: [1, [2]]\n",
    "  recompute_method: [1]\n", "  recompute_num_layers: x\n"])
@pytest.mark.parametrize("with_layers", [False, True])
def test_hostile_27_check_run_refuses_wrong_typed_recompute_values_in_the_dump_with_exit_2(
        tmp_path, model, with_layers):
    body = "model:\n" + ("  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n" if with_layers
                         else "") + model
    d = _run_dir(tmp_path, dump=body)
    for extra in ([], ["--model", "llama3-8b"]):
        r = run_script("check", "--run", d, *extra, "--json")
        assert r.returncode == 2 and "Traceback" not in r.stderr, (model, extra, r.stderr)
        field = model.split(":")[0].strip()
        assert f"model.{field}" in _one_json(r.stdout)["error"]["field"]


def test_hostile_11_check_run_with_a_model_refuses_labels_that_are_not_strings(tmp_path):
    """A published run directory whose dump lists a number and a list as recompute labels, checked
    against a catalogue model: one error line naming the field (it was a TypeError)."""
    d = tmp_path / "run"
    shutil.copytree(EXAMPLES / "logs" / "nemotron3nano" / "moe_act", d)
    (d / "ConfigContainer.yaml").write_text(
        "model:\n  recompute_granularity: selective\n  recompute_modules: [1, [2]]\n")
    # the field names the dump by its path, which an error line shortens in the middle when long
    field = "/run/ConfigContainer.yaml: model.recompute_modules"
    reason = "entries must be non-empty strings, got 1"
    for fmt in ([], ["--json"]):
        r = run_script("check", "--run", d, "--model", "llama3-8b", *fmt)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-800:]
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
        assert r.stderr.endswith(f"{field}: {reason}\n"), r.stderr
    error = _one_json(r.stdout)["error"]
    assert error["field"].endswith(field) and error["message"] == reason and error["exit"] == 2


def _count_opens(monkeypatch, argv: list, watched: list) -> dict:
    """How often each of `watched` is opened while the tool runs once in-process."""
    import builtins
    import contextlib
    import io

    from mbridge_recompute import cli

    names = {str(p.resolve()): p.name for p in watched}
    counts = {p.name: 0 for p in watched}

    def counted(real):
        def opener(file, *a, **kw):
            key = os.path.realpath(os.fspath(file)) if isinstance(file, (str, bytes, os.PathLike)) else None
            if key in names:
                counts[names[key]] += 1
            return real(file, *a, **kw)
        return opener

    monkeypatch.setattr(os, "open", counted(os.open))
    monkeypatch.setattr(builtins, "open", counted(builtins.open))
    monkeypatch.setattr(io, "open", counted(io.open))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
    assert done.value.code in (0, 1), done.value.code
    return counts


@pytest.mark.parametrize("tool", ["check", "compare", "diagnose"])
def test_each_file_of_a_run_is_read_once_per_invocation(tmp_path, monkeypatch, tool):
    src = EXAMPLES / "logs" / "nemotron3nano" / "moe_act"
    d = tmp_path / "moe_act"
    shutil.copytree(src, d)
    dump = (EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text()
    (d / "ConfigContainer.yaml").write_text(dump)
    argv = {"check": ["check", "--run", str(d), "--validator", "builtin", "--json"],
            "compare": ["compare", str(d), "--json"], "diagnose": ["diagnose", str(d), "--json"]}[tool]
    files = [d / "log.txt", d / "manifest.json", d / "ConfigContainer.yaml"]
    counts = _count_opens(monkeypatch, argv, files)
    want = {"log.txt": 1, "manifest.json": 1, "ConfigContainer.yaml": 0 if tool == "diagnose" else 1}
    assert counts == want


# ------------------------------------------------------------------ log readers: bounded memory
RSS_CEILING_MB = 140      # runlog's bounds: ~30 MB of interpreter and package, the rest records


def _max_rss_mb(argv: list) -> tuple:
    """(exit code, peak RSS in MB) of one tool run, measured in a wrapper whose only child it is."""
    import subprocess
    import sys

    from conftest import SCRIPT_OF, SCRIPTS

    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
             "stderr=subprocess.DEVNULL); print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN)"
             ".ru_maxrss)")
    tool, *args = argv
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, str(SCRIPTS / SCRIPT_OF[tool]),
                          *map(str, args)], capture_output=True, text=True, timeout=600)
    code, kib = out.stdout.split()
    return int(code), int(kib) / 1024


def test_hostile_16_log_readers_stay_under_a_memory_ceiling_whatever_the_log_size(tmp_path):
    """A log larger than the ceiling, made of what costs the most to keep: iteration and Step Time
    lines past the kept count, exception lines with tracebacks, and lines of nothing in
    particular. Peak memory stays under RSS_CEILING_MB for every reader (it was ~45x the log)."""
    import sys

    sys.path.insert(0, str(LOGS))
    import logformat as lf

    d = tmp_path / "big"
    d.mkdir()
    frames = "".join(f'  File "/src/megatron/core/m{i}.py", line {i}, in f{i}\n    x = f{i + 1}()\n'
                     for i in range(150))
    with open(d / "log.txt", "w") as fh:
        n = 110_000
        for i in range(1, n + 1):
            fh.write(lf.step_time_line(5.0, 100.0) + "\n" + lf.iteration_line(i, n, 5000.0) + "\n")
        for i in range(1500):
            fh.write(f"Traceback (most recent call last):\n{frames}ValueError: case {i} {'y' * 400}\n")
        fh.write(("XError: " + "z" * 200 + "\n") * 600_000)
    size_mb = (d / "log.txt").stat().st_size / 2**20
    assert size_mb > RSS_CEILING_MB
    for argv in (["compare", d / "log.txt", "--json"], ["diagnose", d / "log.txt", "--json"],
                 ["check", "--run", d, "--json"]):
        code, rss = _max_rss_mb(argv)
        assert code in (0, 1), argv
        assert rss < RSS_CEILING_MB, f"{argv[0]}: {rss:.0f} MB for a {size_mb:.0f} MB log"


# ------------------------------------------------------------------ the command-line contract
TOOLS = ["plan", "config", "check", "harness", "compare", "diagnose", "tests", "tune"]


@pytest.mark.parametrize("tool", TOOLS)
def test_hostile_29_help_with_json_prints_one_json_object(tool):
    r = run_script(tool, "--help", "--json", timeout=60)
    assert r.returncode == 0
    assert "usage:" in _one_json(r.stdout)["help"]


def test_hostile_29_missing_subcommand_and_version_with_json_print_one_json_object():
    import subprocess
    import sys

    from conftest import SCRIPTS

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    missing = subprocess.run([sys.executable, "-m", "mbridge_recompute", "--json"], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=60)
    assert missing.returncode == 2 and _one_json(missing.stdout)["error"]["field"] == "subcommand"
    version = subprocess.run([sys.executable, "-m", "mbridge_recompute", "--version", "--json"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert version.returncode == 0 and _one_json(version.stdout)["version"].startswith("mbridge-recompute ")


@pytest.mark.parametrize("argv,field", [
    (["plan", "--model", ""], "--model"), (["plan", "--recipe", ""], "--recipe"),
    (["plan", ""], "WORKLOAD"), (["plan", "--mcore-version", " "], "--mcore-version"),
    (["check", "--run", ""], "--run"), (["config", "--modules", "mlp", "--output", ""], "--output"),
    (["config", "--candidate", ""], "--candidate"), (["compare", ""], "LOG"),
    (["harness", "--candidates", "", "--", "-m", "x"], "--candidates"),
    (["tests", "--repo", ""], "--repo"),
])
def test_hostile_30_empty_option_values_exit_2_is_empty(argv, field):
    tool, *args = argv
    cut = args.index("--") if "--" in args else len(args)
    r = run_script(tool, *args[:cut], "--json", *args[cut:], timeout=60)
    assert r.returncode == 2, (argv, r.stdout[-300:], r.stderr)
    err = _one_json(r.stdout)["error"]
    assert err["message"] == "is empty" and field in err["field"], err


# ------------------------------------------------------------------ snippets are rendered, never pasted
MOONLIGHT = EXAMPLES / "moonlight_16b.yaml"
INJECTIONS = [
    'moe_act@experimental_attention_variant=x"\nimport os; os.system("id") #',
    "moe_act@experimental_attention_variant=x\nmodel:\n  recompute_granularity: full",
    "moe_act@position_embedding_type=rope\r#",
    "moe_act@position_embedding_type=rope\u2028x",
    "moe_act@position_embedding_type=rope\u202ex",
]


@pytest.mark.parametrize("fmt", ["python", "yaml"])
@pytest.mark.parametrize("candidate", INJECTIONS)
def test_hostile_2_a_candidate_value_with_a_control_character_is_refused_not_written(
        tmp_path, fmt, candidate):
    out = tmp_path / f"snippet.{'py' if fmt == 'python' else 'yaml'}"
    r = run_script("config", MOONLIGHT, "--candidate", candidate, "--format", fmt, "--output", out, "--json")
    assert r.returncode == 2, r.stderr
    message = _one_json(r.stdout)["error"]["message"]
    assert "control or invisible character" in message or "must be one of" in message
    assert not out.exists()


def test_hostile_2_a_string_field_takes_only_the_values_megatron_core_knows():
    r = run_script("config", MOONLIGHT, "--candidate", "moe_act@experimental_attention_variant=x", "--json")
    assert r.returncode == 2 and "must be one of" in _one_json(r.stdout)["error"]["message"]


def _snippets(candidate: str) -> dict:
    import contextlib
    import io

    from mbridge_recompute import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        with pytest.raises(SystemExit) as done:
            cli.main(["config", str(MOONLIGHT), "--candidate", candidate, "--json"])
    return done.value.code, out.getvalue()


def test_hostile_2_snippet_values_are_written_by_repr_and_safe_dump_whatever_the_text():
    """Any printable text in a string field reads back from the Python snippet (run) and the YAML
    snippet (loaded) as exactly that text, and the comment stays one line."""
    import types

    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    text = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"),
                                 blacklist_characters="@"), min_size=1, max_size=30).filter(str.strip)

    _, plain = _snippets("moe_act@position_embedding_type=rope")
    reference = json.loads(plain)["formats"]

    def shape(snippet: str) -> list:
        """Every line after the title comment (which wraps), up to its '=' or ':' (what a value
        could not change); the title's own lines are all comments."""
        lines = snippet.splitlines()
        body = lines.index("# Every recompute key is set, so values from the recipe cannot leak through.")
        assert all(line.startswith("# ") for line in lines[:body])
        return [line.split("=")[0].split(":")[0] for line in lines[body:]]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text)
    def check(value):
        code, out = _snippets("moe_act@position_embedding_type=" + value)
        if code == 2:                      # a value the field's coercion refuses: one error object
            assert "error" in json.loads(out)
            return
        formats = json.loads(out)["formats"]
        stub = types.SimpleNamespace(model=types.SimpleNamespace())
        exec(compile(formats["python"], "<snippet>", "exec"), {"cfg": stub})   # noqa: S102
        assert stub.model.position_embedding_type == value.strip()
        assert yaml.safe_load(formats["yaml"])["model"]["position_embedding_type"] == value.strip()
        for fmt in ("python", "yaml"):
            assert shape(formats[fmt]) == shape(reference[fmt]), formats[fmt]

    check()


@pytest.mark.parametrize("change", ["recompute_granularity=full", "recompute_modules=mlp",
                                    "recompute_method=block", "recompute_num_layers=2",
                                    "distribute_saved_activations=true"])
def test_hostile_9_a_candidate_changing_a_recompute_key_exits_2(change):
    r = run_script("config", "--model", "llama3-8b", "--candidate", f"[]@{change}", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is not a change" in _one_json(r.stdout)["error"]["message"]


def test_write_config_writes_an_empty_offload_modules_list():
    r = run_script("config", MOONLIGHT, "--candidate", "moe_act@offload_modules=[]", "--json")
    assert r.returncode == 0, r.stderr
    formats = _one_json(r.stdout)["formats"]
    assert "cfg.model.offload_modules = []" in formats["python"]
    assert "model.offload_modules=[]" in formats["overrides"]


def test_set_changes_to_cuda_graph_and_offload_keys_appear_in_every_snippet():
    r = run_script("config", MOONLIGHT, "--modules", "moe_act",
                   "--set", "model.fine_grained_activation_offloading=true",
                   "--set", "model.offload_modules=[core_attn]", "--json")
    assert r.returncode == 0, r.stderr
    formats = _one_json(r.stdout)["formats"]
    assert "cfg.model.offload_modules = ['core_attn']" in formats["python"]
    assert "fine_grained_activation_offloading: true" in formats["yaml"]
    assert "model.offload_modules=[core_attn]" in formats["overrides"]
    assert "model.fine_grained_activation_offloading=true" in formats["harness"]
    r = run_script("config", MOONLIGHT, "--modules", "moe_act", "--mcore-version", "0.19.2",
                   "--set", "model.cuda_graph_impl=transformer_engine",
                   "--set", "model.cuda_graph_modules=[attn]", "--json")
    assert r.returncode == 0, r.stderr
    assert "model.cuda_graph_modules=[attn]" in _one_json(r.stdout)["formats"]["overrides"]


# ------------------------------------------------------------------ plan -> run_harness --from-plan
HARNESS_ARGS = ["-m", "llama3", "-mr", "llama3_70b", "-gb", "32", "-sl", "4096", "-ng", "32"]


@pytest.mark.parametrize("workload", [[], ["--model", "deepseek-v3"], [EXAMPLES / "nemotron_3_nano.yaml"],
                                      [EXAMPLES / "llama3_70b_fp8.yaml"]])
def test_hostile_5_the_plans_own_candidates_run_through_from_plan(tmp_path, workload):
    plan = run_script("plan", *workload, "--alternatives", "--json", timeout=300)
    assert plan.returncode in (0, 1), plan.stderr
    (tmp_path / "p.json").write_text(plan.stdout)
    wanted = json.loads(plan.stdout)["harness_candidates"]
    r = run_script("harness", "--from-plan", tmp_path / "p.json", "--json", "--", *HARNESS_ARGS, timeout=120)
    assert r.returncode == 0, r.stderr
    from mbridge_recompute.setting import RecomputeSetting

    runs = {run["name"]: run for run in _one_json(r.stdout)["runs"]}
    for candidate in wanted:               # every candidate is a run, and its changes are in its argv
        setting = RecomputeSetting.parse(candidate)
        run = runs[setting.slug()]
        for field, _ in setting.changes:
            assert any(t.startswith(f"model.{field}=") for t in run["argv"]), (candidate, run["argv"])


def test_hostile_5_two_candidates_that_differ_only_in_a_change_are_two_runs():
    r = run_script("harness", "--candidates", "moe_act@context_parallel_size=2",
                   "moe_act@context_parallel_size=4", "--json", "--", *HARNESS_ARGS)
    assert r.returncode == 0, r.stderr
    assert len(_one_json(r.stdout)["runs"]) == 3          # the control, and the two


def test_hostile_5_a_candidate_given_twice_names_itself_not_another():
    r = run_script("harness", "--candidates", "moe_act@context_parallel_size=2",
                   "moe_act@context_parallel_size=2", "--", *HARNESS_ARGS)
    assert r.returncode == 1 and "'moe_act@context_parallel_size=2' is given twice" in r.stderr
    assert "label order" not in r.stderr


def test_a_passthrough_flag_that_a_candidate_change_sets_is_refused():
    r = run_script("harness", "--candidates", "[]@context_parallel_size=2", "--", *HARNESS_ARGS, "-cp", "1")
    assert r.returncode == 1 and "'-cp 1' fights candidate" in r.stderr


# ------------------------------------------------------------------ run_tests ends what its tests leave
ESCAPER = '''
import os, subprocess, sys, time


def test_leave():
    # a child in its own session (setsid) and a daemon that double-forks: neither is in pytest's
    # process group, so killpg cannot reach them
    subprocess.Popen(["setsid", "sleep", os.environ["MARK"]], start_new_session=True)
    code = ("import os, sys, time\\n"
            "if os.fork() == 0:\\n"
            "    os.setsid()\\n"
            "    if os.fork() == 0:\\n"
            "        time.sleep(float(sys.argv[1]))\\n"
            "    os._exit(0)\\n")
    subprocess.run([sys.executable, "-c", code, os.environ["MARK"]], check=True)
    time.sleep({sleep})
'''


def _with_mark(mark: str) -> list:
    """Live processes whose command line holds `mark`."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in argv and state not in ("Z", "X"):
            out.append(int(cmdline.parent.name))
    return out


@pytest.mark.parametrize("sleep,extra", [(0, []), (300, ["--timeout", "5"])])
def test_hostile_31_a_test_child_that_calls_setsid_does_not_survive_run_tests(tmp_path, sleep, extra):
    """The subreaper (prctl PR_SET_CHILD_SUBREAPER) catches what left pytest's process group."""
    import sys
    import time

    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
    import standin

    repo = standin.make_checkout(tmp_path / "b", "0.5", tests=True)
    (repo / standin.PEFT).write_text(ESCAPER.replace("{sleep}", str(sleep)))
    mark = f"{171717 + int.from_bytes(os.urandom(3), 'big')}"      # this test's own processes
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "MARK": mark}
    r = run_script("tests", "--repo", repo, "--json", *extra, env=env, timeout=120)
    report = _one_json(r.stdout)
    assert r.returncode in (0, 1), r.stderr[-500:]
    deadline = time.monotonic() + 5
    while _with_mark(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _with_mark(mark)
    for pid in left:                        # never leave them running, whatever the verdict
        os.kill(pid, 9)
    assert not left, "a process the test left outside pytest's group survived"
    assert report.get("orphans_ended", 0) >= 2


# ------------------------------------------------------------------ check --run and its fix texts
def _check_json(*args) -> dict:
    r = run_script("check", *args, "--json", timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return _one_json(r.stdout)


def _pre_mlp_fix(release: str, *sets) -> str:
    args = [MOONLIGHT, "--validator", "builtin", "--mcore-version", release,
            "--set", "model.recompute_modules=[layernorm]",
            "--set", "model.cuda_graph_impl=transformer_engine"]
    for s in sets:
        args += ["--set", s]
    found = [f for f in _check_json(*args)["findings"]
             if f["id"] == "pre-mlp-layernorm-with-moe-router-graph"]
    assert len(found) == 1
    return found[0]["fix"]


def test_the_pre_mlp_norm_fix_names_the_shared_expert_overlap_when_preprocess_is_captured():
    fix = _pre_mlp_fix("0.19.2", "model.cuda_graph_modules=[moe_router,moe_preprocess]",
                       "model.moe_token_dispatcher_type=alltoall", "model.moe_shared_expert_overlap=true")
    assert "shared-expert overlap is the blocker" in fix and "add moe_preprocess" not in fix


@pytest.mark.parametrize("release,key", [("0.16.1", "cuda_graph_scope"), ("0.17.1", "cuda_graph_scope"),
                                         ("0.18.2", "cuda_graph_modules"), ("0.19.2", "cuda_graph_modules")])
def test_the_pre_mlp_norm_fix_names_the_capture_list_of_the_release(release, key):
    fix = _pre_mlp_fix(release, f"model.{key}=[moe_router]", "model.moe_shared_expert_overlap=false")
    assert f"add moe_preprocess to {key}" in fix
    if key == "cuda_graph_modules":
        assert "cuda_graph_scope" not in fix


def test_the_pre_mlp_norm_fix_asks_for_the_dispatcher_when_preprocess_is_captured():
    fix = _pre_mlp_fix("0.19.2", "model.cuda_graph_modules=[moe_router,moe_preprocess]",
                       "model.moe_token_dispatcher_type=allgather", "model.moe_shared_expert_overlap=false")
    assert "moe_preprocess is captured already" in fix and "alltoall" in fix


def test_check_run_with_only_a_log_names_the_cause():
    report = _check_json("--run", EXAMPLES / "logs" / "oom" / "backward.log")
    assert not report["ok"]
    ids = [f["id"] for f in report["findings"]]
    assert "run-failed-activations" in ids, ids
    r = run_script("check", "--run", EXAMPLES / "logs" / "oom" / "backward.log")
    assert "no difference can be looked for" in r.stdout


def test_check_run_fix_texts_name_tools_that_exist(tmp_path):
    import re

    from conftest import SCRIPTS

    cases = [EXAMPLES / "logs" / "oom" / n for n in ("backward.log", "fragmentation.log",
                                                     "optimizer_state_init.log")]
    crash = tmp_path / "crash.log"
    crash.write_text('Traceback (most recent call last):\n  File "x.py", line 1, in f\nRuntimeError: boom\n')
    fine = tmp_path / "fine.log"
    fine.write_text((ROOT / "tests" / "fixtures" / "logs" / "pass.log").read_text())
    for log in [*cases, crash, fine]:
        for f in _check_json("--run", log)["findings"]:
            for tool in re.findall(r"\b([a-z_]+\.py)\b(?!:)", f["fix"]):
                assert (SCRIPTS / tool).is_file(), (log.name, f["id"], tool)


def test_the_asked_line_shows_what_the_command_asked(tmp_path):
    d = _run_dir(tmp_path, dump=DUMP, manifest=json.dumps({"argv": [
        "torchrun", "scripts/performance/run_script.py", "model.recompute_modules=[mlp]",
        "--recompute_modules", "moe_act"]}))
    r = run_script("check", "--run", d)
    asked = next(line for line in r.stdout.splitlines() if line.strip().startswith("asked"))
    assert "model.recompute_modules=[mlp]" in asked and "--recompute_modules moe_act" in asked


def test_no_none_promoted_warning_on_a_full_recompute_run(tmp_path):
    dump = ("model:\n  recompute_granularity: full\n  recompute_modules: [core_attn]\n"
            "  recompute_method: block\n  recompute_num_layers: 2\n")
    d = _run_dir(tmp_path, dump=dump, manifest=json.dumps({"argv": [
        "torchrun", "scripts/performance/run_script.py", "-rl", "2"]}))
    report = _check_json("--run", d)
    assert not [f for f in report["findings"] if f["id"] == "run-none-promoted"], report["findings"]
    d2 = _run_dir(tmp_path, "cand", dump=dump, manifest=json.dumps({
        "setting": {"recompute_granularity": "full", "recompute_modules": None, "recompute_method": "block",
                    "recompute_num_layers": 2}}))
    assert not [f for f in _check_json("--run", d2)["findings"] if f["id"] == "run-none-promoted"]


# ------------------------------------------------------------------ the suite's own build says what it does
def test_the_environment_build_prints_a_progress_line_per_environment():
    """tests/envs/build.sh reports each step on stderr (run_all.sh keeps it visible); stdout is
    the envs.json path alone. Run on the built environments, it reuses every one (and rewrites
    envs.json atomically, the same content)."""
    import subprocess

    real = Path(os.environ.get("MBR_ENVS", Path.home() / ".cache" / "mbridge-recompute" / "envs"))
    if not (real / "envs.json").exists():
        pytest.fail(f"no environments at {real}: run `bash tests/envs/build.sh`")
    proc = subprocess.run(["bash", str(ROOT / "tests" / "envs" / "build.sh")], capture_output=True, text=True,
                          env={**os.environ, "MBR_ENVS": str(real)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(real / "envs.json")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("envs: ")]
    for name in ("py312-base", "mcore-0.17.1", "mcore-0.18.2", "mcore-0.19.2", "bridge-0.6.2"):
        assert any(name in line and ("reusing" in line or "built" in line) for line in lines), lines
    assert all(line.rstrip().endswith(" s]") for line in lines)
    run_all = (ROOT / "tests" / "run_all.sh").read_text()
    build = next(line for line in run_all.splitlines() if "tests/envs/build.sh" in line and "bash" in line)
    assert "2>" not in build and "&>" not in build      # its progress reaches the terminal


@pytest.mark.parametrize("tool", ["plan", "check", "config", "plan-hf", "plan-measured"])
def test_each_input_file_is_read_once_per_invocation(tmp_path, monkeypatch, tool):
    w = tmp_path / "w.yaml"
    shutil.copy(MOONLIGHT, w)
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps(json.loads(
        (ROOT / "tests/fixtures/hf_configs/meta-llama--Meta-Llama-3-8B.json").read_text())["config"]))
    report = tmp_path / "compare.json"
    report.write_text(run_script("compare", EXAMPLES / "logs" / "moonlight16b" / "empty",
                                 EXAMPLES / "logs" / "moonlight16b" / "moe_act", "--json").stdout)
    argv, files = {
        "plan": (["plan", str(w), "--json"], [w]),
        "check": (["check", str(w), "--validator", "builtin", "--json"], [w]),
        "config": (["config", str(w), "--modules", "mlp", "--json"], [w]),
        "plan-hf": (["plan", "--hf-config", str(hf), "--json"], [hf]),
        "plan-measured": (["plan", str(w), "--measured", str(report), "--json"], [w, report]),
    }[tool]
    assert _count_opens(monkeypatch, argv, files) == {f.name: 1 for f in files}
