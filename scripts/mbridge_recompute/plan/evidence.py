"""The replay cost model against the step times measured in the card's studies.

For every pair of rows of one study whose recompute sets differ by one label (and every row
against the study's [] control), the measured step-time change is set beside the change the
cost model predicts on the study's own workload (the evidence entry's `workload`). A label
whose measured cost is far above the model somewhere (more than 3x, and more than one
percentage point) is flagged in every plan's label table: the plan's cost for it is likely an
underestimate. Measured times are step_time_ms, or 1/TFLOP/s per GPU where only throughput is
given.

A measurement is quoted only to a workload of the same architecture class (`architecture`): the
layer mix (plain transformer, or a Mamba / GDN hybrid), the attention (GQA, which includes MHA,
or MLA) and the MLP (dense or MoE). What a label replays differs between classes (an MLA up-
projection, a grouped-GEMM expert, a Mamba mixer), so a Moonlight (MLA + MoE) step time says
nothing about a dense Llama's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Optional

from mbridge_recompute import DATA_DIR

FAR_RATIO = 3.0
FAR_POINTS = 1.0


class Architecture(NamedTuple):
    """A workload's architecture class: what a recompute label replays depends on it."""
    mixer: str                        # "transformer", "Mamba hybrid", "GDN hybrid", "Mamba + GDN hybrid"
    attention: str                    # "GQA" (MHA is GQA with one head per group), "MLA", "MLA + DSA", "none"
    mlp: str                          # "dense", "MoE"

    def __str__(self) -> str:
        return " ".join(([self.mixer] if self.mixer != "transformer" else []) + [self.mlp, self.attention])


def architecture(w) -> Architecture:
    """The architecture class of workload `w`, from its layer kinds and attention fields."""
    kinds = set(w.layer_kinds())
    linear = {"mamba": "Mamba", "gdn": "GDN"}
    hybrid = [name for kind, name in linear.items() if kind in kinds]
    if getattr(w, "experimental_attention_variant", None) in ("gated_delta_net", "gdn", "gdn2") \
            and "GDN" not in hybrid:
        hybrid.append("GDN")
    has_attention = any(k.startswith("attn") for k in kinds)
    if not has_attention:
        attention = "none"
    elif w.multi_latent_attention:
        attention = "MLA + DSA" if w.experimental_attention_variant == "dsa" else "MLA"
    else:
        attention = "GQA"
    mlp = "MoE" if any("moe" in k for k in kinds) else "dense"
    return Architecture(" + ".join(hybrid) + " hybrid" if hybrid else "transformer", attention, mlp)


class CostCheck(NamedTuple):
    evidence: str
    architecture: Architecture        # the study's workload's class
    label: Optional[str]              # the label the pair differs by (None: a set against [])
    base: tuple                       # the row's modules it is measured against
    setting: tuple
    measured_pct: float               # measured step-time change, % of the base row's
    modelled_pct: float               # modelled replay cost change, percentage points
    approximate: bool

    @property
    def far_above(self) -> bool:
        return self.measured_pct > max(FAR_RATIO * self.modelled_pct, self.modelled_pct + FAR_POINTS)

    def sentence(self) -> str:
        what = (f"{self.label} on top of [{', '.join(self.base)}]" if self.label
                else f"[{', '.join(self.setting)}] against []")
        return (f"{what}: measured {self.measured_pct:+.2f} % step time vs {self.modelled_pct:+.2f} % "
                f"modelled ({self.evidence}" + (", approximate" if self.approximate else "") + ")")


def study_workload(name: str):
    """The package-data copy of a study's workload (the card names it examples/NAME.yaml)."""
    from pathlib import PurePosixPath

    return DATA_DIR / "workloads" / PurePosixPath(name).name


def _time(row: dict) -> Optional[tuple]:
    """(a quantity proportional to step time, approximate?) for a row, or None."""
    approx = set(row.get("approximate") or [])
    if isinstance(row.get("step_time_ms"), (int, float)):
        return float(row["step_time_ms"]), "step_time_ms" in approx
    if isinstance(row.get("tflops_per_gpu"), (int, float)) and row["tflops_per_gpu"] > 0:
        return 1.0 / float(row["tflops_per_gpu"]), "tflops_per_gpu" in approx
    return None


@lru_cache(maxsize=1)
def checks() -> tuple:
    """Every measured-vs-modelled cost pair of the card's studies, on each study's workload."""
    from mbridge_recompute import memory
    from mbridge_recompute.facts import card
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.setting import RecomputeSetting

    out = []
    for ev in card.load().get("evidence", []):
        if not ev.get("workload"):
            continue
        w = load_workload(str(study_workload(ev["workload"])))
        rows = [(tuple(r["modules"]), _time(r)) for r in ev["rows"]]
        rows = [(m, t) for m, t in rows if t is not None]

        def cost(mods: tuple, w=w) -> float:
            return memory.replay_cost_pct(RecomputeSetting.selective(*mods).apply(w))

        for mods, (t, approx) in rows:
            for base, (t0, approx0) in rows:
                extra = set(mods) - set(base)
                if set(base) <= set(mods) and (len(extra) == 1 or (not base and mods)):
                    label = next(iter(extra)) if len(extra) == 1 else None
                    out.append(CostCheck(ev["id"], architecture(w), label, base, mods,
                                         100.0 * (t / t0 - 1), cost(mods) - cost(base),
                                         approx or approx0))
    return tuple(out)


def far_above(label: str, arch: Architecture) -> list:
    """The checks, on workloads of class `arch`, where `label`'s measured cost is far above the
    model."""
    return [c for c in checks() if c.far_above and c.architecture == arch
            and (c.label == label or (c.label is None and c.setting == (label,)))]


# the fields that make two workloads the same run for the memory evidence (recompute aside)
SAME_RUN = ("num_layers", "hidden_size", "ffn", "num_attention_heads", "heads_kv", "seq_length",
            "vocab_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "vpp",
            "context_parallel_size", "expert_model_parallel_size", "micro_batch_size",
            "global_batch_size", "num_gpus", "fp8", "fp8_recipe", "bf16", "num_moe_experts")


def _same_run(a, b) -> bool:
    return all(getattr(a, f, None) == getattr(b, f, None) for f in SAME_RUN)


def memory_notes(w) -> list:
    """Published peaks of this very workload (a card study whose workload it is), each beside the
    model's figure at the same point (rank, iteration) and the card's note on why they differ."""
    from mbridge_recompute import memory
    from mbridge_recompute.facts import card
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.setting import RecomputeSetting

    out = []
    for ev in card.load().get("evidence", []):
        if not ev.get("workload") or "memory_rank" not in ev:
            continue
        study = load_workload(str(study_workload(ev["workload"])))
        if not _same_run(w, study):
            continue
        rank = ev["memory_rank"]
        rows = []
        for row in ev["rows"]:
            peak = row.get("peak_allocated_gb", row.get("peak_memory_gb"))
            it = row.get("peak_after_iteration")
            if not isinstance(peak, (int, float)) or it is None:
                continue
            r = memory.estimate(RecomputeSetting.selective(*row["modules"]).apply(w)).ranks[rank]
            model = r.first_iteration_allocated_bytes if it == 1 else r.allocated_peak_bytes
            rows.append(f"[{', '.join(row['modules'])}] {peak:g} GB measured, {model / 1e9:.2f} GB "
                        f"modelled after iteration {it} ({r.allocated_moments and _moment(r, it)}), "
                        f"{r.allocated_peak_bytes / 1e9:.2f} GB in the steady state")
        if rows:
            out.append(f"published on this workload ({ev['title']}; {ev['source']}), allocated "
                       f"peaks of pp_rank {rank}: " + "; ".join(rows) + ". " + ev.get("memory_note", ""))
    return out


def _moment(rank, iteration: int) -> str:
    """The moment that sets a rank's allocated peak at `iteration` (1: iteration 1)."""
    from mbridge_recompute.memory import moments

    if iteration != 1:
        return rank.allocated_moment
    first = {k: v for k, v in rank.allocated_moments.items()
             if k in (moments.IT1, moments.STEP, moments.CAPTURE)}
    return max(first, key=first.get) if first else rank.allocated_moment
