"""The TransformerConfig a workload becomes on the installed megatron-core: the class, the keyword
arguments and the activation function object, as a Bridge provider hands them over.

rules/live.py constructs it to let megatron-core's own validation decide; rules/bridge_live.py
hands the same keyword arguments to Bridge's provider. Nothing here imports torch or megatron
until asked.
"""

from __future__ import annotations

import dataclasses
import warnings

# Workload fields a release may lack: when set they are passed anyway, so the installed
# TransformerConfig refuses them as it would (TypeError: unexpected keyword argument).
ABSENT_FIELD_RULES = frozenset({"cuda_graph_modules"})   # cuda-graph-modules-not-in-release


def te_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def _activation(name: str):
    """The function object a Bridge provider hands TransformerConfig for activation `name`.

    TransformerConfig tests activations by identity (`self.activation_func == quick_gelu`,
    `not in [F.gelu, F.silu, quick_gelu]`, transformer_config.py:2115-2134 @ megatron-core 0.19.2),
    against the names its own module imports: quick_gelu from fusions/fused_bias_geglu
    (transformer_config.py:31 @ 0.19.2, :15 @ core_v0.16.1), which is also the one Bridge's GPT-OSS
    provider sets (models/gpt_oss/gpt_oss_bridge.py:37,82 @ megatron-bridge 0.6.2). The same-named
    function in megatron/core/activations.py is another object and fails those tests, so a name is
    looked up in the config module first, then torch, then activations.py.
    """
    import torch.nn.functional as F

    if name in ("silu", "gelu", "relu", "sigmoid", "tanh"):
        return getattr(F, name)
    if name in ("squared_relu", "quick_gelu", "fast_gelu", "erf_gelu"):
        from megatron.core import activations
        from megatron.core.transformer import transformer_config

        fn = getattr(transformer_config, name, None) or getattr(activations, name, None)
        if callable(fn):
            return fn
    return F.gelu


def config_kwargs(w) -> tuple:
    """(config class, kwargs) for the installed megatron-core."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # import-time notices about missing TE / Apex
        import torch
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if w.multi_latent_attention else TransformerConfig
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in w.model_fields().items():
        if key not in names and not (key in ABSENT_FIELD_RULES and value is not None):
            # a field this megatron-core does not have (e.g. MLA dims on a GQA model); a
            # release-dependent Workload field that is set goes through, to fail as it would
            continue
        if key in ("cuda_graph_scope", "cuda_graph_modules") and value is None:
            continue   # unset: the release's own default
        kwargs[key] = list(value) if isinstance(value, list) else value   # __post_init__ mutates lists
    kwargs["activation_func"] = _activation(w.activation_func)
    if kwargs.get("offload_modules") is None and "offload_modules" in names:
        kwargs["offload_modules"] = []
    if w.pipeline_model_parallel_size > 1:
        kwargs["pipeline_dtype"] = torch.bfloat16
    if kwargs.get("apply_rope_fusion") and not te_importable():
        # This check only asks whether TE's fused RoPE kernel imports on *this* machine
        # (tc:1544-1552 @ core_v0.16.1); raising here would also hide every later check
        # (CUDA graphs, EP overlap). Construct without it and say it was not decided.
        kwargs["apply_rope_fusion"] = False
    return cls, kwargs
