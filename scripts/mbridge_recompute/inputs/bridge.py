"""A Megatron Bridge ConfigContainer dump, read as Bridge runs it.

A dump (`logger.save_config_filepath`, `cfg.to_yaml()`) holds the recipe's values before
`runtime_config_update` (config.py:1853-1888 @ megatron-bridge 0.6.2) has applied two of its
sections to the model: a dump the harness writes after it holds them applied already, and
applying them again changes nothing. So both kinds are read the same way:

1. `mixed_precision` (a recipe name such as `bf16_mixed`, or a MixedPrecisionConfig mapping):
   resolved (`get_mixed_precision_config`, mixed_precision.py:445-461), finalised (`fp8_param`
   follows `fp8_param_gather` when unset, :99-105) and every field it has that the model, optimizer
   or ddp section also has is overwritten with it (`update_config_with_precision_overrides`,
   :138-161; called at config.py:1873-1877).
2. `comm_overlap` (when not null): Bridge starts from EP overlap and delayed wgrad off and lets the
   user's non-null values win (comm_overlap.py:433-441, 594-602), then writes them onto the model
   (:618, :588-592). `comm_overlap: null` skips all of it (config.py:1883), and the model's own
   values stand.

The model section's layer pattern is `hybrid_layer_pattern` in 0.6.2 (`hybrid_override_pattern`
is its deprecated spelling, and the two together are refused: hybrid_provider.py:179-194).

Also named, not modelled: environment variables that change what memory is reserved or which
attention kernel runs. A PEFT section is read by inputs/peft.py.
"""

from __future__ import annotations

from typing import Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import fields as upstream_fields

# Environment variables of `env_vars:` that change memory (the others tune communication):
# the allocator's segment policy (reserved memory, fragmentation), TE's attention-backend switches
# (which kernel runs and what it saves, language_module.py:108-152 @ core_v0.19.0) and TE's
# CPU-offload implementation.
MEMORY_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
              "NVTE_UNFUSED_ATTN", "NVTE_CPU_OFFLOAD_V1", "NVTE_MASKED_SOFTMAX_FUSION")
# MixedPrecisionConfig fields that land on each section (the fields both classes have).
_TARGETS = {"model": "model", "optimizer": "optimizer", "ddp": "ddp"}


def is_dump(data: dict) -> bool:
    """A ConfigContainer dump: its top-level `_target_`, or a model section built by a Bridge provider."""
    if isinstance(data.get("_target_"), str) and data["_target_"].endswith("ConfigContainer"):
        return True
    model = data.get("model")
    target = model.get("_target_") if isinstance(model, dict) else None
    return isinstance(target, str) and target.startswith("megatron.bridge.")


def _mixed_precision(value, where: str) -> Optional[dict]:
    if value is None:
        return None
    if isinstance(value, str):
        fields = upstream_fields.mixed_precision_recipe(value)
        if fields is None:
            known = sorted(upstream_fields.bridge()["mixed_precision_recipes"])
            raise InputError(f"{where}mixed_precision",
                             f"unknown mixed-precision recipe {value!r} (megatron-bridge "
                             f"{upstream_fields.bridge_release()} knows: {', '.join(known)})")
        return fields
    if not isinstance(value, dict):
        raise InputError(f"{where}mixed_precision", "must be a recipe name or a mapping")
    known = set(upstream_fields.bridge()["mixed_precision_fields"]) | {"_target_"}
    for key in value:
        if key not in known:
            raise InputError(f"{where}mixed_precision.{key}", "unknown MixedPrecisionConfig field")
    out = {k: v for k, v in value.items() if k != "_target_"}
    # finalize(): an unset fp8_param / fp4_param follows its *_param_gather (mixed_precision.py:99-105)
    for name in ("fp8_param", "fp4_param"):
        if out.get(name) is None and f"{name}_gather" in out:
            out[name] = out[f"{name}_gather"]
    return out


def as_run(data: dict, where: str) -> list[str]:
    """Apply what runtime_config_update would (mixed precision, comm_overlap) to the sections of
    `data`, in place. Returns notes naming what is not modelled."""
    prefix = f"{where}: " if where else ""
    notes: list[str] = []
    mp = _mixed_precision(data.get("mixed_precision"), prefix)
    if mp:
        for section in _TARGETS:
            body = data.get(section)
            if not isinstance(body, dict):
                continue
            names = upstream_fields.known(section)
            for key, value in mp.items():
                if key in names and key in _mp_targets(section):
                    body[key] = value
    comm = data.get("comm_overlap")
    if isinstance(comm, dict):
        model = data.setdefault("model", {})
        if isinstance(model, dict):
            for key in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
                user = comm.get(key)
                model[key] = False if user is None else user
        data["comm_overlap"] = {k: v for k, v in comm.items()
                                if k not in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")}
    elif "comm_overlap" in data and comm is None:
        data.pop("comm_overlap")
    env = data.get("env_vars")
    if isinstance(env, dict):
        for key in MEMORY_ENV:
            if key in env:
                notes.append(f"env_vars.{key}={env[key]}")
    return notes


def _mp_targets(section: str) -> frozenset:
    """The MixedPrecisionConfig fields the section's config class has (hasattr in
    update_config_with_precision_overrides, mixed_precision.py:149-151)."""
    mp = set(upstream_fields.bridge()["mixed_precision_fields"])
    if section == "model":
        return frozenset(mp & (set(upstream_fields.bridge()["decoder_provider_fields"])))
    cls = {"optimizer": "OptimizerConfig", "ddp": "DistributedDataParallelConfig"}[section]
    names = set(upstream_fields.bridge()["sections"].get(section, {}).get("fields", []))
    for key in upstream_fields.mcore_releases():
        names |= set(upstream_fields.upstream()["mcore"][key][cls])
    return frozenset(mp & names)


def _enum_name(value):
    """A Python enum member as Bridge's `to_yaml` writes it ({_target_: megatron.core...CudaGraphModule,
    _call_: true, _args_: [1], _name_: attn}) -> its name; anything else unchanged."""
    if (isinstance(value, dict) and value.get("_call_") is True and isinstance(value.get("_name_"), str)
            and isinstance(value.get("_args_"), list)):
        return value["_name_"]
    if isinstance(value, list):
        return [_enum_name(v) for v in value]
    return value


def normalise_model(data: dict) -> list[str]:
    """Bridge spellings of model values onto the Workload's: enum members by name, an unset
    attention backend as auto, and the 0.6.2 layer-pattern name (hybrid_layer_pattern).
    Returns notes for values read otherwise than they are written."""
    model = data.get("model")
    notes: list[str] = []
    if not isinstance(model, dict):
        return notes
    for key, value in list(model.items()):
        model[key] = _enum_name(value)
    if "attention_backend" in model and model["attention_backend"] is None:
        # None matches no branch of _set_attention_backend and leaves TE's own defaults (every
        # backend enabled), which is what auto sets (language_module.py:123-143 @ core_v0.19.0);
        # Bridge's HF-built providers carry None (e.g. llama3_8b_pretrain_2gpu_h100_bf16_config)
        model["attention_backend"] = "auto"
    layer = model.get("hybrid_layer_pattern")
    if layer is not None:
        if model.get("hybrid_override_pattern") is not None:
            raise InputError("model.hybrid_layer_pattern",
                             "hybrid_override_pattern and hybrid_layer_pattern cannot both be specified "
                             "(hybrid_provider.py:182-185 @ megatron-bridge 0.6.2)")
        if not isinstance(layer, str):
            raise InputError("model.hybrid_layer_pattern", f"must be a string, got {layer!r}")
        model["hybrid_override_pattern"] = layer
    router = model.get("moe_router_dtype")
    if isinstance(router, dict) and isinstance(router.get("_target_"), str):
        # a torch dtype where megatron-core wants 'fp32' / 'fp64': its router compares with those
        # strings only and otherwise routes in the activation dtype (moe/router.py:103-107 @
        # core_v0.19.2), which is what None means; some 0.6.2 dev recipes write torch.float32
        model["moe_router_dtype"] = None
        notes.append(f"model.moe_router_dtype={router['_target_']} (a torch dtype, not 'fp32': megatron-core "
                     "routes in the activation dtype, read as None)")
    target = model.get("_target_")
    if upstream_fields.provider_kind(target) == "other":
        raise InputError("model._target_", f"{target} is not a decoder language model; the memory model "
                                           "covers GPT, MLA and hybrid (Mamba/GDN) decoders")
    return notes


def provider_family(data: dict) -> Optional[str]:
    """'hybrid', 'mla' or 'gpt' by the provider class (for its defaults), None when not a dump."""
    model = data.get("model")
    target = model.get("_target_") if isinstance(model, dict) else None
    if not isinstance(target, str):
        return None
    if model.get("hybrid_override_pattern") or ".hybrid." in target or "Mamba" in target:
        return "hybrid"
    if model.get("multi_latent_attention") or "mla" in target.lower():
        return "mla"
    return "gpt"
