"""Layout, offloading and optimizer alternatives to recompute, for the same GPU count.

Each alternative is a change of Workload fields beside a recompute setting (setting.py's
`changes`); the planner prices it like any candidate (the memory model, the checker, the
modelled step of cost.py) so that "VPP 10" and "mlp" sit on one frontier. Generated here:
- another pipeline size at the same GPU count (PP x 2 or PP / 2, the data-parallel size taking
  up the difference): static memory per rank (fewer layers, but the distributed optimizer
  shards over fewer replicas), activations (fewer layers, more in-flight micro-batches) and the
  bubble (p-1)/(v*m) with m = GBS / (MBS x DP) all move; the VPP size is kept where it still
  divides the layers;
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


def _same_batch(w) -> dict:
    """A change of the data-parallel size keeps the global batch: a workload that does not
    set one runs MBS x DP samples a step, so the option pins that figure (otherwise it would
    compare steps of different batches)."""
    if w.global_batch_size is not None:
        return {}
    return {"global_batch_size": w.micro_batch_size * w.data_parallel_size}


def _pp_options(w, version: str) -> list:
    """PP x 2 and PP / 2 at the same GPU count, where megatron-core can lay the layers out."""
    from mbridge_recompute.placement import place

    if not w.num_gpus or w.pipeline_model_parallel_layout is not None \
            or "|" in (w.hybrid_override_pattern or ""):
        return []            # no GPU count to keep; a layout or pipe segments fix the stages
    p = w.pipeline_model_parallel_size
    out = []
    for new in (p * 2, p // 2):
        if new < 1 or new == p:
            continue
        mp = w.tensor_model_parallel_size * new * w.context_parallel_size
        ep = new * w.expert_model_parallel_size * w.etp
        if w.num_gpus % mp or (w.is_moe and w.num_gpus % ep):
            continue
        dp = w.num_gpus // mp
        gbs = w.global_batch_size or w.micro_batch_size * w.data_parallel_size
        if gbs % (w.micro_batch_size * dp):
            continue
        change = {"pipeline_model_parallel_size": new, **_same_batch(w)}
        for field in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
            if getattr(w, field) is not None:
                change[field] = None
        vpp = w.virtual_pipeline_model_parallel_size
        if vpp is not None and (new == 1 or w.num_layers % (new * vpp)):
            change["virtual_pipeline_model_parallel_size"] = None
        if place(w.replace(**change), version).ok:
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
        out.append({"context_parallel_size": c, **_same_batch(w)})
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
    out = _pp_options(w, version) + _vpp_options(w, pl) + _layout_options(w, pl, rank_peaks) \
        + _cp_options(w)
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


def rows(pricer, cands: list, current, settle_one) -> list:
    """The side-by-side table: each option with what it frees on the hottest rank against the
    current setting, frees = peak(current) - peak(option), for a stated option:
    - each layout / offload / optimizer alternative on the current recompute setting;
    - each allowed single label added to the current labels (instead of full recompute when
      that is what runs now);
    - full recompute of one layer per checkpoint (block:1 and uniform:1), instead of the
      current setting.
    An option not priced yet is priced here (`settle_one` calibrates it and decides its fit)
    and returned in the rows only; its cost is the change of the modelled step."""
    from mbridge_recompute import memory

    now = current.setting.recompute
    have = {c.setting: c for c in cands}
    cur = current.step or memory.step_cost(pricer.w)
    singles = [c.setting.modules[0] for c in cands if not c.setting.changes and c.allowed
               and c.setting.granularity == "selective" and len(c.setting.modules or ()) == 1]
    options = []
    for c in cands:
        if c.setting.changes and c.setting.recompute == now:
            options.append((c.setting, "on the current setting"))
    base = [] if now.granularity != "selective" else \
        ["core_attn"] if now.modules is None else list(now.modules)   # None: MCore's default
    for label in singles:
        if label in base:
            continue
        if now.granularity == "full":
            options.append((RecomputeSetting.selective(label), "instead of the current setting"))
        elif base:
            options.append((RecomputeSetting.selective(*base, label), "added to the current labels"))
        else:
            options.append((RecomputeSetting.selective(label), "on the current setting"))
    for method in ("block", "uniform"):
        s = RecomputeSetting.full(method, 1)
        if s != now and s in have:
            options.append((s, "instead of the current setting"))
    out = []
    for setting, relation in dict.fromkeys(options):
        c = have.get(setting)
        if c is None:
            c = pricer.price(setting)
            settle_one(c)
            have[setting] = c
        if not c.allowed or not c.modelled:
            continue
        row = {"name": c.name, "option": c.setting.describe(), "relation": relation,
               "kind": c.setting.kind, "peak_bytes": c.peak_bytes,
               "frees_bytes": current.peak_bytes - c.peak_bytes, "cost_pct": round(c.cost_pct, 3),
               "replay_pct": round(c.replay_pct, 3), "offload_pct": round(c.offload_pct, 3),
               "cp_pct": round(c.shares.cp_pct, 3) if c.shares else 0.0,
               "fits": c.fits, "dominated_by": c.dominated_by, "detail": ""}
        if c.setting.changes:
            new = c.step
            parts = []
            if new.bubble != cur.bubble:
                parts.append(f"bubble {100 * cur.bubble:.2f} % -> {100 * new.bubble:.2f} %")
            if new.microbatches != cur.microbatches:
                parts.append(f"micro-batches {cur.microbatches} -> {new.microbatches}")
            if new.cp or cur.cp:
                parts.append(f"exposed CP exchange {row['cp_pct']:.2f} %")
            if new.offload != cur.offload:
                parts.append(f"exposed offload copies {row['offload_pct']:.2f} %")
            row["detail"] = ", ".join(parts)
        out.append(row)
    return sorted(out, key=lambda r: (r["cost_pct"], r["peak_bytes"]))
