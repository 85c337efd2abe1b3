"""The memory model against published measured peaks (benchmarks/measured_peaks.py).

The measurements are Megatron-LM functional-test golden values (`mem-max-allocated-bytes` of
the last global rank, 8 GPUs, benchmarks/data/measured/index.yaml cites each file); the model
is run here on the same workloads. No constant of the model is fitted to them.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import measured_peaks  # noqa: E402

ROWS = {r["id"]: r for r in measured_peaks.rows()}


def test_measured_peaks_cover_moe_mtp_mla_unfused_layout_and_vpp():
    feats = [set(f.split(" ")[0] for f in r["features"]) for r in ROWS.values()]
    assert len(ROWS) >= 8
    for need in ("MoE", "MTP", "MLA", "unfused", "layout", "VPP", "uneven", "local"):
        assert any(need in f for f in feats), need
    assert any({"MoE", "MTP", "layout"} <= f for f in feats)


@pytest.mark.parametrize("case", sorted(ROWS))
def test_measured_peak_within_10_percent_or_the_term_is_named(case):
    r = ROWS[case]
    errors = [e for e in (r["error_it1"], r["error_steady"]) if e is not None]
    assert errors
    if r["within"]:
        assert all(abs(e) <= 0.10 for e in errors)
        return
    assert r["term"] and not r["term"].startswith("open"), r


@pytest.mark.parametrize("case", sorted(ROWS))
def test_every_measured_peak_lies_inside_the_plans_error_band(case):
    """The band the plan prints around a rank's allocated peak holds what was measured."""
    assert ROWS[case]["in_band"], ROWS[case]


def test_unmodelled_features_are_the_named_terms():
    """A case off by more than 10 % because of a feature names that feature, and only cases
    using offloading or CUDA graphs do."""
    assert any("offloading" in (r["term"] or "") or r["within"] for r in ROWS.values())
    for r in ROWS.values():
        term = r["term"] or ""
        if "offloading" in term:
            assert "activation offloading" in r["features"]
        if "CUDA graph" in term:
            assert "CUDA graphs" in r["features"]


def test_most_measured_peaks_land_within_10_percent():
    inside = [r for r in ROWS.values() if r["within"]]
    assert len(inside) >= 10, [(r["id"], r["error_it1"], r["error_steady"]) for r in ROWS.values()]


def test_moe_with_mtp_and_unfused_attention_within_5_percent():
    """MoE with MLA, MTP, the unfused core and VPP: the stored softmax probabilities and MTP's
    layer, embedding copy and second loss are most of this peak."""
    r = ROWS["moe_mla_mtp1_vpp4_tp2pp2ep4_h100"]
    assert abs(r["error_it1"]) < 0.05 and abs(r["error_steady"]) < 0.05


def test_upstream_formula_reported_for_every_case():
    for r in ROWS.values():
        assert r["upstream_formula"] > 0


def test_offloading_brings_the_offload_cases_within_reach():
    """The two fine-grained offloading cases: steady state within 11 % once the offloaded
    tensors leave the GPU (without the offload model the prediction is nearly twice the peak)."""
    for case in ("moe_mla_mtp1_layout_offload_tp2pp2ep4_h100", "moe_mla_nomtp_layout_offload_tp2pp2ep4_h100"):
        assert abs(ROWS[case]["error_steady"]) < 0.11, ROWS[case]
