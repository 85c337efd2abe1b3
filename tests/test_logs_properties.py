"""Property-based: the parser never crashes, and interleaving ranks never changes what it reads."""

from __future__ import annotations

import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "logs"))

import logformat as lf  # noqa: E402

from mbridge_recompute.logs import (
    compare,  # noqa: E402
    diagnose,
    oom,
    runlog,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# fragments of real lines, so random bytes often land next to something parseable
VOCAB = [b"iteration ", b"/ ", b"| ", b"lm loss: ", b"nan", b"INF", b"grad norm: ", b"[Rank ", b"] (after ",
         b" iterations) memory (GB) | ", b"mem-max-allocated-gigabytes: ", b"memory (MB) | allocated: ",
         b"Step Time : ", b"s GPU utilization: ", b"MODEL_TFLOP/s/GPU",
         b"CUDA out of memory. Tried to allocate ", b" GiB", b" MiB", b"Traceback (most recent call last):\n",
         b'  File "x.py", line 3, in backward\n', b"[default3]:", b"7: ",
         b"Theoretical memory footprints: weight and optimizer=", b" MB", b"\n", b"\r\n",
         b"\xff\xfe", b"\xc3", b"ValueError: ", b"AssertionError", b"[after training is done]", b"1", b"20",
         b"1e400", b"-", b".", b"Of the allocated memory ", b" is reserved by PyTorch but unallocated"]

log_bytes = st.lists(st.one_of(st.sampled_from(VOCAB), st.binary(max_size=40)), max_size=60).map(b"".join)


@FAST
@given(log_bytes)
def test_parser_never_crashes_on_arbitrary_bytes(data):
    run = runlog.parse_text(data.decode("utf-8", errors="replace"), name="fuzz")
    # and everything built on it stays total too, and its reports are strict JSON
    json.dumps(compare.compare([run]), allow_nan=False)
    json.dumps(diagnose.diagnose(run), allow_nan=False, default=str)


@FAST
@given(st.lists(st.sampled_from(["1.2.3", "1e400", "nan", "-", "99999999999999999999", "0", "7"]),
                min_size=12, max_size=12))
def test_malformed_numbers_in_every_field_do_not_crash(nums):
    a = iter(nums)
    lines = [f"Theoretical memory footprints: weight and optimizer={next(a)} MB, "
             f"activation={next(a)} MB, total=1 MB",
             f"Total number of parameters in billions: {next(a)}",
             f"[Rank 0] (after 2 iterations) memory (GB) | mem-max-allocated-gigabytes: {next(a)} | "
             f"mem-max-reserved-gigabytes: {next(a)}",
             f"[Rank 1] (after 2 iterations) memory (MB) | allocated: {next(a)} | max allocated: {next(a)} | "
             f"reserved: 1 | max reserved: 2",
             f"Step Time : {next(a)}s GPU utilization: {next(a)}MODEL_TFLOP/s/GPU",
             f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {next(a)} GiB. GPU 0 has a "
             f"total capacity of {next(a)} GiB of which 1 GiB is free. Of the allocated memory {next(a)} "
             "GiB is allocated by PyTorch, and 1 GiB is reserved by PyTorch but unallocated.",
             lf.iteration_line(2, 2, 400.0)]
    run = runlog.parse_lines(lines)
    json.dumps(compare.compare([run]), allow_nan=False)
    json.dumps(diagnose.diagnose(run), allow_nan=False)


@FAST
@given(st.binary(max_size=2000))
def test_parser_never_crashes_on_raw_binary(data):
    runlog.parse_text(data.decode("utf-8", errors="replace"))


def _rank_streams():
    """Each rank's lines, in that rank's own order (what one process prints)."""
    last = [lf.step_time_line(0.46, 77.5)]  # rank 0
    rank7 = []
    for it in range(1, 9):
        rank7.append(lf.iteration_line(it, 8, 450.0 + it, loss=11.0 - 0.1 * it))
    rank0 = last + [lf.memory_line(0, 1, 20.0, 30.0, 33.0, 34.0),
                    lf.memory_line(0, 2, 21.0, 31.5, 33.5, 35.0)]
    rank0 += [lf.step_time_line(0.45, 77.0 + i / 10) for i in range(7)]
    rank2 = [lf.memory_line(2, 1, 20.5, 30.9, 33.0, 34.2), lf.memory_line(2, 2, 21.5, 32.25, 34.0, 35.5)]
    return {0: rank0, 2: rank2, 7: rank7}


@st.composite
def interleavings(draw):
    streams = {r: list(lines) for r, lines in _rank_streams().items()}
    style = draw(st.sampled_from(["torchrun", "srun", "none"]))
    out = []
    while any(streams.values()):
        r = draw(st.sampled_from(sorted(r for r, s in streams.items() if s)))
        line = streams[r].pop(0)
        out.append({"torchrun": f"[default{r}]:", "srun": f"{r}: ", "none": ""}[style] + line)
    return out


@FAST
@given(interleavings())
def test_interleaving_ranks_does_not_change_the_run(lines):
    run = runlog.parse_lines(lines)
    assert [it.iteration for it in run.iterations] == list(range(1, 9))
    assert [it.time_ms for it in run.iterations] == [450.0 + it for it in range(1, 9)]
    assert run.per_rank_peaks() == {0: (2, 31.5, 35.0), 2: (2, 32.25, 35.5)}
    assert run.peak()[:2] == (2, 32.25)
    assert len(run.step_times) == 8 and run.optimizer_initialised
    assert run.non_finite == []


@FAST
@given(st.integers(min_value=1, max_value=400), st.floats(min_value=0.01, max_value=5000, allow_nan=False))
def test_iteration_line_round_trips(it, ms):
    line = lf.iteration_line(it, 400, ms, loss=9.75, grad_norm=1.5)
    parsed = runlog.parse_iteration(line)
    assert parsed.iteration == it and parsed.time_ms == float(f"{ms:.1f}") and parsed.finite


@FAST
@given(st.integers(min_value=0, max_value=2**41), st.sampled_from([0, 1, 7]))
def test_oom_sizes_round_trip_through_the_pytorch_format(nbytes, gpu):
    msg = lf.oom_message(nbytes, 80 * lf.GIB, nbytes // 3, 70 * lf.GIB, nbytes // 2, gpu=gpu)
    ev = oom.parse_oom(msg)
    assert ev.gpu == gpu
    # format_size keeps two decimals of the chosen unit
    assert abs(ev.requested - nbytes) <= max(0.005 * 2**30, 0.005 * nbytes) or nbytes <= 1024


@st.composite
def interleaved_tracebacks(draw):
    def msg(gpu, alloc):
        return lf.oom_message(lf.GIB, 80 * lf.GIB, 0.2 * lf.GIB, alloc * lf.GIB, 0.1 * lf.GIB, gpu=gpu)

    streams = {3: lf.traceback(lf.BACKWARD, msg(3, 70)), 5: lf.traceback(lf.FORWARD, msg(5, 71)),
               7: [lf.iteration_line(1, 20, 4000.0)]}
    style = draw(st.sampled_from(["[default{}]:", "[rank{}]: ", "{}: "]))
    first = [style.format(7) + streams.pop(7)[0]]          # iteration 1 was logged before either OOM
    out = []
    while any(streams.values()):
        r = draw(st.sampled_from(sorted(r for r, s in streams.items() if s)))
        out.append(style.format(r) + streams[r].pop(0))
    return first + out


@FAST
@given(interleaved_tracebacks())
def test_interleaved_tracebacks_keep_each_ranks_stage(lines):
    run = runlog.parse_lines(lines)
    assert {o.rank: o.stage for o in run.ooms} == {3: "backward", 5: "forward"}
    assert {o.rank: o.iteration for o in run.ooms} == {3: 2, 5: 2}
