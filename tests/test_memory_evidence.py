"""The model's per-label peak deltas against the published Moonlight 16B and Nemotron 3 Nano sweeps.

Published (references: evidence.md section 1; Bridge 600d069, Megatron-Core 24bad8e; 8 x H100,
seq 4096, MBS 1, TP 2 + SP, EP 8, DP 4; selective modules only changed; decimal GB):
    core_attn -0.004, mla_up_proj -0.716, mla_up_proj + mlp -0.701, moe_act -0.677.
The workload is examples/moonlight_16b.yaml with the fused SwiGLU: with the unfused GLU
the experts would keep about 3x more activation bytes than the measured moe_act saving allows.
The model is compared on deltas of the hottest rank's peak (absolute peaks depend on
optimizer and allocator settings the published table does not give). It over-predicts both
real savings by about a third (0.95 / 0.90 GB): its peak holds every layer's activations, so a
label saves on all 26 MoE layers; the measured savings are about 3/4 of that (where in the
step the measured peak sits is not published).
"""

from __future__ import annotations

import pytest

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import estimate

from conftest import EXAMPLES

GB = 1e9
MEASURED = {"core_attn": -0.004, "mla_up_proj": -0.716, "moe_act": -0.677}


@pytest.fixture(scope="module")
def moonlight():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    return w.replace(extra_model={**w.extra_model, "bias_activation_fusion": True})


def _delta(w, mods) -> float:
    base = estimate(w.replace(recompute_granularity="selective", recompute_modules=[]))
    est = estimate(w.replace(recompute_granularity="selective", recompute_modules=mods))
    return (est.hottest.peak_bytes - base.hottest.peak_bytes) / GB


def test_core_attn_saves_nothing_under_fused_attention(moonlight):
    assert abs(_delta(moonlight, ["core_attn"]) - MEASURED["core_attn"]) < 0.05


@pytest.mark.parametrize("label", ["mla_up_proj", "moe_act"])
def test_real_savings_are_within_35_percent_of_the_measured_ones(moonlight, label):
    assert _delta(moonlight, [label]) == pytest.approx(MEASURED[label], rel=0.35)


def test_mla_up_proj_and_moe_act_save_about_the_same_as_measured(moonlight):
    """Measured 0.716 vs 0.677 GB (ratio 1.06): the two cheapest real savings are of one size."""
    ratio = _delta(moonlight, ["mla_up_proj"]) / _delta(moonlight, ["moe_act"])
    assert 0.85 < ratio < 1.25


# --- Nemotron 3 Nano, 16 x H100 (evidence.md section 2) ------------------------------------
# moe + layernorm vs moe: 63.639 vs 64.653 GB after iteration 2 (-1.014 GB); moe_act vs []:
# -4.194 GB at the matched point after iteration 1.

@pytest.fixture(scope="module")
def nemotron():
    w = load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"))
    return w.replace(extra_model={**w.extra_model, "use_fused_weighted_squared_relu": True})


def test_layernorm_on_top_of_moe_saves_the_pre_mlp_norm_output(nemotron):
    """moe + layernorm also discards the MoE input (pre-MLP norm output, 2hTr) and its rsigma
    (4Tr): 23 MoE layers x (2*2688 + 4) x 8192 bytes = 1.014 GB, as measured."""
    delta = _delta(nemotron, ["moe", "layernorm"]) - _delta(nemotron, ["moe"])
    assert delta == pytest.approx(-1.014, rel=0.02)


def test_moe_act_saves_one_copy_of_the_expert_activation_output(nemotron):
    """With the fused weighted squared-ReLU the experts keep fc1's output and the activation
    output (fc2's input); moe_act drops the latter: 23 x 2 x 1856 x (6 x 8192) = 4.20 GB,
    measured 4.194 GB."""
    assert _delta(nemotron, ["moe_act"]) == pytest.approx(-4.194, rel=0.02)
