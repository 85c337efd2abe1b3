"""The matched sweep the harness builds: every flag trap, checked on the built argv.

Runs `scripts/run_harness.py` as a subprocess (dry-run, the default) against a
temporary checkout that holds the stand-in `scripts/performance/` of
tests/fixtures/harness (Bridge itself cannot be imported here).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_script

FIXTURE = ROOT / "tests" / "fixtures" / "harness" / "standin_bridge"
BASE = ["-m", "deepseek", "-mr", "moonlight_16b", "-ng", "8", "-g", "h100", "-c", "bf16"]
PINNED = [*BASE, "-gb", "64", "-sl", "4096"]


@pytest.fixture
def checkout(tmp_path):
    """A checkout with the stand-in bootstrap.py but without argument_parser.py."""
    repo = tmp_path / "bridge"
    shutil.copytree(FIXTURE, repo)
    (repo / "scripts" / "performance" / "argument_parser.py").unlink()
    return repo


def sweep(repo, *candidates, passthrough=PINNED, extra=()):
    proc = run_script("harness", "--repo", repo, "--json", "--out", Path(repo).parent / "runs",
                      "--candidates", *candidates, *extra, "--", *passthrough)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def refused(repo, *candidates, passthrough=PINNED, extra=()):
    proc = run_script("harness", "--repo", repo, "--out", Path(repo).parent / "runs",
                      "--candidates", *candidates, *extra, "--", *passthrough)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    return proc.stderr


def by_name(report):
    return {r["name"]: r for r in report["runs"]}


def test_empty_module_list_is_a_valid_control_written_through_hydra(checkout):
    argv = by_name(sweep(checkout, "[]"))["empty"]["argv"]
    assert "model.recompute_granularity=selective" in argv
    assert "model.recompute_modules=[]" in argv
    # never an empty flag: --recompute_modules "" parses to [''], an invalid label
    assert "--recompute_modules" not in argv and "" not in argv


def test_module_list_is_one_comma_separated_token(checkout):
    argv = by_name(sweep(checkout, "layernorm,moe_act"))["layernorm+moe_act"]["argv"]
    i = argv.index("--recompute_modules")
    assert argv[i + 1] == "layernorm,moe_act"
    assert argv[i + 2] != "moe_act" and not argv[i + 2].startswith(("layernorm", "moe_act"))


def test_uniform_full_recompute_goes_through_hydra_overrides(checkout):
    argv = by_name(sweep(checkout, "uniform:2"))["uniform2"]["argv"]
    assert {"model.recompute_granularity=full", "model.recompute_method=uniform",
            "model.recompute_num_layers=2"} <= set(argv)
    assert "-rl" not in argv   # -rl always means block (overrides.py:174-177)


def test_block_full_recompute_uses_rl(checkout):
    argv = by_name(sweep(checkout, "block:4"))["block4"]["argv"]
    assert argv[argv.index("-rl") + 1] == "4"
    assert not any(t.startswith(("model.recompute_method=", "model.recompute_num_layers=")) for t in argv)


def test_selective_candidate_clears_a_recipes_full_method_and_layers(checkout):
    argv = by_name(sweep(checkout, "core_attn"))["core_attn"]["argv"]
    assert "model.recompute_method=null" in argv and "model.recompute_num_layers=null" in argv
    assert argv[argv.index("--recompute_modules") + 1] == "core_attn"


def test_none_candidate_disables_recompute_through_hydra(checkout):
    argv = by_name(sweep(checkout, "none"))["off"]["argv"]
    assert "model.recompute_granularity=null" in argv and "model.recompute_modules=[]" in argv


def test_every_run_gets_identical_passthrough_and_differs_only_in_recompute(checkout):
    report = sweep(checkout, "[]", "core_attn", "moe_act", "layernorm,moe_act", "uniform:2", "block:4")
    runs = report["runs"]
    for r in runs:
        argv = r["argv"]
        assert argv[:4] == ["torchrun", "--nproc_per_node", "8", "scripts/performance/bootstrap.py"]
        assert argv[4:4 + len(PINNED)] == PINNED
        assert r["env"] == {"PYTHONPATH": "src"} and r["cwd"] == str(checkout)
        rest = argv[4 + len(PINNED):]
        assert rest[:len(r["recompute_tokens"])] == r["recompute_tokens"]
        assert rest[len(r["recompute_tokens"]):] == [
            "-wdj", f"recompute_{r['name']}", "--save_config_filepath", f"{r['run_dir']}/ConfigContainer.yaml"]
    # what differs between any two runs is only recompute tokens, name and run dir
    assert len({tuple(r["recompute_tokens"]) for r in runs}) == len(runs)


def test_run_names_dirs_and_wandb_names_are_unique(checkout):
    runs = sweep(checkout, "[]", "core_attn", "moe_act", "layernorm,moe_act", "uniform:2", "block:4")["runs"]
    names = [r["name"] for r in runs]
    assert names == ["empty", "core_attn", "moe_act", "layernorm+moe_act", "uniform2", "block4"]
    assert len({r["run_dir"] for r in runs}) == len(runs)
    assert len({r["argv"][r["argv"].index("-wdj") + 1] for r in runs}) == len(runs)


def test_duplicate_candidate_is_refused(checkout):
    assert "given twice" in refused(checkout, "core_attn", " core_attn")


def test_unknown_label_is_refused_before_any_gpu_time(checkout):
    assert "core_atn" in refused(checkout, "[]", "core_atn")


@pytest.mark.parametrize("missing,flag", [("-gb", "-gb"), ("-sl", "-sl")])
def test_missing_gbs_or_seq_is_refused_naming_the_flag(checkout, missing, flag):
    pt = list(PINNED)
    i = pt.index(missing)
    del pt[i:i + 2]
    err = refused(checkout, "[]", passthrough=pt)
    assert f"lack {flag}" in err


def test_gbs_and_seq_options_pin_them_in_every_run(checkout):
    report = sweep(checkout, "[]", "block:2", passthrough=BASE, extra=("--gbs", "128", "--seq", "8192"))
    for r in report["runs"]:
        argv = r["argv"]
        assert argv[argv.index("-gb") + 1] == "128" and argv[argv.index("-sl") + 1] == "8192"


def test_gbs_option_and_passthrough_gb_together_are_refused(checkout):
    assert "give it once" in refused(checkout, "[]", extra=("--gbs", "128"))


@pytest.mark.parametrize("token", [
    ["--recompute_modules", "core_attn"], ["--recompute_modules=core_attn"], ["--recompute_mod", "mlp"],
    ["-rl", "2"], ["-rl2"], ["--recompute_num_layers", "2"], ["model.recompute_granularity=full"],
    ["+model.recompute_modules=[mlp]"], ["model.distribute_saved_activations=true"], ["-ol", "2"],
    ["--save_config_filepath", "/tmp/x.yaml"], ["-wdj", "mine"],
])
def test_passthrough_that_conflicts_with_the_candidates_is_refused(checkout, token):
    err = refused(checkout, "[]", "core_attn", passthrough=[*PINNED, *token])
    assert "conflicts with the sweep" in err and token[0] in err


def test_missing_num_gpus_is_refused(checkout):
    pt = [t for t in PINNED]
    del pt[pt.index("-ng"):pt.index("-ng") + 2]
    assert "-ng" in refused(checkout, "[]", passthrough=pt)


def test_use_recipes_path_writes_every_candidate_as_hydra(checkout):
    """--use_recipes ignores --recompute_modules and -rl (run_recipe.py:45-208)."""
    report = sweep(checkout, "core_attn", "block:3", passthrough=[*PINNED, "--use_recipes", "-ms", "10"])
    for r in report["runs"]:
        assert "--recompute_modules" not in r["argv"] and "-rl" not in r["argv"]
    runs = by_name(report)
    assert "model.recompute_modules=[core_attn]" in runs["core_attn"]["argv"]
    assert {"model.recompute_granularity=full", "model.recompute_method=block",
            "model.recompute_num_layers=3"} <= set(runs["block3"]["argv"])
    assert any("--use_recipes" in n for n in report["notes"])


def test_slurm_launcher_passes_through_bridges_setup_experiment(checkout):
    (checkout / "scripts" / "performance" / "setup_experiment.py").write_text("# stand-in\n")
    report = sweep(checkout, "[]", "moe_act", passthrough=[*PINNED, "-a", "acct", "-p", "batch"],
                   extra=("--launcher", "slurm"))
    for r in report["runs"]:
        assert r["argv"][:2] == ["python", "scripts/performance/setup_experiment.py"]
        assert r["argv"][2:2 + len(PINNED) + 4] == [*PINNED, "-a", "acct", "-p", "batch"]
        assert r["argv"][r["argv"].index("-wdj") + 1] == f"recompute_{r['name']}"
        assert "torchrun" not in r["argv"] and r["env"] == {}


def test_dry_run_says_argv_was_not_parser_checked_when_the_parser_is_absent(checkout):
    report = sweep(checkout, "[]")
    assert report["parser_check"]["checked"] is False
    text = run_script("harness", "--repo", checkout, "--candidates", "[]", "--", *PINNED).stdout
    assert "NOT parser-checked" in text


def test_parser_that_imports_nemo_run_is_reported_not_importable(checkout):
    (checkout / "scripts" / "performance" / "argument_parser.py").write_text("import nemo_run\n")
    report = sweep(checkout, "[]")
    assert report["parser_check"]["checked"] is False
    assert "nemo_run" in report["parser_check"]["reason"]


def test_importable_parser_checks_every_argv(tmp_path):
    repo = tmp_path / "bridge"
    shutil.copytree(FIXTURE, repo)
    report = sweep(repo, "[]", "layernorm,moe_act", "uniform:2", "block:4")
    assert report["parser_check"] == {"checked": True, "reason": "", "problems": {}}


def test_parser_rejection_stops_the_sweep_with_exit_1(tmp_path):
    repo = tmp_path / "bridge"
    shutil.copytree(FIXTURE, repo)
    # -g must be one of Bridge's GPU names: the stand-in parser rejects "a100"
    proc = run_script("harness", "--repo", repo, "--json", "--candidates", "[]", "--",
                      *[t if t != "h100" else "a100" for t in PINNED])
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False and "empty" in report["parser_check"]["problems"]


def test_from_plan_takes_frontier_and_recommendation_plus_the_control(checkout, tmp_path):
    plan = {"frontier": [
        {"recompute_granularity": "selective", "recompute_modules": ["moe_act"], "recompute_method": None,
         "recompute_num_layers": None},
        {"recompute_granularity": "full", "recompute_modules": None, "recompute_method": "uniform",
         "recompute_num_layers": 1}],
        "recommendation": {"recompute_granularity": "selective", "recompute_modules": ["moe_act"],
                           "recompute_method": None, "recompute_num_layers": None, "fits": True}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run_script("harness", "--repo", checkout, "--json", "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 0, proc.stderr
    assert [r["name"] for r in json.loads(proc.stdout)["runs"]] == ["empty", "moe_act", "uniform1"]


@pytest.mark.parametrize("content", [b"frontier: [", b"\xa2\xff not utf-8", None])
def test_from_plan_that_is_not_json_is_refused(checkout, tmp_path, content):
    path = tmp_path / "plan.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    proc = run_script("harness", "--repo", checkout, "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --from-plan:") and proc.stderr.count("\n") == 1


def test_repo_without_bootstrap_is_refused(tmp_path):
    proc = run_script("harness", "--repo", tmp_path, "--candidates", "[]", "--", *PINNED)
    assert proc.returncode == 2 and "bootstrap.py" in proc.stderr


def test_sweep_tokens_are_the_config_writers_harness_format(checkout):
    """Facts live once: the sweep runs exactly what `config --format harness` prints."""
    from mbridge_recompute.setting import RecomputeSetting
    from mbridge_recompute.write.snippets import render

    report = sweep(checkout, "[]", "core_attn", "layernorm,moe_act", "uniform:2", "block:4", "none")
    for r in report["runs"]:
        setting = RecomputeSetting.parse(
            {"empty": "[]", "uniform2": "uniform:2", "block4": "block:4", "off": "none"}.get(
                r["name"], r["name"].replace("+", ",")))
        assert r["recompute_tokens"] == render(setting, "harness")


def test_a_bad_candidate_in_the_plans_short_list_names_from_plan(checkout, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"harness_candidates": ["[]", "uniform:0"]}))
    proc = run_script("harness", "--repo", checkout, "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --from-plan: 'uniform:0'")


def test_from_plan_leaves_out_entries_the_plan_rejects_and_says_so(checkout, tmp_path):
    plan = {"frontier": [
        {"name": "moe", "recompute_granularity": "selective", "recompute_modules": ["moe"],
         "recompute_method": None, "recompute_num_layers": None, "allowed": False,
         "rejected_by": ["moe-recompute-with-ep-overlap"]},
        {"name": "block:2", "recompute_granularity": "full", "recompute_modules": None,
         "recompute_method": "block", "recompute_num_layers": 2, "allowed": True}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run_script("harness", "--repo", checkout, "--json", "--from-plan", path, "--", *PINNED)
    report = json.loads(proc.stdout)
    assert [r["name"] for r in report["runs"]] == ["empty", "block2"]
    assert any("moe-recompute-with-ep-overlap" in n for n in report["notes"])


def test_from_plan_reads_what_plan_json_writes(checkout, tmp_path):
    from mbridge_recompute.setting import RecomputeSetting

    plan = run_script("plan", "--json")
    assert plan.returncode in (0, 1), plan.stderr
    path = tmp_path / "plan.json"
    path.write_text(plan.stdout)
    proc = run_script("harness", "--repo", checkout, "--json", "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(plan.stdout)
    runs = json.loads(proc.stdout)["runs"]
    assert runs[0]["name"] == "empty"
    # the plan's short list is what gets swept, the recommendation among it
    assert [r["name"] for r in runs] == [RecomputeSetting.parse(t).slug() for t in data["harness_candidates"]]
    got = {json.dumps(r["setting"], sort_keys=True) for r in runs}
    for e in [data["recommendation"]]:
        fields = {k: e[k] for k in ("recompute_granularity", "recompute_modules", "recompute_method",
                                    "recompute_num_layers")}
        if fields["recompute_granularity"] == "selective" and fields["recompute_modules"] is None:
            fields["recompute_modules"] = ["core_attn"]
        if fields["recompute_granularity"] != "selective":
            fields["recompute_modules"] = None
        if fields["recompute_granularity"] is None:
            # "no recompute" is swept as the [] control (selector.harness_candidates)
            fields["recompute_granularity"], fields["recompute_modules"] = "selective", []
        assert json.dumps(fields, sort_keys=True) in got


def test_parser_check_catches_a_stray_token_that_hydra_would_reject(tmp_path):
    """A space-separated label list leaves a bare word that argparse forwards to Hydra."""
    repo = tmp_path / "bridge"
    shutil.copytree(FIXTURE, repo)
    proc = run_script("harness", "--repo", repo, "--json", "--candidates", "[]", "--", *PINNED, "layernorm")
    assert proc.returncode == 1
    problems = json.loads(proc.stdout)["parser_check"]["problems"]["empty"]
    assert any("not key=value" in p and "layernorm" in p for p in problems)
