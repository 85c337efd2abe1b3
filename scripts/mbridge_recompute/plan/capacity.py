"""How much memory one GPU gives PyTorch: the capacity the budget is cut from.

PyTorch reports less than the marketed size and less than nvidia-smi (an H100 80GB: 79.11 GiB,
84.94 decimal GB). The capacity comes, in this order, from `cluster.gpu_memory_gib` (as PyTorch
reports it), `cluster.gpu` (the card's `gpus:` table, each entry citing where its figure
comes from), or `cluster.gpu_memory_gb`, read as the one table GPU of that marketed size when
there is exactly one, else as decimal GB.
"""

from __future__ import annotations

from typing import NamedTuple

from mbridge_recompute.facts.gpus import resolve, table
from mbridge_recompute.units import GIB


class Capacity(NamedTuple):
    bytes: int
    how: str           # one sentence: where the figure comes from
    field: str = "cluster.gpu_memory_gb"   # the workload field it was read from


def _from_entry(name: str, why: str, field: str) -> Capacity:
    e = table()[name]
    gib = float(e["total_gib"])
    return Capacity(int(gib * GIB), f"{e['title']}: PyTorch reports {gib:.2f} GiB "
                                    f"({gib * GIB / 1e9:.2f} GB) {why} [{e['source']}]", field)


def capacity(w) -> Capacity:
    if w.gpu_memory_gib is not None:
        return Capacity(int(w.gpu_memory_gib * GIB),
                        f"cluster.gpu_memory_gib {w.gpu_memory_gib:g} GiB "
                        f"({w.gpu_memory_gib * GIB / 1e9:.2f} GB), as PyTorch reports it",
                        "cluster.gpu_memory_gib")
    if w.gpu is not None:
        return _from_entry(resolve(w.gpu), f"(cluster.gpu {w.gpu})", "cluster.gpu")
    sized = [n for n, e in table().items() if float(e["marketed_gb"]) == float(w.gpu_memory_gb)]
    if sized:
        # several GPUs of one marketed size: take the smallest PyTorch figure among them
        name = min(sized, key=lambda n: table()[n]["total_gib"])
        others = [table()[n]["title"] for n in sized if n != name]
        return _from_entry(name, f"(cluster.gpu_memory_gb {w.gpu_memory_gb:g} read as the marketed "
                                 "size" + (f"; the smallest figure of {table()[name]['title']} and "
                                           f"{', '.join(others)}" if others else "")
                                 + "; set cluster.gpu or cluster.gpu_memory_gib to be exact)",
                           "cluster.gpu_memory_gb")
    return Capacity(int(w.gpu_memory_gb * 1e9),
                    f"cluster.gpu_memory_gb {w.gpu_memory_gb:g}, read as decimal GB (no GPU of the "
                    "capacity table has that marketed size)")
