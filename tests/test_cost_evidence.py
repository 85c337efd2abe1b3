"""The replay cost model against the card's measured step times (plan/evidence.py)."""

from __future__ import annotations

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan import evidence
from mbridge_recompute.plan.labels import label_effects

from conftest import EXAMPLES


def _check(study: str, label, base: tuple):
    return next(c for c in evidence.checks() if c.evidence == study and c.label == label
                and c.base == base)


def test_every_measured_step_time_change_is_set_beside_the_cost_model():
    studies = {c.evidence for c in evidence.checks()}
    assert {"moonlight_16b_selective_h100", "nemotron3_nano_capacity_h100",
            "llama3_70b_fp8_sft_h100"} <= studies


def test_moonlight_layernorm_on_top_of_moe_act_measured_far_above_the_model():
    """Moonlight: [moe_act] 466.26 ms, [layernorm, moe_act] 506.53 ms (+8.64 %); the model
    prices layernorm at well under 1 %."""
    c = _check("moonlight_16b_selective_h100", "layernorm", ("moe_act",))
    assert abs(c.measured_pct - 100 * (506.53 / 466.26 - 1)) < 1e-9
    assert c.modelled_pct < 1.0 and c.far_above


def test_moe_act_and_mla_up_proj_are_below_measured_but_not_far():
    for label, measured in (("moe_act", 1.99), ("mla_up_proj", 5.19)):
        c = _check("moonlight_16b_selective_h100", label, ())
        assert abs(c.measured_pct - measured) < 0.01
        assert c.modelled_pct < c.measured_pct and not c.far_above


def test_the_plan_flags_labels_whose_measured_cost_was_far_above_the_model():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    effects = {e.label: e for e in label_effects(w)}
    assert effects["layernorm"].cost_far_below_measured
    assert "measured cost was far above the model" in effects["layernorm"].reason
    assert not effects["moe_act"].cost_far_below_measured
