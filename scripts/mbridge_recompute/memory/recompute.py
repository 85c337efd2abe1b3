"""What a recompute setting does to a model chunk: selective labels in force, and the
layers full recompute checkpoints.

`recompute_num_layers` counts layers of one model chunk (`len(self.layers)`,
transformer_block.py:326 @ core_v0.16.1), so with VPP every chunk applies it on its own.
`uniform` checkpoints consecutive groups of n layers (one [Tr, h] input kept per
group; the whole group is replayed at once in backward). `block` checkpoints the
first n layers of the chunk one by one (all of them when n exceeds the chunk) and
keeps full activations for the rest.
"""

from __future__ import annotations

from mbridge_recompute.placement import place


def modules_of(w, disabled=()) -> frozenset:
    """Selective labels in force: recompute_modules only count under `selective`
    (every selective gate tests granularity == 'selective'), less what the checker found
    switched off (`disabled`: (label, block) pairs). A label off in one block only stays,
    with a "label@block" marker that `block_mods` reads."""
    if w.recompute_granularity != "selective":
        return frozenset()
    mods = set(w.effective_recompute_modules)
    for label, block in disabled:
        if label in mods:
            if block == "all":
                mods.discard(label)
            else:
                mods.add(f"{label}@{block}")
    return frozenset(mods)


def block_mods(mods: frozenset, block: str) -> frozenset:
    """The labels in force inside one block ('attn', 'mlp', 'moe', ...) of a layer."""
    if not any("@" in m for m in mods):
        return mods
    off = {m.split("@", 1)[0] for m in mods if m.endswith("@" + block)}
    return frozenset(m for m in mods if "@" not in m and m not in off)


def granularity_of(w, disabled=()):
    """recompute_granularity in force: full recompute the checker found inert counts as none."""
    if w.recompute_granularity == "full" and ("full", "all") in {tuple(d) for d in disabled}:
        return None
    return w.recompute_granularity


def chunk_groups(granularity, method, num_layers, n_layers: int) -> list:
    """Full recompute of one chunk of `n_layers`: list of (start, stop, recomputed) layer ranges."""
    n = num_layers or 0
    if granularity != "full" or n <= 0:
        return [(0, n_layers, False)] if n_layers else []
    if method == "block":
        k = min(n, n_layers)
        groups = [(i, i + 1, True) for i in range(k)]
        if k < n_layers:
            groups.append((k, n_layers, False))
        return groups
    # uniform (also the fallback for a missing method): groups of n, the last one clamped
    return [(i, min(i + n, n_layers), True) for i in range(0, n_layers, n)]


def layout_of(w) -> tuple:
    """[pp_rank][chunk] -> layer kinds; the split must be one Megatron-Core accepts."""
    pl = place(w)
    if not pl.ok:
        raise ValueError("the memory model needs a pipeline split megatron-core accepts; "
                         f"rejected: {', '.join(p.cid for p in pl.problems)}")
    return pl.chunks


def full_recompute_units(w):
    """(kind, recomputed) for every layer of the model, in chunk order."""
    for rank_chunks in layout_of(w):
        for kinds in rank_chunks:
            for start, stop, rec in chunk_groups(w.recompute_granularity, w.recompute_method,
                                                 w.recompute_num_layers, len(kinds)):
                for kind in kinds[start:stop]:
                    yield kind, rec
