"""Whose defaults an unset field takes: megatron-core's, Megatron Bridge's or Megatron-LM's.

The same training job leaves different things unset depending on where it was written, and the
three disagree on fields the memory model reads:

- `mcore`: megatron-core's `TransformerConfig` dataclass defaults. The Workload's own defaults
  are these (workload.py), so this table is empty.
- `bridge`: a Bridge model provider's defaults (`GPTModelProvider`, `HybridModelProvider`), which
  differ from TransformerConfig's. A ConfigContainer dump writes every field, so these fill only
  what a hand-written `source: bridge` file leaves out.
- `megatron-lm`: what `pretrain_gpt.py`'s argument parser and `core_transformer_config_from_args`
  make of an unset flag, where it differs from the dataclass (fusions on, pipeline outputs
  deallocated, softmax in the input dtype, learned absolute positions).

Each entry is (value, where upstream sets it). Only fields the memory model reads are listed;
tests/test_upstream_fields.py checks the Bridge tables against megatron-bridge 0.6.2's provider
dataclasses (data/upstream_fields.json); tests/test_mlm_args.py checks that a Megatron-LM workload
gets the Megatron-LM table and that the written-down argument definitions it is read with agree
with Megatron-LM's own parser in the megatron-core 0.19.2 environment.
"""

from __future__ import annotations

SOURCES = ("mcore", "bridge", "megatron-lm")

_GPT = "megatron/bridge/models/gpt_provider.py"
_HYB = "megatron/bridge/models/hybrid/hybrid_provider.py"
_ARGS = "megatron/training/arguments.py"
_AU = "megatron/training/argument_utils.py"

# GPTModelProvider (megatron-bridge 0.6.2) vs TransformerConfig: memory-relevant differences.
BRIDGE_GPT = {
    "position_embedding_type": ("learned_absolute", f"{_GPT}:141 @ megatron-bridge 0.6.2"),
    "seq_length": (1024, f"{_GPT}:159 @ megatron-bridge 0.6.2"),
    "attention_softmax_in_fp32": (False, f"{_GPT}:160 @ megatron-bridge 0.6.2"),
    "deallocate_pipeline_outputs": (True, f"{_GPT}:161 @ megatron-bridge 0.6.2"),
    "masked_softmax_fusion": (True, f"{_GPT}:203 @ megatron-bridge 0.6.2"),
    "cross_entropy_loss_fusion": (True, f"{_GPT}:204 @ megatron-bridge 0.6.2"),
}
# HybridModelProvider (megatron-bridge 0.6.2), for a file that holds a hybrid layer pattern.
BRIDGE_HYBRID = {
    "position_embedding_type": ("none", f"{_HYB}:132 @ megatron-bridge 0.6.2"),
    "seq_length": (8192, f"{_HYB}:130 @ megatron-bridge 0.6.2"),
    "share_embeddings_and_output_weights": (False, f"{_HYB}:118 @ megatron-bridge 0.6.2"),
    "normalization": ("RMSNorm", f"{_HYB}:139 @ megatron-bridge 0.6.2"),
    "add_bias_linear": (False, f"{_HYB}:140 @ megatron-bridge 0.6.2"),
    "attention_dropout": (0.0, f"{_HYB}:142 @ megatron-bridge 0.6.2"),
    "hidden_dropout": (0.0, f"{_HYB}:141 @ megatron-bridge 0.6.2"),
    "bf16": (True, f"{_HYB}:121 @ megatron-bridge 0.6.2"),
    "attention_backend": ("flash", f"{_HYB}:144 @ megatron-bridge 0.6.2"),
    "apply_rope_fusion": (True, f"{_HYB}:136 @ megatron-bridge 0.6.2"),
    "deallocate_pipeline_outputs": (True, f"{_HYB}:145 @ megatron-bridge 0.6.2"),
    "cross_entropy_loss_fusion": (True, f"{_HYB}:147 @ megatron-bridge 0.6.2"),
}
# Megatron-LM pretrain_gpt.py: argparse defaults as core_transformer_config_from_args passes them
# (MLM core_v0.19.0; the same at core_v0.16.1, arguments.py:1306+ there).
MEGATRON_LM = {
    "deallocate_pipeline_outputs": (True, f"{_AU}:305 @ core_v0.19.0 (always)"),
    "bias_activation_fusion": (True, f"{_ARGS}:2755-2761 --no-bias-gelu-fusion / --no-bias-swiglu-fusion "
                                     f"store_false, {_AU}:317-319 @ core_v0.19.0"),
    "masked_softmax_fusion": (True, f"{_ARGS}:2750 --no-masked-softmax-fusion store_false @ core_v0.19.0"),
    "apply_rope_fusion": (True, f"{_ARGS}:2765 --no-rope-fusion store_false @ core_v0.19.0 (off unless "
                                f"rope: :1574)"),
    "attention_softmax_in_fp32": (False, f"{_ARGS}:2919 --attention-softmax-in-fp32 store_true @ "
                                         f"core_v0.19.0 (on with --apply-query-key-layer-scaling: :1660)"),
    "position_embedding_type": ("learned_absolute", f"{_ARGS}:2314 @ core_v0.19.0"),
}


def table(source: str, hybrid: bool = False) -> dict:
    """field -> (value, citation) for the defaults of `source`."""
    if source == "bridge":
        return dict(BRIDGE_HYBRID if hybrid else BRIDGE_GPT)
    if source == "megatron-lm":
        return dict(MEGATRON_LM)
    return {}
