"""Korthikanti et al. 2022, Table 2 and Eq. 5, reproduced to the byte by the per-tensor model.

Paper mode = `paper_workload(...)` (MHA, 4h GeLU MLP, dropout 0.1, learned positions so
q/k/v stay views of the fused QKV output, local spec with the unfused 16-bit softmax,
fp16) evaluated with PAPER_KNOBS (norm statistics ignored, as the paper does).
"""

from __future__ import annotations

import pytest

from mbridge_recompute.memory import PAPER_KNOBS, estimate
from mbridge_recompute.memory.paper import paper_workload

# (s, b, h, a, t): GPT-3 175B and 22B shapes of the paper plus smaller ones; h/t and a/t integral.
SHAPES = [
    (2048, 1, 12288, 96, 8),
    (2048, 4, 6144, 64, 8),
    (4096, 2, 4096, 32, 4),
    (1024, 8, 2560, 20, 2),
    (512, 3, 1024, 16, 4),
    (8192, 1, 8192, 64, 8),
]


def _layer(w) -> int:
    return estimate(w, PAPER_KNOBS).per_layer["attn+mlp"]["total"]


def _selective(w):
    return w.replace(recompute_granularity="selective", recompute_modules=["core_attn"])


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_no_parallelism_row_is_sbh_34_plus_5as_over_h(s, b, h, a, t):
    assert _layer(paper_workload(s, b, h, a, t=1)) == 34 * s * b * h + 5 * a * s * s * b


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_tensor_parallel_row_is_sbh_10_plus_24_over_t_plus_5as_over_ht(s, b, h, a, t):
    """Eq. 2: LN inputs (4), dropout masks (2), QKV and fc1 inputs (4) stay replicated."""
    expected = 10 * s * b * h + 24 * s * b * h // t + 5 * a * s * s * b // t
    assert _layer(paper_workload(s, b, h, a, t=t)) == expected


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_tensor_plus_sequence_parallel_row_divides_everything_by_t(s, b, h, a, t):
    """Eq. 4: (sbh/t)(34 + 5as/h)."""
    expected = (34 * s * b * h + 5 * a * s * s * b) // t
    assert _layer(paper_workload(s, b, h, a, t=t, sp=True)) == expected


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_tensor_parallel_with_selective_recompute_drops_the_5as_term(s, b, h, a, t):
    """Selective = MCore's core_attn: for MHA the checkpoint keeps the same QKV buffer
    views, so exactly the softmax / dropout tensors (5as^2b/t) disappear."""
    expected = 10 * s * b * h + 24 * s * b * h // t
    assert _layer(_selective(paper_workload(s, b, h, a, t=t))) == expected


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_tensor_sequence_parallel_and_selective_is_34sbh_over_t(s, b, h, a, t):
    """Eq. 6 per layer: 34 sbh / t."""
    assert _layer(_selective(paper_workload(s, b, h, a, t=t, sp=True))) == 34 * s * b * h // t


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
def test_full_recompute_keeps_2sbh_per_layer(s, b, h, a, t):
    """Full recompute row: only the layer input (2sbh), for every layer of the stage; the
    paper's 2sbh/t variant is what sequence parallelism gives."""
    L = 4
    for sp, keep in ((False, 2 * s * b * h), (True, 2 * s * b * h // t)):
        w = paper_workload(s, b, h, a, t=t, sp=sp, num_layers=L).replace(
            recompute_granularity="full", recompute_method="block", recompute_num_layers=L)
        est = estimate(w, PAPER_KNOBS)
        assert est.ranks[0].activations["checkpoints"] == L * keep
        assert est.per_layer["attn+mlp"]["full_recompute_keeps"] == keep
        assert "attention" not in est.ranks[0].activations


def _layer_part(rank) -> int:
    return sum(rank.activations.get(k, 0) for k in ("attention", "mlp", "norms"))


@pytest.mark.parametrize("s,b,h,a,t", SHAPES[:3])
def test_first_stage_under_1f1b_holds_L_layers_worth_independent_of_p(s, b, h, a, t):
    """Eq. 5: p in-flight micro-batches x L/p layers = L layers on the first stage."""
    L = 16
    per_layer = (34 * s * b * h + 5 * a * s * s * b) // t
    for p in (2, 4, 8):
        w = paper_workload(s, b, h, a, t=t, sp=True, num_layers=L).replace(
            pipeline_model_parallel_size=p, global_batch_size=4 * p * b,
            extra_model={"deallocate_pipeline_outputs": True})
        est = estimate(w, PAPER_KNOBS)
        assert _layer_part(est.ranks[0]) == L * per_layer
        assert est.ranks[0].in_flight_microbatches == p


@pytest.mark.parametrize("p,v", [(4, 2), (4, 4), (2, 2), (8, 2)])
def test_interleaved_first_stage_multiplier_is_1_plus_p_minus_1_over_pm(p, v):
    """Section 4.2.3: the interleaved schedule multiplies the first stage by (1 + (p-1)/(pm))."""
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    L = p * v * 2
    per_layer = (34 * s * b * h + 5 * a * s * s * b) // t
    w = paper_workload(s, b, h, a, t=t, sp=True, num_layers=L).replace(
        pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v,
        global_batch_size=4 * p * b, extra_model={"deallocate_pipeline_outputs": True})
    est = estimate(w, PAPER_KNOBS)
    layers_worth = L * (p * v + p - 1) // (p * v)       # L (1 + (p-1)/(pv)), integral here
    assert _layer_part(est.ranks[0]) == layers_worth * per_layer
    assert est.ranks[0].in_flight_microbatches == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_embedding_dropout_mask_is_sbh_over_t_per_in_flight_microbatch():
    """Extra term of Section 4.3: embedding dropout sbhp/t on the first stage (p micro-batches)."""
    s, b, h, a, t, p = 2048, 2, 4096, 32, 4, 4
    w = paper_workload(s, b, h, a, t=t, sp=True, num_layers=8).replace(
        pipeline_model_parallel_size=p, global_batch_size=8 * b,
        extra_model={"deallocate_pipeline_outputs": True})
    emb = estimate(w, PAPER_KNOBS).ranks[0].activations["embedding"]
    ids = 8 * s * b * p * 2          # int64 token ids + learned position ids per micro-batch
    assert emb == s * b * h * p // t + ids
