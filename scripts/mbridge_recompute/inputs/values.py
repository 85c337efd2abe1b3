"""Field values as a workload holds them: each coerced to its field's type and bounds, or an
InputError naming the field (exit 2).

The Workload dataclass's annotations say each field's type; a field's metadata adds its kind
(size, dtype, version, ...) and bounds. TransformerConfig fields outside Workload that the
memory model reads are checked the same way (`coerce_extra`). Nothing here imports torch or
megatron.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from mbridge_recompute.errors import InputError
from mbridge_recompute.workload import FIELDS, HYBRID_KINDS, TE_ABSENT, Workload

# Bounds on counts. Sizes are multiplied as Python ints and the model walks every layer and
# every micro-batch one by one, so an extra run of digits would surface as an OverflowError,
# a MemoryError or a run that never ends; these bounds make it exit 2 naming the field.
# 2**31 - 1 is far above any real size (it bounds float figures such as cluster.gpu_memory_gb
# too, whose bytes would otherwise overflow to inf); the layer and micro-batch bounds keep
# `plan` within seconds to minutes per pipeline stage.
MAX_INT = 2**31 - 1
MAX_MICROBATCHES = 1_000_000
MAX_SET_CHARS = 100_000
_HINTS = typing.get_type_hints(Workload)
# A number in exponent form without a dot (1e308, 5e-1): YAML 1.1's float needs the dot, so
# PyYAML hands it over as text
_EXPONENT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")

# TransformerConfig fields outside Workload that the memory model reads (memory/shape.py,
# memory/peak.py): checked here like Workload fields, so a bad value is exit 2 naming it
# rather than a ValueError deep in the model. The others are passed through untouched.
EXTRA_SIZES = frozenset({"microbatch_group_size_per_vp_stage", "mamba_head_dim", "mamba_num_heads",
                          "mamba_num_groups", "mamba_state_dim", "linear_num_key_heads",
                          "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"})
EXTRA_FLAGS = frozenset({"bias_activation_fusion", "use_te_activation_func",
                          "use_fused_weighted_squared_relu", "moe_shared_expert_gate",
                          "deallocate_pipeline_outputs", "cross_entropy_loss_fusion",
                          "use_mamba_mem_eff_path", "apply_rope_fusion",
                          "account_for_embedding_in_pipeline_split",
                          "account_for_loss_in_pipeline_split"})


# Optimizer-state dtypes, normalised. A Bridge dump writes a torch dtype as
# {_target_: torch.bfloat16, _call_: false}; TE FusedAdam takes uint8 (fp8) moments.
_DTYPE_NAMES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "bfloat16": "bf16",
                "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
                "uint8": "fp8", "fp8": "fp8"}
DTYPE_FIELDS = tuple(n for n, f in FIELDS.items() if f.metadata.get("kind") == "dtype")

# The layer symbols each release accepts in a hybrid pattern are the card's
# (enums: hybrid_layer_symbols).
# Symbols the memory model lays out (workload.HYBRID_KINDS); D and + are not modelled yet.
MODELLED_SYMBOLS = "".join(HYBRID_KINDS)


def _optional(hint) -> tuple[bool, Any]:
    """(None allowed, the type without None) for Optional[X], X | None and plain X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return True, args[0] if len(args) == 1 else typing.Union[tuple(args)]
    return False, hint


def coerce(name: str, value: Any, where: str) -> Any:
    """Convert one value to Workload field `name`'s declared type, or raise naming `where`."""
    meta = FIELDS[name].metadata
    optional, hint = _optional(_HINTS[name])
    kind = meta.get("kind")
    if value is None:
        if optional:
            return None
        raise InputError(where, "must not be null")
    if kind == "function":
        return _activation_name(value, where)
    if kind == "dtype":
        return _dtype_name(value, where)
    if kind == "version":
        return _version_text(value, where)
    if kind == "labels" and not isinstance(value, (list, tuple)):
        raise InputError(where, f"must be a list of labels, got {type(value).__name__} {value!r}"
                         " (megatron-core iterates a string character by character)")
    if kind == "enum" and isinstance(value, str) and "." in value:
        value = value.rsplit(".", 1)[1]           # AttnBackend.flash -> flash
    return _coerce_type(hint, value, where, meta)


def _version_text(value: Any, where: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # YAML reads 2.8 as a number and 2.10 as 2.1: a version must stay text
        raise InputError(where, f"write the version as text, e.g. 2.8.0 or \"2.8\" "
                                f"(YAML reads a bare {value!r} as a number; 2.10 would become 2.1)")
    if not isinstance(value, str):
        raise InputError(where, f"must be a version such as 2.8.0, got {value!r}")
    from packaging.version import InvalidVersion, Version

    if value.strip().lower() in TE_ABSENT:
        return value
    try:
        Version(value)
    except InvalidVersion:
        raise InputError(where, f"{value!r} is not a version (e.g. 2.8.0; or 'none' when Transformer "
                                "Engine is absent)") from None
    return value


def _coerce_type(hint, value: Any, where: str, meta) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):          # int | list[int], str | list[str]
        scalar, seq = typing.get_args(hint)
        return _coerce_type(seq if isinstance(value, (list, tuple)) else scalar, value, where, meta)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise InputError(where, f"must be a list, got {value!r}")
        (item,) = typing.get_args(hint)
        if item is str:
            bad = [v for v in value if not isinstance(v, str) or not v.strip()]
            if bad:
                raise InputError(where, f"entries must be non-empty strings, got {bad[0]!r}")
            for v in value:
                _plain_text(v, where)
            return [v.strip() for v in value]
        if meta.get("kind") == "layer-mask" and not all(
                isinstance(v, int) and not isinstance(v, bool) and v in (0, 1) for v in value):
            raise InputError(where, "a list must hold 0/1 per layer")
        limit = meta.get("limit") or FIELDS["num_layers"].metadata["limit"]
        if len(value) > limit:
            raise InputError(where, f"has {len(value)} entries; at most {limit}")
        return [_coerce_type(item, v, where, {}) for v in value]
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise InputError(where, f"must be one of {', '.join(choices)}, got {short(value)}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise InputError(where, f"must be true or false, got {short(value)}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
                value = int(value)
            else:
                raise InputError(where, f"must be an integer, got {short(value)}")
        _check_bounds(value, where, meta)
        limit = meta.get("limit")
        if limit is not None and value > limit:
            raise InputError(where, f"must be at most {limit}, got {value}")
        return value
    if hint is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            value = float(value)        # YAML 1.1 reads 1e308 (no dot) as text; it is a number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(where, f"must be a number, got {short(value)}")
        if not abs(value) <= MAX_INT:   # written so that nan fails too (YAML reads .nan, .inf)
            raise InputError(where, f"must be a finite number of at most {MAX_INT}, got {short(value)}")
        _check_bounds(value, where, meta)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise InputError(where, f"must be a string, got {short(value)}")
        return _plain_text(value, where)
    raise TypeError(f"Workload field type {hint!r} has no reader")   # a new field needs one


def _plain_text(value: str, where: str) -> str:
    """A field's text without control, format or line-separator characters: the snippets write it
    into Python and YAML, where a newline or a right-to-left override would change what a reader
    sees or runs."""
    import unicodedata

    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            raise InputError(where, f"holds a control or invisible character (U+{ord(ch):04X}); a field's "
                                    "value is plain text")
    return value


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_bounds(value, where: str, meta) -> None:
    bound = meta.get("bound")
    if bound == "positive" and value <= 0:
        raise InputError(where, f"must be positive, got {value}")
    if bound == "count" and value < 0:
        raise InputError(where, f"must be zero or more, got {value}")
    if bound == "fraction" and not 0 <= value < 1:
        raise InputError(where, f"must be in [0, 1), got {value}")
    if abs(value) > MAX_INT:
        raise InputError(where, f"must be at most {MAX_INT}, got {short(value)}")


def coerce_extra(name: str, value: Any, where: str) -> Any:
    """Check a model field outside Workload that the memory model reads; pass the others through."""
    if value is None:
        return None
    if name in EXTRA_SIZES and (isinstance(value, bool) or not isinstance(value, int)
                                 or not 0 < value <= MAX_INT):
        raise InputError(where, f"must be a positive integer of at most {MAX_INT}, got {short(value)}")
    if name in EXTRA_FLAGS and not isinstance(value, bool):
        raise InputError(where, f"must be true or false, got {short(value)}")
    return value


def _dtype_name(value: Any, where: str) -> str:
    if isinstance(value, dict) and "_target_" in value:
        value = value["_target_"]
    key = value.strip().lower().removeprefix("torch.") if isinstance(value, str) else None
    if key not in _DTYPE_NAMES:
        raise InputError(where, f"must be a dtype such as fp32, bf16, fp16 or fp8 (torch.uint8), "
                                f"got {short(value)}")
    return _DTYPE_NAMES[key]


def _activation_name(value: Any, where: str) -> str:
    if isinstance(value, dict) and "_target_" in value:
        value = value["_target_"]
    if not isinstance(value, str) or not value.strip():
        raise InputError(where, f"must be a function name such as silu or gelu, got {short(value)}")
    return value.rsplit(".", 1)[-1].split(" ")[0].strip("<>")
