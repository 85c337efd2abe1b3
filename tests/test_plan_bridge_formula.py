"""The Bridge estimator's activation formula (benchmarks/bridge_formula.py) used for side-by-side rows."""

from __future__ import annotations

import sys

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.setting import RecomputeSetting

from conftest import EXAMPLES, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bridge_formula  # noqa: E402


def test_formula_reproduces_korthikanti_figure_1_for_gpt3_175b():
    """Korthikanti et al. 2022 Fig. 1: 175B with SP + selective recompute = 12.35 GiB of activations
    (TP 8, PP 8, interleave 3, s 2048, b 1; the catalog's GPT-3 layout)."""
    w = load_workload(model="gpt3-175b")
    gib = bridge_formula.activation_bytes(w) / 2**30
    assert abs(gib - 12.35) / 12.35 < 0.005


def test_formula_ignores_every_recompute_setting():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    for text in ("[]", "core_attn", "moe_act", "moe,layernorm", "uniform:1", "none"):
        assert bridge_formula.predicted_delta_bytes(w, RecomputeSetting.parse(text)) == 0


def test_formula_counts_moe_width_as_topk_experts_plus_shared():
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"))
    wider = w.replace(moe_router_topk=w.moe_router_topk + 1)
    s, b, h = w.seq_length, w.micro_batch_size, w.hidden_size
    layers, t = w.num_layers, w.tensor_model_parallel_size
    moe_layers = w.layer_kinds().count("attn+moe")
    # one more expert per token adds 4 * moe_ffn / h per MoE layer, averaged over the layers, times L
    expected = s * b * h * 4 * (moe_layers * w.moe_ffn_hidden_size) / (layers * h) * layers / t
    got = bridge_formula.activation_bytes(wider) - bridge_formula.activation_bytes(w)
    assert abs(got - expected) <= 2
