"""Worked numbers of the per-layer formulas (GiB per layer per rank, one micro-batch).

    python -m mbridge_recompute.memory.worked        (from scripts/)

Prints, for the Llama3-8B-like and Llama3-70B-like shapes used in the reference
tables and for GPT-3 175B in the paper's setting, the saved bytes per layer under
the TE and local specs and the change each label makes (negative = saving).
"""

from __future__ import annotations

from mbridge_recompute.memory.paper import paper_workload
from mbridge_recompute.memory.peak import NONE
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_bytes
from mbridge_recompute.memory.types import DEFAULT_KNOBS, PAPER_KNOBS
from mbridge_recompute.units import GIB
from mbridge_recompute.workload import Workload


def llama(s, t, h, a, g, f, impl="transformer_engine", **kw) -> Workload:
    return Workload(num_layers=1, hidden_size=h, num_attention_heads=a, num_query_groups=g,
                    kv_channels=128, ffn_hidden_size=f, gated_linear_unit=True,
                    activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                    seq_length=s, vocab_size=128256, attention_dropout=0.0, hidden_dropout=0.0,
                    transformer_impl=impl, masked_softmax_fusion=True,
                    tensor_model_parallel_size=t, sequence_parallel=t > 1, bf16=True,
                    extra_model={"bias_activation_fusion": True, "apply_rope_fusion": True}, **kw)


def rows(w, knobs=DEFAULT_KNOBS, labels=("core_attn", "layernorm", "mlp")) -> tuple:
    sh = shape_of(w, knobs)
    base = layer_bytes(sh, "attn+mlp", NONE)
    deltas = {lab: layer_bytes(sh, "attn+mlp", frozenset([lab])) - base for lab in labels}
    return base, deltas


def report() -> list:
    out = []
    shapes = [("Llama3-8B-like s=8192 b=1 t=1", dict(s=8192, t=1, h=4096, a=32, g=8, f=14336)),
              ("Llama3-70B-like s=8192 b=1 t=8 sp", dict(s=8192, t=8, h=8192, a=64, g=8, f=28672))]
    for name, kw in shapes:
        out.append(f"## {name}")
        for impl in ("transformer_engine", "local"):
            base, deltas = rows(llama(impl=impl, **kw))
            d = ", ".join(f"{k}={v / GIB:+.3f}" for k, v in deltas.items())
            out.append(f"{impl:18s}: {base / GIB:8.3f} GiB/layer   deltas: {d}")
        sh = shape_of(llama(**kw), DEFAULT_KNOBS)
        out.append(f"full recompute keeps: {2 * sh.h * sh.Tr / GIB:.4f} GiB/layer (layer input)")
    w = paper_workload(2048, 1, 12288, 96, t=8, sp=True)
    base, deltas = rows(w, PAPER_KNOBS, ("core_attn",))
    out.append("## GPT-3 175B (paper) s=2048 b=1 t=8 sp, MHA, GeLU, dropout 0.1, no RoPE")
    out.append(f"local (paper mode): {base / GIB:.4f} GiB/layer; core_attn "
               f"{deltas['core_attn'] / GIB:+.4f} -> {(base + deltas['core_attn']) / GIB:.4f}")
    return out


if __name__ == "__main__":
    print("\n".join(report()))
