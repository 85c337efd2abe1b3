"""The facts of a plan's first lines: precision, fusions, parallelism, batch, GPU, recompute."""

from __future__ import annotations

from mbridge_recompute.placement import place
from mbridge_recompute.plan.capacity import capacity
from mbridge_recompute.setting import RecomputeSetting

FUSIONS = ("bias_activation_fusion", "masked_softmax_fusion", "apply_rope_fusion",
           "cross_entropy_loss_fusion", "bias_dropout_fusion", "moe_permute_fusion")


def precision(w) -> str:
    """The training precision in words: bf16 / fp16 / fp32 weights and activations, plus the
    low-precision linears."""
    base = "bf16" if w.bf16 else "fp16" if w.fp16 else "fp32 (neither bf16 nor fp16 set)"
    if w.fp8:
        base += f" + fp8 {w.fp8} {w.fp8_recipe}" + (" (fp8 params)" if w.fp8_param else "")
    if w.fp4:
        base += f" + fp4 {w.fp4}"
    return base


PRECISION_FIELDS = ("bf16", "fp16", "fp8", "fp8_recipe", "fp8_param", "fp4")
PARALLELISM_FIELDS = {"TP": "tensor_model_parallel_size", "PP": "pipeline_model_parallel_size",
                      "VPP": "virtual_pipeline_model_parallel_size", "CP": "context_parallel_size",
                      "EP": "expert_model_parallel_size", "GPUs": "num_gpus"}
WHOSE = {"mcore": "megatron-core's", "bridge": "Bridge's", "megatron-lm": "Megatron-LM's"}


def precision_from(w) -> str:
    """Which inputs set the precision, or whose default it is (a Hugging Face config's
    torch_dtype is not read: a bf16 checkpoint plans in fp32 unless model.bf16 is set)."""
    origins = getattr(w, "origins", None) or {}
    given = sorted({origins[f] for f in PRECISION_FIELDS if f in origins})
    if given:
        return "from " + ", ".join(given)
    return (f"no input sets it: {WHOSE.get(w.defaults_source, w.defaults_source)} default "
            "(--set model.bf16=true for bf16)")


def parallelism_from(w) -> str:
    """Which inputs set TP, PP, VPP, CP, EP and the GPU count; the rest are defaults."""
    origins = getattr(w, "origins", None) or {}
    by: dict = {}
    for label, name in PARALLELISM_FIELDS.items():
        by.setdefault(origins.get(name), []).append(label)
    rest = by.pop(None, [])
    # a world size no input gives is the loader's assumption (inputs/world.py), not an input
    assumed = [f"{', '.join(by.pop(src))} {src}" for src in [s for s in by if s.startswith("assumed")]]
    if not by:
        return "; ".join(["no input sets them: defaults (--set model.tensor_model_parallel_size=N, "
                          "cluster.num_gpus=N, ...)"] + assumed)
    parts = [src if len(by) == 1 and not rest and not assumed else f"{', '.join(labels)} from {src}"
             for src, labels in by.items()] + assumed
    if len(parts) == 1 and not rest:
        return "from " + parts[0]
    return "; ".join(parts + ([f"{', '.join(rest)}: defaults"] if rest else []))


def fusions_on(w) -> list:
    """The memory-relevant fusions switched on (Workload fields or model keys)."""
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    out = []
    for name in FUSIONS:
        value = getattr(w, name, None) if name in w.__dataclass_fields__ else extra.get(name)
        if value:
            out.append(name + (f" ({extra.get('cross_entropy_fusion_impl', 'native')})"
                               if name == "cross_entropy_loss_fusion" else ""))
    return out


def _replicas(w) -> list:
    """What more data-parallel replicas would change, when the world size was assumed."""
    from mbridge_recompute.inputs.world import more_replicas

    said = more_replicas(w)
    return [said] if said else []


def workload_summary(w, setting: RecomputeSetting) -> dict:
    from mbridge_recompute.memory.shape import attention_core

    gpus = w.num_gpus or w.model_parallel_size
    split = place(w)
    from mbridge_recompute.plan.evidence import architecture

    return {"num_layers": w.num_layers, "hidden_size": w.hidden_size,
            "architecture": str(architecture(w)),
            "tp": w.tensor_model_parallel_size, "pp": w.pipeline_model_parallel_size,
            "vpp": len(split.chunks[0]) if split.ok else w.vpp,
            "cp": w.context_parallel_size, "ep": w.expert_model_parallel_size,
            "dp": w.data_parallel_size, "seq_length": w.seq_length,
            "micro_batch_size": w.micro_batch_size, "num_microbatches": w.num_microbatches,
            "num_gpus": gpus, "num_gpus_given": not w.world_assumed, "num_gpus_from": w.num_gpus_from,
            "gpu_memory_gb": w.gpu_memory_gb, "gpu_capacity_bytes": capacity(w).bytes,
            "gpu_capacity": capacity(w).how, "recompute": setting.describe(),
            "precision": precision(w), "precision_from": precision_from(w),
            "parallelism_from": parallelism_from(w), "attention_backend": w.attention_backend,
            "attention_core": attention_core(w), "transformer_impl": w.transformer_impl,
            "fusions": fusions_on(w),
            "defaults_source": getattr(w, "defaults_source", None) or "mcore",
            "input_notes": list(w.input_notes) + _replicas(w)}
