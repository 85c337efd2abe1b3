"""The command-line contract every tool keeps (DESIGN.md): executable scripts, --help,
light start-up without torch or megatron, one JSON object on --json, exit 2 with one
line naming the field for unusable input.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, SCRIPT_OF, SCRIPTS, run_script

TOOLS = sorted(SCRIPT_OF)                     # subcommand names
SCRIPT_FILES = sorted(SCRIPT_OF.values())
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
       "capacity of 79.11 GiB of which 1.20 GiB is free. Of the allocated memory 70.10 GiB is "
       "allocated by PyTorch, and 5.30 GiB is reserved by PyTorch but unallocated.")


@pytest.fixture(scope="module")
def fake_bridge(tmp_path_factory):
    """The two paths the harness needs to recognise a Bridge checkout (no GPU job starts: dry run)."""
    root = tmp_path_factory.mktemp("bridge")
    (root / "scripts" / "performance").mkdir(parents=True)
    (root / "scripts" / "performance" / "bootstrap.py").write_text("")
    return root


@pytest.fixture(scope="module")
def fake_package(tmp_path_factory):
    """A checkout of this package's layout with one passing test, for the test runner."""
    root = tmp_path_factory.mktemp("pkg")
    (root / "scripts" / "mbridge_recompute").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test_one.py").write_text("def test_recompute_one():\n    assert 1 + 1 == 2\n")
    return root


def light_invocations(fake_bridge, fake_package) -> dict:
    logs = [str(p) for p in sorted((EXAMPLES / "logs" / "moonlight16b").iterdir())]
    return {
        "plan": ["plan", "--json"],
        "config": ["config", "--modules", "moe_act", "--json"],
        "check": ["check", "--validator", "builtin", "--json"],
        "compare": ["compare", *logs, "--json"],
        "diagnose": ["diagnose", "--message", OOM, "--json"],
        "harness": ["harness", "--repo", str(fake_bridge), "--candidates", "[]", "moe_act",
                    "--no-parser-check", "--json", "--", "-m", "llama", "-mr", "llama3_8b", "-ng", "8",
                    "-g", "h100", "-gb", "128", "-sl", "8192"],
        "tests": ["tests", "--repo", str(fake_package), "--runner", "python", "--json"],
        "tune": ["tune", str(EXAMPLES / "moonlight_16b.yaml"), "--repo", str(fake_bridge), "--json", "--",
                 "-m", "deepseek", "-mr", "moonlight_16b", "-ng", "8", "-g", "h100", "-gb", "4",
                 "-sl", "4096"],
    }


# ---------------------------------------------------------------- the scripts

def test_the_tools_are_the_scripts():
    assert sorted(p.name for p in SCRIPTS.glob("*.py")) == SCRIPT_FILES


def test_every_script_is_executable_in_git():
    out = subprocess.run(["git", "ls-files", "-s", "--", *[f"scripts/{s}" for s in SCRIPT_FILES]],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    modes = {line.split("\t")[1]: line.split()[0] for line in out.splitlines()}
    assert modes == {f"scripts/{s}": "100755" for s in SCRIPT_FILES}


@pytest.mark.parametrize("script", SCRIPT_FILES)
def test_every_script_has_a_python3_shebang(script):
    assert (SCRIPTS / script).read_text().splitlines()[0] == "#!/usr/bin/env python3"


@pytest.mark.parametrize("tool", TOOLS)
def test_help_exits_zero_with_usage_on_stdout(tool):
    r = run_script(tool, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "exit" in r.stdout.lower()


# ---------------------------------------------------------------- light start-up

_PROBE = """
import json, sys
sys.path.insert(0, {scripts!r})
from mbridge_recompute.cli import SUBCOMMANDS, build_parser, main
argv = json.loads(sys.argv[1])
if argv:
    try:
        main(argv)
    except SystemExit as done:
        code = done.code
else:
    for name in SUBCOMMANDS:
        build_parser(name)
    code = 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron", "transformer_engine"))
sys.stderr.write("\\nPROBE " + json.dumps({{"code": code, "heavy": heavy}}) + "\\n")
"""


def _probe(argv: list) -> dict:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(scripts=str(SCRIPTS)), json.dumps(argv)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180, cwd=ROOT)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("PROBE ")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][6:])


def test_building_every_parser_imports_neither_torch_nor_megatron():
    assert _probe([])["heavy"] == []


@pytest.mark.parametrize("tool", TOOLS)
def test_a_light_run_imports_neither_torch_nor_megatron(tool, fake_bridge, fake_package):
    result = _probe(light_invocations(fake_bridge, fake_package)[tool])
    assert result["code"] in (0, 1), result
    assert result["heavy"] == []


# ---------------------------------------------------------------- --json and bad input

MINIMAL_KEYS = {
    "plan": {"ranks", "labels", "frontier", "recommendation", "assumptions"},
    "config": {"setting", "formats"},
    "check": {"ok", "validator", "findings"},
    "compare": {"control", "runs"},
    "diagnose": {"findings"},
    "harness": {"runs"},
    "tests": {"verdict", "selected", "passed", "failed", "errors", "skipped"},
    "tune": {"procedure", "steps", "runs", "next", "stop", "answer"},
}


@pytest.mark.parametrize("tool", TOOLS)
def test_json_is_one_object_with_the_contract_keys(tool, fake_bridge, fake_package):
    argv = light_invocations(fake_bridge, fake_package)[tool]
    r = run_script(argv[0], *argv[1:])
    assert r.returncode in (0, 1), r.stderr[-2000:]
    report = json.loads(r.stdout)            # fails on a second object or stray text
    assert isinstance(report, dict)
    assert MINIMAL_KEYS[tool] <= set(report), MINIMAL_KEYS[tool] - set(report)


BAD_INPUT = {
    "plan": ["/nonexistent/workload.yaml"],
    "config": ["/nonexistent/workload.yaml", "--modules", "moe_act"],
    "check": ["/nonexistent/workload.yaml", "--validator", "builtin"],
    "compare": ["/nonexistent/run.log"],
    "diagnose": ["/nonexistent/run.log"],
    "harness": ["--repo", "/nonexistent/bridge", "--candidates", "[]"],
    "tests": ["--repo", "/nonexistent/checkout"],
    "tune": ["/nonexistent/workload.yaml"],
}


@pytest.mark.parametrize("tool", TOOLS)
def test_unusable_input_exits_2_with_one_line_naming_the_field(tool):
    r = run_script(tool, *BAD_INPUT[tool])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("tool", TOOLS)
def test_an_unknown_option_exits_2_without_a_traceback(tool, fake_bridge, fake_package):
    required = {"compare": [str(EXAMPLES / "logs" / "moonlight16b" / "empty")],
                "harness": ["--repo", str(fake_bridge), "--candidates", "[]"],
                "tests": ["--repo", str(fake_package)]}.get(tool, [])
    r = run_script(tool, *required, "--no-such-option")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--no-such-option" in r.stderr


@pytest.mark.parametrize("tool, option, value", [
    ("tests", "--timeout", "nan"), ("tests", "--timeout", "inf"),
    ("harness", "--timeout", "nan"), ("harness", "--grace", "inf"),
])
def test_a_non_finite_number_of_seconds_is_bad_input(tool, option, value, fake_bridge, fake_package):
    required = {"harness": ["--repo", str(fake_bridge), "--candidates", "[]"],
                "tests": ["--repo", str(fake_package)]}[tool]
    r = run_script(tool, *required, option, value)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {option}:") and "Traceback" not in r.stderr


def test_a_bad_set_value_names_the_field():
    r = run_script("check", "--validator", "builtin", "--set", "model.tensor_model_parallel_size=0")
    assert r.returncode == 2
    assert "tensor_model_parallel_size" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("tool", sorted(SCRIPT_OF))
def test_usage_names_the_script_the_user_ran(tool, run_tool):
    p = run_tool(tool, "--help")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: {SCRIPT_OF[tool]}")


# ---------------------------------------------------------------- exit codes and JSON on every exit

@pytest.mark.parametrize("tool", TOOLS)
def test_with_json_unusable_input_also_prints_one_error_object(tool):
    r = run_script(tool, *BAD_INPUT[tool], "--json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    err = json.loads(r.stdout)["error"]                     # one object, nothing else on stdout
    assert err["exit"] == 2 and err["field"] and err["message"]
    assert r.stderr == f"error: {err['field']}: {err['message']}\n"


@pytest.mark.parametrize("tool", TOOLS)
def test_with_json_an_argparse_error_prints_one_error_object(tool, fake_bridge, fake_package):
    required = {"compare": [str(EXAMPLES / "logs" / "moonlight16b" / "empty")],
                "harness": ["--repo", str(fake_bridge), "--candidates", "[]"],
                "tests": ["--repo", str(fake_package)]}.get(tool, [])
    r = run_script(tool, *required, "--json", "--no-such-option")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["exit"] == 2 and "--no-such-option" in err["field"] + err["message"]


def _cases(fake_bridge, fake_package, tmp):
    """(tool, argv, exit code) per tool: 0 ok, 1 read and rejected or a problem found, 2 unreadable."""
    logs = EXAMPLES / "logs"
    empty = tmp / "empty.log"
    empty.write_text("")
    pinned = ["-m", "llama", "-mr", "llama3_8b", "-ng", "8", "-g", "h100", "-gb", "128", "-sl", "8192"]
    hb = ["harness", "--repo", str(fake_bridge), "--out", str(tmp / "runs"), "--candidates"]
    return [
        (hb + ["moe_act", "--", *pinned], 0),
        (hb + ["moe_act", "--", *pinned, "-rl", "2"], 1),                 # fights the sweep
        (hb + ["moe_act", "moe_act", "--", *pinned], 1),                   # given twice
        (hb + ["moe_act", "--", *pinned[:-2]], 1),                         # no -sl: not a matched sweep
        (hb + ["moe_act", "--", *pinned, "--task", "lora"], 1),           # not a choice at main
        (hb + ["moe_atc", "--", *pinned], 2),                              # unknown label
        (["harness", "--repo", str(fake_bridge), "--from-plan", str(empty), "--", *pinned], 2),
        (["compare", *map(str, sorted((logs / "moonlight16b").iterdir()))], 0),
        (["compare", str(logs / "oom" / "backward.log")], 1),              # a lone control that did not pass
        (["compare", str(empty)], 2),
        (["diagnose", str(logs / "oom" / "backward.log")], 0),
        (["diagnose", "--message", "all good"], 1),
        (["diagnose", str(empty)], 2),
        (["tests", "--repo", str(fake_package), "--runner", "python"], 0),
        (["tests", "--repo", str(fake_package), "--runner", "python", "-k", "nothing"], 1),
        (["tests", "--repo", str(fake_package), "--suite", "nope"], 2),
    ]


def test_each_exit_code_means_one_thing_for_every_tool_i_can_run(fake_bridge, fake_package, tmp_path):
    for argv, code in _cases(fake_bridge, fake_package, tmp_path):
        i = argv.index("--") if "--" in argv else len(argv)     # --json goes before the harness arguments
        r = run_script(argv[0], *argv[1:i], "--json", *argv[i:])
        assert r.returncode == code, (argv, r.stderr[-400:])
        assert "Traceback" not in r.stderr
        out = json.loads(r.stdout)
        if code == 2 or "error" in out:
            assert out["error"]["exit"] == code and r.stderr.count("error: ") == 1


def test_a_note_printed_before_a_failure_is_dropped_so_the_error_is_one_line(tmp_path):
    """hf_config notes an ignored key, then --set fails: exit 2 must still be one line."""
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                              "intermediate_size": 512, "vocab_size": 1000, "some_unknown_key": 1}))
    r = run_script("plan", "--hf-config", hf, "--set", "model.num_layers=abc")
    assert r.returncode == 2 and r.stderr == "error: model.num_layers: must be an integer, got 'abc'\n"
    ok = run_script("plan", "--hf-config", hf, "--json")
    assert "note: --hf-config" in ok.stderr          # on success the note is still shown


def test_an_error_line_stays_short_whatever_the_input_held():
    r = run_script("compare", str(EXAMPLES / "logs" / "oom" / "backward.log"), "--control", "x" * 100_000)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and len(r.stderr) < 1500
    assert "more characters" in r.stderr


def test_bad_input_to_plan_check_and_config_gets_the_json_error_object_too(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    for argv in (["plan", str(bad)], ["check", str(bad), "--validator", "builtin"],
                 ["config", str(bad), "--modules", "moe_act"]):
        r = run_script(*argv, "--json")
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["exit"] == 2, argv
