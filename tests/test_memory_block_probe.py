"""The memory model against a real TransformerBlock measured on a GPU (data, not a mock).

benchmarks/data/h200_local_spec_probe.json: one H200, torch 2.11, megatron-core 0.16.1, local
spec, bf16, TP 1, no Transformer Engine, no RoPE, 4 layers, micro-batch 1; bytes the block keeps
for backward after one forward (benchmarks/gpu/activation_probe.py made it).
"""

from __future__ import annotations

import importlib.util
import json

from mbridge_recompute.facts import card

from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_probe_compare",
                                              ROOT / "benchmarks" / "gpu_probe_compare.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def test_model_matches_every_measured_block_within_a_few_bytes_per_layer():
    """Selective (off, [], core_attn, mlp, core_attn+mlp) and full uniform/block, MHA-GeLU and
    GQA-SwiGLU: the model's bytes equal the measured ones (the 4-byte int32 mask-type tensor
    a core_attn checkpoint keeps is the only slack allowed)."""
    measured = [r for r in compare.rows() if "error" not in r]
    assert len(measured) == 16
    for r in measured:
        assert abs(r["predicted"] - r["measured"]) <= 8 * 4, r


def test_gqa_query_reshape_copy_is_what_autograd_keeps():
    """Without RoPE, GQA's q reshape copies; k/v are repeat_interleave'd: nothing pins the
    fused QKV buffer, and under core_attn the checkpoint keeps the q copy plus the buffer."""
    rows = {(r["shape"], r["setting"]): r for r in compare.rows()}
    assert rows[("gqa_swiglu_s4096", "off")]["ratio"] == 1.0
    assert abs(rows[("gqa_swiglu_s4096", "core_attn")]["ratio"] - 1.0) < 1e-6


def test_runtime_failures_measured_on_the_gpu_are_in_the_card():
    """The probe's failures are the card's runtime constraints, word for word."""
    cases = json.loads(compare.PROBE.read_text())["cases"]
    errors = {(c["shape"], c["setting"]): c["error"] for c in cases if "error" in c}
    assert card.constraint("label-needs-te")["message"] in errors[("mha_gelu_s2048", "layernorm")]
    assert card.constraint("moe-router-needs-te")["message"] in errors[("moe_e8_top2_s4096", "moe")]
    assert errors[("gqa_swiglu_s4096", "uniform3_of_4")].startswith("IndexError")
    uniform = card.constraint("uniform-num-layers-not-dividing-chunk")
    assert "IndexError" in uniform["condition"] + uniform["message"] + uniform.get("fix", "")
