"""Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198) as a workload: the paper's assumptions expressed in MCore
terms, so that `estimate(paper_workload(...), PAPER_KNOBS)` reproduces Table 2.

Paper assumptions -> MCore: MHA (num_query_groups = heads), MLP h -> 4h -> h with GeLU,
dropout 0.1 after the attention softmax, the attention projection and the MLP,
learned absolute positions (no RoPE: q, k, v stay views of the fused QKV output),
16-bit activations, no flash attention (local spec, unfused core attention whose
softmax keeps a 16-bit output: attention_softmax_in_fp32=False), norm statistics
ignored (PAPER_KNOBS).
"""

from __future__ import annotations

from mbridge_recompute.workload import Workload


def paper_workload(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                   num_layers: int = 1, **changes) -> Workload:
    w = Workload(
        num_layers=num_layers, hidden_size=h, num_attention_heads=a, num_query_groups=a,
        ffn_hidden_size=4 * h, gated_linear_unit=False, activation_func="gelu",
        normalization="LayerNorm", add_bias_linear=True, seq_length=s, vocab_size=51200,
        position_embedding_type="learned_absolute", transformer_impl="local",
        attention_dropout=0.1, hidden_dropout=0.1, masked_softmax_fusion=False,
        attention_softmax_in_fp32=False, tensor_model_parallel_size=t, sequence_parallel=sp,
        fp16=True, micro_batch_size=b,
    )
    return w.replace(**changes) if changes else w
