"""Activation recompute for Megatron Bridge / Megatron-Core: plan, write, check, measure.

The package is importable without torch or megatron; only the live validator
(`rules.live`) imports megatron-core, and only when it is asked for.
"""

from pathlib import Path

__version__ = "0.1.0"

# Package data (the card, the model catalog, field lists): one folder, shipped with the package.
DATA_DIR = Path(__file__).resolve().parent / "data"
# The skill's root (SKILL.md, card.yaml, examples/), two levels above the package in a checkout or
# an installed skill (scripts/mbridge_recompute); a pip install has no skill root around it.
_PACKAGE = Path(__file__).resolve().parent
SKILL_ROOT = _PACKAGE.parents[1] if _PACKAGE.parent.name == "scripts" else None
