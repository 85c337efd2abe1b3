"""Measure what real megatron-core layers keep for backward and print it next to the model.

    python -m mbridge_recompute.memory.measure [--out FILE.json]      (from scripts/, needs CUDA)

Builds a one-GPU `GPTModel` with the local spec (no Transformer Engine needed) for a few
dense workloads (MoE layers need Transformer Engine even on the local spec: the router GEMM
calls te_general_gemm), runs one forward with `torch.autograd.graph.saved_tensors_hooks`, and counts
the bytes of every distinct storage autograd (or a checkpoint function) keeps, without
parameters and model inputs, attributed to the decoder layer that saved it first; storages
that a checkpoint discards (resized to 0) count 0. It also reads the growth of
`torch.cuda.memory_allocated()` over the forward as a cross-check. Each row prints the
measured bytes of decoder layer 0 (and of the whole decoder) and the model's prediction
for the same workload.

This file imports torch and megatron-core inside `main()` only; nothing on the light
paths imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CASES = [
    # name, workload fields, recompute fields
    ("paper-mha-gelu-dropout", dict(paper=True), {}),
    ("paper-mha-gelu-dropout core_attn", dict(paper=True),
     dict(recompute_granularity="selective", recompute_modules=["core_attn"])),
    ("gqa-rope-swiglu-fused", dict(), {}),
    ("gqa-rope-swiglu-unfused", dict(fusion=False), {}),
    ("gqa-rope-swiglu core_attn", dict(), dict(recompute_granularity="selective",
                                              recompute_modules=["core_attn"])),
    ("gqa-rope-swiglu mlp", dict(), dict(recompute_granularity="selective",
                                        recompute_modules=["mlp"])),
    ("gqa-rope fp32-softmax s=8192", dict(s=8192, softmax_fp32=True), {}),
    ("gqa full uniform 2", dict(layers=4), dict(recompute_granularity="full",
                                                recompute_method="uniform", recompute_num_layers=2)),
    ("gqa full block 1", dict(layers=4), dict(recompute_granularity="full",
                                              recompute_method="block", recompute_num_layers=1)),
]


def workload_for(spec: dict, rec: dict):
    from mbridge_recompute.memory.paper import paper_workload
    from mbridge_recompute.workload import Workload

    s = spec.get("s", 2048)
    layers = spec.get("layers", 2)
    if spec.get("paper"):
        w = paper_workload(s, 2, 1024, 16, num_layers=layers).replace(
            vocab_size=1024, bf16=True, fp16=False)
    else:
        w = Workload(num_layers=layers, hidden_size=1024, num_attention_heads=16,
                     num_query_groups=4, kv_channels=64, ffn_hidden_size=2816,
                     gated_linear_unit=True, activation_func="silu", normalization="LayerNorm",
                     add_bias_linear=False, seq_length=s, vocab_size=1024,
                     position_embedding_type="rope", transformer_impl="local",
                     attention_dropout=0.0, hidden_dropout=0.0, masked_softmax_fusion=False,
                     attention_softmax_in_fp32=bool(spec.get("softmax_fp32", False)),
                     bf16=True, micro_batch_size=1,
                     extra_model={"bias_activation_fusion": spec.get("fusion", True)})
    if spec.get("moe"):
        w = w.replace(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=704,
                      moe_shared_expert_intermediate_size=1408, moe_grouped_gemm=False,
                      moe_token_dispatcher_type="alltoall")
    return w.replace(**rec) if rec else w


def _config(w):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    act = F.silu if w.activation_func == "silu" else F.gelu
    kw = dict(num_layers=w.num_layers, hidden_size=w.hidden_size,
              num_attention_heads=w.num_attention_heads, num_query_groups=w.heads_kv,
              kv_channels=w.head_dim, ffn_hidden_size=w.ffn, gated_linear_unit=w.gated_linear_unit,
              activation_func=act, normalization=w.normalization, add_bias_linear=w.add_bias_linear,
              attention_dropout=w.attention_dropout, hidden_dropout=w.hidden_dropout,
              masked_softmax_fusion=w.masked_softmax_fusion,
              attention_softmax_in_fp32=w.attention_softmax_in_fp32,
              bias_activation_fusion=bool(w.extra_model.get("bias_activation_fusion", False)),
              bf16=True, params_dtype=torch.bfloat16, gradient_accumulation_fusion=False,
              persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    if w.num_moe_experts:
        kw.update(num_moe_experts=w.num_moe_experts, moe_router_topk=w.moe_router_topk,
                  moe_ffn_hidden_size=w.moe_ffn_hidden_size,
                  moe_shared_expert_intermediate_size=w.moe_shared_expert_intermediate_size,
                  moe_grouped_gemm=False, moe_token_dispatcher_type=w.moe_token_dispatcher_type)
    if w.recompute_granularity:
        kw.update(recompute_granularity=w.recompute_granularity,
                  recompute_modules=w.recompute_modules, recompute_method=w.recompute_method,
                  recompute_num_layers=w.recompute_num_layers)
    return TransformerConfig(**kw)


def measure_case(w) -> dict:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    cfg = _config(w)
    spec = get_gpt_layer_local_spec(num_experts=w.num_moe_experts, moe_grouped_gemm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=spec,
                     vocab_size=w.vocab_size, max_sequence_length=w.seq_length,
                     position_embedding_type=w.position_embedding_type,
                     share_embeddings_and_output_weights=True).cuda().to(torch.bfloat16)
    model.train()
    s, b = w.seq_length, w.micro_batch_size
    tokens = torch.randint(0, w.vocab_size, (b, s), device="cuda")
    labels = torch.randint(0, w.vocab_size, (b, s), device="cuda")
    pos = torch.arange(s, device="cuda").unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(b, 1, s, s, dtype=torch.bool, device="cuda"), 1)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {t.untyped_storage().data_ptr() for t in (tokens, labels, pos, mask)}
    where = ["other"]
    seen: dict = {}

    def pre(i):
        def hook(*_):
            where.append(f"layer{i}")
        return hook

    def post(*_):
        where.pop()

    for i, layer in enumerate(model.decoder.layers):
        layer.register_forward_pre_hook(pre(i))
        layer.register_forward_hook(post)

    def pack(t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key and key not in excluded and key not in seen:
            seen[key] = (where[-1], st)
        return t

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(tokens, pos, mask, labels=labels)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    by: dict = {}
    for tag, st in seen.values():
        by[tag] = by.get(tag, 0) + st.nbytes()
    loss.float().sum().backward()        # the graph is valid end to end
    del loss
    return {"by_layer": by, "allocated_growth": grown}


def predict(w) -> dict:
    """The model's numbers; `comparable` leaves out the token / position ids the embedding
    keeps, because the measurement does not count model inputs."""
    from mbridge_recompute.memory import estimate
    est = estimate(w)
    kind = "attn+moe" if w.num_moe_experts else "attn+mlp"
    positions = 2 if w.position_embedding_type == "learned_absolute" else 1
    ids = 8 * w.seq_length * w.micro_batch_size * positions
    return {"layer": est.per_layer[kind]["total"], "rank_activations": est.ranks[0].activation_bytes,
            "comparable": est.ranks[0].activation_bytes - ids,
            "checkpoint": est.per_layer[kind]["full_recompute_keeps"],
            "components": est.ranks[0].activations}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    rows = []
    for name, spec, rec in CASES:
        w = workload_for(spec, rec)
        row = {"case": name}
        try:
            row.update(measured=measure_case(w))
        except Exception as exc:  # keep measuring the other cases
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["predicted"] = predict(w)
        rows.append(row)
        m = row.get("measured", {}).get("by_layer", {})
        total = sum(m.values())
        print(f"{name:40s} layer0 measured {m.get('layer0', 0):>13,d} predicted "
              f"{row['predicted']['layer']:>13,d} | all measured {total:>14,d} predicted "
              f"{row['predicted']['comparable']:>14,d}"
              f" | alloc growth {row.get('measured', {}).get('allocated_growth', 0):>14,d}"
              + (f" | {row['error']}" if "error" in row else ""), flush=True)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
