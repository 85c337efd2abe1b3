"""A recompute setting: the five config keys that decide what is recomputed.

Shared by the config writer, the checker, the planner and the harness, so that
"selective [moe_act]" or "full uniform 2" means one thing everywhere.
"""

from __future__ import annotations

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

    @classmethod
    def parse(cls, text: str, where: str = "candidate") -> "RecomputeSetting":
        """Candidate syntax: '[]', 'core_attn', 'layernorm,moe_act', 'uniform:2', 'block:4', 'none'."""
        t = text.strip()
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
                         distribute_saved_activations=self.distribute_saved_activations)

    def as_fields(self) -> dict:
        return {"recompute_granularity": self.granularity,
                "recompute_modules": list(self.modules) if self.modules is not None else None,
                "recompute_method": self.method, "recompute_num_layers": self.num_layers}

    def slug(self) -> str:
        """File-name-safe name (run directories, -wdj names): off, empty, core_attn,
        layernorm+moe_act, uniform2, block4. The candidate string is `candidate()`."""
        if self.granularity is None:
            return "off"
        if self.granularity == "full":
            return f"{self.method}{self.num_layers}"
        return "+".join(self.modules) if self.modules else "empty"

    def candidate(self) -> str:
        """The candidate string `parse` (and `run_harness.py --candidates`) reads back."""
        if self.granularity is None:
            return "none"
        if self.granularity == "full":
            return f"{self.method}:{self.num_layers}"
        if self.modules is None:
            return "core_attn"   # MCore's default list (tc:1193-1194 @ core_v0.16.1), spelled out
        return ",".join(self.modules) if self.modules else "[]"

    def describe(self) -> str:
        if self.granularity is None:
            return "no recompute"
        if self.granularity == "full":
            return f"full {self.method} {self.num_layers}"
        if self.modules is None:
            return "selective (default [core_attn])"
        return f"selective [{', '.join(self.modules)}]"
