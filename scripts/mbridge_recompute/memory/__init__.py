"""Activation and static memory model of a Megatron-Core training step (pure Python, no torch).

Public API:
    estimate(w, knobs=DEFAULT_KNOBS) -> MemoryEstimate        per-PP-rank peak for w's own recompute setting
    what_it_drops(w, label) -> (modelled, description)        what a label discards on this workload
    replay_cost_pct(w, knobs=DEFAULT_KNOBS) -> float           replayed forward work as % of the step
    step_cost_pct(w, reference) -> float                      the modelled step (replay, bubble,
                                                             exposed offload / CP transfers) vs a
                                                             reference layout, in %
    first_iteration_peak_bytes(w, rank) -> int                a rank's peak in iteration 1, before the
                                                             first optimizer step creates Adam state

How it is built (one module per job):
    shape.py      the per-rank dimensions read from a Workload (frozen, so results cache)
    tensors.py    saved tensors of one layer per block type (attention GQA/MLA, MLP, MoE, Mamba,
                  GatedDeltaNet) under selective labels, tensor by tensor, TE and local specs
    recompute.py  which labels are in force; full recompute groups per model chunk
    schedule.py   layer placement over PP/VPP chunks; in-flight micro-batches in MCore's order
    static.py     parameters per rank; weights, gradients, optimizer, fp8 copies, residual
    peak.py       per-rank peak = static + worst in-flight saved activations + largest transient
    effects.py    what each label discards here (applicability is the checker's: plan/labels.py)
    cost.py       replayed FLOPs (+ communication, memory-bound kernels) as % of the step; the
                  step of a layout (bubble, exposed offload and CP transfers)
    offload.py    which saved tensors fine-grained activation offloading moves to the host
    paper.py      Korthikanti et al. 2022 as a workload (reproduces Table 2 to the byte)
    measure.py    GPU harness: bytes real megatron-core layers keep, next to the prediction
    worked.py     worked per-layer numbers for the reference shapes

Every modelled quantity a Workload does not hold is a `Knobs` field with a stated default,
and every assumption is returned as a sentence in `MemoryEstimate.assumptions`.
"""

from mbridge_recompute.memory.cost import (
    StepShares,
    change_pct,
    replay_cost_pct,
    shares,
    step_cost,
    step_cost_pct,
)
from mbridge_recompute.memory.effects import what_it_drops
from mbridge_recompute.memory.peak import estimate, first_iteration_peak_bytes
from mbridge_recompute.memory.types import DEFAULT_KNOBS, PAPER_KNOBS, Knobs, MemoryEstimate, RankMemory

__all__ = ["estimate", "first_iteration_peak_bytes", "what_it_drops", "replay_cost_pct",
           "step_cost", "step_cost_pct", "change_pct", "shares", "StepShares",
           "MemoryEstimate", "RankMemory", "Knobs", "DEFAULT_KNOBS", "PAPER_KNOBS"]
