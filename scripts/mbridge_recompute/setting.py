"""A recompute setting: the five config keys that decide what is recomputed, and the layout,
offloading or optimizer changes a plan's alternative makes beside them.

Shared by the config writer, the checker, the planner and the harness, so that
"selective [moe_act]", "full uniform 2" or "mlp@virtual_pipeline_model_parallel_size=10" means
one thing everywhere. Candidate syntax: the recompute part ('[]', 'core_attn',
'layernorm,moe_act', 'uniform:2', 'block:4', 'none'), then one '@FIELD=VALUE' per changed
Workload field (a list value joins its items with '+').
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from mbridge_recompute.errors import InputError


@dataclass(frozen=True)
class RecomputeSetting:
    granularity: Optional[str] = None          # None (off), "selective", "full"
    modules: Optional[tuple] = None            # selective labels; () is the matched control
    method: Optional[str] = None               # full: "uniform" / "block"
    num_layers: Optional[int] = None           # full: per model chunk
    distribute_saved_activations: bool = False
    changes: tuple = ()                        # ((Workload field, value), ...) sorted; lists as tuples

    @classmethod
    def off(cls) -> "RecomputeSetting":
        return cls()

    @classmethod
    def selective(cls, *modules: str) -> "RecomputeSetting":
        return cls(granularity="selective", modules=tuple(modules))

    @classmethod
    def full(cls, method: str, num_layers: int, distribute: bool = False) -> "RecomputeSetting":
        return cls(granularity="full", method=method, num_layers=num_layers,
                   distribute_saved_activations=distribute)

    @classmethod
    def from_workload(cls, w) -> "RecomputeSetting":
        mods = tuple(w.recompute_modules) if w.recompute_modules is not None else None
        return cls(w.recompute_granularity, mods, w.recompute_method, w.recompute_num_layers,
                   w.distribute_saved_activations)

    def with_changes(self, **fields) -> "RecomputeSetting":
        """This setting with Workload fields changed beside the recompute keys."""
        merged = dict(self.changes)
        merged.update({k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        return RecomputeSetting(self.granularity, self.modules, self.method, self.num_layers,
                                self.distribute_saved_activations, tuple(sorted(merged.items())))

    @property
    def recompute(self) -> "RecomputeSetting":
        """The recompute part alone."""
        return RecomputeSetting(self.granularity, self.modules, self.method, self.num_layers,
                                self.distribute_saved_activations)

    @classmethod
    def parse(cls, text: str, where: str = "candidate") -> "RecomputeSetting":
        """Candidate syntax: '[]', 'core_attn', 'layernorm,moe_act', 'uniform:2', 'block:4', 'none',
        each optionally followed by '@FIELD=VALUE' changes."""
        base, *parts = text.strip().split("@")
        setting = cls._parse_recompute(base, text, where)
        if parts:
            setting = setting.with_changes(**dict(_parse_change(p, text, where) for p in parts))
        return setting

    @classmethod
    def _parse_recompute(cls, t: str, text: str, where: str) -> "RecomputeSetting":
        t = t.strip()
        if t in ("none", "off", "null"):
            return cls.off()
        if t in ("[]", ""):
            return cls.selective()
        if ":" in t:
            method, _, n = t.partition(":")
            if method not in ("uniform", "block"):
                raise InputError(where, f"{text!r}: full recompute is uniform:N or block:N")
            try:
                num = int(n)
            except ValueError:
                raise InputError(where, f"{text!r}: N must be an integer") from None
            if num < 1:
                raise InputError(where, f"{text!r}: N must be >= 1")
            return cls.full(method, num)
        mods = [m.strip() for m in t.strip("[]").split(",")]
        if any(not m for m in mods):
            raise InputError(where, f"{text!r}: empty label (labels are one comma-separated token)")
        return cls.selective(*mods)

    def apply(self, w):
        """The workload with this setting in place of its own."""
        return w.replace(recompute_granularity=self.granularity,
                         recompute_modules=list(self.modules) if self.modules is not None else None,
                         recompute_method=self.method, recompute_num_layers=self.num_layers,
                         distribute_saved_activations=self.distribute_saved_activations,
                         **{k: list(v) if isinstance(v, tuple) else v for k, v in self.changes})

    def as_fields(self) -> dict:
        out = {"recompute_granularity": self.granularity,
               "recompute_modules": list(self.modules) if self.modules is not None else None,
               "recompute_method": self.method, "recompute_num_layers": self.num_layers}
        if self.changes:
            out["changes"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.changes}
        return out

    @property
    def kind(self) -> str:
        """What the candidate changes: recompute, layout, cp, offload, optimizer (joined by +)."""
        kinds = []
        fields = {f for f, _ in self.changes}
        for field in sorted(fields):
            k = CHANGE_KINDS.get(field) or SET_KINDS.get(field, "layout")
            if k == "vpp" and "pipeline_model_parallel_layout" in fields:
                continue          # a layout sets VPP itself (its stages over PP)
            if k not in kinds:
                kinds.append(k)
        if self.granularity is not None and (self.modules != () or self.granularity == "full"):
            kinds.append("recompute")
        return "+".join(kinds) or "recompute"

    def _spelled(self, off: str, full: str, default: str, listed) -> str:
        """The recompute part in one spelling: none, full, selective with MCore's default list
        (modules None: ["core_attn"], tc:1193-1194 @ core_v0.16.1, spelled out) or the labels
        given (`listed(modules)`)."""
        if self.granularity is None:
            return off
        if self.granularity == "full":
            return full
        return default if self.modules is None else listed(self.modules)

    def slug(self) -> str:
        """File-name-safe name (run directories, -wdj names): off, empty, core_attn,
        layernorm+moe_act, uniform2, block4, empty-vpp10. The candidate string is `candidate()`."""
        base = self._spelled("off", f"{self.method}{self.num_layers}", "core_attn",
                             lambda mods: "+".join(mods) or "empty")
        for field, value in self.changes:
            base += "-" + SHORT.get(field, field) + re.sub(r"[^A-Za-z0-9]+", "_", _token(value))
        return base

    def candidate(self) -> str:
        """The candidate string `parse` (and `run_harness.py --candidates`) reads back."""
        base = self._spelled("none", f"{self.method}:{self.num_layers}", "core_attn",
                             lambda mods: ",".join(mods) or "[]")
        return base + "".join(f"@{k}={_token(v)}" for k, v in self.changes)

    def describe(self) -> str:
        base = self._spelled("no recompute", f"full {self.method} {self.num_layers}",
                             "selective (default [core_attn])",
                             lambda mods: f"selective [{', '.join(mods)}]")
        if self.changes:
            base += " with " + ", ".join(f"{k}={_token(v)}" for k, v in self.changes)
        return base


# The keys the recompute part of a candidate sets; an '@' change may not name them.
RECOMPUTE_KEYS = ("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers",
                  "distribute_saved_activations")
# The kind of change a Workload field makes, for the frontier's marks.
CHANGE_KINDS = {"virtual_pipeline_model_parallel_size": "vpp", "pipeline_model_parallel_layout": "layout",
                "num_layers_in_first_pipeline_stage": "layout", "num_layers_in_last_pipeline_stage": "layout",
                "context_parallel_size": "cp", "use_distributed_optimizer": "optimizer",
                "fine_grained_activation_offloading": "offload", "offload_modules": "offload",
                "cpu_offloading": "offload", "cpu_offloading_num_layers": "offload"}
# A change no plan proposes but a user's --set carries into a snippet (commands/config.py)
SET_KINDS = {"cuda_graph_impl": "cuda-graph", "cuda_graph_scope": "cuda-graph",
             "cuda_graph_modules": "cuda-graph"}
SHORT = {"virtual_pipeline_model_parallel_size": "vpp", "pipeline_model_parallel_layout": "layout",
         "context_parallel_size": "cp", "use_distributed_optimizer": "distopt",
         "fine_grained_activation_offloading": "offload", "offload_modules": "mods",
         "cpu_offloading": "cpuoff", "cpu_offloading_num_layers": "cpuoffn", "cuda_graph_impl": "cg",
         "cuda_graph_scope": "cgscope", "cuda_graph_modules": "cgmods"}


def _token(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value) if value else "[]"
    return str(value)


def _parse_change(part: str, text: str, where: str) -> tuple:
    from mbridge_recompute.inputs.values import coerce
    from mbridge_recompute.workload import FIELDS

    field, eq, raw = part.partition("=")
    field = field.strip()
    if not eq or field not in FIELDS:
        raise InputError(where, f"{text!r}: '@{part}' is not '@FIELD=VALUE' with a Workload field")
    if field in RECOMPUTE_KEYS:
        raise InputError(where, f"{text!r}: @{field} is not a change; the recompute part before '@' says it "
                                "('[]', 'moe_act', 'uniform:2', 'block:4', 'none')")
    raw = raw.strip()
    if FIELDS[field].metadata.get("kind") == "labels":
        # a list joins its items with '+'; '[]' (or nothing) is the empty list
        items = [] if raw in ("[]", "") else [x for x in raw.strip("[]").split("+") if x]
        return field, tuple(coerce(field, items, f"{where} {text!r}: @{field}"))
    low = raw.lower()
    if low in ("true", "false"):
        value = low == "true"
    elif low in ("null", "none"):
        value = None
    elif re.fullmatch(r"-?\d+", raw):
        value = int(raw)
    elif re.fullmatch(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", raw):
        value = float(raw)          # a float field's value (cluster.gpu_memory_gb=0.0001)
    else:
        value = raw
    # the field's own type and bounds, as a workload file's value is checked
    return field, coerce(field, value, f"{where} {text!r}: @{field}")
