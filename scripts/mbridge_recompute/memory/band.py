"""The error band of a rank's predicted peak: how far the measured peak may lie from it.

The band is built from terms, each present only when the workload has what it is about, and
each sized from the accuracy table (benchmarks/measured_peaks.py, benchmarks/data/measured/):
the cases with that feature bound how far the model has been off. Allocated-side terms widen
both peaks; device-side terms only the device peak. A calibration against a measured run
(`--measured-peak-gb`) absorbs what does not change between recompute settings: only the
terms marked `kept` survive it, and the model term becomes CALIBRATED_DELTA of a candidate's
change from the measured setting (the plan adds it: plan/report.Candidate.band).

tests/test_measured_peaks.py checks that every case of the accuracy table lies inside its band
(test_every_measured_peak_lies_inside_the_plans_error_band); its constants were sized on
those same cases, so that check is in-sample, not evidence for a new workload class.
"""

from __future__ import annotations

from typing import NamedTuple

from mbridge_recompute.memory.graphs import graphs_of
from mbridge_recompute.units import GB

BUG_TERM = "known bug "   # the band term of a known memory bug is this and the card's bug id
# The model on cases without the terms below: measured between -9.1 % (Llama3 70B FP8 SFT at
# TP 8, iteration 1) and +7.6 % (DeepSeek-V3 proxy on H100, release golden) of the prediction.
MODEL_UNDER = 0.08        # measured above the prediction by up to this share
MODEL_OVER = 0.10         # measured below the prediction by up to this share
# After calibration what is left is the error of the change from the measured setting: on the
# published sweeps (benchmarks/accuracy.py) the model's savings are too large by up to 2x
# (Moonlight layernorm,moe_act: -1.35 GB modelled, -0.67 measured; moe_act -0.90 vs -0.68),
# never too small by more than 3 % (Nemotron 3 Nano): the measured peak may lie above the
# calibrated prediction by half the change, below it by a quarter.
CALIBRATED_DELTA = (0.25, 0.5)       # (below, above), of |candidate - measured setting|
# Dropless MoE without forced balancing: the hottest EP rank can receive up to twice the
# balanced tokens early in training: the Moonlight 16B sweep (max over printed ranks after
# iteration 2) needs about 2x on its routed-token tensors (-12.2 % without); the MoE/MLA
# functional test's peak drifts +4 % from iteration 2 to 50.
IMBALANCE = 0.5           # extra routed-token activations as a share of the MoE component
# what of it is left once a measured run anchors the plan: the peaks of the long MoE runs in the
# table grow by 0.05-0.25 of their MoE component after iteration 2 (DeepSeek-V3 proxy over 47680
# iterations: 0.23; Mixtral 8x22B over 150: 0.08)
CALIBRATED_DRIFT = 0.5
# Stack-dependent cross-entropy working set on the loss stage: the same DeepSeek-V3 proxy
# configuration measured 5.2 GB (H100, MBS 1) and 21 GB (GB200, MBS 4) higher after the PyTorch
# and TE bumps of 2026-06-18 with unchanged static memory, 2.45-2.48 fp32 [T, V/t] logits, i.e.
# about 1.25 per loss (main + 1 MTP depth). With its static memory predicted within 1.3 % the
# model lies between the two stacks: the release goldens 0.62-0.66 per loss below it, the
# weekly ones 0.57-0.62 above.
LOSS_STACK_LOGITS = (0.7, 0.7)       # (below, above), fp32 [T, V/t] per loss
# Static memory of MoE / MTP stages above the enumerated terms and the workspaces term below:
# up to 0.15 GB (2.7 %) on 5.6 GB in the MoE/MLA functional tests (0.28-0.46 GB in all, with and
# without MTP alike), 0.13-0.47 GB (0.4-0.8 %) on the DeepSeek-V3 proxy's MTP stage, 1.3 % on
# Mixtral 8x7B at VPP 8 (mem-allocated after iteration 1 against the allocated static terms).
MOE_STATIC_RESIDUE = 0.03
# PyTorch-allocated workspaces and small persistent buffers (cuBLAS / TE workspaces, RNG
# states, routing bookkeeping): 0.08-0.27 GB on the small functional tests.
WORKSPACES = 0.3 * GB
# Fine-grained activation offloading: iteration 1 (the offload manager's warm-up) measured up to
# 23 % below the prediction, steady state up to 9.3 % above it.
OFFLOAD_LOWER = 0.25      # of activations + transient
OFFLOAD_UPPER = 0.10
# CUDA graphs: pool fragmentation in the device peak (not measured: a stated guess).
GRAPH_POOL_SLACK = 0.10   # of the graphed activations


class Term(NamedTuple):
    name: str
    lower: int            # bytes the measured peak may lie below the prediction
    upper: int            # bytes it may lie above
    device_only: bool     # widens the device peak only (memory PyTorch does not count)
    kept: bool            # survives a calibration
    why: str


class Band(NamedTuple):
    allocated: tuple      # (lower, upper) bytes around allocated_peak_bytes
    device: tuple         # (lower, upper) bytes around peak_bytes
    terms: tuple          # Term


def _force_balanced(w) -> bool:
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    return bool(extra.get("moe_router_force_load_balancing"))


class Context(NamedTuple):
    """What the terms read of a workload, worked out once for all its ranks."""
    sh: object
    graphs: object
    force_balanced: bool
    world_given: bool
    bugs_on: bool


def context(w) -> Context:
    from mbridge_recompute.memory.shape import shape_of
    from mbridge_recompute.memory.types import DEFAULT_KNOBS

    return Context(shape_of(w, DEFAULT_KNOBS), graphs_of(w), _force_balanced(w), w.num_gpus is not None,
                   bool(w.is_moe))


def terms(w, est, rank, release_key=None, ctx=None) -> list:
    """The band terms of one rank of an estimate of `w` (`release_key`: the release whose known
    memory bugs apply, card `memory_bugs:`). Settings the model does not read are not sized
    here: the plan names each one as not modelled."""
    ctx = ctx or context(w)
    sh = ctx.sh
    alloc = rank.allocated_peak_bytes
    out = [Term("model", round(MODEL_OVER * alloc), round(MODEL_UNDER * alloc), False, False,
                f"the model on the accuracy table's plain cases: -{MODEL_OVER:.0%} .. "
                f"+{MODEL_UNDER:.0%}")]
    out.append(Term("workspaces", 0, round(WORKSPACES), False, False,
                    "cuBLAS / Transformer Engine workspaces and small persistent buffers "
                    "(0.08-0.27 GB in the functional tests)"))
    moe = rank.activations.get("moe", 0)
    if w.is_moe and moe > 0 and w.moe_expert_capacity_factor is None and not ctx.force_balanced:
        out.append(Term("routing imbalance", 0, round(IMBALANCE * moe), False, True,
                        "dropless routing without moe_router_force_load_balancing: the hottest "
                        "EP rank can get about twice the balanced tokens early in training "
                        "(Moonlight 16B sweep, max over ranks)"))
    if rank.moe_layers:
        static_alloc = rank.static_bytes - rank.outside_allocator_bytes
        out.append(Term("MoE static residue", 0, round(MOE_STATIC_RESIDUE * static_alloc), False,
                        False, "static memory of MoE / MTP stages above the enumerated "
                        "parameters, gradients, optimizer state and dummy weight gradients "
                        "(up to 2.7 % beyond the workspaces measured)"))
    if rank.pp_rank == len(est.ranks) - 1 and sh.vocab:
        losses = 1 + (w.mtp_num_layers or 0)
        logits = 4 * sh.T * sh.vocab_ * losses
        below, above = LOSS_STACK_LOGITS
        out.append(Term("loss-stage stack", round(below * logits), round(above * logits), False,
                        False, f"the cross-entropy working set differs between PyTorch / TE "
                        f"stacks: -{below:g} / +{above:g} fp32 [T, V/t] per loss around the "
                        "model, measured on one configuration across two stacks"))
    if sh.offload:
        act = rank.activation_bytes + rank.transient_bytes
        out.append(Term("activation offloading", round(OFFLOAD_LOWER * act),
                        round(OFFLOAD_UPPER * act), False, True,
                        "fine-grained offloading: iteration 1 (the offload manager's warm-up) "
                        "offloads every group; copy timing decides what is still on the GPU"))
    g = ctx.graphs
    if g is not None:
        io = rank.static.get("cuda_graph_buffers", 0)
        out.append(Term("CUDA-graph buffers", 0, round(io), False, False,
                        "the graphs' static input/output buffers are an estimate (x2)"))
        out.append(Term("CUDA-graph pool", 0, round(GRAPH_POOL_SLACK * rank.graphed_bytes), True,
                        False, "fragmentation inside the graph pool (a stated guess)"))
    flex = rank.static.get("flex_buffers", 0)
    if flex:
        out.append(Term("flex dispatcher buffers", 0, round(flex), True, False,
                        "DeepEP / HybridEP buffer sizes follow their defaults and the NVLink "
                        "domain (x2)"))
    if not ctx.world_given:
        out.append(Term("world size assumed", round(0.5 * rank.static.get("optimizer", 0)), 0,
                        False, False, "no GPU count: more data-parallel replicas would shard "
                        "the optimizer state further"))
    if release_key is not None and (ctx.bugs_on or w.recompute_granularity):
        from mbridge_recompute.memory.bugs import hits

        for hit in hits(w, sh, rank, release_key):
            out.append(Term(BUG_TERM + hit.id, 0, round(hit.nbytes), False, False, hit.sentence))
    return out


def band(w, est, rank, calibrated: bool = False, release_key=None, ctx=None) -> Band:
    """The rank's band. Allocated-side terms add up on each side; calibration keeps only the
    `kept` terms and a narrower model term."""
    return _sum(terms(w, est, rank, release_key, ctx), calibrated)


def bands(w, est, rank, release_key=None, ctx=None) -> tuple:
    """(uncalibrated, calibrated) bands of one rank, from one set of terms."""
    ts = terms(w, est, rank, release_key, ctx)
    return _sum(ts, False), _sum(ts, True)


def _sum(ts: list, calibrated: bool) -> Band:
    if calibrated:
        kept = []
        for t in ts:
            if not t.kept or t.name == "model":
                continue
            if t.name == "routing imbalance":
                # the measured run's imbalance is in the offset; what is left is its drift
                t = t._replace(upper=round(CALIBRATED_DRIFT * t.upper), why=(
                    "routing imbalance drifts after the measured iterations (the long MoE runs of "
                    "the accuracy table: +0.05-0.25 of the MoE activations)"))
            kept.append(t)
        ts = kept          # the plan adds CALIBRATED_DELTA of each candidate's change
    lo_a = sum(t.lower for t in ts if not t.device_only)
    up_a = sum(t.upper for t in ts if not t.device_only)
    lo_d = lo_a + sum(t.lower for t in ts if t.device_only)
    up_d = up_a + sum(t.upper for t in ts if t.device_only)
    return Band((lo_a, up_a), (lo_d, up_d), tuple(ts))
