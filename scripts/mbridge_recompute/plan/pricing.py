"""Pricing one recompute setting: its modelled peak per pipeline rank, its replay cost, and
whether the checker allows it. The plan owns no memory arithmetic and no rules of its own."""

from __future__ import annotations

from mbridge_recompute.plan.report import Candidate
from mbridge_recompute.rules.findings import disabled_by, errors
from mbridge_recompute.setting import RecomputeSetting


def unfixable(control: dict, off: dict) -> list:
    """The error findings of the [] control's check that the recompute-free setting's check has
    too: what no recompute setting can fix (a GPU, precision, release or layout rule)."""
    ids = {f["id"] for f in errors(off["findings"])}
    return [f for f in errors(control["findings"]) if f["id"] in ids]


class Pricer:
    """Prices settings of one workload against one release, with the [] control's errors as
    the baseline (a candidate is rejected only by what it adds)."""

    def __init__(self, w, version: str):
        from mbridge_recompute import memory
        from mbridge_recompute.rules import check_workload

        self.w = w
        self.version = version
        # costs are changes of the modelled step against the current layout without recompute and
        # without offloading, so that replay, offload copies and layout are terms of their own
        self.reference = RecomputeSetting.off().apply(w).replace(fine_grained_activation_offloading=False)
        self.reference_step = memory.step_cost(self.reference)   # once: every price compares to it
        self._check = lambda with_setting: check_workload(with_setting, validator="builtin", version=version)
        self.baseline = self._check(RecomputeSetting.selective().apply(w))
        # what no recompute setting fixes: the [] control's errors that recompute off has too (an
        # error of the [] control alone, e.g. cpu-offloading-with-recompute, rejects candidates)
        self.workload_errors = unfixable(self.baseline, self._check(RecomputeSetting.off().apply(w)))
        self.baseline_errors = frozenset(f["id"] for f in self.workload_errors)
        self._release_key = None

    def findings(self, setting: RecomputeSetting) -> list:
        """The findings `setting` adds over the [] control."""
        seen = {f["id"] for f in self.baseline["findings"]
                if f["severity"] != "error" or f["id"] in self.baseline_errors}
        return [f for f in self._check(setting.apply(self.w))["findings"] if f["id"] not in seen]

    def price(self, setting: RecomputeSetting, findings: list | None = None) -> Candidate:
        """The candidate as megatron-core would run it: what the checker finds switched off
        (its silent no-ops' `disables`) is priced as not recomputed."""
        from mbridge_recompute import memory
        from mbridge_recompute.placement import place

        with_setting = setting.apply(self.w)
        if findings is None:
            findings = self.findings(setting)
        split = place(with_setting, self.version)
        if not split.ok:
            # a layout megatron-core rejects: a rejected point, nothing to model
            p = self.w.pipeline_model_parallel_size
            ids = sorted({f["id"] for f in errors(findings)} | {pr.cid for pr in split.problems})
            return Candidate(setting=setting, rank_peaks=(0,) * p, rank_terms=("",) * p,
                             cost_pct=0.0, rejected_by=tuple(ids))
        # the workload's own skipped offloads hold under every setting (the [] control has them)
        off = disabled_by(findings + [f for f in self.baseline["findings"] if _offload_skip(f)])
        est = memory.estimate(with_setting, disabled=off)
        step = memory.step_cost(with_setting, disabled=off)
        terms = memory.shares(step, self.reference_step)
        from mbridge_recompute.memory import band

        ctx = band.context(with_setting)
        both = [band.bands(with_setting, est, r, self.release_key, ctx) for r in est.ranks]
        return Candidate(setting=setting, rank_peaks=tuple(int(r.peak_bytes) for r in est.ranks),
                         rank_terms=tuple(r.peak_term for r in est.ranks),
                         rank_static=tuple(int(r.static_bytes) for r in est.ranks),
                         rank_host=tuple(int(r.host_bytes) for r in est.ranks),
                         cost_pct=float(terms.cost_pct), shares=terms,
                         rejected_by=tuple(sorted({f["id"] for f in errors(findings)})),
                         disabled=off, step=step,
                         rank_allocated=tuple(int(r.allocated_peak_bytes) for r in est.ranks),
                         rank_band=tuple(b.device for b, _ in both),
                         rank_band_calibrated=tuple(b.device for _, b in both))

    def band(self, w, est, rank, calibrated: bool = False):
        """One rank's error band (memory/band.py) for an estimate of this workload."""
        from mbridge_recompute.memory import band

        return band.band(w, est, rank, calibrated, self.release_key)

    @property
    def release_key(self) -> str:
        if self._release_key is None:
            from mbridge_recompute.facts import releases

            self._release_key = releases.resolve_version(self.version)
        return self._release_key


def _offload_skip(f: dict) -> bool:
    from mbridge_recompute.memory.offload import SKIPPED

    return any(str(d[0]).startswith(SKIPPED) for d in f.get("disables", ()))
