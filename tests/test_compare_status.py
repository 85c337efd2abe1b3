"""Run status per the measurement contract, matching, the steady window and exit codes."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import EXAMPLES, ROOT, run_script

FIXTURES = ROOT / "tests" / "fixtures" / "logs"
sys.path.insert(0, str(FIXTURES))

import logformat as lf  # noqa: E402

from mbridge_recompute.errors import InputError  # noqa: E402
from mbridge_recompute.logs import compare, rundir, runlog  # noqa: E402


def summary(name: str, **kw) -> dict:
    return compare.summarize(rundir.parse_file(FIXTURES / name), **kw)


@pytest.mark.parametrize("fixture,status,stage", [
    ("pass.log", "pass", None),
    ("interleaved_torchrun.log", "pass", None),
    ("interleaved_srun.log", "pass", None),
    ("megatron_lm.log", "pass", None),
    ("non_utf8.log", "pass", None),
    ("nan_missing_loss.log", "nan", None),
    ("nan_grad_norm.log", "nan", None),
    ("truncated.log", "incomplete", None),
    ("oom_setup.log", "oom", "setup"),
    ("oom_optimizer_init.log", "oom", "optimizer-state-init"),
    ("oom_first_forward.log", "oom", "first-forward"),
    ("oom_backward.log", "oom", "backward"),
    ("oom_fragmentation.log", "oom", "forward"),
])
def test_status_follows_the_measurement_contract(fixture, status, stage):
    s = summary(fixture)
    assert (s["status"], s["stage"]) == (status, stage)


def test_pass_needs_the_optimizer_initialised():
    lines = [lf.iteration_line(1, 1, 5000.0)]
    s = compare.summarize(runlog.parse_lines(lines))
    assert s["status"] == "incomplete" and not s["optimizer_initialised"]
    s = compare.summarize(runlog.parse_lines([lf.iteration_line(1, 2, 5000.0),
                                              lf.iteration_line(2, 2, 500.0)]))
    assert s["status"] == "pass"


def test_run_cut_short_of_its_window_is_incomplete():
    s = summary("truncated.log")
    assert s["steady_steps"] == 3 and s["min_steady_steps"] == 10      # iterations 11-13 of 11-20


def test_min_steady_steps_can_be_lowered():
    assert summary("truncated.log", min_steady=3)["status"] == "pass"


def test_steady_window_defaults_to_the_second_half_and_can_be_moved():
    s = summary("pass.log")
    assert s["steady_window"] == [11, 20] and s["steady_steps"] == 10
    s = summary("pass.log", steady_from=16)
    assert s["steady_window"] == [16, 20] and s["steady_steps"] == 5
    s = summary("pass.log", fraction=0.7)
    assert s["steady_window"] == [15, 20]


def test_steady_window_excludes_the_warmup_iteration():
    s = summary("pass.log", steady_from=1)
    assert s["step_time_ms"] > summary("pass.log")["step_time_ms"] + 200     # iteration 1 took 5.2 s


def test_log_interval_is_inferred_for_the_expected_steps():
    lines = [lf.iteration_line(it, 20, 400.0) for it in range(5, 21, 5)]
    s = compare.summarize(runlog.parse_lines(lines))
    assert s["min_steady_steps"] == 2 and s["status"] == "pass"          # 15 and 20 of 11-20


def test_skipped_iterations_are_reported():
    lines = [lf.iteration_line(it, 4, 400.0, skipped=1 if it == 3 else 0) for it in range(1, 5)]
    s = compare.summarize(runlog.parse_lines(lines))
    assert s["skipped_iterations"] == 1 and any("skipped" in n for n in s["notes"])


def _copy_sweep(tmp_path, names=("empty", "moe_act")):
    for n in names:
        shutil.copytree(EXAMPLES / "logs" / "moonlight16b" / n, tmp_path / n)
    return [tmp_path / n / "log.txt" for n in names]


def test_different_parallelism_in_the_manifest_is_unmatched(tmp_path):
    paths = _copy_sweep(tmp_path)
    m = json.loads((tmp_path / "moe_act" / "manifest.json").read_text())
    m["argv"][m["argv"].index("-tp") + 1] = "4"
    (tmp_path / "moe_act" / "manifest.json").write_text(json.dumps(m))
    proc = run_script("compare", *paths, "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    row = next(r for r in out["runs"] if r["name"] == "moe_act")
    assert row["matched"] is False
    assert row["reasons"] == ["command lines differ beyond recompute: --tensor_model_parallel_size 4 vs 2 in "
                              "the control"]
    assert out["narrowest"] is None and out["unmatched"] == ["moe_act"]


def test_different_revision_is_unmatched(tmp_path):
    paths = _copy_sweep(tmp_path)
    m = json.loads((tmp_path / "moe_act" / "manifest.json").read_text())
    m["revisions"]["megatron-core"] = "0" * 40
    (tmp_path / "moe_act" / "manifest.json").write_text(json.dumps(m))
    row = next(r for r in json.loads(run_script("compare", *paths, "--json").stdout)["runs"]
               if r["name"] == "moe_act")
    assert row["reasons"] == [f"revision of megatron-core differs: {'0' * 40} vs "
                              "24bad8e677d22625d86ef2a54c9506b6e4992c93 in the control"]


def test_recompute_flags_alone_keep_the_pair_matched():
    a = ["-tp", "2", "--recompute_mod", "moe_act", "-wdj", "a"]
    b = ["--tensor_model_parallel_size", "2", "model.recompute_granularity=selective",
         "model.recompute_modules=[]", "-wdj", "b"]
    assert compare.command_settings({"argv": a}) == compare.command_settings({"argv": b}) == {
        "--tensor_model_parallel_size": ["2"]}


def test_different_batch_or_weights_in_the_logs_is_unmatched():
    base = [lf.iteration_line(it, 4, 400.0, gbs=4) for it in range(1, 5)]
    other = [lf.iteration_line(it, 4, 380.0, gbs=8) for it in range(1, 5)]
    other += lf.theoretical_lines(16.0, 9000.0)
    control = runlog.parse_lines(base + lf.theoretical_lines(16.0, 13812.46), name="empty")
    run = runlog.parse_lines(other, name="x")
    reasons = compare.match(run, control)
    assert any("global batch size" in r for r in reasons)
    assert any("weight+optimizer" in r for r in reasons)


def test_control_defaults_to_the_first_log_without_an_empty_run():
    a = rundir.parse_file(FIXTURES / "pass.log")
    b = rundir.parse_file(FIXTURES / "nan_grad_norm.log")
    assert compare.compare([b, a])["control"] == "nan_grad_norm"
    assert compare.compare([b, a], control_name="pass")["control"] == "pass"


def test_unknown_control_name_is_bad_input():
    proc = run_script("compare", FIXTURES / "pass.log", "--control", "nope")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --control:") and "Traceback" not in proc.stderr


def test_unreadable_log_is_exit_2(tmp_path):
    proc = run_script("compare", tmp_path / "missing.log", "--json")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    assert json.loads(proc.stdout) == {"error": {"field": str(tmp_path / "missing.log"),
                                                 "message": "no such file", "exit": 2}}


def test_same_run_name_twice_is_bad_input():
    with pytest.raises(InputError):
        compare.compare([rundir.parse_file(FIXTURES / "pass.log"), rundir.parse_file(FIXTURES / "pass.log")])


def test_exit_1_when_no_candidate_passes():
    proc = run_script("compare", FIXTURES / "pass.log", FIXTURES / "oom_backward.log",
                      FIXTURES / "nan_missing_loss.log", "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert [r["status"] for r in out["runs"]] == ["pass", "oom", "nan"]
    assert out["narrowest"] is None


def test_control_that_ooms_is_compared_at_the_matched_point():
    """Nemotron 3 Nano capacity sweep: `[]` and moe_act OOM after iteration 1, moe passes."""
    sweep = EXAMPLES / "logs" / "nemotron3nano"
    proc = run_script("compare", sweep / "empty", sweep / "moe_act", sweep / "moe", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {r["name"]: r for r in out["runs"]}
    assert rows["empty"]["status"] == "oom" and rows["moe_act"]["status"] == "oom"
    assert rows["moe_act"]["delta_at"] == 1
    assert round(rows["moe_act"]["delta_peak_gb"], 3) == -4.194          # published: -4.194 GB
    assert round(rows["moe_act"]["delta_peak_pct"], 2) == -6.33          # published: -6.33%
    assert rows["moe"]["status"] == "pass" and rows["moe"]["peak_allocated_gb"] == 64.653
    # six one-decimal values cannot average to exactly 657.42: the fixture is within 0.01 ms
    assert rows["moe"]["step_time_ms"] == pytest.approx(657.42, abs=0.01)
    assert rows["moe"]["steady_window"] == [7, 12]
    assert out["narrowest"] == "moe"


def test_json_has_the_design_keys():
    out = json.loads(run_script("compare", FIXTURES / "pass.log", "--json").stdout)
    assert set(out) >= {"control", "runs"}
    assert set(out["runs"][0]) >= {"name", "status", "peak_allocated_gb", "peak_reserved_gb", "step_time_ms",
                                   "tflops_per_gpu", "delta_peak_pct", "delta_time_pct", "matched"}


def test_bad_option_values_are_exit_2():
    for args in (["--steady-from", "0"], ["--steady-fraction", "1.5"], ["--min-steady-steps", "0"],
                 ["--steady-fraction", "nan"], ["--min-saving-pct", "-1"], ["--min-saving-pct", "nan"],
                 ["--min-saving-pct", "100"]):
        proc = run_script("compare", FIXTURES / "pass.log", *args)
        assert proc.returncode == 2 and proc.stderr.startswith("error: --"), args


def _harness_manifest(name, tokens, env=None, status="ok"):
    argv = ["torchrun", "--nproc_per_node", "8", "scripts/performance/bootstrap.py", "-m", "kimi", "-mr",
            "moonlight_16b", "-ng", "8", "-gb", "4", *tokens, "-wdj", f"recompute_{name}",
            "--save_config_filepath", f"runs/{name}/ConfigContainer.yaml"]
    return {"name": name, "setting": {"recompute_granularity": "selective", "recompute_modules": []},
            "argv": argv, "recompute_tokens": tokens, "env": env or {}, "status": status, "returncode": 0,
            "git": {"megatron_bridge": "600d069b", "megatron_lm": "24bad8e6"}}


def test_harness_manifest_recompute_tokens_and_run_names_keep_the_pair_matched(tmp_path):
    paths = _copy_sweep(tmp_path)
    (tmp_path / "empty" / "manifest.json").write_text(json.dumps(_harness_manifest(
        "empty", ["model.recompute_granularity=selective", "model.recompute_modules=[]"])))
    (tmp_path / "moe_act" / "manifest.json").write_text(json.dumps(_harness_manifest(
        "moe_act", ["--recompute_modules", "moe_act", "model.recompute_method=null"])))
    out = json.loads(run_script("compare", *paths, "--json").stdout)
    assert out["unmatched"] == [] and out["narrowest"] == "moe_act"


def test_allocator_setting_in_one_run_only_is_unmatched(tmp_path):
    paths = _copy_sweep(tmp_path)
    (tmp_path / "empty" / "manifest.json").write_text(json.dumps(_harness_manifest("empty", [])))
    (tmp_path / "moe_act" / "manifest.json").write_text(json.dumps(_harness_manifest(
        "moe_act", [], env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, status="timed-out")))
    proc = run_script("compare", *paths, "--json")
    assert proc.returncode == 1
    row = next(r for r in json.loads(proc.stdout)["runs"] if r["name"] == "moe_act")
    assert row["reasons"] == ["environment PYTORCH_CUDA_ALLOC_CONF differs: expandable_segments:True vs None "
                              "in the control"]
    assert any("timed-out" in n for n in row["notes"])


def test_repeated_iteration_lines_count_once():
    lines = [lf.iteration_line(it, 4, 400.0) for it in range(1, 5)]
    s = compare.summarize(runlog.parse_lines(lines + lines[2:]), min_steady=3)
    assert s["steady_steps"] == 2 and s["status"] == "incomplete"      # iterations 3 and 4, once each


CONFIG_DUMP = """\
model:
  _target_: megatron.bridge.models.deepseek.MoonlightModelProvider16B
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  expert_model_parallel_size: 8
  sequence_parallel: true
  seq_length: {seq}
  bf16: true
  params_dtype:
    _call_: false
    _target_: torch.bfloat16
  recompute_granularity: selective
  recompute_modules: {modules}
train:
  micro_batch_size: 1
  global_batch_size: 4
  train_iters: 20
logger:
  save_config_filepath: runs/{name}/ConfigContainer.yaml
"""


def test_config_dumps_that_differ_only_in_recompute_are_matched(tmp_path):
    paths = _copy_sweep(tmp_path)
    for name, mods in (("empty", "[]"), ("moe_act", "[moe_act]")):
        (tmp_path / name / "ConfigContainer.yaml").write_text(
            CONFIG_DUMP.format(seq=4096, modules=mods, name=name))
    runs = [rundir.parse_file(p) for p in paths]
    assert runs[0].config["model.seq_length"] == 4096            # the python tag is read, not executed
    assert compare.match(runs[1], runs[0]) == []


def test_config_dump_with_another_sequence_length_is_unmatched(tmp_path):
    paths = _copy_sweep(tmp_path)
    (tmp_path / "empty" / "ConfigContainer.yaml").write_text(
        CONFIG_DUMP.format(seq=4096, modules="[]", name="e"))
    (tmp_path / "moe_act" / "ConfigContainer.yaml").write_text(
        CONFIG_DUMP.format(seq=8192, modules="[moe_act]", name="m"))
    proc = run_script("compare", *paths, "--json")
    assert proc.returncode == 1
    row = next(r for r in json.loads(proc.stdout)["runs"] if r["name"] == "moe_act")
    assert row["reasons"] == ["config model.seq_length differs: 8192 vs 4096 in the control"]


def test_logs_with_the_same_file_name_are_named_after_their_directories(tmp_path):
    for d in ("empty", "moe_act"):
        (tmp_path / d).mkdir()
        shutil.copy(FIXTURES / "pass.log", tmp_path / d / "slurm.out")
    logs = (tmp_path / "empty" / "slurm.out", tmp_path / "moe_act" / "slurm.out")
    out = json.loads(run_script("compare", *logs, "--json").stdout)
    assert [r["name"] for r in out["runs"]] == ["empty", "moe_act"] and out["control"] == "empty"


def test_the_nemotron_rows_that_ran_out_in_iteration_1_report_no_peak():
    """Published: `core_attn` (grouped-expert linear) and `layernorm, moe_act` (output projection)
    ran out of memory in iteration 1; `moe, layernorm` completed at 63.639 GB, 677.62 ms."""
    sweep = EXAMPLES / "logs" / "nemotron3nano"
    proc = run_script("compare", *sorted(sweep.iterdir()), "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)["runs"]}
    for name in ("core_attn", "layernorm+moe_act"):
        assert rows[name]["status"] == "oom" and rows[name]["stage"] == "first-forward"
        assert rows[name]["peak_allocated_gb"] is None and rows[name]["last_iteration"] == 0
    assert rows["moe+layernorm"]["status"] == "pass" and rows["moe+layernorm"]["peak_allocated_gb"] == 63.639
    assert rows["moe+layernorm"]["step_time_ms"] == pytest.approx(677.62, abs=0.01)
