"""Per-label effects: for every recompute label of the release, whether it does anything on
this workload, what it saves on each pipeline rank against the selective [] control, and
what it costs.

"The config rejects it" and "it is a silent no-op" come from the checker's findings for the
single-label setting (one source of applicability); the memory model adds only whether it
covers the label and what the label discards.
"""

from __future__ import annotations

from mbridge_recompute.facts import releases
from mbridge_recompute.memory.effects import what_it_drops
from mbridge_recompute.memory.recompute import modules_of
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_bytes, layer_tensors
from mbridge_recompute.memory.types import DEFAULT_KNOBS
from mbridge_recompute.plan.evidence import architecture, far_above
from mbridge_recompute.plan.pricing import Pricer
from mbridge_recompute.plan.report import Candidate, LabelEffect
from mbridge_recompute.rules.findings import errors
from mbridge_recompute.setting import RecomputeSetting

NONE = frozenset()


_REJECTED = {"config": "config rejects it", "training-args": "the training arguments reject it",
             "runtime": "fails at runtime"}


def _rejected(f: dict) -> str:
    return f"{_REJECTED.get(f['kind'], 'rejected')} ({f['id']}): {f['message']}"


def _no_op(findings: list, label: str):
    """The first silent no-op the checker reports that switches `label` off entirely (a
    no-op confined to one block, such as the pre-MLP norm, leaves the label priced without it)."""
    for f in findings:
        if f["kind"] != "silent-no-op" or f["severity"] == "info":
            continue
        disables = {tuple(d) for d in f.get("disables", ())}
        if not disables or (label, "all") in disables:
            return f
    return None


def _partial_no_op(findings: list, label: str):
    return next((f for f in findings if f["kind"] == "silent-no-op"
                 and any(d[0] == label and d[1] != "all" for d in f.get("disables", ()))), None)


def _kept(sh, kind: str, mods: frozenset) -> dict:
    out: dict = {}
    for x in layer_tensors(sh, kind, mods):
        out[x.name] = out.get(x.name, 0.0) + x.nbytes
    return out


def adds_memory_because(pricer: Pricer, control: Candidate, single: Candidate,
                        saving: tuple) -> str:
    """Why a label raises some rank's peak, from the model itself: the tensors it keeps that
    the [] control does not (core_attn's checkpoint pins the fused QKV buffer under TE), and a
    transient (its replay working set) that outgrows what it frees. Empty when it adds nothing."""
    from mbridge_recompute import memory

    worse = [r for r, x in enumerate(saving) if x < 0]
    if not worse:
        return ""
    w = pricer.w
    sh = shape_of(w, DEFAULT_KNOBS)
    mods = modules_of(single.setting.apply(w), single.disabled)
    reasons = []
    for kind in dict.fromkeys(w.layer_kinds()):
        before, after = _kept(sh, kind, NONE), _kept(sh, kind, mods)
        extra = {n: b - before.get(n, 0.0) for n, b in after.items() if b > before.get(n, 0.0)}
        if extra:
            reasons.append(f"in each {kind} layer it keeps " + ", ".join(
                f"{n} (+{b / 1e6:.1f} MB)" for n, b in sorted(extra.items(), key=lambda kv: -kv[1])))
    ce = memory.estimate(control.setting.apply(w), disabled=control.disabled)
    se = memory.estimate(single.setting.apply(w), disabled=single.disabled)
    for r in worse:
        grew = se.ranks[r].transient_bytes - ce.ranks[r].transient_bytes
        if grew > 0:
            reasons.append(f"on pp_rank {r} the transient at the peak grows by {grew / 1e9:.2f} GB "
                           f"({se.ranks[r].peak_term})")
    return "; ".join(dict.fromkeys(reasons))


def evaluate_labels(pricer: Pricer, control: Candidate) -> tuple[list, dict]:
    """(LabelEffect per label of the release, {label: its priced single-label Candidate}).

    Labels the checker rejects on their own are priced too (the report says what they would
    save); no-ops and labels the memory model does not cover are not.
    """
    w = pricer.w
    sh = shape_of(w, DEFAULT_KNOBS)
    kinds = list(dict.fromkeys(w.layer_kinds()))
    effects, singles = [], {}
    for label in releases.labels_for(pricer.version):
        setting = RecomputeSetting.selective(label)
        findings = pricer.findings(setting)
        zero = (0,) * len(control.rank_peaks)
        no_op = _no_op(findings, label)
        if no_op is not None:
            effects.append(LabelEffect(label, False, f"silent no-op ({no_op['id']}): {no_op['message']}",
                                       0, zero, 0.0, {k: 0 for k in kinds}))
            continue
        modelled, drops = what_it_drops(w, label)
        error = next(iter(errors(findings)), None)
        if not modelled:
            reason = drops if error is None else _rejected(error)
            effects.append(LabelEffect(label, False, reason, 0, zero, 0.0, {k: 0 for k in kinds}))
            continue
        single = pricer.price(setting, findings)
        singles[label] = single
        if error is not None:
            effects.append(LabelEffect(label, False, _rejected(error),
                                       0, zero, 0.0, {k: 0 for k in kinds}))
            continue
        mods = frozenset([label])
        partial = _partial_no_op(findings, label)
        if partial is not None:
            drops += f"; partly switched off ({partial['id']}): {partial['message']}"
            mods = modules_of(setting.apply(w), single.disabled)
        measured = tuple(c.sentence() for c in far_above(label, architecture(w)))
        if measured:
            drops += "; its measured cost was far above the model: " + "; ".join(measured)
        saving = tuple(c - s for c, s in zip(control.rank_peaks, single.rank_peaks))
        effects.append(LabelEffect(
            label, True, drops, control.model_peak_bytes - single.model_peak_bytes, saving,
            round(single.replay_pct, 4),
            {k: layer_bytes(sh, k, NONE) - layer_bytes(sh, k, mods) for k in kinds}, measured,
            offload_pct=round(single.offload_pct, 4),
            per_layer_bytes={k: layer_bytes(sh, k, NONE) for k in kinds},
            adds=adds_memory_because(pricer, control, single, saving)))
    return effects, singles


def label_effects(w, version=None) -> list:
    """One LabelEffect per recompute label of `version` (default: the invocation's release)."""
    version = releases.resolve(version)
    pricer = Pricer(w, version)
    control = pricer.price(RecomputeSetting.selective())
    return evaluate_labels(pricer, control)[0]
