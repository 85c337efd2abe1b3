"""Hostile run directories: compare reads what a harness run wrote, and anything else a user
(or a broken job) leaves there -- manifests with fields of the wrong type, numbers past Python's
integer-conversion limit, deep nesting, YAML alias bombs in ConfigContainer.yaml -- must end in
exit 2 with one line naming the file, quickly, never a traceback or an exhausted memory."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from conftest import ROOT, run_script

FIXTURES = ROOT / "tests" / "fixtures" / "logs"


def run_dir(tmp_path, name="moe_act", manifest=None, config=None, log=None):
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    if log is None:
        shutil.copy(FIXTURES / "pass.log", d / "log.txt")
    else:
        (d / "log.txt").write_text(log)
    if manifest is not None:
        (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    if config is not None:
        (d / "ConfigContainer.yaml").write_text(config)
    return d


def unreadable(*paths, field=None, limit_s=20.0):
    t0 = time.monotonic()
    proc = run_script("compare", *paths, "--json", timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-500:])
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1 and len(proc.stderr) < 1000
    assert json.loads(proc.stdout)["error"]["exit"] == 2
    if field:
        assert field in proc.stderr
    assert took < limit_s, f"took {took:.1f} s"
    return proc.stderr


@pytest.mark.parametrize("manifest,field", [
    ({"setting": {"recompute_granularity": "selective", "recompute_modules": 5}}, "recompute_modules"),
    ({"setting": {"recompute_granularity": "selective", "recompute_modules": [1, 2]}}, "recompute_modules"),
    ({"setting": {"recompute_granularity": "full", "recompute_method": "block",
                  "recompute_num_layers": True}}, "recompute_num_layers"),
    ({"argv": "torchrun -m x"}, "argv"),
    ({"argv": [1, None]}, "argv"),
    ({"env": {"A": 5}}, "env"),
    ({"name": ["x"]}, "name"),
    ({"revisions": "abc"}, "revisions"),
    ([1, 2], "must be a JSON object"),
])
def test_manifest_fields_of_the_wrong_type_are_unreadable_input(tmp_path, manifest, field):
    unreadable(run_dir(tmp_path, manifest=manifest), field=field)


@pytest.mark.parametrize("text", [
    '{"name": "x", "returncode": ' + "9" * 5000 + "}",      # past the 4300-digit int() limit
    "[" * 20000 + "]" * 20000,                               # past the recursion limit
    "{" * 5000,
    "",
    "\xff\xfe not json",
])
def test_hostile_manifests_are_unreadable_input(tmp_path, text):
    unreadable(run_dir(tmp_path, manifest=text), field="manifest.json")


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9))


@pytest.mark.parametrize("config,why", [
    (f"model:\n  tensor_model_parallel_size: 1\n{BOMB}", "once aliases are expanded"),
    ("model: &m\n  inner: *m\n", "a collection that contains it"),
    ("model: " + "[" * 20000, "nesting depth"),
    ("model:\n  seq_length: 4096\n  x: [unclosed\n", "not valid YAML"),
])
def test_hostile_config_dumps_are_refused_quickly(tmp_path, config, why):
    err = unreadable(run_dir(tmp_path, config=config), field="ConfigContainer.yaml", limit_s=10.0)
    assert why in err


def test_a_huge_integer_in_a_log_is_text_not_a_traceback(tmp_path):
    big = "9" * 5000
    log = (FIXTURES / "pass.log").read_text() + (
        f" [2026-08-12 10:11:12] iteration {big}/{big} | global batch size: {big} | "
        f"number of nan iterations: {big} |\n[Rank {big}] (after {big} iterations) memory (GB) | "
        f"mem-max-allocated-gigabytes: 1e99999 |\nexiting program at iteration {big}\n")
    proc = run_script("compare", run_dir(tmp_path, log=log), "--json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["runs"][0]["status"] == "pass"


def test_a_device_is_not_read_as_a_log():
    unreadable("/dev/zero", field="/dev/zero")


def test_an_empty_log_is_unreadable_input(tmp_path):
    unreadable(run_dir(tmp_path, log=""), field="log.txt")


def test_two_logs_with_one_run_name_are_rejected_not_unreadable(tmp_path):
    proc = run_script("compare", FIXTURES / "pass.log", FIXTURES / "pass.log", "--json")
    assert proc.returncode == 1 and proc.stderr.startswith("error: LOG: two logs share the run name")
    assert json.loads(proc.stdout)["error"]["exit"] == 1
