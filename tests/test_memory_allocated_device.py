"""Like-for-like peaks: each rank's allocated peak (what torch.cuda.max_memory_allocated and
Bridge's mem-max-allocated-gigabytes report) and device peak (what the budget is held against),
and the terms that separate them: the residual, the flex dispatcher's buffers outside PyTorch,
CUDA-graph pools, and the optimizer step's fp32 gradient copies that floor both."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from test_memory_properties import workloads

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import estimate, first_iteration_peak_bytes, moments
from mbridge_recompute.memory.dispatcher import flex_buffer_bytes
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.types import DEFAULT_KNOBS
from mbridge_recompute.units import GB

from conftest import EXAMPLES, ROOT

MEASURED = ROOT / "benchmarks" / "data" / "measured"


def _llama(**kw):
    return load_workload(str(EXAMPLES / "llama3_70b_fp8.yaml")).replace(**kw)


def test_device_peak_is_the_allocated_peak_plus_what_pytorch_does_not_count():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    for r in estimate(w).ranks:
        assert r.device_peak_bytes == r.peak_bytes
        assert r.peak_bytes - r.allocated_peak_bytes == r.static["residual"]
        assert r.as_dict()["allocated_peak_bytes"] == r.allocated_peak_bytes
        assert r.as_dict()["device_peak_bytes"] == r.peak_bytes


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_allocated_peak_is_positive_and_never_above_the_device_peak(w):
    for r in estimate(w).ranks:
        assert 0 < r.first_iteration_allocated_bytes <= r.allocated_peak_bytes <= r.peak_bytes
        static_allocated = r.static_bytes - r.outside_allocator_bytes - r.static["cuda_graph_buffers"]
        assert r.allocated_peak_bytes > static_allocated
        assert first_iteration_peak_bytes(w, r) <= r.peak_bytes


def test_16bit_gradient_buffers_make_the_optimizer_step_copy_every_gradient_shard_to_fp32():
    """grad_reduce_in_fp32 false (the Llama3 70B SFT perf config): the step's fp32 copies are
    4 bytes per locally optimised parameter (distrib_optimizer.py:2419 @ core_v0.16.1)."""
    w = _llama(recompute_modules=["mlp"])
    r = estimate(w).ranks[0]
    assert r.step_bytes == pytest.approx(4 * r.params / w.data_parallel_size, rel=1e-6)
    # with mlp recomputed the step, not the forward/backward, sets the peak of pp_rank 0
    assert r.peak_term == moments.STEP
    assert r.peak_bytes == r.static_bytes + r.step_bytes
    assert r.allocated_moment == moments.STEP


def test_fp32_gradient_buffers_need_no_step_copies():
    w = _llama(grad_reduce_in_fp32=True)
    assert all(r.step_bytes == 0 for r in estimate(w).ranks)


def test_first_iteration_has_no_adam_moments_but_does_have_the_step():
    w = _llama(recompute_modules=["core_attn"])
    r = estimate(w).ranks[0]
    it1 = r.allocated_moments[moments.IT1]
    assert it1 == r.allocated_moments[moments.STEADY] - r.lazy_bytes
    assert r.first_iteration_allocated_bytes == max(it1, r.allocated_moments[moments.STEP])


def test_flex_dispatcher_buffers_count_against_the_device_not_the_allocated_peak():
    w = load_workload(str(MEASURED / "dsv3_proxy_hybridep_tp2pp4ep16_h100.yaml"))
    sh = shape_of(w, DEFAULT_KNOBS)
    flex = flex_buffer_bytes(w, sh)
    # HybridEP sizes its token buffer for every token of the 16 ranks on one rank:
    # 2048 tokens x 16 ranks x 7168 x 2 bytes, twice across two NVLink domains
    assert flex == pytest.approx(2 * 2048 * 16 * (2 * 7168 + 4 * 4 * 8 + 4 * 7168 / 128))
    alltoall = w.replace(moe_token_dispatcher_type="alltoall")
    for a, b in zip(estimate(w).ranks, estimate(alltoall).ranks):
        assert a.static["flex_buffers"] == round(flex) and b.static["flex_buffers"] == 0
        assert a.allocated_peak_bytes == b.allocated_peak_bytes
        assert a.peak_bytes - b.peak_bytes == round(flex)


def test_deepep_buffers_follow_its_size_hints():
    w = load_workload(str(MEASURED / "dsv3_proxy_hybridep_tp2pp4ep16_h100.yaml"))
    w = w.replace(extra_model={**w.extra_model, "moe_flex_dispatcher_backend": "deepep"})
    flex = flex_buffer_bytes(w, shape_of(w, DEFAULT_KNOBS))
    assert 0.2 * GB < flex < 1.0 * GB        # NVLink (288 recv tokens x 10 channels x 8) + RDMA


def test_graphed_attention_leaves_the_allocated_peak_once_captured_before_iteration_1():
    """cuda_graph_warmup_steps 0 with attention graphed: its saved activations live in the
    graph pool, out of max_memory_allocated; the device still holds them."""
    w = load_workload(str(MEASURED / "moe_mla_vpp4_fp8tensorwise_attn_cudagraph_tp2pp2ep4_h100.yaml"))
    eager = w.replace(cuda_graph_impl="none", cuda_graph_modules=None, cuda_graph_scope=None)
    for g, e in zip(estimate(w).ranks, estimate(eager).ranks):
        assert g.graphed_bytes > 0
        # the eager part replays next to the graphs' static buffers; the capture ran the
        # graphed attention of every micro-batch in flight before any eager MLP/MoE work
        assert g.allocated_moments[moments.GRAPHED] == (e.allocated_moments[moments.STEADY]
                                                        - g.graphed_bytes + g.static["cuda_graph_buffers"])
        assert g.allocated_peak_bytes == max(g.allocated_moments.values())
        assert g.allocated_peak_bytes < e.allocated_peak_bytes
        assert g.peak_bytes >= e.peak_bytes


def test_two_or_more_eager_warmup_iterations_keep_the_eager_allocated_peak():
    """max_memory_allocated counts since process start: the eager steady iteration before the
    capture (default cuda_graph_warmup_steps 3) sets it."""
    w = load_workload(str(MEASURED / "moe_mla_vpp4_fp8tensorwise_attn_cudagraph_tp2pp2ep4_h100.yaml"))
    w = w.replace(extra_model={**w.extra_model, "cuda_graph_warmup_steps": 3})
    eager = w.replace(cuda_graph_impl="none", cuda_graph_modules=None, cuda_graph_scope=None)
    for g, e in zip(estimate(w).ranks, estimate(eager).ranks):
        assert g.allocated_peak_bytes == e.allocated_peak_bytes
        assert g.peak_bytes - e.peak_bytes == g.static["cuda_graph_buffers"] > 0
