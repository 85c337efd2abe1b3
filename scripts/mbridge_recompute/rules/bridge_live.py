"""Megatron Bridge's own validation, run live where Bridge imports.

The workload becomes a real Bridge `ConfigContainer` -- the model provider Bridge builds for it
(GPTModelProvider, MLAModelProvider or HybridModelProvider) with the workload's TransformerConfig
fields, its `rng`, `rerun_state_machine` and `env_vars`, and the smallest training, optimizer,
scheduler, dataset, logger, tokenizer and checkpoint sections that validate -- and goes through
Bridge's `runtime_config_update` (environment, mixed precision, data-parallel size, comm
overlap, `ConfigContainer.validate()`, which finalizes the model config), then through the
checks `provide()` makes before it builds the model (training/config.py:1853-1888,
models/gpt_provider.py:217-237 @ megatron-bridge 0.6.2). The model itself is never built: a
failure of `provide()` other than an assertion the card names is past the checks.

The launch environment is not the checker's: NVTE_CPU_OFFLOAD_V1 is cleared for the run, so only
the config's own `env_vars` count (as the built-in rule does), and os.environ is restored after.
A Transformer Engine version the workload states is told to megatron-core's version cache, as
the TransformerConfig validator does.

Imports of torch, megatron and Bridge happen inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
from functools import lru_cache
from pathlib import PurePath
from typing import Optional

from mbridge_recompute.facts import card
from mbridge_recompute.workload import TE_ABSENT

CLEARED_ENV = ("NVTE_CPU_OFFLOAD_V1",)


def available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        return False


@dataclasses.dataclass
class Outcome:
    """What Bridge's validation did with the workload."""
    stage: Optional[str] = None          # "validate" or "provide" when it raised
    exc_type: Optional[str] = None
    exc_message: Optional[str] = None
    where: Optional[str] = None          # file:line of the innermost Bridge / megatron frame


def _provider_class(w):
    if w.hybrid_override_pattern:
        from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

        return HybridModelProvider
    if w.multi_latent_attention:
        from megatron.bridge.models.mla_provider import MLAModelProvider

        return MLAModelProvider
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    return GPTModelProvider


def container(w):
    """The Bridge ConfigContainer that stands for `w` (not yet validated)."""
    import torch
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        GPTDatasetConfig,
        LoggerConfig,
        RerunStateMachineConfig,
        RNGConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
    )
    from megatron.core.optimizer import OptimizerConfig

    from mbridge_recompute.rules.mcore_config import config_kwargs

    cls = _provider_class(w)
    _, kwargs = config_kwargs(w)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in kwargs.items() if k in names}
    if w.hybrid_override_pattern:
        kwargs.pop("hybrid_override_pattern", None)
        kwargs["hybrid_layer_pattern"] = w.hybrid_override_pattern
    kwargs.update(seq_length=w.seq_length, vocab_size=w.vocab_size or 1024)
    if w.bf16 or w.fp16:
        kwargs["params_dtype"] = torch.bfloat16 if w.bf16 else torch.float16
    model = cls(**kwargs)
    nan = {} if w.check_for_nan_in_loss is None else {"check_for_nan_in_loss": w.check_for_nan_in_loss}
    gbs = w.global_batch_size or w.micro_batch_size * w.data_parallel_size
    return ConfigContainer(
        model=model,
        train=TrainingConfig(micro_batch_size=w.micro_batch_size, train_iters=1,
                             global_batch_size=gbs),
        optimizer=OptimizerConfig(optimizer="adam", lr=1e-4, bf16=bool(w.bf16), fp16=bool(w.fp16),
                                  use_distributed_optimizer=bool(w.use_distributed_optimizer)),
        scheduler=SchedulerConfig(),
        dataset=GPTDatasetConfig(random_seed=1, seq_length=w.seq_length, reset_position_ids=False,
                                 reset_attention_mask=False, eod_mask_loss=False),
        logger=LoggerConfig(), tokenizer=TokenizerConfig(), checkpoint=CheckpointConfig(),
        rng=RNGConfig(te_rng_tracker=bool(w.te_rng_tracker)),
        rerun_state_machine=RerunStateMachineConfig(**nan),
        env_vars=dict(w.env_vars))


def _where(exc: BaseException) -> Optional[str]:
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = PurePath(frame.f_code.co_filename)
        if "megatron" in path.parts:
            parts = path.parts[path.parts.index("megatron"):]
            return f"{'/'.join(parts)}:{line}"
    return None


def run(w) -> Outcome:
    """Bridge's validation of `w`; never raises for what the validation raises."""
    import megatron.core.utils as mcore_utils
    from megatron.bridge.training.config import runtime_config_update

    saved_env = dict(os.environ)
    saved_te = mcore_utils._te_version
    out = Outcome()
    try:
        for name in CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ["WORLD_SIZE"] = str(w.num_gpus or w.model_parallel_size * w.expert_model_parallel_size)
        te = w.te_version
        if te is not None and str(te).strip().lower() not in TE_ABSENT:
            from packaging.version import Version

            mcore_utils._te_version = Version(str(te))
        cfg = container(w)
        stage = "validate"
        try:
            runtime_config_update(cfg)
            stage = "provide"
            cfg.model.provide()
        except Exception as exc:   # noqa: BLE001 - every validation failure is a finding
            if stage == "provide" and not isinstance(exc, AssertionError):
                return out         # the checks passed; building the model needs the GPU stack
            out = Outcome(stage, type(exc).__name__, str(exc), _where(exc))
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        mcore_utils._te_version = saved_te
    return out


@lru_cache(maxsize=None)
def _regex(message: str):
    parts = re.split(r"\{[^}]*\}", message)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.DOTALL)


def bridge_ids(key: str) -> list:
    """The Bridge constraints of release `key`, in the order Bridge checks them."""
    from mbridge_recompute.rules.builtin import BRIDGE_ORDER

    return [cid for cid in BRIDGE_ORDER if card.holds(cid, key)]


def map_message(message: str, key: str) -> Optional[str]:
    """The Bridge constraint of release `key` whose message `message` is, or None."""
    for cid in bridge_ids(key):
        text = card.constraint_at(cid, key)["message"]
        if _regex(text).fullmatch(message.strip()):
            return cid
    return None


def verdict(out: Outcome, key: str) -> tuple:
    """("accept", None, None), ("reject", card id or None, exception type), or ("mcore", None,
    type) when megatron-core's own config raised inside Bridge's validation."""
    if out.exc_type is None:
        return ("accept", None, None)
    cid = map_message(out.exc_message, key)
    if cid is None and out.where and out.where.startswith("megatron/core/"):
        return ("mcore", None, out.exc_type)
    return ("reject", cid, out.exc_type)
