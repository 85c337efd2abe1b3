"""What the layer spec builds around a GEMM: which norms are fused into the next linear.

The one home of "a norm fused into the next GEMM". On the Transformer Engine GPT spec the
attention input norm is part of `linear_qkv` (TELayerNormColumnParallelLinear; the layer's
`input_layernorm` stays IdentityOp) and a dense layer's pre-MLP norm is part of `linear_fc1`
(`pre_mlp_layernorm` is IdentityOp without experts), gpt_layer_specs.py:265,279,291 @
core_v0.16.1. Multi-latent attention keeps a separate input norm (its q and kv
down-projections both read it) and a MoE layer a separate pre-MLP norm (the router and the
experts both read it). The local spec fuses nothing.

A fused norm is no module of its own: the `layernorm` label cannot recompute it, offloading
`attn_norm` / `mlp_norm` moves nothing for it, and its input and statistics are kept by the
fused linear.
"""

from __future__ import annotations

NORMS = ("attention", "mlp")       # the input norm, the pre-MLP norm

# The blocks each layer kind holds, in forward order (Workload.layer_kinds): the one map the
# memory model's tensors, static parts, dummy weight gradients, LoRA adapters and CUDA-graph
# pools all walk.
LAYER_BLOCKS = {"attn+mlp": ("attn", "mlp"), "attn+moe": ("attn", "moe"), "attn": ("attn",),
                "mlp": ("mlp",), "moe": ("moe",), "mamba": ("mamba",), "gdn": ("gdn",)}


def norm_fused(norm: str, te: bool, mla: bool = False, moe: bool = False) -> bool:
    """Whether `norm` ('attention' or 'mlp') of a layer is fused into the GEMM after it."""
    if norm == "attention":
        return te and not mla
    if norm == "mlp":
        return te and not moe
    raise ValueError(f"unknown norm {norm!r}; one of {NORMS}")


def separate_norms(kinds, te: bool, mla: bool) -> list[tuple[str, str]]:
    """(layer kind, norm) for every norm of these layer kinds that is a module of its own,
    the ones `layernorm` recomputes. Mamba and GatedDeltaNet mixers hold their norms inside
    the mixer, out of the label's reach."""
    out = []
    for kind in dict.fromkeys(kinds):
        blocks = kind.split("+")
        if "attn" in blocks and not norm_fused("attention", te, mla):
            out.append((kind, "attention"))
        if ("mlp" in blocks or "moe" in blocks) and not norm_fused("mlp", te, moe="moe" in blocks):
            out.append((kind, "mlp"))
    return out
