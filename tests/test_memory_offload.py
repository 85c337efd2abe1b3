"""Fine-grained activation offloading in the memory and cost models (memory/offload.py)."""

from __future__ import annotations

from mbridge_recompute import memory
from mbridge_recompute.memory.offload import offloaded_bytes
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_tensors
from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs
from mbridge_recompute.workload import Workload

NONE = frozenset()


def dense(**kw):
    base = dict(num_layers=8, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                ffn_hidden_size=14336, gated_linear_unit=True, activation_func="silu",
                normalization="RMSNorm", add_bias_linear=False, seq_length=4096, bf16=True,
                attention_dropout=0.0, hidden_dropout=0.0, vocab_size=128256,
                pipeline_model_parallel_size=2, num_gpus=2, global_batch_size=8)
    base.update(kw)
    return Workload(**base)


def _offload(w, *modules):
    return w.replace(fine_grained_activation_offloading=True, offload_modules=list(modules))


def test_core_attn_offload_moves_exactly_what_core_attention_keeps():
    w = _offload(dense(), "core_attn")
    sh = shape_of(w, DEFAULT_KNOBS)
    core = sum(x.nbytes for x in layer_tensors(sh, "attn+mlp", NONE)
               if x.name.startswith(("A4 q", "A5 k, v", "A7 softmax LSE")) and x.nbytes >= 2 * 2**20)
    assert offloaded_bytes(sh, "attn+mlp", NONE, sh.offload) == core > 0


def test_a_norm_fused_into_the_next_gemm_offloads_nothing():
    """TE dense spec: input_layernorm and pre_mlp_layernorm are IdentityOps (transformer_layer.py
    :449-458 @ core_v0.16.1)."""
    sh = shape_of(_offload(dense(), "attn_norm", "mlp_norm"), DEFAULT_KNOBS)
    assert offloaded_bytes(sh, "attn+mlp", NONE, sh.offload) == 0
    local = shape_of(_offload(dense(transformer_impl="local"), "attn_norm"), DEFAULT_KNOBS)
    assert offloaded_bytes(local, "attn+mlp", NONE, local.offload) > 0


def test_offloading_lowers_the_first_stage_peak_by_the_offloaded_in_flight_bytes():
    w = dense()
    off = _offload(w, "core_attn", "attn_proj")
    base, moved = memory.estimate(w).ranks[0], memory.estimate(off).ranks[0]
    sh = shape_of(off, DEFAULT_KNOBS)
    per_layer = offloaded_bytes(sh, "attn+mlp", NONE, sh.offload)
    layers_in_flight = base.in_flight_microbatches * base.layers
    assert abs((base.activation_bytes - moved.activation_bytes) - per_layer * layers_in_flight) < 16
    # what left the GPU is held in pinned host memory, a figure of its own; every activation
    # component stays what the GPU keeps (>= 0) and they still sum to the activations
    assert abs(moved.host_bytes - per_layer * layers_in_flight) < 16 and base.host_bytes == 0
    assert all(v >= 0 for v in moved.activations.values())
    assert abs(sum(moved.activations.values()) - moved.activation_bytes) < 16
    assert moved.activations["attention"] < base.activations["attention"]


def test_offloading_costs_the_pcie_time_the_layer_cannot_hide():
    w = dense()
    off = _offload(w, "core_attn", "attn_proj")
    ref = w
    fast = memory.step_cost_pct(off, ref, Knobs(pcie_flops_per_byte=1.0))
    slow = memory.step_cost_pct(off, ref, Knobs(pcie_flops_per_byte=1e7))
    assert fast == 0.0 and slow > 0.0
