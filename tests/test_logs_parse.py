"""Parsing Bridge and Megatron-LM logs into `Run` records (fixtures from the upstream print formats)."""

from __future__ import annotations

import math
import sys

import pytest

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "logs"
sys.path.insert(0, str(FIXTURES))

import logformat as lf  # noqa: E402

from mbridge_recompute.errors import InputError  # noqa: E402
from mbridge_recompute.logs import oom, rundir, runlog  # noqa: E402


def parse(name: str) -> runlog.RunLog:
    return rundir.parse_file(FIXTURES / name)


def test_iteration_line_fields_are_read():
    line = lf.iteration_line(11, 20, 457.2, gbs=4, loss=10.49281, grad_norm=12.345, skipped=1, nan=0)
    it = runlog.parse_iteration(line)
    assert (it.iteration, it.total, it.time_ms, it.global_batch_size) == (11, 20, 457.2, 4)
    assert it.loss == pytest.approx(10.49281)
    assert it.grad_norm == pytest.approx(12.345)
    assert (it.skipped, it.nan_iterations, it.complete) == (1, 0, True)


def test_missing_lm_loss_means_non_finite():
    # Bridge prints a loss key only when its average is >= 0 (train_utils.py:1120-1125): NaN drops it
    line = lf.iteration_line(13, 20, 457.2, loss=None)
    assert "lm loss" not in line
    it = runlog.parse_iteration(line)
    assert it.loss is None and not it.finite
    run = parse("nan_missing_loss.log")
    assert run.non_finite == [13]


def test_grad_norm_inf_or_nan_is_non_finite():
    assert parse("nan_grad_norm.log").non_finite == [15]
    assert not runlog.parse_iteration(lf.iteration_line(3, 20, 400.0, grad_norm=math.nan)).finite


def test_inf_loss_is_read_as_inf():
    line = lf.iteration_line(3, 20, 400.0, loss=math.inf)
    assert "lm loss: INF" in line
    assert runlog.parse_iteration(line).loss == math.inf


def test_nan_iteration_counter_is_read():
    it = runlog.parse_iteration(lf.iteration_line(4, 20, 400.0, nan=2))
    assert it.nan_iterations == 2 and not it.finite


def test_step_time_line_is_read_and_paired_with_its_iteration():
    run = parse("pass.log")
    assert len(run.step_times) == 20
    paired = dict((k, st) for k, st in run.step_time_at())
    assert paired[11].tflops == pytest.approx(77.5, abs=0.5)
    assert paired[1].seconds == pytest.approx(5.21)


def test_bridge_memory_report_is_decimal_gb():
    rep = runlog.parse_memory(lf.memory_line(3, 2, 25.0, 36.618, 38.0, 40.124))
    assert (rep.rank, rep.after, rep.max_allocated_gb, rep.max_reserved_gb) == (3, 2, 36.618, 40.124)
    assert rep.source == "bridge"


def test_megatron_lm_memory_report_mib_becomes_decimal_gb():
    rep = runlog.parse_memory(lf.mlm_memory_line(0, 2, 24000.0, 35000.0, 36000.0, 38002.0))
    assert rep.source == "mlm"
    assert rep.max_allocated_gb == pytest.approx(35000.0 * 2**20 / 1e9)
    assert rep.max_reserved_gb == pytest.approx(38002.0 * 2**20 / 1e9)


def test_megatron_lm_log_parses_into_a_run():
    run = parse("megatron_lm.log")
    assert run.format == "mlm"
    assert run.last_iteration == 20 and run.completed
    assert run.iterations[5].tflops == 77.5           # iteration-line throughput (log_throughput)
    hot, alloc, _ = run.peak()
    assert hot == 0 and alloc == pytest.approx(35000.0 * 2**20 / 1e9)


def test_peak_is_max_over_ranks_after_iteration_2():
    run = parse("interleaved_torchrun.log")
    peaks = run.per_rank_peaks()
    assert set(peaks) == {0, 2}
    assert peaks[0][0] == 2 and peaks[2][0] == 2
    hot, alloc, _ = run.peak()
    assert hot == 2 and alloc == 37.052                   # the hotter rank, not rank 0
    _, alloc1, _ = run.peak(at=1)
    assert alloc1 == pytest.approx(37.052 - 2.71)        # the iteration-1 point is kept apart


def test_interleaved_prefixed_ranks_parse_like_the_plain_log():
    plain = parse("pass.log")
    for name in ("interleaved_torchrun.log", "interleaved_srun.log"):
        run = parse(name)
        assert [it.iteration for it in run.iterations] == list(range(1, 21))
        assert [it.time_ms for it in run.iterations] == [it.time_ms for it in plain.iterations]
        assert run.completed and len(run.step_times) == 20


def test_prefix_is_split_and_rank_kept():
    assert runlog.split_prefix("[default3]:[rank3]: ValueError: x")[1:] == (3, "ValueError: x")
    assert runlog.split_prefix("[default3]:  File \"a.py\", line 1, in f")[2] == '  File "a.py", line 1, in f'
    assert runlog.split_prefix("12: [Rank 12] (after 1 iterations)")[1] == 12
    assert runlog.split_prefix("[1,5]<stdout>:hello")[1:] == (5, "hello")
    assert runlog.split_prefix(" [2026-08-12 10:11:12] iteration 1/ 2 |")[0] == ""


def test_truncated_line_is_incomplete_not_non_finite():
    run = parse("truncated.log")
    assert run.truncated
    last = run.iterations[-1]
    assert last.iteration == 14 and not last.complete and last.loss is None
    assert run.non_finite == []          # a cut line is not evidence of NaN
    assert last.time_ms is not None      # what was printed before the cut is kept


def test_non_utf8_bytes_are_replaced_not_fatal():
    run = parse("non_utf8.log")
    assert run.replaced_bytes >= 3
    assert run.last_iteration == 20 and run.completed
    assert run.peak()[1] == 36.618


def test_theoretical_lines_are_mib_and_read():
    run = parse("pass.log")
    assert run.theoretical[0].weight_optimizer_mib == 13812.46
    assert run.theoretical[0].activation_mib == 9216.0
    assert run.params_billions == 15.96
    short = runlog.THEO.search("Theoretical memory footprints: weight and optimizer=21044.80 MB")
    assert short.group(1) == "21044.80" and short.group(2) is None


def test_optimizer_initialised_needs_iteration_2():
    assert parse("pass.log").optimizer_initialised
    run = runlog.parse_lines([lf.iteration_line(1, 20, 5000.0), lf.memory_line(0, 1, 20.0, 30.0, 31.0, 32.0)])
    assert not run.optimizer_initialised
    run = runlog.parse_lines([lf.memory_line(0, 2, 20.0, 30.0, 31.0, 32.0)])
    assert run.optimizer_initialised


def test_oom_numbers_are_parsed_in_bytes():
    msg = lf.oom_message(2 * lf.GIB, 79.11 * lf.GIB, 1.1 * lf.GIB, 71.4 * lf.GIB, 5.6 * lf.GIB, gpu=3)
    ev = oom.parse_oom(msg)
    assert ev.gpu == 3
    assert ev.requested == 2 * 2**30
    assert ev.capacity == pytest.approx(79.11 * 2**30)
    assert ev.free == pytest.approx(1.1 * 2**30)
    assert ev.allocated == pytest.approx(71.4 * 2**30)
    assert ev.reserved_unallocated == pytest.approx(5.6 * 2**30)
    assert ev.process_in_use == pytest.approx(77.6 * 2**30, rel=1e-3)


def test_oom_units_mib_and_bytes_and_legacy_wording():
    ev = oom.parse_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has "
                        "a total capacity of 8.00 GiB of which 0 bytes is free. Of the allocated memory "
                        "7.51 GiB is allocated by PyTorch, and 15.90 MiB is reserved by PyTorch but "
                        "unallocated.")
    assert ev.requested == 20 * 2**20 and ev.free == 0
    assert ev.reserved_unallocated == pytest.approx(15.9 * 2**20)
    old = oom.parse_oom("RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB "
                        "total capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved "
                        "in total by PyTorch)")
    assert old.capacity == pytest.approx(7.93 * 2**30)
    assert old.reserved_unallocated == pytest.approx((188.0 - 130.35) * 2**20)
    other = oom.parse_oom(lf.oom_message(2**30, 80 * 2**30, 2**28, 60 * 2**30, 2**28).replace(
        "Including non-PyTorch", "Process 4242 has 9.50 GiB memory in use. Including non-PyTorch"))
    assert other.other_processes == pytest.approx(9.5 * 2**30)


def test_source_line_mentioning_oom_is_not_an_oom():
    assert oom.parse_oom("    except torch.cuda.OutOfMemoryError:") is None
    assert oom.parse_oom("torch.OutOfMemoryError: CUDA out of memory.") is not None


@pytest.mark.parametrize("fixture,stage,iteration", [
    # no iteration logged before the OOM: the log does not say which one it was
    ("oom_setup.log", "setup", None),
    ("oom_optimizer_init.log", "optimizer-state-init", None),
    ("oom_first_forward.log", "first-forward", None),
    ("oom_backward.log", "backward", 3),
    ("oom_iteration5.log", "unknown", 5),
    ("oom_fragmentation.log", "forward", 2),
])
def test_oom_stage_is_read_from_its_traceback_and_the_preceding_iterations(fixture, stage, iteration):
    run = parse(fixture)
    assert len(run.ooms) == 1
    assert (run.ooms[0].stage, run.ooms[0].iteration) == (stage, iteration)


def test_same_oom_printed_twice_is_one_event():
    msg = lf.oom_message(2**30, 80 * 2**30, 2**28, 70 * 2**30, 2**28)
    lines = lf.traceback(lf.FORWARD, msg)
    run = runlog.parse_lines([msg] + [f"[default1]:{ln}" for ln in lines])
    assert len(run.ooms) == 1
    assert run.ooms[0].frames and run.ooms[0].rank == 1      # the copy with the traceback is kept


def test_tracebacks_of_interleaved_ranks_do_not_mix():
    fwd = lf.traceback(lf.FORWARD, lf.oom_message(2**30, 80 * 2**30, 2**28, 70 * 2**30, 2**28, gpu=0))
    bwd = lf.traceback(lf.BACKWARD, lf.oom_message(2**31, 80 * 2**30, 2**28, 71 * 2**30, 2**28, gpu=1))
    lines = []
    for a, b in zip(fwd + [""] * (len(bwd) - len(fwd)), bwd):
        lines += [f"[default0]:{a}", f"[default1]:{b}"]
    run = runlog.parse_lines([lf.iteration_line(1, 20, 4000.0)] + lines)
    stages = {o.gpu: o.stage for o in run.ooms}
    assert stages == {0: "forward", 1: "backward"}


def test_pytorch_rank_prefixed_traceback_is_read():
    # torch.distributed.run prints each rank's traceback as `[rankN]: <line>`
    msg = lf.oom_message(2**30, 80 * 2**30, 2**28, 70 * 2**30, 2**28)
    lines = [f"[rank5]: {ln}" for ln in lf.traceback(lf.BACKWARD, msg)]
    lines += [f"[rank5]: {ln}" for ln in lf.traceback(lf.FORWARD[:2], "ValueError: boom")]
    run = runlog.parse_lines([lf.iteration_line(1, 20, 4000.0)] + lines)
    assert run.ooms[0].stage == "backward" and run.ooms[0].rank == 5
    assert run.errors[-1].exc_type == "ValueError" and run.errors[-1].frames


def test_completion_marker_sets_completed():
    assert parse("pass.log").completed
    assert not parse("truncated.log").completed


def test_run_is_named_after_the_stem_or_the_manifest():
    assert parse("pass.log").name == "pass"
    run = rundir.parse_file(ROOT / "examples" / "logs" / "moonlight16b" / "moe_act" / "log.txt")
    assert run.name == "moe_act" and run.setting == "moe_act"
    assert run.manifest["revisions"]["megatron-core"].startswith("24bad8e6")
    empty = rundir.parse_file(ROOT / "examples" / "logs" / "moonlight16b" / "empty" / "log.txt")
    assert empty.setting == "[]"


def test_log_txt_without_manifest_is_named_after_its_directory(tmp_path):
    d = tmp_path / "block4"
    d.mkdir()
    (d / "log.txt").write_text(lf.iteration_line(1, 2, 100.0) + "\n")
    assert rundir.parse_file(d / "log.txt").name == "block4"


def test_unreadable_log_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as exc:
        rundir.parse_file(tmp_path / "missing.log")
    assert "no such file" in str(exc.value)
    with pytest.raises(InputError):
        rundir.parse_file(tmp_path)


def test_broken_manifest_is_an_input_error(tmp_path):
    (tmp_path / "log.txt").write_text("x\n")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError) as exc:
        rundir.parse_file(tmp_path / "log.txt")
    assert exc.value.field.endswith("manifest.json")


def test_logs_module_does_not_import_torch():
    import subprocess

    code = ("import sys; sys.path.insert(0, %r); import mbridge_recompute.logs.runlog, "
            "mbridge_recompute.logs.compare, mbridge_recompute.logs.diagnose; "
            "print('torch' in sys.modules or 'megatron' in sys.modules)"
            % str(ROOT / "scripts"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_source_lines_inside_a_traceback_are_not_events():
    frames = [("/x/train.py", 10, "train_step", "except (torch.cuda.OutOfMemoryError,"),
              ("/x/train.py", 11, "train_step", "    ValueError: this is code, not an exception")]
    run = runlog.parse_lines(lf.traceback(frames, "RuntimeError: boom"))
    assert run.ooms == []
    assert [(e.exc_type, e.message) for e in run.errors] == [("RuntimeError", "boom")]
    assert [f.func for f in run.errors[0].frames] == ["train_step", "train_step"]


def test_line_numbers_count_newlines_only():
    run = runlog.parse_text("a\x0cb\u2028c\n" + lf.iteration_line(1, 2, 10.0) + "\n")
    assert run.iterations[0].line == 2
