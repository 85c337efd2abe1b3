"""Known memory bugs of megatron-core (card `memory_bugs:`) that a workload meets on a release,
and how many bytes each keeps on a pipeline rank. The facts (condition, releases, issue, fix)
live in the card; this module decides when a workload meets them and sizes them from the
rank's shape. The plan names each one in its output and widens the rank's error band by it
(memory/band.py); the point estimate does not include them, since a fix may have landed in
the user's own build."""

from __future__ import annotations

from typing import NamedTuple

from mbridge_recompute.memory.shape import Shape, extra_value


class Hit(NamedTuple):
    id: str
    nbytes: float          # kept on the rank at its peak
    sentence: str          # what the plan prints


def _unpermute_kept(w, sh: Shape, rank) -> float:
    """One set of unpermute intermediates per MoE layer under full recompute (issue 3221)."""
    if (w.recompute_granularity != "full" or not rank.moe_layers
            or extra_value(w, "moe_permute_fusion", False)):
        return 0.0
    if sh.dispatcher not in ("alltoall", "allgather", "flex"):
        return 0.0
    e = 4 if sh.router_fp32 else sh.elt
    return rank.moe_layers * e * sh.h * (sh.n_routed() + sh.Tr * sh.etp)


def _deepep_probs_kept(w, sh: Shape, rank) -> float:
    """The MoE input and its gradient kept per MoE layer by _DeepepManager.token_probs (PR 5227)."""
    from mbridge_recompute.memory.dispatcher import flex_backend

    if sh.dispatcher != "flex" or flex_backend(w) != "deepep" or not rank.moe_layers:
        return 0.0
    if not w.recompute_granularity:
        return 0.0
    return rank.moe_layers * 2 * sh.elt * sh.h * sh.Tr


SIZES = {"moe-full-recompute-unpermute-kept": _unpermute_kept,
         "deepep-token-probs-kept-with-recompute": _deepep_probs_kept}


def hits(w, sh: Shape, rank, release_key: str) -> list:
    """The card's memory bugs of release `release_key` that `w` meets on `rank`, sized."""
    from mbridge_recompute.facts import card, releases

    out = []
    for bug in card.load().get("memory_bugs", []):
        if not releases.in_range(release_key, bug["releases"]):
            continue
        size = SIZES[bug["id"]](w, sh, rank)
        if size <= 0:
            continue
        out.append(Hit(bug["id"], size, (
            f"known memory bug of megatron-core {release_key} ({bug['id']}): {bug['condition']}; "
            f"keeps {size / 1e9:.2f} GB on pp_rank {rank.pp_rank} ({bug['size']}); issue "
            f"{bug['issue']}; fix {bug['fix']}" + (f"; {bug['note']}" if bug.get("note") else ""))))
    return out
