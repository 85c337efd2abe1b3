"""Inputs -> Workload: the only place where input is parsed and validated.

Sources, applied in this order (later wins): a catalog model (`--model`), a
Hugging Face `config.json` (`--hf-config`), a workload YAML (our schema or a
Bridge config dump), then `--set key=value` overrides in Hydra syntax.

Every problem raises `InputError(field, reason)`: exit 2, one line, the field
named as the user wrote it. Nothing here imports torch or megatron.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from mbridge_recompute import DATA_DIR
from mbridge_recompute.errors import InputError
from mbridge_recompute.facts import releases
from mbridge_recompute.workload import FIELD_NAMES, FIELDS, Workload, section_fields

DATA = DATA_DIR

# Sections of a Bridge ConfigContainer dump that the tools do not read; their keys
# are not checked (they cannot be, without Bridge importable). The optimizer section is
# read for the OPTIMIZER_KEYS only (its other keys pass unchecked).
IGNORED_SECTIONS = frozenset({
    "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "rng",
    "profiling", "ft", "straggler", "nvrx_straggler", "rerun_state_machine", "peft",
    "inprocess_restart", "mixed_precision", "tensor_inspect", "mixed_precision_config",
    "train_config", "energy_monitor", "dataset_config", "validation", "inference",
})
# Keys a Bridge model provider dumps that are not TransformerConfig fields.
BRIDGE_MODEL_KEYS = frozenset({
    "_target_", "seq_length", "vocab_size", "make_vocab_size_divisible_by",
    "share_embeddings_and_output_weights", "position_embedding_type", "rotary_base",
    "rotary_percent", "rope_scaling", "rope_scaling_factor", "seq_len_interpolation_factor",
    "fp16_lm_cross_entropy", "parallel_output", "transformer_layer_spec", "generation_config",
    "hybrid_override_pattern", "mamba_num_groups", "mamba_head_dim", "mamba_state_dim",
    "mamba_num_heads", "hf_model_id", "should_pad_vocab", "scatter_embedding_sequence_parallel",
    "tp_comm_overlap_cfg", "use_transformer_engine_full_layer_spec", "use_te_rng_tracker",
    "qk_layernorm", "vocab_size_divisible_by", "moe_layer_freq", "first_k_dense_replace",
    "restore_modelopt_state", "init_model_with_meta_device", "cross_entropy_loss_fusion",
    "attention_backend", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "vp_stage", "mtp_enabled", "mamba_stack_spec",
})
TRAIN_OTHER_KEYS = frozenset({
    "train_iters", "train_samples", "eval_iters", "eval_interval", "exit_interval",
    "exit_duration_in_mins", "exit_signal_handler", "manual_gc", "manual_gc_interval",
    "manual_gc_eval", "rampup_batch_size", "decrease_batch_size_if_needed", "empty_unused_memory_level",
    "check_weight_hash_across_dp_replicas_interval", "skip_train", "exit_signal",
    "train_sync_interval", "iterations_to_skip", "check_optimizer_step_success",
})
DDP_OTHER_KEYS = frozenset({
    "overlap_grad_reduce", "overlap_param_gather", "align_param_gather", "use_custom_fsdp",
    "data_parallel_sharding_strategy", "bucket_size", "average_in_collective",
    "check_for_nan_in_grad", "check_for_large_grads", "use_megatron_fsdp",
    "num_distributed_optimizer_instances", "fp8_param_gather", "nccl_ub",
    "keep_fp8_transpose_cache", "reuse_grad_buf_for_mxfp8_param_ag",
    "pad_buckets_for_high_nccl_busbw", "reduce_scatter_with_fp32_accumulation",
    "preserve_fp32_weights", "suggested_communication_unit_size", "gradient_reduce_div_fusion",
    "fsdp_double_buffer", "outer_dp_sharding_strategy", "disable_symmetric_registration",
})


@lru_cache(maxsize=1)
def mcore_field_names() -> frozenset:
    lines = (DATA / "mcore_fields.txt").read_text().splitlines()
    return frozenset(x.strip() for x in lines if x.strip() and not x.startswith("#"))


def _known_model_keys() -> frozenset:
    return FIELD_NAMES | mcore_field_names() | BRIDGE_MODEL_KEYS


def _suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------- coercion
# Bounds on counts. Sizes are multiplied as Python ints and the model walks every layer and
# every micro-batch one by one, so an extra run of digits would surface as an OverflowError,
# a MemoryError or a run that never ends; these bounds make it exit 2 naming the field.
# 2**31 - 1 is far above any real size (it bounds float figures such as cluster.gpu_memory_gb
# too, whose bytes would otherwise overflow to inf); the layer and micro-batch bounds keep
# `plan` within seconds to minutes per pipeline stage.
MAX_INT = 2**31 - 1
MAX_MICROBATCHES = 1_000_000
_HINTS = typing.get_type_hints(Workload)

# TransformerConfig fields outside Workload that the memory model reads (memory/shape.py,
# memory/peak.py): checked here like Workload fields, so a bad value is exit 2 naming it
# rather than a ValueError deep in the model. The others are passed through untouched.
_EXTRA_SIZES = frozenset({"microbatch_group_size_per_vp_stage", "mamba_head_dim", "mamba_num_heads",
                          "mamba_num_groups", "mamba_state_dim", "linear_num_key_heads",
                          "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"})
_EXTRA_FLAGS = frozenset({"bias_activation_fusion", "use_te_activation_func",
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
_DTYPE_FIELDS = tuple(n for n, f in FIELDS.items() if f.metadata.get("kind") == "dtype")



def _optional(hint) -> tuple[bool, Any]:
    """(None allowed, the type without None) for Optional[X], X | None and plain X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return True, args[0] if len(args) == 1 else typing.Union[tuple(args)]
    return False, hint


def _coerce(name: str, value: Any, where: str) -> Any:
    """Convert one value to the Workload field's declared type, or raise naming `where`."""
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
    if kind == "version" and isinstance(value, (int, float)) and not isinstance(value, bool):
        # YAML reads 2.8 as a number and 2.10 as 2.1: a version must stay text
        raise InputError(where, f"write the version as text, e.g. 2.8.0 or \"2.8\" "
                                f"(YAML reads a bare {value!r} as a number; 2.10 would become 2.1)")
    if kind == "labels" and not isinstance(value, (list, tuple)):
        raise InputError(where, f"must be a list of labels, got {type(value).__name__} {value!r}"
                         " (megatron-core iterates a string character by character)")
    if kind == "enum" and isinstance(value, str) and "." in value:
        value = value.rsplit(".", 1)[1]           # AttnBackend.flash -> flash
    return _coerce_type(hint, value, where, meta)


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
            return [v.strip() for v in value]
        if meta.get("kind") == "layer-mask" and not all(
                isinstance(v, int) and not isinstance(v, bool) and v in (0, 1) for v in value):
            raise InputError(where, "a list must hold 0/1 per layer")
        return [_coerce_type(item, v, where, {}) for v in value]
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise InputError(where, f"must be one of {', '.join(choices)}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise InputError(where, f"must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise InputError(where, f"must be an integer, got {value!r}")
        _check_bounds(value, where, meta)
        limit = meta.get("limit")
        if limit is not None and value > limit:
            raise InputError(where, f"must be at most {limit}, got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(where, f"must be a number, got {value!r}")
        if not abs(value) <= MAX_INT:   # written so that nan fails too (YAML reads .nan, .inf)
            raise InputError(where, f"must be a finite number of at most {MAX_INT}, got {value}")
        _check_bounds(value, where, meta)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise InputError(where, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"Workload field type {hint!r} has no reader")   # a new field needs one


def _check_bounds(value, where: str, meta) -> None:
    bound = meta.get("bound")
    if bound == "positive" and value <= 0:
        raise InputError(where, f"must be positive, got {value}")
    if bound == "count" and value < 0:
        raise InputError(where, f"must be zero or more, got {value}")
    if bound == "fraction" and not 0 <= value < 1:
        raise InputError(where, f"must be in [0, 1), got {value}")
    if abs(value) > MAX_INT:
        raise InputError(where, f"must be at most {MAX_INT}, got {value}")


def _coerce_extra(name: str, value: Any, where: str) -> Any:
    if value is None:
        return None
    if name in _EXTRA_SIZES and (isinstance(value, bool) or not isinstance(value, int)
                                 or not 0 < value <= MAX_INT):
        raise InputError(where, f"must be a positive integer of at most {MAX_INT}, got {value!r}")
    if name in _EXTRA_FLAGS and not isinstance(value, bool):
        raise InputError(where, f"must be true or false, got {value!r}")
    return value


def _dtype_name(value: Any, where: str) -> str:
    if isinstance(value, dict) and "_target_" in value:
        value = value["_target_"]
    key = value.strip().lower().removeprefix("torch.") if isinstance(value, str) else None
    if key not in _DTYPE_NAMES:
        raise InputError(where, f"must be a dtype such as fp32, bf16, fp16 or fp8 (torch.uint8), "
                                f"got {value!r}")
    return _DTYPE_NAMES[key]


def _activation_name(value: Any, where: str) -> str:
    if isinstance(value, dict) and "_target_" in value:
        value = value["_target_"]
    if not isinstance(value, str):
        raise InputError(where, f"must be a function name such as silu or gelu, got {value!r}")
    return value.rsplit(".", 1)[-1].split(" ")[0].strip("<>")


# ---------------------------------------------------------------- sources
def read_text(path, where: str) -> str:
    """A user's input file as text, or InputError naming `where`."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(where, f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(where, f"cannot read {path}: {exc.__class__.__name__}") from None


def _read_yaml(path: Path, where: str) -> dict:
    import yaml  # light; imported only when a file is read

    text = read_text(path, where)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise InputError(where, f"not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(where, "must be a mapping with sections such as model:, train:, cluster:")
    return data


def _sections_to_fields(data: dict, origin: str) -> tuple[dict, dict]:
    """Map the file's sections onto Workload fields. Returns (fields, extra_model)."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    unread: dict[str, Any] = {}
    mapped = {"train": (section_fields("train"), TRAIN_OTHER_KEYS),
              "ddp": (section_fields("ddp"), DDP_OTHER_KEYS),
              "comm_overlap": (section_fields("comm_overlap"), None),
              "cluster": (section_fields("cluster"), frozenset()),
              "optimizer": (section_fields("optimizer"), None)}
    for section, body in data.items():
        where = f"{origin}{section}"
        if section == "model":
            if not isinstance(body, dict):
                raise InputError(where, "must be a mapping of TransformerConfig fields")
            known = _known_model_keys()
            for key, value in body.items():
                kw = f"{where}.{key}"
                if key in FIELD_NAMES:
                    fields[key] = _coerce(key, value, kw)
                elif key == "first_k_dense_replace":
                    fields.setdefault("_first_k_dense", (value, kw))
                elif key in known:
                    if key in mcore_field_names():
                        extra[key] = _coerce_extra(key, value, kw)
                    else:
                        unread[key] = value
                else:
                    raise InputError(kw, f"unknown model field{_suggest(key, known)}")
        elif section in mapped:
            ours, others = mapped[section]
            if not isinstance(body, dict):
                raise InputError(where, "must be a mapping")
            for key, value in body.items():
                kw = f"{where}.{key}"
                if key in ours:
                    fields[key] = _coerce(key, value, kw)
                elif others is None or key in others:
                    unread[f"{section}.{key}"] = value
                else:
                    raise InputError(kw, f"unknown {section} field"
                                     f"{_suggest(key, set(ours) | set(others))}")
        elif section in IGNORED_SECTIONS or section.startswith("_"):
            continue
        else:
            top = {"model", "train", "ddp", "comm_overlap", "cluster", "optimizer"} | IGNORED_SECTIONS
            raise InputError(where, f"unknown section{_suggest(section, top)}")
    fields["unread"] = unread
    return fields, extra


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one Hydra-style `key=value`. Values use YAML scalars/flow lists: null, true, [a,b]."""
    import yaml

    if "=" not in text:
        raise InputError(f"--set {text}", "expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not key:
        raise InputError(f"--set {text}", "empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if key.endswith("recompute_modules") and isinstance(value, str) and value not in ("",):
        value = [v.strip() for v in value.split(",")]  # the harness flag's comma form
    return key, value


def _apply_overrides(data: dict, overrides: Iterable[str]) -> None:
    for text in overrides:
        key, value = parse_override(text)
        parts = key.split(".")
        if len(parts) == 1:
            section = next((sec for sec in ("cluster", "train") if parts[0] in section_fields(sec)),
                           "model")
            parts = [section, parts[0]]
        if len(parts) != 2:
            raise InputError(f"--set {key}", "expected section.key (e.g. model.recompute_modules)")
        data.setdefault(parts[0], {})
        if not isinstance(data[parts[0]], dict):
            raise InputError(f"--set {key}", f"section {parts[0]} is not a mapping")
        data[parts[0]][parts[1]] = value


def _merge(base: dict, top: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def load_workload(path: str | None = None, sets: Iterable[str] = (), model: str | None = None,
                  hf_config: str | None = None, mcore_version: str | None = None,
                  default: bool = False) -> Workload:
    """Build and validate a Workload. `default=True` starts from the embedded default workload."""
    data: dict = {}
    if default and not (path or model or hf_config):
        data = _read_yaml(DATA / "default_workload.yaml", "default workload")
    if model:
        from mbridge_recompute.inputs import catalog

        data = _merge(data, catalog.model_sections(model))
    if hf_config:
        from mbridge_recompute.inputs import hf_config as hf

        data = _merge(data, {"model": hf.model_fields(Path(hf_config))})
    if path:
        data = _merge(data, _read_yaml(Path(path), path))
    _apply_overrides(data, sets)
    fields, extra = _sections_to_fields(data, "")
    first_k = fields.pop("_first_k_dense", None)
    if first_k is not None and "moe_layer_freq" not in fields:
        value, where = first_k
        n = fields.get("num_layers", Workload.num_layers)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= n:
            raise InputError(where, f"must be an integer from 0 to num_layers={n}, got {value!r}")
        fields["moe_layer_freq"] = [0] * value + [1] * (n - value)
    workload = Workload(**fields, extra_model=extra)
    validate(workload, mcore_version or releases.target_version())
    return workload


def validate(w: Workload, version: str) -> None:
    """Consistency checks that make a workload meaningless (exit 2), not constraint findings."""
    if w.gpu is not None:
        from mbridge_recompute.facts.gpus import resolve

        resolve(w.gpu)           # an unknown GPU name: exit 2 listing the known ones
    tp = w.tensor_model_parallel_size
    if w.num_attention_heads % tp:
        raise InputError("model.tensor_model_parallel_size",
                         f"{tp} does not divide num_attention_heads={w.num_attention_heads}")
    if w.num_query_groups and w.num_attention_heads % w.num_query_groups:
        raise InputError("model.num_query_groups",
                         f"{w.num_query_groups} does not divide num_attention_heads="
                         f"{w.num_attention_heads}")
    # Where layers sit (and which splits megatron-core rejects) is placement.py's: a rejected
    # split is a checker finding with megatron-core's message, not unusable input.
    for field, name in (("model.cuda_graph_scope", "cuda_graph_scope"),
                        ("model.cuda_graph_modules", "cuda_graph_modules")):
        known = releases.enum(name, version)
        given = getattr(w, name)
        if given is None or not known:
            continue      # not set, or not a field of this release (a checker finding)
        names = [x.strip() for x in (given.split(",") if isinstance(given, str) else given)]
        unknown = [x for x in names if x not in known]
        if unknown:
            # megatron-core raises a bare KeyError (CudaGraphScope[name], tc:1711 @ core_v0.16.1;
            # CudaGraphModule[name], cgc:57 @ core_v0.18.2)
            raise InputError(field, f"unknown name {unknown[0]!r}{_suggest(unknown[0], known)} for "
                                    f"megatron-core {releases.resolve_version(version)}; valid: "
                                    f"{', '.join(known)}")
    if w.num_microbatches > MAX_MICROBATCHES:
        raise InputError("train.global_batch_size",
                         f"{w.global_batch_size} makes {w.num_microbatches} micro-batches per step; "
                         f"at most {MAX_MICROBATCHES}")
    if isinstance(w.moe_layer_freq, list) and len(w.moe_layer_freq) != w.num_layers:
        raise InputError("model.moe_layer_freq",
                         f"has {len(w.moe_layer_freq)} entries for num_layers={w.num_layers}")
    if w.is_moe and w.num_moe_experts % w.expert_model_parallel_size:
        raise InputError("model.expert_model_parallel_size",
                         f"{w.expert_model_parallel_size} does not divide num_moe_experts="
                         f"{w.num_moe_experts}")
    if w.is_moe and w.moe_router_topk > w.num_moe_experts:
        raise InputError("model.moe_router_topk",
                         f"{w.moe_router_topk} exceeds num_moe_experts={w.num_moe_experts}")
    if w.num_gpus and w.num_gpus % w.model_parallel_size:
        raise InputError("cluster.num_gpus",
                         f"{w.num_gpus} is not a multiple of TP*PP*CP={w.model_parallel_size}")
    if not w.use_precision_aware_optimizer:
        # MCore asserts these (optimizer/optimizer_config.py:414-426 @ core_v0.16.1)
        for name in _DTYPE_FIELDS:
            if getattr(w, name) != "fp32":
                raise InputError(f"optimizer.{name}",
                                 f"{getattr(w, name)} needs use_precision_aware_optimizer=true "
                                 "(megatron-core allows only fp32 without it)")
    elif not w.use_distributed_optimizer:
        # optimizer/optimizer_config.py:379-381 @ core_v0.16.1
        raise InputError("optimizer.use_precision_aware_optimizer",
                         "needs the distributed optimizer (use_distributed_optimizer=true)")
    if w.recompute_granularity not in (None, "selective", "full"):
        # MCore raises too, but with a typo'd message; name the field here.
        raise InputError("model.recompute_granularity",
                         f"must be selective, full or null, got {w.recompute_granularity!r}")
    if w.recompute_method not in (None, "uniform", "block"):
        raise InputError("model.recompute_method",
                         f"must be uniform, block or null, got {w.recompute_method!r}")
    if w.recompute_granularity == "selective" and w.recompute_modules:
        releases.require_known(w.recompute_modules, version, "model.recompute_modules")


def read_json(path: str, where: str) -> Any:
    text = read_text(path, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None


def add_workload_arguments(parser) -> None:
    """Options shared by every workload-taking tool."""
    parser.add_argument("workload", nargs="?", metavar="WORKLOAD.yaml",
                        help="workload file (our schema or a Bridge config dump)")
    parser.add_argument("--model", metavar="NAME", help="start from a catalog model")
    parser.add_argument("--hf-config", metavar="PATH", help="architecture from a Hugging Face config.json")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override, Hydra syntax: model.recompute_modules=[moe_act] (repeatable)")
    parser.add_argument("--mcore-version", metavar="VER",
                        help="megatron-core version to check labels against "
                             "(default: the installed one, else 0.16.1)")
