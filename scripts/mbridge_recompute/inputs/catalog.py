"""The model catalog: `--model NAME` -> workload sections.

`data/models.yaml` holds each model's architecture (MCore / Bridge `model:` keys,
each entry citing where its dimensions come from) and, only where a cited recipe
or measured study fixes one, a typical layout (parallelism, batch, cluster).
`model_sections(name)` returns sections shaped like a workload file, so the
loader merges them exactly as it merges a file.
"""

from __future__ import annotations

import copy
from functools import lru_cache

from mbridge_recompute import DATA_DIR
from mbridge_recompute.errors import InputError

MODELS_PATH = DATA_DIR / "models.yaml"


@lru_cache(maxsize=1)
def _load() -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(MODELS_PATH.read_text(encoding="utf-8"), Loader=loader)
    return data["models"]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@lru_cache(maxsize=1)
def _index() -> dict:
    """Canonical names and aliases (normalised) -> canonical name."""
    out = {}
    for canonical, entry in _load().items():
        out[_key(canonical)] = canonical
        for alias in entry.get("aliases", []):
            out[_key(alias)] = canonical
    return out


def names() -> list[str]:
    """Canonical catalog names, in file order."""
    return list(_load())


def resolve(name: str) -> str:
    """The canonical name for `name` (case, '_' vs '-' and aliases tolerated)."""
    canonical = _index().get(_key(name or ""))
    if canonical is None:
        raise InputError("--model", f"unknown model {name!r}; known: {', '.join(names())}")
    return canonical


def entry(name: str) -> dict:
    """The raw catalog entry (title, source, model, optional layout), a copy."""
    return copy.deepcopy(_load()[resolve(name)])


def has_layout(name: str) -> bool:
    return "layout" in _load()[resolve(name)]


def model_sections(name: str) -> dict:
    """Workload sections for catalog model `name`: architecture plus the cited layout if any."""
    e = entry(name)
    sections: dict = {"model": dict(e["model"])}
    layout = e.get("layout") or {}
    for section, body in layout.items():
        if section == "source":
            continue
        sections.setdefault(section, {}).update(body)
    return sections


def describe(name: str) -> dict:
    """Title and sources, for reports that say where a workload came from."""
    e = entry(name)
    out = {"name": resolve(name), "title": e.get("title", ""), "source": e.get("source", "")}
    if "layout" in e:
        out["layout_source"] = e["layout"].get("source", "")
    return out
