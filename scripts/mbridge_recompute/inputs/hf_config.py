"""Hugging Face `config.json` -> Megatron-Core `model:` fields (`--hf-config PATH`).

Only the architecture is read: dimensions, attention layout (GQA, MLA), MLP
kind, MoE layout, hybrid pattern. Sequence length, parallelism and batch are
run choices and stay with the workload. Keys that are neither mapped nor known
to be irrelevant (tokenizer ids, dtype, RoPE scaling, init ...) are ignored with
one note on stderr, so a new architecture never fails silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs.values import MAX_INT, short
from mbridge_recompute.workload import FIELDS

# HF key -> MCore field, copied as-is when present.
DIRECT = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_query_groups",
    "intermediate_size": "ffn_hidden_size",
    "head_dim": "kv_channels",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "share_embeddings_and_output_weights",
    "attention_dropout": "attention_dropout",
    # MoE
    "num_experts_per_tok": "moe_router_topk",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    # MLA (DeepSeek-V2/V3, Moonlight, Kimi)
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_head_dim",
    "qk_rope_head_dim": "qk_pos_emb_head_dim",
    "v_head_dim": "v_head_dim",
    # Nemotron-H hybrid
    "hybrid_override_pattern": "hybrid_override_pattern",
    "mamba_num_heads": "mamba_num_heads",
    "mamba_head_dim": "mamba_head_dim",
    "ssm_state_size": "mamba_state_dim",
    "n_groups": "mamba_num_groups",
    "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
}
# Expert-count key per family: Mixtral, Qwen2/3-MoE, DeepSeek / Nemotron-H.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Keys read by the special cases below.
HANDLED = {"hidden_act", "mlp_hidden_act", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
           "norm_eps", "attention_bias", "mlp_bias", "n_shared_experts", "shared_expert_intermediate_size",
           "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
           "num_nextn_predict_layers", "model_type", "qk_norm", "use_qk_norm", "architectures",
           *EXPERT_KEYS}
# Keys that do not change activation or parameter memory: ignored without a note.
IRRELEVANT = {
    "_name_or_path", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
    "dtype", "transformers_version", "use_cache", "initializer_range", "max_position_embeddings",
    "rope_theta", "rope_scaling", "rope_parameters", "sliding_window", "use_sliding_window",
    "max_window_layers", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "aux_loss_alpha", "seq_aux", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
    "topk_method", "n_group", "topk_group", "ep_size", "quantization_config", "bias",
    "pretraining_tp", "tokenizer_class", "generation_config", "chat_template", "residual_in_fp32",
    "rescale_prenorm_residual", "time_step_min", "time_step_max", "time_step_floor",
    "time_step_limit", "conv_kernel", "chunk_size", "use_conv_bias", "use_bias", "expand",
    "mamba_hidden_act", "mamba_proj_bias", "num_logits_to_keep", "rope_interleave",
    "layer_types", "attention_head_dim", "embedding_multiplier", "mtp_hidden_act",
}
# Families whose attention has per-head q/k norms without saying so in config.json: their
# Hugging Face attention modules build q_norm/k_norm unconditionally, and Megatron-Bridge sets
# qk_layernorm=True for them (models/qwen/qwen3_bridge.py:56 @ Megatron-Bridge 04c9ff7).
QK_NORM_MODEL_TYPES = {"qwen3", "qwen3_moe", "olmo2", "olmoe"}
# Gemma's MLP is gated (gate_proj * up_proj) although hidden_act names only the gelu.
GATED_GELU_MODEL_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text"}


def _read(path: Path) -> dict:
    where = "--hf-config"
    from mbridge_recompute import files

    data = files.read_json(path, where, "hf config")
    if not isinstance(data, dict):
        raise InputError(where, f"{path} must hold a JSON object (a Hugging Face config.json)")
    # Multimodal configs nest the language model.
    if "num_hidden_layers" not in data and isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type",
                                                                             data.get("model_type"))}
    return data


# Counts the memory model walks one by one: refused before any per-layer list is built (the
# Workload field's own limit), and the bound on every other integer.
MAX_LAYERS = FIELDS["num_layers"].metadata["limit"]
# The ignored-keys note names at most this many keys (a config.json may hold thousands)
MAX_NAMED_KEYS = 20


def _bad(path: Path, key: str, reason: str):
    """An error naming the config.json key (not the Megatron field it maps to)."""
    return InputError("--hf-config", f"{path}: {key} {reason}")


def _int(data: dict, key: str, path: Path, positive: bool = False) -> Any:
    value = data[key]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, key, f"must be a non-negative integer, got {short(value)}")
    if positive and value == 0:
        raise _bad(path, key, "must be positive, got 0")
    if value > MAX_INT:
        raise _bad(path, key, f"must be at most {MAX_INT}, got {short(value)}")
    return value


# config.json keys of a non-integer type, checked before they are used
_STRING_KEYS = ("hybrid_override_pattern", "hidden_act", "mlp_hidden_act", "model_type")
_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qk_norm", "use_qk_norm")


def _check_types(data: dict, path: Path) -> None:
    for key in _STRING_KEYS:
        if data.get(key) is not None and not isinstance(data[key], str):
            raise _bad(path, key, f"must be a string, got {short(data[key])}")
    for key in _BOOL_KEYS:
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise _bad(path, key, f"must be true or false, got {short(data[key])}")
    dense = data.get("mlp_only_layers")
    if dense is not None and (not isinstance(dense, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in dense)):
        raise _bad(path, "mlp_only_layers", f"must be a list of layer indices, got {short(dense)}")
    dropout = data.get("attention_dropout")
    if dropout is not None and (isinstance(dropout, bool) or not isinstance(dropout, (int, float))
                                or not 0 <= dropout < 1):
        raise _bad(path, "attention_dropout", f"must be a number in [0, 1), got {short(dropout)}")
    layers = data.get("num_hidden_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_LAYERS:
        raise _bad(path, "num_hidden_layers", f"must be at most {MAX_LAYERS}, got {short(layers)}")
    pattern = data.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        if len(pattern) > MAX_LAYERS:
            raise _bad(path, "hybrid_override_pattern", f"has {len(pattern)} layers; at most {MAX_LAYERS}")
        from mbridge_recompute.facts import releases

        symbols = releases.enum_union("hybrid_layer_symbols")
        bad = sorted(set(pattern) - symbols)
        if bad:
            valid = " ".join(sorted(symbols))
            raise _bad(path, "hybrid_override_pattern", f"holds {bad[0]!r}, not a layer symbol of any "
                                                        f"megatron-core release (valid: {valid})")


def convert(data: dict, path: Path = Path("config.json")) -> tuple[dict, list[str]]:
    """Map a parsed config.json onto MCore fields. Returns (fields, notes)."""
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        if key not in data:
            raise InputError("--hf-config", f"{path}: missing {key!r} (not a decoder LM config.json?)")
        if data[key] is None:
            raise _bad(path, key, "must be a positive integer, got None")
    _check_types(data, path)
    out: dict[str, Any] = {}
    notes: list[str] = []
    from mbridge_recompute.inputs.values import coerce, coerce_extra
    from mbridge_recompute.workload import FIELD_NAMES

    for hf_key, field in DIRECT.items():
        if hf_key in data and data[hf_key] is not None:
            value = data[hf_key]
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if is_number and field != "attention_dropout":
                value = _int(data, hf_key, path)
            # checked here, so an error names the config.json key, not the Megatron field
            try:
                value = (coerce if field in FIELD_NAMES else coerce_extra)(field, value, hf_key)
            except InputError as exc:
                raise _bad(path, hf_key, exc.reason) from None
            out[field] = value
        elif hf_key == "q_lora_rank" and hf_key in data:
            out[field] = None                      # Moonlight: no q compression
    model_type = str(data.get("model_type", ""))

    # MLP kind. silu/swish MLPs of these families are gated (SwiGLU: gate and up projections).
    act = data.get("mlp_hidden_act") or data.get("hidden_act")
    if act in ("silu", "swish"):
        out.update(gated_linear_unit=True, activation_func="silu")
    elif isinstance(act, str) and act.startswith("gelu"):
        out.update(gated_linear_unit=model_type in GATED_GELU_MODEL_TYPES, activation_func="gelu")
    elif act in ("relu2", "squared_relu"):
        out.update(gated_linear_unit=False, activation_func="squared_relu")
    elif act is not None:
        notes.append(f"hidden_act {act!r} has no MCore mapping here; left at the workload's value")
    if any(k in data for k in ("rms_norm_eps",)) or model_type.startswith("nemotron_h"):
        out["normalization"] = "RMSNorm"
    elif any(k in data for k in ("layer_norm_eps", "layer_norm_epsilon")):
        out["normalization"] = "LayerNorm"
    if "attention_bias" in data or "mlp_bias" in data:
        out["add_bias_linear"] = bool(data.get("attention_bias")) or bool(data.get("mlp_bias"))
    elif "rms_norm_eps" in data:
        out["add_bias_linear"] = False             # Llama-family configs without bias keys have none
    if data.get("qk_norm") or data.get("use_qk_norm") or model_type in QK_NORM_MODEL_TYPES:
        out["qk_layernorm"] = True
    if "kv_lora_rank" in data and data["kv_lora_rank"]:
        out["multi_latent_attention"] = True
        out["qk_layernorm"] = True                 # MLA's q_a / kv_a latent norms
        out.pop("num_query_groups", None)          # MLA has no query groups
    if data.get("num_nextn_predict_layers"):
        try:       # the Workload field's own bound (a depth the model walks layer by layer)
            out["mtp_num_layers"] = coerce("mtp_num_layers", _int(data, "num_nextn_predict_layers", path),
                                           "num_nextn_predict_layers")
        except InputError as exc:
            raise _bad(path, "num_nextn_predict_layers", exc.reason) from None

    # MoE.
    experts_key = next((k for k in EXPERT_KEYS if data.get(k)), None)
    if experts_key:
        experts = _int(data, experts_key, path)
        out["num_moe_experts"] = experts
        if "moe_ffn_hidden_size" not in out and "ffn_hidden_size" in out:
            out["moe_ffn_hidden_size"] = out["ffn_hidden_size"]   # Mixtral: experts use intermediate_size
        if data.get("n_shared_experts"):
            out["moe_shared_expert_intermediate_size"] = (
                _int(data, "n_shared_experts", path) * out.get("moe_ffn_hidden_size", 0))
        if data.get("shared_expert_intermediate_size"):
            out["moe_shared_expert_intermediate_size"] = _int(data, "shared_expert_intermediate_size", path)
        if "hybrid_override_pattern" not in out:
            out["moe_layer_freq"] = _moe_pattern(data, out["num_layers"], path)
        # Training choices, not architecture: as Bridge's MoE providers set them.
        out["moe_grouped_gemm"] = True
        out["moe_token_dispatcher_type"] = "alltoall"
        notes.append("moe_grouped_gemm=true and moe_token_dispatcher_type=alltoall assumed "
                     "(training choices, not in config.json; override with --set)")
    if "hybrid_override_pattern" in out:
        out["num_layers"] = len(out["hybrid_override_pattern"])

    unknown = sorted(k for k in data if k not in DIRECT and k not in HANDLED and k not in IRRELEVANT
                     and k != "text_config")
    if unknown:
        from mbridge_recompute.errors import clip

        # one line whatever a key holds; other controls and format characters are escaped where
        # the note is printed (output.safe_text)
        shown = ", ".join(clip(k.replace("\n", "\\n").replace("\t", "\\t"), 60)
                          for k in unknown[:MAX_NAMED_KEYS])
        more = f" and {len(unknown) - MAX_NAMED_KEYS} more" if len(unknown) > MAX_NAMED_KEYS else ""
        notes.append(f"ignored keys not used by the memory model: {shown}{more}")
    return out, notes


def _moe_pattern(data: dict, num_layers: int, path: Path) -> list[int]:
    """Per-layer 1 = MoE, 0 = dense, as MCore's list form of moe_layer_freq."""
    if "first_k_dense_replace" in data or "moe_layer_freq" in data:
        # DeepSeek: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
        k = _int(data, "first_k_dense_replace", path) if "first_k_dense_replace" in data else 0
        if k is not None and k > num_layers:
            # as a workload's own first_k_dense_replace is checked (inputs/loading.py): more dense
            # layers than layers would make an MoE model without one MoE layer
            raise _bad(path, "first_k_dense_replace", f"must be an integer from 0 to num_hidden_layers="
                                                      f"{num_layers}, got {k}")
        freq = _int(data, "moe_layer_freq", path, positive=True) if "moe_layer_freq" in data else 1
        return [1 if i >= (k or 0) and i % max(1, freq or 1) == 0 else 0 for i in range(num_layers)]
    # Qwen2/3-MoE: MoE unless listed in mlp_only_layers, every decoder_sparse_step-th layer.
    step = _int(data, "decoder_sparse_step", path, positive=True) if "decoder_sparse_step" in data else 1
    dense = set(data.get("mlp_only_layers") or [])
    return [0 if i in dense or (i + 1) % max(1, step or 1) else 1 for i in range(num_layers)]


def read(path) -> tuple[dict, list[str]]:
    """Fields and notes for the config.json at `path`."""
    return convert(_read(Path(path)), Path(path))


def model_fields(path) -> dict:
    """MCore `model:` fields for the config.json at `path`; notes go to stderr."""
    fields, notes = read(path)
    if notes:
        from mbridge_recompute.output import warn

        for note in notes:
            warn(f"note: --hf-config {path}: {note}")
    return fields
