"""diagnose: which kind of memory failed -- allocator, static/optimizer state, or activations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, SCRIPTS, run_script

FIXTURES = ROOT / "tests" / "fixtures" / "logs"
sys.path.insert(0, str(FIXTURES))

import logformat as lf  # noqa: E402

from mbridge_recompute.logs import diagnose, rundir, runlog  # noqa: E402

GIB = lf.GIB
CAP = 79.11 * GIB


def findings(name: str) -> list:
    return diagnose.diagnose(rundir.parse_file(FIXTURES / name))["findings"]


def kinds(fs: list) -> list:
    return [f["kind"] for f in fs]


def test_fragmentation_is_diagnosed_before_recompute():
    fs = findings("oom_fragmentation.log")
    assert kinds(fs) == ["fragmentation", "activations"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in fs[0]["next_action"]
    assert "before adding any recompute" in fs[0]["next_action"]
    assert "5.60 GiB >= the 2.00 GiB request" in fs[0]["evidence"]


def test_reserved_far_above_allocated_in_the_memory_report_is_fragmentation():
    lines = [lf.iteration_line(1, 20, 3000.0), lf.memory_line(0, 1, 40.0, 60.0, 70.0, 72.0)]
    lines += lf.traceback(lf.FORWARD, lf.oom_message(1 * GIB, CAP, 0.5 * GIB, 75.0 * GIB, 0.2 * GIB))
    fs = diagnose.diagnose(runlog.parse_lines(lines))["findings"]
    assert fs[0]["kind"] == "fragmentation"
    assert "max reserved 72.000 GB vs max allocated 60.000 GB" in fs[0]["evidence"]


def test_small_cache_slack_is_not_fragmentation():
    fs = findings("oom_backward.log")     # 0.25 GiB unallocated vs a 1.5 GiB request
    assert kinds(fs) == ["activations"]


def test_backward_oom_is_activation_pressure_and_points_to_plan():
    f = findings("oom_backward.log")[0]
    assert f["stage"] == "backward" and f["iteration"] == 3
    assert "plan.py" in f["next_action"]
    assert "97% of capacity" in f["evidence"]


def test_first_forward_oom_is_activation_pressure():
    f = findings("oom_first_forward.log")[0]
    assert (f["kind"], f["stage"]) == ("activations", "first-forward")


def test_optimizer_state_init_oom_says_recompute_will_not_help():
    f = findings("oom_optimizer_init.log")[0]
    assert (f["kind"], f["stage"]) == ("static", "optimizer-state-init")
    assert f["next_action"].startswith("recompute will not help")
    for remedy in ("use_distributed_optimizer", "data parallelism", "PP/EP", "use_precision_aware_optimizer"):
        assert remedy in f["next_action"]


def test_oom_while_building_the_model_is_static():
    f = findings("oom_setup.log")[0]
    assert (f["kind"], f["stage"]) == ("static", "setup")


def test_oom_after_iteration_1_without_a_traceback_is_activations():
    f = findings("oom_iteration5.log")[0]
    assert (f["kind"], f["iteration"]) == ("activations", 5)
    assert "stage unknown" in f["evidence"]


def test_oom_before_any_iteration_without_a_traceback_is_unknown():
    rep = diagnose.diagnose(runlog.parse_lines([lf.oom_message(2 * GIB, CAP, GIB, 70 * GIB, 0.1 * GIB)]))
    assert kinds(rep["findings"]) == ["unknown"] and not rep["explained"]


def test_memory_outside_pytorch_is_reported():
    msg = lf.oom_message(2 * GIB, CAP, 0.3 * GIB, 60.0 * GIB, 0.2 * GIB, in_use=78.0 * GIB)
    other = "Process 999 has 9.00 GiB memory in use. Including non-PyTorch"
    msg = msg.replace("Including non-PyTorch", other)
    lines = [lf.iteration_line(1, 20, 3000.0)] + lf.traceback(lf.FORWARD, msg)
    rep = diagnose.diagnose(runlog.parse_lines(lines))
    ev = rep["findings"][0]["evidence"]
    assert "17.80 GiB of this process is outside PyTorch" in ev
    assert "other processes hold 9.00 GiB" in ev


def test_every_rank_ooming_gives_one_finding_per_kind():
    lines = [lf.iteration_line(1, 20, 3000.0)]
    for r in range(8):
        lines += [f"[default{r}]:{ln}" for ln in lf.traceback(
            lf.BACKWARD, lf.oom_message(GIB, CAP, 0.2 * GIB, (76.0 + r / 10) * GIB, 0.1 * GIB, gpu=r))]
    fs = diagnose.diagnose(runlog.parse_lines(lines))["findings"]
    assert kinds(fs) == ["activations"]
    assert fs[0]["oom"]["rank"] == 7                      # the most loaded rank is the evidence
    assert "and 7 more OOM event(s)" in fs[0]["evidence"]


def test_cli_json_has_the_design_keys_and_exit_0():
    proc = run_script("diagnose", FIXTURES / "oom_fragmentation.log", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for f in out["findings"]:
        assert {"kind", "evidence", "next_action"} <= set(f)
    assert out["findings"][0]["oom"]["reserved_unallocated_gib"] == 5.6


def test_cli_reads_stdin_with_dash():
    text = (FIXTURES / "oom_optimizer_init.log").read_bytes()
    proc = subprocess.run([sys.executable, str(SCRIPTS / "diagnose.py"), "-", "--json"], input=text,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["findings"][0]["kind"] == "static"


def test_cli_message_alone_is_classified():
    msg = lf.oom_message(2 * GIB, CAP, GIB, 60 * GIB, 6 * GIB)
    out = json.loads(run_script("diagnose", "--message", msg, "--json").stdout)
    assert out["findings"][0]["kind"] == "fragmentation"


def test_clean_run_is_nothing_recognisable_exit_1():
    proc = run_script("diagnose", FIXTURES / "pass.log", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["findings"] == []


def test_no_input_or_missing_file_is_exit_2(tmp_path):
    proc = run_script("diagnose")
    assert proc.returncode == 2 and proc.stderr.startswith("error: LOG:")
    proc = run_script("diagnose", tmp_path / "nope.log", "--json")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    # --json: the one error object on stdout too
    assert json.loads(proc.stdout)["error"]["exit"] == 2


def test_guide_examples_are_diagnosed_as_their_names_say():
    from conftest import EXAMPLES

    expected = {"fragmentation": "fragmentation", "optimizer_state_init": "static", "backward": "activations"}
    for name, kind in expected.items():
        proc = run_script("diagnose", EXAMPLES / "logs" / "oom" / f"{name}.log", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["findings"][0]["kind"] == kind, name


# Real PyTorch output: captured on an H200 with torch 2.11.0+cu130 by tests/fixtures/logs/gpu_oom_probe.py


def test_real_torch_oom_text_is_parsed_completely():
    run = rundir.parse_file(FIXTURES / "real_oom_fragmentation.log")
    (oom,) = run.ooms
    assert oom.requested == 1024 * 2**20
    assert oom.capacity == 139.80 * GIB and oom.allowed == 4 * GIB
    assert oom.free == 135.97 * GIB and oom.process_in_use == 3.83 * GIB
    assert oom.allocated == 1.64 * GIB and oom.reserved_unallocated == 1.68 * GIB


def test_real_split_segments_are_diagnosed_as_fragmentation():
    fs = findings("real_oom_fragmentation.log")
    assert kinds(fs) == ["fragmentation"]


def test_real_forward_oom_is_activations_near_its_cap():
    f = findings("real_oom_forward.log")[0]
    assert (f["kind"], f["stage"]) == ("activations", "first-forward")
    assert "99% of its cap" in f["evidence"]


def test_real_backward_oom_is_read_from_the_autograd_frames():
    f = findings("real_oom_backward.log")[0]
    assert (f["kind"], f["stage"]) == ("activations", "backward")
    assert "exceeds all the memory this process may use" in f["evidence"]


def test_a_harness_run_directory_is_read_through_its_log_txt():
    from conftest import EXAMPLES

    proc = run_script("diagnose", EXAMPLES / "logs" / "nemotron3nano" / "moe_act", "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["findings"][0]
    assert (f["kind"], f["stage"], f["iteration"]) == ("activations", "forward", 2)


def test_a_directory_without_log_txt_is_bad_input_to_diagnose_and_compare(tmp_path):
    for tool in ("diagnose", "compare"):
        proc = run_script(tool, tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", tool
        assert proc.stderr == f"error: {tmp_path}: is a directory without log.txt\n", tool


def test_oom_in_a_later_optimizer_step_is_static():
    lines = [lf.iteration_line(it, 20, 500.0) for it in (1, 2, 3)]
    lines += lf.traceback(lf.OPTIMIZER_STEP, lf.oom_message(GIB, CAP, 0.3 * GIB, 77 * GIB, 0.2 * GIB))
    f = diagnose.diagnose(runlog.parse_lines(lines))["findings"][0]
    assert (f["kind"], f["stage"], f["iteration"]) == ("static", "optimizer-step", 4)


# ---------------------------------------------------------------- only what the text says

PASTED = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
          "capacity of 79.11 GiB of which 1.20 GiB is free. Of the allocated memory 76.10 GiB is allocated "
          "by PyTorch, and 317.44 MiB is reserved by PyTorch but unallocated.")


def test_a_pasted_oom_message_states_no_iteration_and_no_rank():
    proc = run_script("diagnose", "--message", PASTED, "--json")
    f = json.loads(proc.stdout)["findings"][0]
    assert f["iteration"] is None and f["oom"]["rank"] is None
    assert "iteration 1" not in f["evidence"] and "rank" not in f["evidence"]
    assert "before any logged iteration" in f["evidence"]


def test_numbers_that_rule_fragmentation_out_say_so_and_point_to_plan():
    """0.31 GiB reserved-but-unallocated cannot hold a 2 GiB request however the blocks lie."""
    f = json.loads(run_script("diagnose", "--message", PASTED, "--json").stdout)["findings"][0]
    assert f["kind"] == "unknown"
    assert "not fragmentation: only 0.31 GiB is reserved but unallocated, less than the 2.00 GiB request" \
        in f["evidence"]
    assert "plan.py" in f["next_action"] and "static/activation split" in f["next_action"]


def test_ansi_colour_codes_neither_hide_the_stage_nor_reach_the_terminal(tmp_path):
    red, reset = "\x1b[31m", "\x1b[0m"
    lines = [lf.iteration_line(1, 20, 3000.0)] + [
        f"{red}{ln}{reset}" for ln in lf.traceback(lf.BACKWARD, lf.oom_message(GIB, CAP, 0.2 * GIB, 76 * GIB,
                                                                               0.1 * GIB))]
    log = tmp_path / "colour.log"
    log.write_text("\n".join(lines) + "\n")
    f = json.loads(run_script("diagnose", log, "--json").stdout)["findings"][0]
    assert (f["kind"], f["stage"], f["iteration"]) == ("activations", "backward", 2)
    text = run_script("diagnose", log).stdout
    assert "\x1b" not in text and "backward" in text
    # a control sequence that survives in a message is shown as text, never sent to the terminal
    text = run_script("diagnose", "--message", PASTED + " \x1b]0;pwned\x07 \x1b[2J").stdout
    assert "\x1b" not in text and "\x07" not in text


@pytest.mark.parametrize("encode", [
    lambda t: t.encode("utf-16"),                      # PowerShell's `>` (with a BOM)
    lambda t: t.encode("utf-16-le"),                   # ... without one
    lambda t: t.replace("\n", "\r").encode(),          # CR-only line ends
    lambda t: t.replace("\n", "\r\n").encode("utf-8-sig"),
])
def test_utf16_and_cr_only_logs_parse(tmp_path, encode):
    log = tmp_path / "odd.log"
    log.write_bytes(encode((FIXTURES / "oom_backward.log").read_text()))
    proc = run_script("diagnose", log, "--json")
    f = json.loads(proc.stdout)["findings"][0]
    assert proc.returncode == 0 and (f["kind"], f["stage"], f["iteration"]) == ("activations", "backward", 3)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_read_as_a_log(target):
    proc = run_script("diagnose", target, "--json", timeout=20)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
    assert json.loads(proc.stdout)["error"]["exit"] == 2


def test_an_empty_log_or_empty_stdin_is_unreadable_input(tmp_path):
    (tmp_path / "empty.log").write_text("")
    proc = run_script("diagnose", tmp_path / "empty.log")
    assert proc.returncode == 2 and proc.stderr.endswith("is empty\n")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "diagnose.py"), "-"], input="", capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr == "error: stdin: is empty\n"
