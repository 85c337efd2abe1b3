"""Activation recompute for Megatron Bridge / Megatron-Core: plan, write, check, measure.

The package is importable without torch or megatron; only the live validator
(`rules.live`) imports megatron-core, and only when it is asked for.
"""

__version__ = "0.1.0"
