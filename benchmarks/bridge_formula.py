"""The Megatron Bridge theoretical estimator's activation term, for side-by-side rows.

Our own code, written from the documented formula of
`src/megatron/bridge/training/utils/theoretical_memory_utils.py:356-432,769-791`
(Megatron-Bridge 067f987df0), which follows Korthikanti et al. 2022 Table 2:

    per layer   s*b*h*(18 + 4*r),  r = (L_dense*ffn + L_moe*(moe_ffn*topk + shared_ffn)) / (L*h)
    x L (the first stage holds PP micro-batches x L/PP layers), L including MTP layers
    + 8*s*b*PP (embedding input) + s*b*h*PP (embedding dropout)
    x (1 + (PP-1)/(PP*VP))            if virtual pipelining
    x min(1, M/PP)                    if no VP, PP > 1 (M = micro-batches)
    + 4*s*b*h*(1 + V/h)               if PP == 1 (output layer and cross entropy)
    / (TP*CP)

It never reads recompute_modules or recompute_granularity, so every recompute
setting of one workload gets the same number: the predicted delta of any label
is 0. Hybrid (Mamba) layers are counted as attention + MLP layers, as Bridge does.
"""

from __future__ import annotations


def padded_vocab(w, divisible_by: int = 128) -> int:
    """Vocabulary padded as Megatron pads it: to a multiple of divisible_by * TP."""
    v = w.vocab_size or 0
    m = divisible_by * w.tensor_model_parallel_size
    return ((v + m - 1) // m) * m


def activation_bytes(w) -> int:
    s, b, h = w.seq_length, w.micro_batch_size, w.hidden_size
    pp, vp = w.pipeline_model_parallel_size, w.virtual_pipeline_model_parallel_size
    kinds = w.layer_kinds()
    layers = len(kinds) + (w.mtp_num_layers or 0)
    moe_layers = sum(1 for k in kinds if "moe" in k)
    dense_layers = layers - moe_layers
    moe_width = 0
    if w.is_moe:
        moe_width = (w.moe_ffn_hidden_size or w.ffn) * w.moe_router_topk + \
            (w.moe_shared_expert_intermediate_size or 0)
    r = (dense_layers * w.ffn + moe_layers * moe_width) / (layers * h)
    act = s * b * h * (18 + 4 * r) * layers
    act += 8 * s * b * pp + s * b * h * pp
    if vp and vp > 1:
        act *= 1 + (pp - 1) / (pp * vp)
    elif pp > 1:
        act *= min(1.0, w.num_microbatches / pp)
    if pp == 1:
        act += 4 * s * b * h * (1 + padded_vocab(w) / h)
    return int(act / (w.tensor_model_parallel_size * w.context_parallel_size))


def predicted_delta_bytes(w, setting) -> int:
    """The formula's predicted change from the control for `setting`: always 0 (it ignores recompute)."""
    return activation_bytes(setting.apply(w)) - activation_bytes(w)
