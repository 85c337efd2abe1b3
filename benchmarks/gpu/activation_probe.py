#!/usr/bin/env python3
"""Measure the activations a real Megatron-Core TransformerBlock keeps, per recompute setting (GPU).

Runs on one CUDA GPU with megatron-core importable (no Transformer Engine needed:
it uses the local spec, `get_gpt_layer_local_spec`). For each workload shape and
each recompute setting it builds the block, runs one forward (twice; the
first pass is a warm-up) on a [s, b, h]
input and reads `torch.cuda.memory_allocated()` before and after:

    saved = allocated_after_forward - allocated_before - bytes(output)

which is what the block keeps for backward (one micro-batch). Then it runs
backward and reports the peak above the post-forward level (the replay working
set plus gradients). Prints one JSON object; the figures are what
benchmarks/gpu_probe_compare.py sets against the memory model.

Usage: python3 benchmarks/gpu/activation_probe.py > probe.json
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

SHAPES = {
    # paper-like: MHA, GeLU 4h, dropout 0.1, LayerNorm, no RoPE
    "mha_gelu_s2048": dict(hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096,
                           gated_linear_unit=False, attention_dropout=0.1, hidden_dropout=0.1,
                           normalization="LayerNorm", seq=2048),
    # Llama-like: GQA, SwiGLU, RMSNorm, no dropout
    "gqa_swiglu_s4096": dict(hidden_size=2048, num_attention_heads=16, num_query_groups=4,
                             ffn_hidden_size=5632, gated_linear_unit=True, activation="silu",
                             attention_dropout=0.0, hidden_dropout=0.0, normalization="RMSNorm",
                             seq=4096),
    # MoE: 8 SequentialMLP experts, top-2, allgather dispatcher (EP 1), GQA, SwiGLU
    "moe_e8_top2_s4096": dict(hidden_size=1024, num_attention_heads=16, num_query_groups=4,
                              ffn_hidden_size=2816, gated_linear_unit=True, activation="silu",
                              num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024,
                              moe_token_dispatcher_type="allgather", attention_dropout=0.0,
                              hidden_dropout=0.0, normalization="RMSNorm", seq=4096),
}
MOE_SETTINGS = ("off", "empty", "core_attn", "mlp", "moe", "uniform1")
SETTINGS = {
    "off": dict(recompute_granularity=None),
    "empty": dict(recompute_granularity="selective", recompute_modules=[]),
    "core_attn": dict(recompute_granularity="selective", recompute_modules=["core_attn"]),
    "mlp": dict(recompute_granularity="selective", recompute_modules=["mlp"]),
    "core_attn+mlp": dict(recompute_granularity="selective", recompute_modules=["core_attn", "mlp"]),
    "layernorm": dict(recompute_granularity="selective", recompute_modules=["layernorm"]),
    "uniform1": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "uniform2": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    "block2": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    "moe": dict(recompute_granularity="selective", recompute_modules=["moe"]),
    "uniform3_of_4": dict(recompute_granularity="full", recompute_method="uniform",
                          recompute_num_layers=3),
}
NUM_LAYERS = 4
BATCH = 1


def setup() -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)


def measure(shape: dict, setting: dict) -> dict:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = dict(shape)
    seq = shape.pop("seq")
    act = shape.pop("activation", "gelu")
    kwargs = dict(num_layers=NUM_LAYERS, bf16=True, params_dtype=torch.bfloat16,
                  add_bias_linear=False, transformer_impl="local", **shape, **setting)
    if act == "silu":
        kwargs["activation_func"] = torch.nn.functional.silu
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_local_spec(num_experts=shape.get("num_moe_experts"),
                                    normalization=shape["normalization"])
    block = TransformerBlock(config, spec, post_layer_norm=False).cuda().to(torch.bfloat16)
    block.train()
    h = shape["hidden_size"]
    x = torch.randn(seq, BATCH, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, seq, seq, device="cuda", dtype=torch.bool), diagonal=1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    out = block(x, attention_mask=mask)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    out_bytes = out.numel() * out.element_size()
    torch.cuda.reset_peak_memory_stats()
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - after
    saved = after - before - out_bytes
    del out, block, x, mask
    torch.cuda.empty_cache()
    return {"saved_bytes": saved, "saved_bytes_per_layer": saved / NUM_LAYERS,
            "output_bytes": out_bytes, "backward_peak_over_forward_bytes": backward_peak,
            "seq_length": seq, "micro_batch_size": BATCH, "num_layers": NUM_LAYERS}


def main() -> int:
    import megatron.core

    setup()
    report = {
        "conditions": {
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "megatron_core": megatron.core.__version__, "spec": "get_gpt_layer_local_spec",
            "precision": "bf16", "tp": 1, "pp": 1, "cp": 1, "transformer_engine": False,
            "masked_softmax_fusion": False, "rope": False,
        },
        "cases": [],
    }
    for shape_name, shape in SHAPES.items():
        for setting_name, setting in SETTINGS.items():
            wanted = MOE_SETTINGS if "num_moe_experts" in shape else \
                [n for n in SETTINGS if n != "moe"]
            if setting_name not in wanted:
                continue
            case = {"shape": shape_name, "setting": setting_name, "config": {**shape, **setting}}
            try:
                # the first pass of a shape also allocates one-time buffers (library
                # workspaces); measure twice and keep the second.
                first = measure(shape, setting)
                case.update(measure(shape, setting))
                case["first_pass_saved_bytes"] = first["saved_bytes"]
            except Exception as exc:  # record what megatron-core raised; that is a finding too
                case["error"] = f"{type(exc).__name__}: {exc}"[:400]
                case["where"] = traceback.format_exc().strip().splitlines()[-3:]
                torch.cuda.empty_cache()
            report["cases"].append(case)
            print(f"{shape_name:18s} {setting_name:14s} "
                  f"{case.get('saved_bytes_per_layer', case.get('error'))}", file=sys.stderr)
    json.dump(report, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
