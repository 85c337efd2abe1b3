"""Property-based: every reader the log tools own, fed arbitrary bytes and arbitrary YAML/JSON
trees, ends in exit 0, 1 or 2 -- never a traceback, and exit 2 carries one line and, with --json,
one error object.

The tools are driven in-process through `cli.main` (the same entry point the scripts call), so a
few hundred examples run in seconds; any exception other than the tool's own SystemExit fails
the example.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "logs"))

import logformat as lf  # noqa: E402

from mbridge_recompute import cli  # noqa: E402

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PASS_LOG = (ROOT / "tests" / "fixtures" / "logs" / "pass.log").read_bytes()


def invoke(argv: list) -> tuple:
    """(exit code, stdout, stderr) of one in-process run; anything but SystemExit propagates."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
        except SystemExit as done:
            code = done.code
        else:
            code = 0
    return code, out.getvalue(), err.getvalue()


def judged(code, out, err, as_json=True):
    assert code in (0, 1, 2), (code, err[-500:])
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("error: ") and len(err) < 2000, err[:500]
        if as_json:
            assert json.loads(out)["error"]["exit"] == 2
    elif as_json:
        json.loads(out)                      # one object, whatever the verdict


# arbitrary JSON-shaped trees, with the values that broke readers before: huge integers, nesting,
# wrong types where a list or a number belongs
scalars = st.one_of(st.none(), st.booleans(), st.integers(),
                    st.integers(min_value=10**300, max_value=10**400),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
trees = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.text(max_size=12), kids, max_size=4)),
                     max_leaves=25)
keys = st.sampled_from(["name", "argv", "setting", "env", "revisions", "git", "status", "returncode",
                        "recompute_tokens", "recompute_granularity", "recompute_modules", "recompute_method",
                        "recompute_num_layers", "model", "train", "seq_length", "global_batch_size"])
keyed_trees = st.dictionaries(keys, trees, max_size=6)


def _json_text(tree) -> str:
    return json.dumps(tree, default=str, allow_nan=True)


VOCAB = [b"iteration ", b"/ ", b"| ", b"lm loss: ", b"nan", b"[Rank ", b"] (after ",
         b" iterations) memory (GB) | ",
         b"mem-max-allocated-gigabytes: ", b"CUDA out of memory. Tried to allocate ", b" GiB", b"\n", b"\r",
         b"\x1b[31m", b"\xff\xfe", b"\x00", b"Traceback (most recent call last):\n", b"ValueError: ",
         b"9" * 5000, b"Error parsing override 'x'", b"--recompute_modules a ", b"-rl 2 "]
log_bytes = st.lists(st.one_of(st.sampled_from(VOCAB), st.binary(max_size=40)), max_size=40).map(b"".join)


@FAST
@given(log_bytes)
def test_compare_and_diagnose_read_arbitrary_log_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.log"
        log.write_bytes(data)
        judged(*invoke(["compare", str(log), "--json"]))
        judged(*invoke(["diagnose", str(log), "--json"]))
        judged(*invoke(["diagnose", str(log)]), as_json=False)


def _passing_run_with(tmp: Path, name: str, text: str) -> Path:
    """A run directory with a passing log and `name` holding `text`."""
    run = tmp / "moe_act"
    run.mkdir()
    (run / "log.txt").write_bytes(PASS_LOG)
    (run / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    return run


@FAST
@given(st.one_of(keyed_trees.map(_json_text), trees.map(_json_text), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1"))))
def test_compare_reads_arbitrary_manifests(text):
    with tempfile.TemporaryDirectory() as tmp:
        run = _passing_run_with(Path(tmp), "manifest.json", text)
        judged(*invoke(["compare", str(run), "--json"]))
        judged(*invoke(["diagnose", str(run), "--json"]))


def _yaml_text(tree) -> str:
    try:
        return yaml.safe_dump(tree, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return _json_text(tree)


yaml_docs = st.one_of(
    st.dictionaries(st.sampled_from(["model", "train", "dataset", "logger"]), keyed_trees, max_size=3).map(
        _yaml_text),
    trees.map(_yaml_text),
    st.lists(st.sampled_from(["a: &x [1, 2]\n", "b: *x\n", "c: &y {k: *x}\n", "d: [*y, *y]\n",
                              "model:\n", "  seq_length: 4096\n", "!!python/name:x {}\n", "[", "{",
                              "e: " + "9" * 5000 + "\n"]),
             max_size=12).map("".join),
    st.text(max_size=200),
)


@FAST
@given(yaml_docs)
def test_compare_reads_arbitrary_config_dumps(text):
    with tempfile.TemporaryDirectory() as tmp:
        run = _passing_run_with(Path(tmp), "ConfigContainer.yaml", text)
        judged(*invoke(["compare", str(run), "--json"]))


@FAST
@given(st.text(min_size=1, max_size=400))
def test_diagnose_reads_any_pasted_message(message):
    code, out, err = invoke(["diagnose", "--message", message, "--json"])
    judged(code, out, err)
    code, out, err = invoke(["diagnose", "--message", message])
    judged(code, out, err, as_json=False)
    assert "\x1b" not in out


def test_an_alias_bomb_and_a_deep_document_are_refused_quickly_in_process():
    import time

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9))
    for text in (bomb, "model: " + "[" * 50000, '{"x": ' * 30000):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "r"
            run.mkdir()
            (run / "log.txt").write_bytes(PASS_LOG)
            (run / "ConfigContainer.yaml").write_text(text)
            (run / "manifest.json").write_text('{"name": "r"}')
            t0 = time.monotonic()
            code, out, err = invoke(["compare", str(run), "--json"])
            assert code == 2 and time.monotonic() - t0 < 5, err


def test_log_lines_in_every_format_still_parse_after_the_hardening():
    """The bounded numbers still read real lines (the formats of logformat.py)."""
    lines = [lf.iteration_line(7, 20, 457.2), lf.memory_line(3, 2, 40.0, 60.0, 62.0, 64.0)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "x.log"
        log.write_text("\n".join(lines) + "\n")
        code, out, _ = invoke(["compare", str(log), "--json"])
        row = json.loads(out)["runs"][0]
        assert row["last_iteration"] == 7 and row["ranks"]["3"]["max_allocated_gb"] == 60.0
