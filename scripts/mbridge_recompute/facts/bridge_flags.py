"""The flags of each Megatron Bridge release's harness parser (scripts/performance/argument_parser.py),
as data/bridge_harness_flags.json records them per release: spellings, arity, choices, required,
append and line (tests/tools/add_release.py reads them at a tag)."""

from __future__ import annotations

import json
from functools import lru_cache

from mbridge_recompute import DATA_DIR


@lru_cache(maxsize=1)
def _flag_data() -> dict:
    path = DATA_DIR / "bridge_harness_flags.json"
    return json.loads(path.read_text(encoding="utf-8"))["releases"]


def flags(key: str) -> list:
    """The flags of `key`'s harness parser: [{"flags", "value", "line", "choices"?, ...}]."""
    return _flag_data()[key]["flags"]
