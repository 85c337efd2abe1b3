"""The card: labels, constraints, evidence and limitations, in one YAML file.

`data/card.yaml` is the source of truth inside the package (so a pip install has
it); the skill's top-level `card.yaml` is a byte-identical copy that agents and
people read, kept equal by tests/test_card.py. Code that states a fact (a rule's
message, a label's versions) reads it from here instead of repeating it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from mbridge_recompute import DATA_DIR

CARD_PATH = DATA_DIR / "card.yaml"


@lru_cache(maxsize=1)
def load() -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml keeps start-up fast
    return yaml.load(CARD_PATH.read_text(encoding="utf-8"), Loader=loader)


def constraint(cid: str) -> dict:
    for c in load()["constraints"]:
        if c["id"] == cid:
            return c
    raise KeyError(f"card.yaml has no constraint {cid!r}")


def constraints() -> list[dict]:
    return list(load()["constraints"])


def label(name: str) -> dict:
    for entry in load()["labels"]:
        if entry["label"] == name:
            return entry
    raise KeyError(f"card.yaml has no label {name!r}")
