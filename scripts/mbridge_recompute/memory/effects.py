"""Per-label effect: peak saving on the hottest rank against the selective [] control, and
the replay cost, for every recompute label of the target megatron-core version.

A label that the config rejects for this workload, or that runs as a silent no-op
(reference: mcore-recompute §0.4 / §2.2), is reported with applicable=False, a
reason and saving 0.
"""

from __future__ import annotations

from mbridge_recompute.memory.cost import replay_cost_pct
from mbridge_recompute.memory.peak import NONE, estimate
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_bytes
from mbridge_recompute.memory.types import DEFAULT_KNOBS, Knobs, LabelEffect


def _selective(w, *labels):
    return w.replace(recompute_granularity="selective", recompute_modules=list(labels),
                     recompute_method=None, recompute_num_layers=None,
                     distribute_saved_activations=False)


def applicability(w, label: str, version: str) -> tuple:
    """(applicable, reason) for one label on this workload."""
    kinds = set(w.layer_kinds())
    attn = any("attn" in k.split("+") for k in kinds)
    dense_mlp = any("mlp" in k.split("+") for k in kinds)
    moe = any("moe" in k.split("+") for k in kinds)
    te = w.transformer_impl == "transformer_engine"
    fp8_delayed = bool(w.fp8) and w.fp8_recipe == "delayed"
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    if label == "core_attn":
        if not attn:
            return False, "no attention layers in this model"
        if te and not w.multi_latent_attention:
            return True, ("TE fused attention keeps no s^2 tensor; the checkpoint pins the fused "
                          "QKV buffer through the v view, so it adds memory (config warning "
                          "tc:1224-1230 @ core_v0.16.1)")
        if te:
            return True, "MLA under TE fused attention: drops only the fp32 softmax LSE"
        return True, "local unfused attention: drops the softmax probabilities (and dropout tensors)"
    if label == "mla_up_proj":
        if not w.multi_latent_attention:
            return False, ("config rejects it: mla_up_proj requires multi_latent_attention "
                           "(tc:1218-1222 @ core_v0.16.1)")
        return True, "drops the up-projected query, key and value kept by core attention"
    if label == "layernorm":
        if fp8_delayed:
            return False, ("config rejects it: delayed scaling does not support layernorm recompute "
                           "for fp8 (tc:1241-1247 @ core_v0.16.1)")
        if te and not w.multi_latent_attention and not moe:
            return False, ("silent no-op: the TE spec fuses both norms into linear_qkv / linear_fc1 "
                           "(IdentityOp), so there is no norm output to discard")
        if not (kinds & {"attn+mlp", "attn+moe", "attn", "mlp", "moe"}):
            return False, "no transformer norms in this model"
        return True, ("discards norm outputs and recomputes them in backward (needs Transformer "
                      "Engine at runtime, even in bf16: CheckpointWithoutOutput)")
    if label == "mlp":
        if not dense_mlp:
            return False, "silent no-op: mlp recompute applies only to dense (non-MoE) MLP layers"
        return True, "checkpoints the whole dense MLP; keeps only its input"
    if label in ("moe", "moe_act", "shared_experts") and not moe:
        return False, f"silent no-op: {label} applies only to MoE layers"
    if label == "moe":
        if w.cuda_graph_impl == "local":
            return False, ("silent no-op: MoELayer skips the moe checkpoint under "
                           "cuda_graph_impl='local' (moe_layer.py:152-157 @ core_v0.16.1)")
        if w.overlap_moe_expert_parallel_comm:
            if version == "main":
                return False, "config rejects it with overlap_moe_expert_parallel_comm (main tc:3030)"
            return False, ("silent no-op under overlap_moe_expert_parallel_comm: the fine-grained "
                           "callables bypass MoELayer.forward")
        return True, "checkpoints the whole MoE layer; keeps only its input (the norm output)"
    if label == "moe_act":
        if not w.moe_grouped_gemm:
            return False, ("config rejects it: moe_act requires moe_grouped_gemm "
                           "(tc:1213-1216 @ core_v0.16.1)")
        if fp8_delayed:
            return False, ("config rejects it: delayed scaling does not support moe_act recompute "
                           "for fp8 (tc:1241-1247 @ core_v0.16.1)")
        return True, "discards the grouped experts' activation output (fc2 input)"
    if label == "shared_experts":
        if not w.moe_shared_expert_intermediate_size:
            return False, "silent no-op: the model has no shared experts"
        if w.moe_shared_expert_overlap:
            return False, ("config rejects it with moe_shared_expert_overlap "
                           "(tc:1232-1239 @ core_v0.16.1)")
        return True, "checkpoints the shared-expert MLP"
    if label == "gdn_norm_out":
        if "gdn" not in kinds:
            return False, "needs GatedDeltaNet layers (experimental_attention_variant gdn/gdn2)"
        return True, "discards the gated-norm output (out_proj input)"
    if label in ("gdp_in_proj", "gdp_qkv"):
        return False, "gated delta product layers are not modelled (needs that attention variant)"
    if label == "mhc":
        if not extra.get("enable_mhc_connections"):
            return False, "config rejects it: mhc requires enable_mhc_connections=True"
        return False, "hyper-connections are not modelled"
    return False, "label not modelled"


def label_effects(w, version: str | None = None, knobs: Knobs = DEFAULT_KNOBS) -> list:
    """One LabelEffect per recompute label of `version` (default: the installed megatron-core)."""
    from mbridge_recompute.facts import releases

    version = releases.resolve_version(version) if version else releases.target_version()
    control = estimate(_selective(w), knobs)
    base_peak = control.hottest.peak_bytes
    sh = shape_of(w, knobs)
    kinds = list(dict.fromkeys(w.layer_kinds()))
    out = []
    for label in releases.labels_for(version):
        ok, reason = applicability(w, label, version)
        if not ok:
            out.append(LabelEffect(label, False, reason, 0, 0.0,
                                   {k: 0 for k in kinds}))
            continue
        wl = _selective(w, label)
        est = estimate(wl, knobs)
        mods = frozenset([label])
        per_kind = {k: layer_bytes(sh, k, NONE) - layer_bytes(sh, k, mods) for k in kinds}
        out.append(LabelEffect(label, True, reason, base_peak - est.hottest.peak_bytes,
                               round(replay_cost_pct(wl, knobs), 4), per_kind))
    return out
