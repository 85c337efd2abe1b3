"""What a recompute label drops on this architecture, as the memory model sees it.

Whether the config rejects a label or runs it as a silent no-op is the checker's to say
(rules/builtin.py, card.yaml); this module only says whether the memory model covers the
label here, and what it discards when it runs.
"""

from __future__ import annotations

from mbridge_recompute.memory.shape import attention_core


def what_it_drops(w, label: str) -> tuple[bool, str]:
    """(modelled, what the label discards here); modelled=False means the memory model has no
    saving to offer for it on this workload."""
    kinds = set(w.layer_kinds())
    blocks = {b for k in kinds for b in k.split("+")}
    if label == "core_attn":
        if "attn" not in blocks:
            return False, "no attention layers in this model"
        core = attention_core(w)      # the one owner of which kernel runs (memory/shape.py)
        if core == "te_fused" and not w.multi_latent_attention:
            return True, ("TE fused attention keeps no s^2 tensor; the checkpoint pins the fused "
                          "QKV buffer through the v view, so it adds memory (config warning "
                          "tc:1224-1230 @ core_v0.16.1)")
        if core == "te_fused":
            return True, "MLA under TE fused attention: drops only the fp32 softmax LSE"
        if core == "te_unfused":
            return True, "TE unfused attention: drops the softmax probabilities (and dropout tensors)"
        return True, "local unfused attention: drops the softmax probabilities (and dropout tensors)"
    if label == "mla_up_proj":
        return True, "drops the up-projected query, key and value kept by core attention"
    if label == "layernorm":
        return True, ("discards norm outputs and recomputes them in backward (needs Transformer "
                      "Engine at runtime, even in bf16: CheckpointWithoutOutput)")
    if label == "mlp":
        return True, "checkpoints the whole dense MLP; keeps only its input"
    if label == "moe":
        return True, "checkpoints the whole MoE layer; keeps only its input (the norm output)"
    if label == "moe_act":
        return True, "discards the grouped experts' activation output (fc2 input)"
    if label == "shared_experts":
        return True, "checkpoints the shared-expert MLP"
    if label == "gdn_norm_out":
        if "gdn" not in blocks:
            return False, "no GatedDeltaNet layers in this model"
        return True, "discards the gated-norm output (out_proj input)"
    if label in ("gdp_in_proj", "gdp_qkv"):
        return False, "GatedDeltaProduct layers are not modelled"
    if label == "mhc":
        return False, "hyper-connections are not modelled"
    return False, "label not modelled"
