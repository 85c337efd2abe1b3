"""The matched sweep the harness builds: every flag trap, checked on the built argv.

Runs `scripts/run_harness.py` as a subprocess (dry-run, the default) against a
temporary checkout assembled from the stand-in harness of tests/fixtures/harness
(`standin.make_checkout`, shaped like Bridge 0.5, 0.6 or main; Bridge itself cannot be
imported here).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
import standin  # noqa: E402

BASE = ["-m", "deepseek", "-mr", "moonlight_16b", "-ng", "8", "-g", "h100", "-c", "bf16"]
PINNED = [*BASE, "-gb", "64", "-sl", "4096"]


@pytest.fixture
def checkout(tmp_path):
    """A main-shaped checkout with the stand-in entry point but without argument_parser.py."""
    return standin.make_checkout(tmp_path / "bridge", "main", parser=False)


def sweep(repo, *candidates, passthrough=PINNED, extra=(), cwd=None):
    args = ["--repo", repo] if repo is not None else []
    proc = run_script("harness", *args, "--json", "--out", Path(cwd or repo or ".").parent / "runs",
                      "--candidates", *candidates, *extra, "--", *passthrough, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _failed(code, repo, candidates, passthrough, extra):
    proc = run_script("harness", "--repo", repo, "--out", Path(repo).parent / "runs",
                      "--candidates", *candidates, *extra, "--", *passthrough)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    return proc.stderr


def refused(repo, *candidates, passthrough=PINNED, extra=()):
    """Readable input the sweep rejects: exit 1, one error line."""
    return _failed(1, repo, candidates, passthrough, extra)


def unreadable(repo, *candidates, passthrough=PINNED, extra=()):
    """Input the tool cannot read (an unknown label, a missing file): exit 2, one error line."""
    return _failed(2, repo, candidates, passthrough, extra)


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
            "-wdj", f"recompute_{r['name']}",
            "--save_config_filepath", f"{r['run_dir']}/ConfigContainer.yaml"]
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


def test_the_same_labels_in_another_order_are_the_same_candidate(checkout):
    """MCore tests labels by membership (attention.py:330 @ core_v0.16.1): one run, not two."""
    err = refused(checkout, "layernorm,mlp", "mlp,layernorm")
    assert "given twice" in err and "order does not matter" in err


def test_a_label_repeated_inside_one_candidate_is_refused(checkout):
    assert "'core_attn' is given twice" in refused(checkout, "core_attn,core_attn")


def test_unknown_label_is_unreadable_input_before_any_gpu_time(checkout):
    assert "core_atn" in unreadable(checkout, "[]", "core_atn")


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


def test_dry_run_says_argv_was_not_parser_checked(checkout):
    report = sweep(checkout, "[]")
    assert report["parser_check"]["checked"] is False
    text = run_script("harness", "--repo", checkout, "--candidates", "[]", "--", *PINNED).stdout
    assert "NOT parser-checked" in text


def test_parser_that_imports_nemo_run_is_reported_not_importable(checkout):
    (checkout / "scripts" / "performance" / "argument_parser.py").write_text("import nemo_run\n")
    report = sweep(checkout, "[]", extra=("--parser-check",))
    assert report["parser_check"]["checked"] is False
    assert "nemo_run" in report["parser_check"]["reason"]


def test_importable_parser_checks_every_argv_when_asked(tmp_path):
    repo = standin.make_checkout(tmp_path / "bridge", "main")
    report = sweep(repo, "[]", "layernorm,moe_act", "uniform:2", "block:4", extra=("--parser-check",))
    assert report["parser_check"] == {"checked": True, "reason": "", "problems": {}}


def test_parser_rejection_stops_the_sweep_with_exit_1(tmp_path):
    """-g b300 is a choice of Bridge's real parser, not of this stand-in's: only the checkout's own
    parser (run with --parser-check) can reject it."""
    repo = standin.make_checkout(tmp_path / "bridge", "main")
    proc = run_script("harness", "--repo", repo, "--json", "--parser-check", "--candidates", "[]", "--",
                      *[t if t != "h100" else "b300" for t in PINNED])
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


def test_launching_from_a_repo_without_the_entry_point_is_refused(tmp_path):
    proc = run_script("harness", "--repo", tmp_path, "--launch", "--out", tmp_path / "runs",
                      "--candidates", "[]", "--", *PINNED)
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


def test_a_stray_word_that_hydra_would_reject_is_refused_before_any_run(checkout):
    """A space-separated label list leaves a bare word that argparse forwards to Hydra, where it
    fails with "Error parsing override 'layernorm' missing EQUAL": refused from the flag data,
    without importing anything."""
    err = refused(checkout, "[]", passthrough=[*PINNED, "layernorm"])
    assert "'layernorm'" in err and "missing EQUAL" in err


# ---------------------------------------------------------------- Bridge releases

@pytest.mark.parametrize("release,entry,how", [
    ("0.5", "scripts/performance/run_script.py", "package_info.py says 0.5.1; no bootstrap.py"),
    ("0.6", "scripts/performance/bootstrap.py", "package_info.py says 0.6.1; bootstrap.py present"),
    ("main", "scripts/performance/bootstrap.py", "package_info.py says 0.7.0; bootstrap.py present"),
])
def test_each_release_gets_its_own_entry_point_and_says_how_it_was_detected(tmp_path, release, entry, how):
    repo = standin.make_checkout(tmp_path / "bridge", release, parser=False)
    report = sweep(repo, "[]", "moe_act")
    assert report["release"]["key"] == release and report["release"]["how"].startswith(how)
    for r in report["runs"]:
        assert r["argv"][:4] == ["torchrun", "--nproc_per_node", "8", entry] and r["entry"] == entry
    text = run_script("harness", "--repo", repo, "--candidates", "moe_act", "--", *PINNED).stdout
    assert f"Bridge release: {release} ({how}" in text


def test_0_5_pins_the_model_sequence_length_through_hydra_when_sl_is_pinned(tmp_path):
    """-sl sets only the dataset's length at 0.5 (overrides.py:382,417,431 @ v0.5.1)."""
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    report = sweep(repo, "[]", passthrough=[*BASE, "-gb", "64", "-sl", "8192"])
    argv = report["runs"][0]["argv"]
    assert "model.seq_length=8192" in argv and argv[argv.index("-sl") + 1] == "8192"
    assert any("only the mock/squad dataset length" in n for n in report["notes"])
    for release in ("0.6", "main"):
        other = standin.make_checkout(tmp_path / release, release, parser=False)
        argv = sweep(other, "[]", passthrough=[*BASE, "-gb", "64", "-sl", "8192"])["runs"][0]["argv"]
        assert not any(t.startswith("model.seq_length=") for t in argv)


def test_0_5_seq_option_is_pinned_through_hydra_too_but_not_twice(tmp_path):
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    argv = sweep(repo, "[]", passthrough=[*BASE, "-gb", "64"], extra=("--seq", "2048"))["runs"][0]["argv"]
    assert argv.count("model.seq_length=2048") == 1
    given = [*BASE, "-gb", "64", "-sl", "2048", "model.seq_length=2048"]
    argv = sweep(repo, "[]", passthrough=given)["runs"][0]["argv"]
    assert argv.count("model.seq_length=2048") == 1


def test_0_5_use_recipes_starts_run_recipe_and_needs_no_hydra_sequence_length(tmp_path):
    """run_recipe.py sets model.seq_length from -sl itself at 0.5 (run_recipe.py:160-161 @ v0.5.1)."""
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    (repo / "scripts" / "performance" / "run_recipe.py").write_text("# stand-in\n")
    argv = sweep(repo, "[]", passthrough=[*PINNED, "--use_recipes", "-ms", "10"])["runs"][0]["argv"]
    assert argv[3] == "scripts/performance/run_recipe.py"
    assert not any(t.startswith("model.seq_length=") for t in argv)


def test_0_5_dry_run_flag_is_said_not_to_validate(tmp_path):
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    notes = sweep(repo, "[]", passthrough=[*PINNED, "-d"])["notes"]
    assert any("nothing is validated" in n and "run_script.py:105-111 @ v0.5.1" in n for n in notes)
    main = standin.make_checkout(tmp_path / "main", "main", parser=False)
    notes = sweep(main, "[]", passthrough=[*PINNED, "-d"])["notes"]
    assert not any("nothing is validated" in n for n in notes)


@pytest.mark.parametrize("release,task,ok", [("0.5", "lora", True), ("0.5", "peft", False),
                                             ("main", "peft", True), ("main", "lora", False)])
def test_task_choices_are_the_releases(tmp_path, release, task, ok):
    repo = standin.make_checkout(tmp_path / "bridge", release, parser=False)
    if ok:
        sweep(repo, "[]", passthrough=[*PINNED, "--task", task])
    else:
        err = refused(repo, "[]", passthrough=[*PINNED, "--task", task])
        assert "invalid choice" in err and f"Bridge {release}" in err


@pytest.mark.parametrize("extra_args,what", [
    (["-etp", "2"], "'-etp': not a flag"),                      # the flag is -et; Hydra would choke on it
    (["--num_moe_experts", "8"], "not a flag of this release's harness at Bridge 0.5"),  # added in 0.6
    (["-ms", "10", "-ms", "20"], "--max_steps is given twice"),                # argparse keeps the last
    (["-c", "fp8_ds"], "invalid choice"),
])
def test_the_releases_flags_are_checked_without_importing_the_checkout(tmp_path, extra_args, what):
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    pt = [t for t in PINNED if t not in ("-c", "bf16")]
    assert what in refused(repo, "[]", passthrough=[*pt, *extra_args])


def test_bridge_release_option_wins_and_says_the_checkout_disagrees(tmp_path):
    repo = standin.make_checkout(tmp_path / "bridge", "main", parser=False)
    report = sweep(repo, "[]", extra=("--bridge-release", "0.6"))
    assert report["release"]["key"] == "0.6" and report["release"]["how"] == "given with --bridge-release 0.6"
    assert any("reads as main" in n for n in report["release"]["notes"])


def test_a_checkout_older_than_0_5_is_printed_but_not_launched(tmp_path):
    """Before the precedence fix a run without a recompute flag lost its Hydra recompute (#3470)."""
    repo = standin.make_checkout(tmp_path / "bridge", "0.5", parser=False)
    (repo / standin.PRECEDENCE).unlink()
    report = sweep(repo, "[]")
    assert report["release"]["supported"] is False
    proc = run_script("harness", "--repo", repo, "--launch", "--out", tmp_path / "runs", "--candidates", "[]",
                      "--", *PINNED)
    assert proc.returncode == 1 and "older than v0.5.0" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_without_a_checkout_prints_the_argv_and_what_it_could_not_check(tmp_path):
    report = sweep(None, "[]", "moe_act", extra=("--bridge-release", "0.5"), cwd=tmp_path)
    assert report["repo"] is None and report["release"]["key"] == "0.5"
    assert [r["argv"][3] for r in report["runs"]] == ["scripts/performance/run_script.py"] * 2
    assert any("no checkout" in u for u in report["unchecked"])
    assert all(not r["display"].startswith("cd ") for r in report["runs"])
    proc = run_script("harness", "--launch", "--candidates", "[]", "--", *PINNED, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --repo:")


def test_dry_run_on_a_partial_checkout_prints_the_argv_and_says_what_is_missing(tmp_path):
    repo = tmp_path / "bridge"
    (repo / "src" / "megatron" / "bridge").mkdir(parents=True)
    report = sweep(repo, "[]")
    assert report["runs"] and any("partial checkout" in u for u in report["unchecked"])
    assert report["release"]["key"] is None


def test_a_dry_run_imports_and_writes_nothing_in_the_checkout(tmp_path):
    repo = standin.make_checkout(tmp_path / "bridge", "main")

    def tree():
        return sorted((str(p.relative_to(repo)), p.stat().st_mtime_ns) for p in repo.rglob("*"))

    before = tree()
    sweep(repo, "[]", "moe_act")
    assert tree() == before
    # the parser check imports argument_parser.py in a child, with bytecode writing off
    report = sweep(repo, "[]", "moe_act", extra=("--parser-check",))
    assert report["parser_check"]["checked"] is True
    assert tree() == before and not list(repo.rglob("__pycache__"))


def test_empty_repo_path_is_unreadable_input_not_the_current_directory(checkout):
    proc = run_script("harness", "--repo", "", "--candidates", "[]", "--", *PINNED)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --repo: is empty")


def test_a_relative_torchrun_is_the_users_path_not_the_checkouts(checkout, tmp_path):
    report = sweep(checkout, "[]", extra=("--torchrun", "bin/torchrun"), cwd=tmp_path)
    assert report["runs"][0]["argv"][0] == str(tmp_path / "bin" / "torchrun")
    assert sweep(checkout, "[]")["runs"][0]["argv"][0] == "torchrun"      # a bare name is looked up on PATH


def test_default_out_is_relative_to_where_the_user_runs_the_tool(checkout, tmp_path):
    proc = run_script("harness", "--repo", checkout, "--json", "--candidates", "[]", "--", *PINNED,
                      cwd=tmp_path)
    assert json.loads(proc.stdout)["runs"][0]["run_dir"] == str(tmp_path / "recompute-runs" / "empty")


def test_launching_into_the_skill_itself_is_refused(checkout):
    proc = run_script("harness", "--repo", checkout, "--launch", "--candidates", "[]", "--", *PINNED,
                      cwd=ROOT)
    assert proc.returncode == 2 and "inside the installed skill" in proc.stderr
    assert not (ROOT / "recompute-runs").exists()


def test_the_control_is_added_to_candidates_unless_no_control(checkout):
    assert [r["name"] for r in sweep(checkout, "moe_act")["runs"]] == ["empty", "moe_act"]
    assert [r["name"] for r in sweep(checkout, "moe_act", extra=("--no-control",))["runs"]] == ["moe_act"]
    assert "'[]'" in refused(checkout, "[]", "moe_act", extra=("--no-control",))


def test_printed_argv_pastes_back_to_the_same_tokens(checkout):
    """Hydra lists and values with [ ] { } $ or spaces are shell-quoted in the text output."""
    text = run_script("harness", "--repo", checkout, "--out", checkout.parent / "runs", "--candidates", "[]",
                      "moe_act", "--", *PINNED, "model.x={a: 1}", "model.y=$HOME").stdout
    report = sweep(checkout, "[]", "moe_act", passthrough=[*PINNED, "model.x={a: 1}", "model.y=$HOME"])
    # each run's command, its backslash continuations joined as the shell joins them
    lines = [ln for ln in text.replace(" \\\n", " ").splitlines() if ln.startswith("cd ")]
    assert len(lines) == 2
    for line, run in zip(lines, report["runs"]):
        assert shlex.split(line.split(" && ", 1)[1])[1:] == run["argv"]
        assert "'model.x={a: 1}'" in line and "'model.y=$HOME'" in line
    assert "'model.recompute_modules=[]'" in lines[0]


def test_candidate_lists_are_bounded_before_they_are_expanded(checkout):
    err = refused(checkout, *[f"block:{n}" for n in range(1, 70)])
    assert "at most 64" in err
    err = refused(checkout, ",".join(["mlp"] * 20_000))     # one argv string stays under 128 KiB
    assert "at most 32 labels" in err and len(err) < 1000


@pytest.mark.parametrize("plan,field", [
    ({"frontier": [{"recompute_granularity": "selective", "recompute_modules": 5}]}, "recompute_modules"),
    ({"frontier": [{"recompute_granularity": "full", "recompute_method": "block",
                    "recompute_num_layers": True}]}, "full recompute needs"),
    ({"frontier": [{"recompute_granularity": "selective", "recompute_modules": ["mlp"], "allowed": False,
                    "rejected_by": 5}]}, "rejected_by"),
    ({"harness_candidates": "[]"}, "harness_candidates"),
    ({"frontier": 7}, "frontier"),
    ({"recommendation": [1]}, "recommendation"),
])
def test_plan_file_fields_of_the_wrong_type_are_unreadable_input(checkout, tmp_path, plan, field):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run_script("harness", "--repo", checkout, "--json", "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["exit"] == 2


@pytest.mark.parametrize("text", ["[" * 20000 + "]" * 20000, '{"frontier": [' + "9" * 5000 + "]}",
                                  "{" * 5000])
def test_hostile_plan_files_are_unreadable_input(checkout, tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    proc = run_script("harness", "--repo", checkout, "--from-plan", path, "--", *PINNED)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --from-plan:")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_a_device_as_plan_file_is_refused_without_reading_it(checkout):
    proc = run_script("harness", "--repo", checkout, "--from-plan", "/dev/zero", "--", *PINNED, timeout=20)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
