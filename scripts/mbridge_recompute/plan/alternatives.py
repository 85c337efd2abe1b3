"""Layout, offloading and optimizer alternatives to recompute, for the same GPU count.

Each alternative is a change of Workload fields beside a recompute setting (setting.py's
`changes`); the planner prices it like any candidate (the memory model, the checker, the
modelled step of cost.py) so that "VPP 10" and "mlp" sit on one frontier. Generated here:
- other VPP sizes that divide every pipeline rank's layers (a shorter bubble, (p-1)/(v*m), and
  a different in-flight mix);
- an explicit pipeline layout moving one or two layers off the hottest pipeline rank onto the
  coolest (Megatron's layout string, pipeline_parallel_layer_layout.py);
- context parallelism where the sequence splits into 2*CP chunks and the data-parallel size
  that is left still divides the global batch;
- the distributed optimizer where it is off;
- fine-grained activation offloading of the modules that hold the most saved bytes, from the
  release's offload_modules.
Whether megatron-core accepts each is the checker's to say (a rejected one stays a rejected
point); nothing here decides legality.
"""

from __future__ import annotations

from mbridge_recompute.setting import RecomputeSetting

MAX_VPP = 16


def _vpp_options(w, pl) -> list:
    if w.pipeline_model_parallel_size <= 1 or w.pipeline_model_parallel_layout is not None \
            or w.hybrid_override_pattern:
        return []
    stages = pl.stage_layers
    current = len(pl.chunks[0])
    out = []
    # (uneven stages with a split that counts the embedding never get here: placement rejects
    # them, uneven-pp-with-pipeline-split-accounting, and the plan stops before alternatives)
    for v in range(1, MAX_VPP + 1):
        if v == current or any(n % v for n in stages) or min(stages) < v:
            continue
        out.append({"virtual_pipeline_model_parallel_size": v if v > 1 else None})
    return out


def layout_string(counts: list, mtp: int) -> str:
    """Megatron's layout string for decoder-layer counts per virtual stage (stage i = rank i % PP,
    chunk i // PP): E on the first, MTP and L on the last; runs of equal middle stages written
    as (t*n|)*k, which the parser unrolls first (pipeline_parallel_layer_layout.py:290-300)."""
    def t(c: int) -> str:
        return f"t*{c}" if c > 1 else "t" * c
    head = "E" + t(counts[0]) + "|" if len(counts) > 1 else ""
    middle = counts[1:-1]
    tail = ("" if len(counts) > 1 else "E") + t(counts[-1]) + "m" * mtp + "L"
    out, i = "", 0
    while i < len(middle):
        j = i
        while j < len(middle) and middle[j] == middle[i]:
            j += 1
        out += f"({t(middle[i])}|)*{j - i}" if j - i > 1 else t(middle[i]) + "|"
        i = j
    return head + out + tail


def _layout_options(w, pl, rank_peaks: list) -> list:
    p = w.pipeline_model_parallel_size
    if p <= 1 or w.pipeline_model_parallel_layout is not None or w.hybrid_override_pattern:
        return []
    v = len(pl.chunks[0])
    counts = [len(pl.chunks[i % p][i // p]) for i in range(p * v)]
    hot = max(range(p), key=lambda r: rank_peaks[r])
    cool = min(range(p), key=lambda r: rank_peaks[r])
    if hot == cool:
        return []
    out = []
    for d in (1, 2):
        new = list(counts)
        src, dst = hot, (v - 1) * p + cool          # the hot rank's first chunk, the cool one's last
        if new[src] - d < 1:
            continue
        new[src] -= d
        new[dst] += d
        change = {"pipeline_model_parallel_layout": layout_string(new, w.mtp_num_layers or 0)}
        # the layout replaces these; megatron-core rejects them beside it (or checks VPP against it)
        for field in ("virtual_pipeline_model_parallel_size", "num_layers_in_first_pipeline_stage",
                      "num_layers_in_last_pipeline_stage"):
            if getattr(w, field) is not None:
                change[field] = None
        out.append(change)
    return out


def _cp_options(w) -> list:
    world = w.num_gpus or w.model_parallel_size
    out = []
    for factor in (2, 4):
        c = w.context_parallel_size * factor
        mp = w.tensor_model_parallel_size * w.pipeline_model_parallel_size * c
        if world % mp or w.seq_length % (2 * c):
            continue
        dp = world // mp
        gbs = w.global_batch_size or w.micro_batch_size * w.data_parallel_size
        if gbs % (w.micro_batch_size * dp):
            continue
        out.append({"context_parallel_size": c})
    return out


def _offload_options(w, version: str, hottest_kinds: list) -> list:
    from mbridge_recompute.facts import releases
    from mbridge_recompute.memory.offload import offloaded_bytes
    from mbridge_recompute.memory.recompute import modules_of
    from mbridge_recompute.memory.shape import shape_of
    from mbridge_recompute.memory.types import DEFAULT_KNOBS

    if w.fine_grained_activation_offloading or w.cpu_offloading:
        return []
    known = releases.enum("offload_modules", version) or []
    sh = shape_of(w, DEFAULT_KNOBS)
    mods = modules_of(w)
    sizes = {}
    for m in known:
        sizes[m] = sum(offloaded_bytes(sh, k, mods, frozenset([m])) for k in hottest_kinds)
    ranked = [m for m in sorted(sizes, key=lambda m: -sizes[m]) if sizes[m] > 0]
    out = []
    for chosen in ([ranked[0]] if ranked else [], ranked[:2] if len(ranked) > 1 else [],
                   ranked[:3] if len(ranked) > 2 else []):
        if chosen:
            out.append({"fine_grained_activation_offloading": True, "offload_modules": tuple(chosen)})
    return out


def alternatives(w, version: str, rank_peaks: list) -> list:
    """Field changes for the same GPU count, each a dict of Workload field -> value."""
    from mbridge_recompute.placement import place

    pl = place(w, version)
    if not pl.ok:
        return []
    hot = max(range(len(rank_peaks)), key=lambda r: rank_peaks[r])
    out = _vpp_options(w, pl) + _layout_options(w, pl, rank_peaks) + _cp_options(w)
    if not w.use_distributed_optimizer:
        out.append({"use_distributed_optimizer": True})
    out += _offload_options(w, version, pl.rank_kinds(hot))
    return out


def settings(w, version: str, rank_peaks: list, recompute: list) -> list:
    """Every alternative alone (on the current recompute setting and on the [] control) and
    with each of the given recompute settings."""
    bases = list(dict.fromkeys([RecomputeSetting.from_workload(w), RecomputeSetting.selective(),
                                *recompute]))
    out = []
    for change in alternatives(w, version, rank_peaks):
        for base in bases:
            out.append(base.with_changes(**change))
    return list(dict.fromkeys(out))
