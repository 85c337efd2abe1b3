"""The candidates a plan prices: off, the selective [] control, every single label, the label
sets worth combining, full recompute; plus the workload's own setting (`current`).

A single label that saves nothing worth having on any rank is dropped from the combinations, and
one the checker rejects on its own stays a rejected point and is not combined; each such choice
is noted for the assumptions.
"""

from __future__ import annotations

from typing import NamedTuple

from mbridge_recompute.plan import sentences
from mbridge_recompute.plan.labels import evaluate_labels
from mbridge_recompute.plan.search import full_settings, selective_settings
from mbridge_recompute.setting import RecomputeSetting

NEGLIGIBLE_FRACTION = 1e-3    # a label saving under 0.1 % of the control's peak cannot change a fit


class Found(NamedTuple):
    control: object               # the [] control's Candidate
    effects: list                 # LabelEffect per label of the release
    candidates: list              # every priced Candidate (the control and the kept singles too)
    current: object               # the workload's own setting, priced
    combinable: list              # labels combined into sets
    notes: list                   # sentences: labels not applicable, dropped, not combined


def find(pricer) -> Found:
    control = pricer.price(RecomputeSetting.selective())
    effects, singles = evaluate_labels(pricer, control)
    floor = NEGLIGIBLE_FRACTION * control.model_peak_bytes
    notes = [sentences.not_applicable(e.label, e.reason) for e in effects if e.label not in singles]
    kept, combinable = [], []
    for label, single in singles.items():
        saving = max((c - s for c, s in zip(control.rank_peaks, single.rank_peaks)), default=0)
        if saving <= floor:
            notes.append(sentences.dropped(next(e for e in effects if e.label == label), control))
            continue
        kept.append(single)
        if single.allowed:
            combinable.append(label)
        else:
            notes.append(sentences.rejected_alone(label, single.rejected_by))
    priced = {c.setting for c in kept}
    settings = [RecomputeSetting.off()] + [s for s in selective_settings(combinable)[1:]
                                           if s not in priced] + full_settings(pricer.w, pricer.version)
    cands = [control] + kept + [pricer.price(s) for s in settings]
    now = RecomputeSetting.from_workload(pricer.w)
    current = next((c for c in cands if c.setting == now), None) or pricer.price(now)
    return Found(control, effects, cands, current, combinable, notes)
