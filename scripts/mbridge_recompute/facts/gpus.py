"""The GPU capacity table (data/gpus.yaml): what PyTorch reports per GPU model, with sources."""

from __future__ import annotations

from functools import lru_cache

from mbridge_recompute import DATA_DIR
from mbridge_recompute.errors import InputError


@lru_cache(maxsize=1)
def table() -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((DATA_DIR / "gpus.yaml").read_text(encoding="utf-8"), Loader=loader)["gpus"]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")


def resolve(name: str) -> str:
    """The table name for `name` (aliases, case and separators tolerated), or InputError."""
    key = _key(name)
    for canonical, entry in table().items():
        if key == canonical or key in entry.get("aliases", []):
            return canonical
    raise InputError("cluster.gpu", f"unknown GPU {name!r}; known: {', '.join(table())} "
                                    "(or give cluster.gpu_memory_gib as PyTorch reports it)")
