"""`check --run`: the recompute setting a run really had, next to what its command asked for.

Runs are started by the tool's own launcher (runs/launch.py, as `run_harness.py --launch` does)
against the STAND-IN harness of tests/fixtures/harness (a GPU training rank cannot run here: the
stand-in applies Bridge's flat-path precedence -- recipe full/block/5, then Hydra, then the
flags -- validates like megatron-core, and writes its config with --save_config_filepath).
The commands that go wrong are the ones users write by hand: a selective flag that leaves the
recipe's full-recompute values in place, Hydra nulls next to -rl.
"""

from __future__ import annotations

import json

from test_harness_launch import PINNED, launch, standin  # noqa: F401 (the fixture)

from mbridge_recompute.logs import effective
from mbridge_recompute.runs.harness import PlannedRun
from mbridge_recompute.runs.launch import launch_run
from mbridge_recompute.setting import RecomputeSetting

from conftest import EXAMPLES, run_script


def _check_run(*args):
    proc = run_script("check", "--json", "--validator", "builtin", "--run", *map(str, args))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(proc.stdout) if proc.stdout else None


def test_check_run_names_the_setting_of_each_run_the_harness_launched(standin, tmp_path):  # noqa: F811
    repo, env, _ = standin
    out = tmp_path / "runs"
    proc = launch(repo, env, out, "[]", "layernorm", "block:2")
    assert proc.returncode == 0, proc.stderr
    expected = (("empty", ("selective", [], None, None)),
                ("layernorm", ("selective", ["layernorm"], None, None)),
                ("block2", ("full", [], "block", 2)))
    for name, ran in expected:
        code, report = _check_run(out / name)
        assert code.returncode == 0, code.stdout + code.stderr
        got = report["run"]["ran"]
        assert (got["recompute_granularity"], got["recompute_modules"], got["recompute_method"],
                got["recompute_num_layers"]) == ran
        assert report["run"]["asked_from"] == "manifest candidate" and report["run"]["differences"] == []
    text = " ".join(run_script("check", "--validator", "builtin", "--run", out / "layernorm").stdout.split())
    assert "ran (" in text and "modules=['layernorm']" in text and "no difference" in text


def _user_run(repo, env, tmp_path, monkeypatch, name, asked: RecomputeSetting, tokens: list) -> str:
    """A run of a hand-written command: the harness's own argv for the [] control, its recompute
    tokens replaced by `tokens`, started by the tool's launcher."""
    proc = run_script("harness", "--repo", repo, "--json", "--out", tmp_path / "plan",
                      "--candidates", "[]", "--", *PINNED, env=env)
    assert proc.returncode == 0, proc.stderr
    built = json.loads(proc.stdout)["runs"][0]
    argv = [t for t in built["argv"] if t not in built["recompute_tokens"]] + tokens
    run_dir = tmp_path / name
    run_dir.mkdir()
    dump = str(run_dir / "ConfigContainer.yaml")
    argv = [dump if t.endswith("ConfigContainer.yaml") else t for t in argv]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = PlannedRun(name, asked, argv, built["env"], built["cwd"], str(run_dir), tokens)
    from mbridge_recompute.runs import procgroup

    with procgroup.SignalGuard() as guard:
        launch_run(run, {"repo": str(repo)}, timeout=60, grace=2, guard=guard)
    return run_dir


def test_a_selective_flag_next_to_the_recipes_full_recompute_is_a_recipe_leak(
        standin, tmp_path, monkeypatch):  # noqa: F811
    repo, env, _ = standin
    run_dir = _user_run(repo, env, tmp_path, monkeypatch, "leak", RecomputeSetting.selective("layernorm"),
                        ["--recompute_modules", "layernorm"])
    proc, report = _check_run(run_dir)
    assert proc.returncode == 1
    assert report["run"]["ran"] is None and "recompute_num_layers must be None" in report["run"]["error"]
    f = next(f for f in report["findings"] if f["id"] == "run-recipe-leak")
    assert f["severity"] == "error" and "model.recompute_num_layers=null" in f["fix"]


def test_hydra_nulls_cannot_undo_rl_and_check_run_says_why(standin, tmp_path, monkeypatch):  # noqa: F811
    repo, env, _ = standin
    tokens = ["model.recompute_granularity=null", "model.recompute_method=null",
              "model.recompute_num_layers=null", "-rl", "4"]
    run_dir = _user_run(repo, env, tmp_path, monkeypatch, "order", RecomputeSetting.off(), tokens)
    proc, report = _check_run(run_dir)
    assert proc.returncode == 1
    assert report["run"]["ran"]["recompute_num_layers"] == 4
    causes = {d["field"]: d["cause"] for d in report["run"]["differences"]}
    assert causes == {"recompute_granularity": "flag-order", "recompute_method": "flag-order",
                      "recompute_num_layers": "flag-order"}
    assert any("run_script.py:76-79" in f["message"]
               for f in report["findings"] if f["id"] == "run-flag-order")


def test_a_log_and_its_dump_elsewhere_are_read_too(standin, tmp_path):  # noqa: F811
    repo, env, _ = standin
    out = tmp_path / "runs"
    assert launch(repo, env, out, "core_attn").returncode == 0
    log = tmp_path / "copied.log"
    log.write_text((out / "core_attn" / "log.txt").read_text())
    dump = tmp_path / "elsewhere.yaml"
    dump.write_text((out / "core_attn" / "ConfigContainer.yaml").read_text())
    proc, report = _check_run(log, "--run-config", dump)
    assert proc.returncode == 0 and report["run"]["ran"]["recompute_modules"] == ["core_attn"]
    assert report["run"]["asked_from"].startswith("nothing")


def test_a_label_that_ran_but_did_nothing_is_named_with_the_workload_given(standin, tmp_path):  # noqa: F811
    """The stand-in's dump holds only the recompute keys; with the workload it ran (a dense Llama)
    the checker sees that moe recomputes nothing there."""
    repo, env, _ = standin
    out = tmp_path / "runs"
    assert launch(repo, env, out, "moe").returncode == 0
    proc, report = _check_run(out / "moe", EXAMPLES / "llama3_70b_fp8.yaml")
    causes = [d["cause"] for d in report["run"]["differences"]]
    assert causes == ["ignored-label"] and proc.returncode == 0
    assert any(f["id"] == "run-ignored-label" and "moe-labels-on-dense-model" in f["message"]
               for f in report["findings"])


def test_none_promoted_to_core_attn_is_its_own_cause():
    s = effective.RunSetting(run="r", asked={"recompute_granularity": "selective", "recompute_modules": None,
                                             "recompute_method": None, "recompute_num_layers": None},
                             asked_from="manifest candidate",
                             ran={"recompute_granularity": "selective", "recompute_modules": ["core_attn"],
                                  "recompute_method": None, "recompute_num_layers": None}, ran_from="dump")
    causes = [(d["field"], d["cause"]) for d in effective.differences(s)]
    assert causes == [("recompute_modules", "none-promoted")]


def test_use_recipes_ignores_the_recompute_flags():
    argv = ["bootstrap.py", "--use_recipes", "--recompute_modules", "mlp"]
    requests, use_recipes = effective.requests_of(argv)
    assert use_recipes and requests == []
    asked = {"recompute_granularity": "selective", "recompute_modules": ["mlp"],
             "recompute_method": None, "recompute_num_layers": None}
    s = effective.RunSetting(run="r", asked=asked,
                             asked_from="manifest candidate",
                             ran={"recompute_granularity": None, "recompute_modules": None,
                                  "recompute_method": None, "recompute_num_layers": None},
                             ran_from="dump", requests=requests, use_recipes=True, argv=argv)
    assert "ignored-flags" in {d["cause"] for d in effective.differences(s)}


def test_every_cause_of_a_difference_has_a_fix():
    from mbridge_recompute.logs.effective import CAUSES, FIXES

    assert list(FIXES) == list(CAUSES)
