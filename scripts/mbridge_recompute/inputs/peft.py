"""A Bridge `peft:` section (ConfigContainer.peft) as the memory model reads it.

Megatron Bridge 0.6.2 applies a PEFT scheme after the model is built: `PEFT.__call__` freezes
every parameter (`freeze_model`: requires_grad = False, peft/base.py:135-160 @ megatron-bridge
0.6.2) and then wraps each matched linear layer with an adapter whose own parameters train
(`LoRA.transform`, peft/lora.py:120-222). Megatron-core then builds gradient buffers and the
optimizer only for parameters that require a gradient, so the frozen base keeps its 16-bit
weights and nothing else. The memory model reads:

- LoRA (`megatron.bridge.peft.lora.LoRA`): rank `dim`, `target_modules` (last module names:
  linear_qkv, linear_proj, linear_fc1, linear_fc2 by default, lora.py:102-104; in_proj / out_proj
  for Mamba mixers; `exclude_modules` with no targets means every linear but those),
  `dropout` and its position, `normalize_moe_lora` (expert rank dim // top-k, utils.py
  get_effective_lora_dim), `share_expert_adapters` (one adapter for all local experts of an EP
  rank, the default), `sequence_parallel_input_regather`, `lora_dtype` (None: the model's dtype).
- DoRA (`megatron.bridge.peft.dora.DoRA`): read as LoRA; the magnitude vector and the weight-norm
  activations it adds are named as not modelled.
- anything else (CanonicalLoRA, a custom scheme): named as not modelled, and the plan is full
  fine-tuning (every parameter trains), said first.

`read` returns the normalised section (a plain dict the Workload holds as `peft`) and the notes
the plan says first. Nothing here imports Bridge or torch.
"""

from __future__ import annotations

from typing import Any

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs.values import MAX_INT, short

LORA = "megatron.bridge.peft.lora.LoRA"
DORA = "megatron.bridge.peft.dora.DoRA"
DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")   # lora.py:102-104
# The linear layers of the stacks the memory model lays out, by their module name
LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "linear_q_proj", "linear_q_down_proj",
           "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj", "in_proj", "out_proj", "router")
_DTYPES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "bfloat16": 2, "float16": 2,
           "float32": 4, "bf16": 2, "fp16": 2, "fp32": 4}


def _flag(body: dict, key: str, default: bool, where: str) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{where}.{key}", f"must be true or false, got {short(value)}")
    return value


def _names(body: dict, key: str, where: str) -> list:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(f"{where}.{key}", f"must be a list of module names, got {short(value)}")
    if len(value) > 1000:
        raise InputError(f"{where}.{key}", f"lists {len(value)} modules; at most 1000")
    return [v.strip() for v in value]


def _last(name: str) -> str:
    """A target's module name: the part after the last dot of a wildcard path
    ('*.layers.0.*.linear_qkv' -> linear_qkv)."""
    return name.rsplit(".", 1)[-1]


def read(body: Any, where: str = "peft") -> tuple:
    """(the normalised PEFT section or None, notes said first) for a dump's `peft:` value."""
    if body is None:
        return None, []
    if not isinstance(body, dict):
        raise InputError(where, f"must be a PEFT mapping (a dump writes its _target_ and fields), got "
                                f"{short(body)}")
    target = body.get("_target_")
    if target not in (LORA, DORA):
        named = target if isinstance(target, str) else "a PEFT scheme without _target_"
        return None, [f"PEFT {named} is not modelled: every parameter is planned as trainable (full "
                      "fine-tuning: gradients and optimizer state for the frozen base too, an upper bound)"]
    dim = body.get("dim", 32)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= MAX_INT:
        raise InputError(f"{where}.dim", f"must be a positive integer, got {short(dim)}")
    dropout = body.get("dropout", 0.0) or 0.0
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise InputError(f"{where}.dropout", f"must be a number in [0, 1), got {short(dropout)}")
    position = body.get("dropout_position", "pre") or "pre"
    if position not in ("pre", "post"):
        raise InputError(f"{where}.dropout_position", f"must be pre or post, got {short(position)}")
    targets = _names(body, "target_modules", where)
    excluded = _names(body, "exclude_modules", where)
    notes: list[str] = []
    if excluded and targets:
        raise InputError(f"{where}.exclude_modules", "goes with an empty target_modules (LoRA matches "
                                                     "every linear but the excluded ones)")
    if excluded:
        names = [n for n in LINEARS if n not in {_last(x) for x in excluded}]
    else:
        names = [_last(x) for x in (targets if "target_modules" in body else list(DEFAULT_TARGETS))]
    if any(("*" in x or "." in x) for x in targets + excluded):
        notes.append("LoRA targets given as module paths are read by their last name, in every layer")
    dtype = body.get("lora_dtype")
    if isinstance(dtype, dict):
        dtype = dtype.get("_target_")
    if dtype is not None and dtype not in _DTYPES:
        raise InputError(f"{where}.lora_dtype", f"must be a torch dtype such as torch.bfloat16, got "
                                                f"{short(dtype)}")
    out = {"scheme": "dora" if target == DORA else "lora", "dim": dim, "alpha": body.get("alpha"),
           "dropout": float(dropout), "dropout_position": position, "targets": sorted(set(names)),
           "normalize_moe_lora": _flag(body, "normalize_moe_lora", False, where),
           "share_expert_adapters": _flag(body, "share_expert_adapters", True, where),
           "experts_shared_outer_loras": _flag(body, "experts_shared_outer_loras", False, where),
           "sequence_parallel_input_regather": _flag(body, "sequence_parallel_input_regather", False, where),
           "dtype_bytes": _DTYPES.get(dtype) if dtype is not None else None}
    what = "DoRA (read as LoRA)" if target == DORA else "LoRA"
    notes.insert(0, f"{what} rank {dim} on {', '.join(out['targets']) or 'no module'}: the base weights are "
                    "frozen (no gradient buffer, no optimizer state); adapters, their gradients and "
                    "optimizer state, and what they keep for backward are planned (memory/lora.py)")
    if target == DORA:
        notes.append("DoRA's magnitude vectors and the weight-norm activations it adds are not modelled")
    if out["experts_shared_outer_loras"]:
        notes.append("LoRA experts_shared_outer_loras is read as one adapter per EP rank (its outer "
                     "lora_A / lora_B sharing is not modelled)")
    return out, notes
