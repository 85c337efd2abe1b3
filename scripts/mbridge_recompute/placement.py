"""Where every decoder layer sits: pipeline stages, model chunks, and the splits Megatron-Core rejects.

The one home of layer placement. The checker (`recompute_num_layers` is counted per model
chunk), the memory model (what each pipeline rank holds and keeps) and the planner (which
`uniform:N` / `block:N` candidates exist) all read `place(w)`.

Megatron-Core's arithmetic, followed here:
- even split: `num_layers` (+1 for an embedding, +1 for a loss stage accounted in the split)
  over PP ranks, asserted divisible when the model is built (`get_num_layers_to_build`,
  transformer_block.py:152-167 @ core_v0.16.1);
- uneven split: `num_layers_in_first/last_pipeline_stage` fixed, the rest spread evenly over
  the middle stages, validated in `TransformerConfig.__post_init__` (tc:1359-1434);
- interleaving: each rank's layers are split evenly over its VPP model chunks (asserted
  divisible, transformer_block.py:170-178), and virtual stage `j*p + r` is rank r's chunk j
  (transformer_layer.py:39-180, `get_transformer_layer_offset`). Without pipeline parallelism
  there is one chunk (`get_num_layers_to_build` interleaves only when PP > 1);
- hybrid (Mamba) stacks on 0.16 slice their layer pattern the same way but with a floor
  division in the even case, so a remainder is never built, and assert that there is no
  interleaving (ssm/mamba_block.py:172-219 @ core_v0.16.1); from 0.17 a pattern's '|' separators
  are its stages (rank r's chunk j builds segment j*PP + r; segments past PP x VPP are never
  built, which Megatron-LM's arguments avoid by deriving VPP = segments / PP,
  arguments.py:687-705 @ core_v0.17.1, and a Bridge config does not), and without them the
  layers are split evenly or by the first/last counts, each divisibility a ValueError
  (select_pipeline_segment, ssm/mamba_hybrid_layer_allocation.py:314-468 @ core_v0.17.1);
- an explicit `pipeline_model_parallel_layout` replaces all of the above: its stages, in
  virtual-stage order, say how many decoder (`t`) and MTP (`m`) layers each holds; stage `i`
  is rank `i % PP`'s chunk `i // PP`, and the number of stages over PP is the VPP size
  (pipeline_parallel_layer_layout.py:24-83, 283-321 @ core_v0.16.1, unchanged to 0.19).
  TransformerConfig then skips the uneven and accounting checks (tc:1306-1357).

Multi-token prediction sits on the last virtual stage of the rank that holds `m` in a layout,
else on the last pipeline rank's last chunk (`mtp_on_this_rank`, mtp:464-531 @ core_v0.16.1).

A split Megatron-Core rejects (or, for hybrid stacks, builds wrong) is not placed:
`Placement.problems` names each by its card constraint id (message, exception, citation and
the releases it holds for live in the card) and `chunks` is empty. A problem is raised only
for a release the card says it holds for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Optional

from mbridge_recompute.workload import hybrid_kinds


class Problem(NamedTuple):
    """A split Megatron-Core rejects: the card constraint id and what was seen."""
    cid: str
    detail: str


@dataclass(frozen=True)
class Placement:
    """Decoder layers per pipeline rank and model chunk, in Megatron-Core's virtual-stage order."""
    chunks: tuple          # [pp_rank][chunk] -> tuple of layer kinds ('attn+mlp', 'mamba', ...)
    problems: tuple        # Problem entries, in the order Megatron-Core checks them
    mtp_at: Optional[tuple] = None   # (pp_rank, chunk) holding the MTP depths, None without MTP
    mtp_layers: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def stage_layers(self) -> list[int]:
        """Decoder layers held by each pipeline rank (all its chunks)."""
        return [sum(len(c) for c in rank) for rank in self.chunks]

    @property
    def chunk_sizes(self) -> list[int]:
        """Decoder layers of every model chunk, rank by rank: what `recompute_num_layers`
        is measured against (`len(self.layers)`, transformer_block.py:326 @ core_v0.16.1)."""
        return [len(c) for rank in self.chunks for c in rank]

    @property
    def distinct_chunk_sizes(self) -> list[int]:
        return sorted(set(self.chunk_sizes))

    def rank_kinds(self, rank: int) -> list[str]:
        return [k for chunk in self.chunks[rank] for k in chunk]


def place(w, version: Optional[str] = None) -> Placement:
    """The placement of workload `w`'s decoder layers (its `layer_kinds()`) on megatron-core
    `version` (a Release or a version; default: the invocation's release)."""
    from mbridge_recompute.facts import releases

    v = releases.resolve_version(version)
    emb = bool(w.extra_model.get("account_for_embedding_in_pipeline_split"))
    loss = bool(w.extra_model.get("account_for_loss_in_pipeline_split"))
    mtp = w.mtp_num_layers or 0
    if w.pipeline_model_parallel_layout is not None and not w.hybrid_override_pattern:
        return _place_layout(tuple(w.layer_kinds()), layout_key(w.pipeline_model_parallel_layout),
                             w.pipeline_model_parallel_size, w.virtual_pipeline_model_parallel_size,
                             w.num_layers_in_first_pipeline_stage,
                             w.num_layers_in_last_pipeline_stage, emb, loss, mtp)
    if w.hybrid_override_pattern and _holds("hybrid-segments-not-divisible-by-pp", v):
        return _place_hybrid_segments(tuple(w.hybrid_override_pattern.split("/")[0].split("|")),
                                      w.pipeline_model_parallel_size,
                                      w.virtual_pipeline_model_parallel_size,
                                      w.num_layers_in_first_pipeline_stage,
                                      w.num_layers_in_last_pipeline_stage, mtp)
    pl = _place(v, tuple(w.layer_kinds()), bool(w.hybrid_override_pattern),
                w.pipeline_model_parallel_size,
                w.virtual_pipeline_model_parallel_size, w.num_layers_in_first_pipeline_stage,
                w.num_layers_in_last_pipeline_stage, emb, loss)
    if mtp and pl.ok:
        p = len(pl.chunks)
        return Placement(pl.chunks, (), (p - 1, len(pl.chunks[-1]) - 1), mtp)
    return pl


def _holds(cid: str, version: str) -> bool:
    from mbridge_recompute.facts import card

    return card.holds(cid, version)


class UnevenSplit(NamedTuple):
    """`num_layers_in_first/last_pipeline_stage`: the fixed counts, and what is left for the
    middle stages (spread evenly over them)."""
    fixed: dict            # pp_rank -> its fixed layer count (0 for first, p - 1 for last)
    middle_layers: int
    middle_stages: int

    def stages(self, p: int) -> list[int]:
        """Layers per pipeline rank (a remainder the middle stages do not divide is dropped;
        the checks reject that split before it is placed)."""
        per = self.middle_layers // self.middle_stages if self.middle_stages else 0
        return [self.fixed.get(r, per) for r in range(p)]


def uneven_split(n: int, p: int, first, last) -> UnevenSplit:
    """The one home of the uneven first/last split, shared by the checks and both placers.
    With PP 1 the first and last stage are one rank; Megatron-Core still subtracts both counts
    when it validates them (and then builds the whole stack), so the last count is kept apart
    from the first there."""
    fixed = {}
    if first is not None:
        fixed[0] = first
    if last is not None:
        fixed[p - 1 if p > 1 else 1] = last
    return UnevenSplit(fixed, n - sum(fixed.values()), p - len(fixed))


def _uneven_problems(n: int, p: int, v: Optional[int], first, last) -> list[Problem]:
    """TransformerConfig's uneven-PP checks, in its order (tc:1359-1434 @ core_v0.16.1)."""
    out = []
    for which, value in (("first", first), ("last", last)):
        if value is None:
            continue
        if value <= 0:
            out.append(Problem(f"uneven-{which}-stage-not-positive",
                               f"num_layers_in_{which}_pipeline_stage={value}"))
            return out
        if v is not None and value % v:
            out.append(Problem(f"uneven-{which}-stage-not-divisible-by-vpp",
                               f"num_layers_in_{which}_pipeline_stage={value} is not a multiple of "
                               f"virtual_pipeline_model_parallel_size={v}"))
            return out
    split = uneven_split(n, p, first, last)
    middle_layers, middle_stages = split.middle_layers, split.middle_stages
    if bool(middle_layers) != bool(middle_stages):
        out.append(Problem("uneven-middle-mismatch",
                           f"{middle_layers} layers left for {middle_stages} middle pipeline stages"))
    elif middle_stages and middle_layers % middle_stages:
        out.append(Problem("uneven-middle-not-divisible",
                           f"{middle_layers} middle layers over {middle_stages} middle stages"))
    elif middle_stages and v is not None and (middle_layers // middle_stages) % v:
        out.append(Problem("uneven-middle-not-divisible-by-vpp",
                           f"{middle_layers // middle_stages} layers per middle stage over VPP {v}"))
    return out


def _accounting_problems(total: int, p: int, v: Optional[int]) -> list[Problem]:
    """TransformerConfig's checks of a split that counts the embedding / loss as layers
    (tc:1435-1480 @ core_v0.16.1)."""
    if total % p:
        cid = ("pipeline-split-accounting-not-divisible" if v is None
               else "pipeline-split-accounting-not-divisible-with-vpp")
        return [Problem(cid, f"{total} layers with the embedding/loss stages counted over "
                             f"pipeline_model_parallel_size={p}")]
    if v is not None and (total // p) % v:
        return [Problem("pipeline-split-accounting-not-divisible-by-vpp",
                        f"{total // p} layers per pipeline rank (embedding/loss counted) over VPP {v}")]
    return []


@lru_cache(maxsize=512)
def _place(version: str, kinds: tuple, hybrid: bool, p: int, v: Optional[int], first, last,
           emb: bool, loss: bool) -> Placement:
    n = len(kinds)
    uneven = first is not None or last is not None
    hybrid = hybrid and _holds("hybrid-pp-drops-layers", version)   # older hybrid stacks split alone
    problems: list[Problem] = []
    if hybrid and v is not None and p > 1 and _holds("hybrid-no-interleaving", version):
        problems.append(Problem("hybrid-no-interleaving",
                                f"a hybrid (Mamba) stack with virtual_pipeline_model_parallel_size={v}"))
    elif uneven and (emb or loss):
        problems.append(Problem("uneven-pp-with-pipeline-split-accounting",
                                "num_layers_in_first/last_pipeline_stage with "
                                "account_for_embedding/loss_in_pipeline_split"))
    elif uneven:
        problems += _uneven_problems(n, p, v, first, last)
    elif emb or loss:
        problems += _accounting_problems(n + emb + loss, p, v)
    vpp = v if (v and p > 1) else 1
    if problems:
        return Placement((), tuple(problems))

    if uneven and p > 1:
        stages = uneven_split(n, p, first, last).stages(p)
    elif uneven:
        # PP 1: MCore still validates the fixed counts (above) but builds the whole stack
        stages = [n]
    elif hybrid:
        if n % p:
            return Placement((), (Problem("hybrid-pp-drops-layers",
                                          f"{n} layers over pipeline_model_parallel_size={p}: "
                                          f"each rank builds {n // p}, the last {n % p} are never "
                                          "built"),))
        stages = [n // p] * p
    else:
        total = n + emb + loss
        if total % p:
            return Placement((), (Problem("pp-does-not-divide-layers",
                                          f"{total} layers" + (" (embedding/loss stages counted)"
                                                               if emb or loss else "")
                                          + f" over pipeline_model_parallel_size={p}"),))
        stages = [total // p] * p
    per_chunk = []
    for r, count in enumerate(stages):
        if count % vpp:
            return Placement((), (Problem("vpp-does-not-divide-stage-layers",
                                          f"pp_rank {r} holds {count} layers, not a multiple of "
                                          f"virtual_pipeline_model_parallel_size={vpp}"),))
        sizes = [count // vpp] * vpp
        if not uneven and emb and r == 0:
            sizes[0] -= 1
        if not uneven and loss and r == p - 1:
            sizes[-1] -= 1
        per_chunk.append(sizes)
    if any(s < 0 for sizes in per_chunk for s in sizes):
        which = "first" if per_chunk[0][0] < 0 else "last"
        return Placement((), (Problem(f"pipeline-split-accounting-leaves-no-{which}-layers",
                                      f"the {which} virtual stage holds the "
                                      f"{'embedding' if which == 'first' else 'loss'} and no layer"),))
    chunks = [[()] * vpp for _ in range(p)]
    i = 0
    for j in range(vpp):
        for r in range(p):
            size = per_chunk[r][j]
            chunks[r][j] = kinds[i:i + size]
            i += size
    return Placement(tuple(tuple(rank) for rank in chunks), ())


# --- explicit layouts -------------------------------------------------------------------
# Layer names of the list form (LayerType members) and the characters of the string form
# (pipeline_parallel_layer_layout.py:303-308 @ core_v0.16.1).
LAYOUT_NAMES = {"embedding": "E", "loss": "L", "decoder": "t", "mtp": "m", "encoder": "#"}
LAYOUT_CHARS = "ELtm"


def layout_key(layout) -> tuple:
    """A layout as MCore holds it, hashable: a tuple of stages, each a string of layer
    characters (E embedding, L loss, t decoder, m MTP; ! a character the string form does not
    know, # an encoder layer and ? a name that is no LayerType in the list form).

    The string form is unrolled as `parse_str_to_list` does (commas dropped, `(X)*n` first,
    then `x*n`, split on `|`; pipeline_parallel_layer_layout.py:283-321 @ core_v0.16.1); the
    list form holds LayerType names per stage (:53-71).
    """
    if isinstance(layout, str):
        text = layout.replace(",", "")
        text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        return tuple("".join(c if c in LAYOUT_CHARS else "!" for c in stage)
                     for stage in text.split("|"))
    return tuple("".join(LAYOUT_NAMES.get(str(x).strip().lower(), "?") for x in stage)
                 for stage in layout)


def _layout_problems(stages: tuple, n: int, p: int, v: Optional[int], first, last,
                     emb: bool, loss: bool, mtp: int) -> list[Problem]:
    """TransformerConfig's and PipelineParallelLayerLayout's checks of a layout, in their order
    (tc:1306-1357, pipeline_parallel_layer_layout.py:24-150 @ core_v0.16.1). Each stops
    validation: megatron-core raises at the first."""
    if first is not None or last is not None or emb or loss:
        return [Problem("layout-with-other-pipeline-arguments",
                        "pipeline_model_parallel_layout with num_layers_in_first/last_pipeline_stage "
                        "or account_for_embedding/loss_in_pipeline_split")]
    for stage in stages:         # the string form is parsed before anything else is checked
        if "!" in stage:
            return [Problem("layout-invalid-layer-character",
                            "a character other than E, t, m, L in the layout string")]
    if len(stages) % p:
        return [Problem("layout-stages-not-divisible-by-pp",
                        f"{len(stages)} stages over pipeline_model_parallel_size={p}")]
    if any("?" in stage for stage in stages):
        return [Problem("layout-invalid-layer-name",
                        "a stage names a layer that is not a LayerType (embedding, decoder, mtp, "
                        "loss, encoder)")]
    detected = len(stages) // p
    if v is not None and v != detected:
        return [Problem("layout-vpp-conflict",
                        f"virtual_pipeline_model_parallel_size={v}, the layout has {detected} "
                        "virtual stages per rank")]
    flat = "".join(stages)
    checks = (
        ("layout-first-not-embedding", not flat.startswith("E"), f"the layout starts with {flat[:1]!r}"),
        ("layout-last-not-loss", not flat.endswith("L"), f"the layout ends with {flat[-1:]!r}"),
        ("layout-embedding-not-once", flat.count("E") != 1, f"{flat.count('E')} embedding stages"),
        ("layout-loss-not-once", flat.count("L") != 1, f"{flat.count('L')} loss stages"),
        ("layout-decoder-count", flat.count("t") != n,
         f"{flat.count('t')} decoder layers in the layout, num_layers={n}"),
        ("layout-mtp-count", flat.count("m") != mtp,
         f"{flat.count('m')} MTP layers in the layout, mtp_num_layers={mtp or None}"),
        ("layout-decoder-after-mtp", "m" in flat and "t" in flat[flat.index("m"):],
         "a decoder layer after an MTP layer"),
    )
    for cid, failed, detail in checks:
        if failed:
            return [Problem(cid, detail)]
    grid = [[stages[j * p + r] for j in range(detected)] for r in range(p)]
    for r in range(p):
        for j in range(detected - 1):
            if "m" in grid[r][j]:
                return [Problem("layout-mtp-not-in-last-virtual-stage",
                                f"MTP in chunk {j} of pp_rank {r} (of {detected})")]
    for r in range(p):
        if "m" in grid[r][-1] and grid[r][-1].count("m") != mtp:
            return [Problem("layout-mtp-split",
                            f"pp_rank {r} holds {grid[r][-1].count('m')} of {mtp} MTP layers")]
    if "#" in flat:
        return [Problem("layout-encoder-not-supported", "an encoder layer in the layout")]
    return []


@lru_cache(maxsize=512)
def _place_layout(kinds: tuple, stages: tuple, p: int, v: Optional[int], first, last,
                  emb: bool, loss: bool, mtp: int) -> Placement:
    problems = _layout_problems(stages, len(kinds), p, v, first, last, emb, loss, mtp)
    if problems:
        return Placement((), tuple(problems))
    vpp = len(stages) // p
    chunks = [[()] * vpp for _ in range(p)]
    i = 0
    mtp_at = None
    for s, stage in enumerate(stages):
        r, j = s % p, s // p
        size = stage.count("t")
        chunks[r][j] = kinds[i:i + size]
        i += size
        if "m" in stage:
            mtp_at = (r, j)
    return Placement(tuple(tuple(rank) for rank in chunks), (), mtp_at, mtp if mtp_at else 0)


# --- hybrid stacks from 0.17: '|' stage separators ------------------------------------------
def _kinds(segment: str) -> tuple:
    return tuple(hybrid_kinds(segment))


@lru_cache(maxsize=512)
def _place_hybrid_segments(segments: tuple, p: int, v: Optional[int], first, last,
                           mtp: int) -> Placement:
    """select_pipeline_segment's rules, in its order (:314-468 @ core_v0.17.1)."""
    uneven = first is not None or last is not None
    if len(segments) > 1 and uneven:
        return Placement((), (Problem("hybrid-pipes-with-uneven-stages",
                                      "num_layers_in_first/last_pipeline_stage with a '|' pattern"),))
    if len(segments) == 1:
        kinds = _kinds(segments[0])
        n = len(kinds)
        if p > 1 and v is not None and v > 1:
            return Placement((), (Problem("hybrid-vpp-needs-pipes",
                                          f"virtual_pipeline_model_parallel_size={v} without '|'"),))
        if p <= 1:
            stages = [n]
        elif uneven:
            split = uneven_split(n, p, first, last)
            if split.middle_stages > 0 and split.middle_layers % split.middle_stages:
                return Placement((), (Problem("hybrid-uneven-middle-not-divisible",
                                              f"{split.middle_layers} middle layers over "
                                              f"{split.middle_stages} middle stages"),))
            stages = split.stages(p)
        else:
            if n % p:
                return Placement((), (Problem("hybrid-pp-does-not-divide-layers",
                                              f"{n} layers over pipeline_model_parallel_size={p}"),))
            stages = [n // p] * p
        chunks, i = [], 0
        for count in stages:
            chunks.append((kinds[i:i + count],))
            i += count
        mtp_at = (p - 1, 0) if mtp else None
        return Placement(tuple(chunks), (), mtp_at, mtp)
    if len(segments) % p:
        return Placement((), (Problem("hybrid-segments-not-divisible-by-pp",
                                      f"{len(segments)} segments over pipeline_model_parallel_size={p}"),))
    vpp = v or 1
    if vpp * p > len(segments):
        return Placement((), (Problem("hybrid-segment-out-of-range",
                                      f"{len(segments)} segments for PP {p} x VPP {vpp}"),))
    if vpp * p < len(segments):
        return Placement((), (Problem("hybrid-segments-beyond-vpp",
                                      f"{len(segments)} segments for PP {p} x VPP {vpp}: segments "
                                      f"{vpp * p}..{len(segments) - 1} are never built"),))
    chunks = [[()] * vpp for _ in range(p)]
    for j in range(vpp):
        for r in range(p):
            chunks[r][j] = _kinds(segments[j * p + r])
    mtp_at = (p - 1, vpp - 1) if mtp else None
    return Placement(tuple(tuple(rank) for rank in chunks), (), mtp_at, mtp)
