#!/usr/bin/env python3
"""Set the memory model against the TransformerBlock probe measured on a GPU.

benchmarks/data/h200_local_spec_probe.json holds what benchmarks/gpu/activation_probe.py
measured on one H200 (torch 2.11, megatron-core 0.16.1, local spec, bf16, TP 1, no TE,
no RoPE, 4 layers, micro-batch 1): bytes a TransformerBlock keeps for backward after one
forward, per layer. The block's input tensor exists before the forward, so the measured
per-layer figure lacks 1/4 of one [s, b, h] input; the model's per-layer total is
corrected by that before comparing. Full-recompute rows are compared as the checkpoint
inputs they keep (one [s, b, h] per group after the first).

    python3 benchmarks/gpu_probe_compare.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from mbridge_recompute.memory import estimate  # noqa: E402
from mbridge_recompute.workload import Workload  # noqa: E402

PROBE = ROOT / "benchmarks" / "data" / "h200_local_spec_probe.json"


def workload(case: dict) -> Workload:
    cfg = dict(case["config"])
    seq = cfg.pop("seq")
    act = cfg.pop("activation", "gelu")
    return Workload(num_layers=case["num_layers"], seq_length=seq,
                    micro_batch_size=case["micro_batch_size"], bf16=True, add_bias_linear=False,
                    transformer_impl="local", activation_func=act, position_embedding_type="none",
                    **cfg)


def rows() -> list[dict]:
    out = []
    for case in json.loads(PROBE.read_text())["cases"]:
        if "error" in case:
            out.append({"shape": case["shape"], "setting": case["setting"], "error": case["error"]})
            continue
        w = workload(case)
        L, h = case["num_layers"], w.hidden_size
        block_input = 2 * case["seq_length"] * case["micro_batch_size"] * h
        measured = case["saved_bytes"]
        if w.recompute_granularity == "full":
            n = w.recompute_num_layers
            if w.recompute_method == "uniform":
                predicted = (L // n - 1) * block_input   # each group keeps its input; the first is x
            else:
                layer = next(iter(estimate(w.replace(recompute_granularity=None)).per_layer.values()))
                predicted = (n - 1) * block_input + (L - n) * layer["total"]
        else:
            layer = next(iter(estimate(w).per_layer.values()))
            predicted = L * layer["total"] - block_input
        out.append({"shape": case["shape"], "setting": case["setting"], "measured": measured,
                    "predicted": predicted, "ratio": predicted / measured,
                    "delta_per_layer_in_hT": (predicted - measured) / L / (block_input / 2)})
    return out


def main() -> int:
    print(f"{'shape':18s} {'setting':14s} {'measured MiB':>13s} {'model MiB':>10s} {'model/meas':>10s}"
          f" {'Δ/layer in h·T':>14s}")
    for r in rows():
        if "error" in r:
            print(f"{r['shape']:18s} {r['setting']:14s} {r['error'][:60]}")
            continue
        print(f"{r['shape']:18s} {r['setting']:14s} {r['measured'] / 2**20:13.2f} "
              f"{r['predicted'] / 2**20:10.2f} {r['ratio']:10.4f} {r['delta_per_layer_in_hT']:14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
