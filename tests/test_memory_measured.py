"""The model against bytes measured on real megatron-core layers.

The figures below were recorded by `python -m mbridge_recompute.memory.measure` (from
scripts/) on one NVIDIA H200 with torch 2.11.0+cu130 and megatron-core 0.16.1, local
spec (no Transformer Engine), bf16, TP 1: for each workload in measure.CASES it counted
every distinct storage autograd and the checkpoint functions kept over one GPTModel
forward (parameters and model inputs left out), layer 0 alone and the whole model. They
are measurements, not outputs of this model; this test re-derives the prediction for the
same workloads and requires byte equality. (The GPU run itself cannot happen here.)
"""

from __future__ import annotations

import pytest

from mbridge_recompute.memory import measure

# case -> (layer 0 bytes or None when layer 0 is checkpointed, all kept bytes)
MEASURED_H200_MCORE_0161 = {
    "paper-mha-gelu-dropout": (813_760_512, 1_665_339_392),
    "paper-mha-gelu-dropout core_attn": (142_671_876, 323_162_120),
    "gqa-rope-swiglu-fused": (203_456_512, 423_725_056),
    "gqa-rope-swiglu-unfused": (226_525_184, 469_862_400),
    "gqa-rope-swiglu core_attn": (68_190_212, 153_192_456),
    "gqa-rope-swiglu mlp": (168_853_504, 354_519_040),
    "gqa-rope fp32-softmax s=8192": (6_719_406_080, 13_506_060_288),
    "gqa full uniform 2": (None, 25_724_928),
    "gqa full block 1": (None, 631_900_160),
}

CASES = {name: (spec, rec) for name, spec, rec in measure.CASES}


@pytest.mark.parametrize("case", sorted(MEASURED_H200_MCORE_0161))
def test_model_matches_bytes_megatron_core_kept_on_a_gpu(case):
    layer0, total = MEASURED_H200_MCORE_0161[case]
    spec, rec = CASES[case]
    predicted = measure.predict(measure.workload_for(spec, rec))
    if layer0 is not None:
        assert predicted["layer"] == layer0
    assert predicted["comparable"] == total


def test_every_measured_case_is_still_in_the_harness():
    assert set(MEASURED_H200_MCORE_0161) <= set(CASES)
