"""Megatron-LM's theoretical memory report, for side-by-side rows against measured peaks.

Our own code, written from the formulas of `megatron/training/theoretical_memory_usage.py`
(Megatron-LM d98e8a6, functions compute_weight_and_optimizer_memory :12-305,
compute_activation_memory :308-380, compute_activation_memory_without_sp :382-453,
report_theoretical_memory :456-494):

- weights and optimizer of the most loaded shard (the first pipeline stage: its share of the
  decoder layers, all MTP layers and the embedding; the output layer too when untied and
  PP = 1) at 18 bytes per parameter, or 6 + 12/DP with the distributed optimizer (routed
  experts over the expert-data-parallel size);
- activations: with sequence parallelism and selective recompute, s*b*h*(18 + 4*ffn/h) per
  layer over TP (Korthikanti et al.); otherwise s*b*h*(10 + 24/TP) per layer, x 1.05; both
  plus the embedding terms, the interleaving penalty or min(1, M/PP), and the output layer when
  PP = 1.

Hybrid Mamba models get no report (report_theoretical_memory returns before computing one).
It does not read recompute_modules, the attention backend, MTP's activations, MoE routing or
the pipeline layout, and reports the first stage, not the last rank the measurements come from.
"""

from __future__ import annotations


def _norm(w) -> int:
    return 1 if w.normalization == "RMSNorm" else 2


def weight_and_optimizer_bytes(w, padded_vocab: int) -> float:
    h, a = w.hidden_size, w.num_attention_heads
    pp, tp = w.pipeline_model_parallel_size, w.tensor_model_parallel_size
    glu = 1.5 if w.swiglu else 1.0
    kinds = w.layer_kinds()
    moe_layers = sum(1 for k in kinds if "moe" in k)
    dense_layers = len(kinds) - moe_layers
    mtp = w.mtp_num_layers or 0
    mtp_moe = mtp if kinds and "moe" in kinds[-1] else 0
    mtp_dense = mtp - mtp_moe
    norm = _norm(w)
    if w.multi_latent_attention:
        qk = w.qk_head_dim + w.qk_pos_emb_head_dim
        q = h * a * qk if not w.q_lora_rank else w.q_lora_rank * (h + a * qk + norm)
        attn = (q + w.kv_lora_rank * (h + a * (w.qk_head_dim + w.v_head_dim) + norm)
                + h * w.qk_pos_emb_head_dim + a * w.v_head_dim * h)
    else:
        attn = 2 * h * h * (1 + w.heads_kv / a) * (w.head_dim * a / h)
    dense_mlp = 2 * h * w.ffn * glu
    e = w.num_moe_experts or 1
    shared = 2 * h * (w.moe_shared_expert_intermediate_size or 0) * glu
    routed = 2 * h * (w.moe_ffn_hidden_size or w.ffn) * e * glu if w.is_moe else 0
    router = h * e if w.is_moe else 0
    norms = 2 * h * norm
    embedding = h * padded_vocab
    tp_block = (attn + dense_mlp) * dense_layers + (attn + shared) * moe_layers
    rep_block = norms * dense_layers + (norms + router) * moe_layers + norm * h
    exp_block = routed * moe_layers
    tp_mtp = (attn + dense_mlp) * mtp_dense + (attn + shared) * mtp_moe
    rep_mtp = norms * mtp_dense + (norms + router) * mtp_moe
    tp_shard = (tp_block / pp + tp_mtp + embedding) / tp
    if not w.share_embeddings_and_output_weights and pp == 1:
        tp_shard += embedding / tp
    rep_shard = rep_block / pp + rep_mtp
    exp_shard = (exp_block / pp + routed * mtp_moe) / (w.etp * w.expert_model_parallel_size)
    world = w.num_gpus or w.model_parallel_size
    edp = max(1, world // (w.etp * w.expert_model_parallel_size * pp))

    def per_param(dp: int) -> float:
        return 6 + 12 / dp if w.use_distributed_optimizer else 18

    return (tp_shard + rep_shard) * per_param(w.data_parallel_size) + exp_shard * per_param(edp)


def activation_bytes(w, padded_vocab: int) -> float:
    s, b, h = w.seq_length, w.micro_batch_size, w.hidden_size
    pp, tp, vp = w.pipeline_model_parallel_size, w.tensor_model_parallel_size, \
        w.virtual_pipeline_model_parallel_size
    with_sp = w.sequence_parallel and w.recompute_granularity == "selective"
    per_layer = s * b * h * ((18 + 4 * w.ffn / h) if with_sp else (10 + 24 / tp))
    act = per_layer * w.num_layers + 8 * s * b * pp + s * b * h * pp
    if vp:
        act *= 1 + (pp - 1) / (pp * vp)
    elif pp > 1:
        act *= min(1, w.num_microbatches / pp)
    if pp == 1:
        if with_sp:
            act += s * b * h * 4 * (1 + padded_vocab / h)
        else:
            act += (s * b * padded_vocab / tp + s * b * h) * 2
    if with_sp:
        return act / tp
    return act * 1.05


def total_bytes(w, padded_vocab: int):
    """The report's total, or None for a hybrid Mamba model, for which report_theoretical_memory
    prints that it is not supported and reports nothing (:457-459)."""
    if w.hybrid_override_pattern:
        return None
    return weight_and_optimizer_bytes(w, padded_vocab) + activation_bytes(w, padded_vocab)

