"""GPU facts (the card's `gpus:` section): what PyTorch reports per GPU model, its architecture,
and which FP8 / FP4 recipes Transformer Engine runs on it (`precision_recipes:`).

A recipe runs on a GPU when the GPU's compute capability meets the recipe's `min_cc` (and stays
below its `below_cc`): Transformer Engine asserts exactly that when megatron-core enters the first
FP8 / FP4 autocast region (quantization.py:720-759 @ v2.17.1). Which GPU a workload runs on comes
from `cluster.gpu`; `cluster.gpu_memory_gb` decides it only when every GPU of that marketed size
has the same compute capability (80 GB is both A100 and H100, so it does not).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from mbridge_recompute.errors import InputError
from mbridge_recompute.facts import card


def table() -> dict:
    return card.load()["gpus"]


def recipes_table() -> dict:
    return card.load()["precision_recipes"]


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


def cc_tuple(text: Optional[str]) -> Optional[tuple]:
    """'10.3' -> (10, 3); None stays None."""
    if text is None:
        return None
    major, minor = str(text).split(".")
    return int(major), int(minor)


def runs(recipe: str, cc: Optional[tuple]) -> Optional[bool]:
    """Whether a GPU of compute capability `cc` runs `recipe` (True/False), or None when the
    recipe or the GPU is not one the card decides (custom recipes, non-NVIDIA GPUs)."""
    entry = recipes_table().get(recipe)
    if entry is None or cc is None:
        return None
    if cc < cc_tuple(entry["min_cc"]):
        return False
    below = entry.get("below_cc")
    return not (below is not None and cc >= cc_tuple(below))


def recipes_for(name: str) -> Optional[list]:
    """The FP8 / FP4 recipes GPU `name` runs (card order), or None when not decided here."""
    cc = cc_tuple(table()[resolve(name)]["compute_capability"])
    if cc is None:
        return None
    return [r for r in recipes_table() if runs(r, cc)]


class GpuOfWorkload(NamedTuple):
    cc: Optional[tuple]      # compute capability, or None when not known
    name: Optional[str]      # the table entry, or None when only its architecture is known
    how: str                 # where the answer comes from, for a finding


def of_workload(w) -> GpuOfWorkload:
    """The GPU a workload runs on, as far as its cluster section says."""
    if w.gpu is not None:
        name = resolve(w.gpu)
        e = table()[name]
        return GpuOfWorkload(cc_tuple(e["compute_capability"]), name, f"cluster.gpu {w.gpu} ({e['title']})")
    sized = [n for n, e in table().items() if float(e["marketed_gb"]) == float(w.gpu_memory_gb)]
    ccs = {table()[n]["compute_capability"] for n in sized}
    if len(ccs) == 1 and None not in ccs:
        titles = ", ".join(table()[n]["title"] for n in sized)
        return GpuOfWorkload(cc_tuple(ccs.pop()), sized[0] if len(sized) == 1 else None,
                             f"cluster.gpu_memory_gb {w.gpu_memory_gb:g} ({titles})")
    return GpuOfWorkload(None, None, "the GPU is not named (cluster.gpu)")
