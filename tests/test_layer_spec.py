"""The one "norm fused into the next GEMM" predicate (layer_spec.norm_fused) against the layer
specs of the installed megatron-core 0.16.1.

The Transformer Engine GPT spec cannot be built here (it needs Transformer Engine); its
`TESpecProvider` is replaced by a stand-in that names the provider method each slot asks for.
Which slot gets a fused norm-linear, a separate norm or IdentityOp is the real
`get_gpt_layer_with_transformer_engine_spec` of megatron-core.
"""

from __future__ import annotations

import warnings

import pytest

from mbridge_recompute.layer_spec import norm_fused, separate_norms


class _Slot:
    def __init__(self, name: str):
        self.name = name

    def __iter__(self):                   # provider methods that return (module, submodules)
        return iter((_Slot(self.name + ".module"), _Slot(self.name + ".submodules")))


class _Provider:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: _Slot(name)


@pytest.fixture
def specs(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt import gpt_layer_specs
    # the name exists only when the Transformer Engine import succeeded
    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", _Provider, raising=False)
    return gpt_layer_specs


def _is_separate_norm(slot) -> bool:
    from megatron.core.transformer.identity_op import IdentityOp

    if slot is IdentityOp:
        return False
    return getattr(slot, "name", None) == "layer_norm" or "Norm" in getattr(slot, "__name__", "")


@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("moe", [False, True])
def test_te_spec_fuses_exactly_the_norms_the_predicate_says(specs, mla, moe):
    kw = {"multi_latent_attention": mla}
    if moe:
        kw.update(num_experts=4, moe_grouped_gemm=True)
    layer = specs.get_gpt_layer_with_transformer_engine_spec(**kw).submodules
    assert _is_separate_norm(layer.input_layernorm) == (not norm_fused("attention", True, mla=mla))
    assert _is_separate_norm(layer.pre_mlp_layernorm) == (not norm_fused("mlp", True, moe=moe))
    if not mla:
        qkv = layer.self_attention.submodules.linear_qkv
        assert (qkv.name == "column_parallel_layer_norm_linear") == norm_fused("attention", True)


@pytest.mark.parametrize("moe", [False, True])
def test_local_spec_fuses_no_norm(specs, moe):
    layer = specs.get_gpt_layer_local_spec(**({"num_experts": 4} if moe else {})).submodules
    assert _is_separate_norm(layer.input_layernorm) and not norm_fused("attention", False)
    assert _is_separate_norm(layer.pre_mlp_layernorm) and not norm_fused("mlp", False, moe=moe)


def test_layernorm_has_nothing_to_recompute_only_where_every_norm_is_fused():
    assert separate_norms(["attn+mlp"] * 4, te=True, mla=False) == []
    assert separate_norms(["attn+mlp", "attn+moe"], te=True, mla=False) == [("attn+moe", "mlp")]
    assert separate_norms(["attn+mlp"], te=True, mla=True) == [("attn+mlp", "attention")]
    assert separate_norms(["mamba", "attn", "mlp"], te=True, mla=False) == []
    assert len(separate_norms(["attn+mlp"], te=False, mla=False)) == 2
    with pytest.raises(ValueError):
        norm_fused("qk", True)


def test_every_block_of_every_layer_kind_has_its_tensors_parameters_and_weight_shapes():
    """layer_spec.LAYER_BLOCKS is the one map of layer kind -> blocks: the saved tensors, the
    static parameters and the dummy weight-gradient shapes are each given for exactly its blocks."""
    from mbridge_recompute.layer_spec import LAYER_BLOCKS
    from mbridge_recompute.memory.static import BLOCK_PARTS, BLOCK_WGRADS
    from mbridge_recompute.memory.tensors import BLOCK_TENSORS

    blocks = {b for kind in LAYER_BLOCKS.values() for b in kind}
    assert blocks == {"attn", "mlp", "moe", "mamba", "gdn"}
    assert set(BLOCK_TENSORS) == set(BLOCK_PARTS) == set(BLOCK_WGRADS) == blocks
