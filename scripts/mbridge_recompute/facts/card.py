"""The card: labels, constraints, enums, evidence and limitations, in one YAML file, each fact
keyed by the megatron-core releases it holds for.

`data/card.yaml` is the source of truth inside the package (so a pip install has it); the
skill's top-level `card.yaml` is a byte-identical copy that agents and people read, kept equal
by tests/test_card.py. Code that states a fact (a rule's message, exception, citation, the
releases it holds for, a label's releases) reads it from here instead of repeating it.

A constraint holds for the releases its `at` names (release key -> `file:line` in that
release's tag). `changes` lists what differs from a release on: `message`, `raises`, `params`.
`constraint_at(cid, key)` gives the entry as it is in one release.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple, Optional

from mbridge_recompute import DATA_DIR

CARD_PATH = DATA_DIR / "card.yaml"


@lru_cache(maxsize=1)
def load() -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml keeps start-up fast
    return yaml.load(CARD_PATH.read_text(encoding="utf-8"), Loader=loader)


@lru_cache(maxsize=1)
def _by_id() -> dict:
    return {c["id"]: c for c in load()["constraints"]}


def constraint(cid: str) -> dict:
    """The card entry of `cid` as written (release-independent fields and `at`)."""
    try:
        return _by_id()[cid]
    except KeyError:
        raise KeyError(f"card.yaml has no constraint {cid!r}") from None


def constraints() -> list[dict]:
    return list(load()["constraints"])


def holds(cid: str, key: str) -> bool:
    """Whether constraint `cid` exists in release `key`."""
    return key in constraint(cid)["at"]


@lru_cache(maxsize=None)
def constraint_at(cid: str, key: str) -> Optional[dict]:
    """Constraint `cid` as release `key` has it (message, raises, params after `changes`, and
    the citation of that release), or None when it does not hold there."""
    c = constraint(cid)
    if key not in c["at"]:
        return None
    order = list(load()["releases"])
    out = {k: v for k, v in c.items() if k not in ("at", "changes")}
    out["params"] = dict(c.get("params") or {})
    for ch in c.get("changes") or []:
        if order.index(ch["since"]) <= order.index(key):
            for field in ("message", "raises"):
                if field in ch:
                    out[field] = ch[field]
            out["params"].update(ch.get("params") or {})
    out["at"] = c["at"][key]
    out["release"] = key
    out["citation"] = _cite(c, key)
    return out


def _cite(c: dict, key: str) -> str:
    """A Megatron Bridge rule's line is in the Bridge release `bridge` names (its `at` is keyed by
    the megatron-core release that Bridge release pins); every other line is megatron-core's."""
    if c.get("bridge"):
        return f"{c['at'][key]} @ megatron-bridge {c['bridge'][key]}"
    return citation(c["at"][key], key)


def message_variants(cid: str) -> list[tuple]:
    """[(message, [release keys it holds for])] for constraint `cid`, oldest first."""
    out: dict = {}
    for key in constraint(cid)["at"]:
        out.setdefault(constraint_at(cid, key)["message"], []).append(key)
    return list(out.items())


def citations(cid: str, keys: list) -> str:
    """`file:line @ tag` of `cid` in each of `keys`, joined."""
    c = constraint(cid)
    return "; ".join(_cite(c, k) for k in keys if k in c["at"])


def citation(location: str, key: str) -> str:
    """`file:line @ tag` for a location of release `key`."""
    return f"{location} @ {load()['releases'][key]['tag']}"


class Site(NamedTuple):
    """A place in upstream code as the card writes it: `tc:1208-1211`, `moe_utils.py:24-39,1192`
    or `cgc:108-111 (from tc:2187)` (a check in a helper module, and the line that calls it)."""
    file: str                       # a card abbreviation, a file name or a path
    ranges: tuple                   # ((first, last), ...) lines, in the order written
    caller: Optional["Site"] = None

    @property
    def start(self) -> int:
        return self.ranges[0][0]

    @property
    def end(self) -> int:
        return self.ranges[0][1]

    def path(self, abbreviations: Optional[dict] = None) -> str:
        """The file's path from the Megatron-LM checkout root (megatron/core/...) when the card
        abbreviates it, else the file as written."""
        legend = load()["abbreviations"] if abbreviations is None else abbreviations
        return legend.get(self.file, self.file)

    def text(self) -> str:
        lines = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in self.ranges)
        return f"{self.file}:{lines}" + (f" (from {self.caller.text()})" if self.caller else "")


_SITE = re.compile(r"([\w./]+):(\d+(?:-\d+)?(?:,\s?\d+(?:-\d+)?)*)(?:\s*\(from\s+([^)]*)\))?$")


def site(text: str) -> Site:
    """The one parser of the card's `file:line` sites (ValueError when `text` is none)."""
    m = _SITE.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"expected file:line, got {text!r}")
    ranges = []
    for part in m.group(2).split(","):
        first, _, last = part.strip().partition("-")
        ranges.append((int(first), int(last or first)))
    return Site(m.group(1), tuple(ranges), site(m.group(3)) if m.group(3) else None)


def site_of(cid: str, key: str) -> Optional[Site]:
    """Where constraint `cid` sits in release `key`, or None when it does not hold there."""
    loc = constraint(cid)["at"].get(key)
    return None if loc is None else site(loc)


def order_in(cid: str, key: str) -> Optional[tuple]:
    """Where a config check sits in release `key`'s __post_init__: (file rank, line).

    ModelParallelConfig's checks run first (through super().__post_init__()); a check in a
    helper module (cgc) is placed at the line that calls it, written `cgc:A-B (from tc:N)`.
    """
    s = site_of(cid, key)
    if s is None:
        return None
    s = s.caller or s
    return ({"mpc": 0, "tc": 1}.get(s.file, 2), s.start)


def label(name: str) -> dict:
    for entry in load()["labels"]:
        if entry["label"] == name:
            return entry
    raise KeyError(f"card.yaml has no label {name!r}")
