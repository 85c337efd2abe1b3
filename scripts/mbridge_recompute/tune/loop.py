"""The rounds of a tune: decide, build the runs with the harness, launch them, read them, record.

Everything is the package's own: `plan.planner.plan` prices and (with the offsets of
`tune/calibrate.py`) calibrates, `runs.harness.build_sweep` builds each run's argv exactly as
`run_harness.py` would, `runs.launch.launch_run` starts it in its own process group and writes
its run directory (log.txt, manifest.json), `tune/evidence.py` reads it with `logs.compare` and
`logs.diagnose`, `write.snippets.render_all` writes the answer in every format.

Nothing starts without `launch=True`; a dry run decides the first round, shows its commands and
writes nothing. Signals (SIGINT, SIGTERM, SIGHUP) are held while the tool is deciding or writing
and act at the next safe point; one that arrives during a run ends that run's process group,
and the run is recorded as interrupted, to run again when the same command resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from mbridge_recompute.errors import Rejected
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.tune import decide as rules
from mbridge_recompute.tune.calibrate import Models, anchor, observe
from mbridge_recompute.tune.evidence import Measurement, measure, read_run
from mbridge_recompute.tune.state import RunRecord, TuneState, now
from mbridge_recompute.units import GB

# stops a later command may go on from: an interrupted tune, or a run budget a larger
# --max-runs extends
RESUMABLE = ("interrupted",)
# stops after which no run is an answer: the runs are not comparable evidence (unmatched), the
# model and the measurements disagree beyond any offset (the workload is not the job that ran),
# or the tune did not get to decide (interrupted, a run the checkout's parser refused)
NO_ANSWER = ("unmatched", "calibration-refused", "interrupted", "refused")


@dataclass
class Options:
    w: object
    release: object
    workload: str                      # how the workload was named, for the reader
    root: Path
    repo: Optional[str]
    launcher: str
    passthrough: list                  # the harness arguments every run gets (with -ms)
    budget_gb: Optional[float] = None
    free_gb: Optional[float] = None
    max_runs: int = 6
    allowed: Optional[list] = None     # --candidates: only these settings (candidate strings)
    gbs: Optional[int] = None
    seq: Optional[int] = None
    env: dict = field(default_factory=dict)
    name_prefix: str = "tune"
    python: str = "python"
    torchrun: str = "torchrun"
    bridge_release: Optional[str] = None
    timeout: Optional[float] = None
    grace: float = 30.0
    force: bool = False
    parser_check: bool = True


def _refuse_unrunnable(report) -> None:
    """Rejected, before any GPU time, for a workload no run can start: a pipeline split
    megatron-core rejects (nothing to price), or errors under every recompute setting."""
    if report.estimate is None:
        raise Rejected("WORKLOAD", f"{report.diagnosis} (check_config.py says how)")
    if report.workload_findings:
        f = report.workload_findings[0]
        raise Rejected("WORKLOAD", f"rejected under every recompute setting ({f['id']}: "
                                   f"{f['message']}); fix it first (check_config.py says how)")


class Tuner:
    def __init__(self, opts: Options, progress: Callable[[str], None]):
        from mbridge_recompute.plan.budget import gb_to_bytes
        from mbridge_recompute.plan.planner import plan
        from mbridge_recompute.plan.pricing import Pricer

        self.opts = opts
        self.progress = progress
        self.w = opts.w
        self.version = opts.release.key
        self.plan0 = plan(self.w, budget_gb=opts.budget_gb, version=opts.release)
        _refuse_unrunnable(self.plan0)
        self.pricer = Pricer(self.w, self.version)
        self.models = Models(self.pricer)
        self.budget = self.plan0.budget_bytes
        self.need = None if opts.free_gb is None else gb_to_bytes(opts.free_gb, "--free-gb")
        self.current = RecomputeSetting.from_workload(self.w)
        self.baseline = rules.baseline_setting(self.current)
        self.baseline_name = self.baseline.candidate()
        self.allowed = None
        if opts.allowed is not None:
            self.allowed = {rules.setting_key(RecomputeSetting.parse(t, "--candidates"))
                            for t in opts.allowed}
        self._baseline_log = None
        self.sweep_notes: list = []

    # ------------------------------------------------------------ identity
    def fingerprint(self) -> dict:
        from dataclasses import asdict

        from mbridge_recompute.tune.state import digest

        o = self.opts
        return {"workload": digest(asdict(self.w)), "release": self.version, "launcher": o.launcher,
                "repo": str(Path(o.repo).expanduser().resolve()) if o.repo else None,
                "harness_arguments": list(o.passthrough), "budget_bytes": self.budget,
                "free_bytes": self.need, "candidates": sorted(o.allowed) if o.allowed is not None else None,
                "env": dict(sorted(o.env.items())), "gbs": o.gbs, "seq": o.seq}

    def new_state(self) -> TuneState:
        p = self.plan0
        summary = {"workload": self.opts.workload, "summary": dict(p.workload),
                   "ranks": [{"pp_rank": r.pp_rank, "static_bytes": int(r.static_bytes),
                              "peak_bytes": int(r.peak_bytes)}
                             for r in (p.estimate.ranks if p.estimate else [])],
                   "recommendation": p.recommendation.name if p.recommendation else None,
                   "warnings": [f["message"] for f in p.warnings]}
        return TuneState(fingerprint=self.fingerprint(), root=str(self.opts.root),
                         baseline=self.baseline_name, budget_bytes=self.budget, need_bytes=self.need,
                         plan=summary)

    # ------------------------------------------------------------ what was measured
    def measurements(self, state: TuneState) -> list:
        return [Measurement.from_dict(r.measurement) for r in state.finished() if r.measurement]

    def calibrated(self, state: TuneState):
        """(plan report, offsets): the plan re-made with the offsets every finished run implies."""
        from mbridge_recompute.plan.planner import plan

        ms = self.measurements(state)
        offsets = observe(ms, self.models)
        if not offsets.per_rank:
            return self.plan0, offsets
        measured = anchor(offsets, self.models, self.baseline, len(ms))
        report = plan(self.w, budget_gb=self.opts.budget_gb, measured=measured, version=self.opts.release)
        return report, offsets

    def candidates(self, report) -> list:
        """The plan's candidates, and the --candidates settings its search left out, priced and
        calibrated the same way (budget.settle), in plan's order."""
        from mbridge_recompute.plan.budget import settle
        from mbridge_recompute.plan.search import order

        cands = list(report.candidates)
        if self.allowed is not None:
            have = {rules.setting_key(c.setting) for c in cands}
            extra = [self.pricer.price(RecomputeSetting.parse(t, "--candidates")) for t in self.opts.allowed]
            extra = [c for c in extra if rules.setting_key(c.setting) not in have]
            settle(extra, self.budget, report.calibration)
            cands += extra
        return sorted(cands, key=order)

    def _cost(self, candidate: str, cands: list) -> float:
        c = next((x for x in cands if x.name == candidate), None)
        if c is None:
            c = self.pricer.price(RecomputeSetting.parse(candidate, "tune.json"))
        return c.cost_pct

    def situation(self, state: TuneState, report, offsets) -> rules.Situation:
        cands = self.candidates(report)
        base = next((c for c in cands if c.name == self.baseline_name), None) or report.current
        done = {r.candidate: rules.Verdict(**r.verdict) for r in state.finished() if r.verdict}
        ms = {m.candidate: m for m in self.measurements(state)}
        target = self._target_rank(ms.get(self.baseline_name), base)
        base_m = ms.get(self.baseline_name)
        measured = [p.allocated_gb for p in (base_m.steady if base_m else []) if p.pp_rank == target]
        return rules.Situation(
            candidates=cands, base=base, diagnosis=report.diagnosis, baseline=self.baseline_name,
            budget=self.budget, need=self.need, target_rank=target, done=done,
            costs={c: self._cost(c, cands) for c in done},
            step_times={c: m.step_time_ms for c, m in ms.items()},
            against_model=dict(offsets.against_model),
            runs_left=self.opts.max_runs - state.runs_started, allowed=self.allowed,
            base_measured=int(max(measured) * GB) if measured else None)

    @staticmethod
    def _target_rank(baseline: Optional[Measurement], base) -> int:
        """The pipeline rank a saving is measured on: the baseline's hottest reporting rank."""
        if baseline is not None:
            peaks = baseline.steady or baseline.first_iteration
            if peaks:
                return max(peaks, key=lambda p: p.allocated_gb).pp_rank
        return base.hottest_pp_rank

    # ------------------------------------------------------------ deciding
    def decide(self, state: TuneState):
        """(decision, calibration record) for the next step."""
        if not state.runs:
            return rules.first_round(self.plan0, self.baseline_name, self.current), None
        try:
            report, offsets = self.calibrated(state)
        except Rejected as exc:          # plan refuses offsets that make a term negative
            return rules.Decision(stop="calibration-refused", why=f"{exc.field}: {exc.reason}"), None
        s = self.situation(state, report, offsets)
        decision = rules.next_round(s)
        cal = offsets.to_dict()
        cal["plan_calibration"] = report.calibration.to_dict() if report.calibration else None
        cal["target_rank"] = s.target_rank
        return decision, cal

    def preview(self) -> Optional[rules.Decision]:
        """The round after the baseline if the baseline measured as the model predicts."""
        cands = self.candidates(self.plan0)
        base = next((c for c in cands if c.name == self.baseline_name), None) or self.plan0.current
        passes = bool(base.fits) and self.need is None
        s = rules.Situation(candidates=cands, base=base, diagnosis=self.plan0.diagnosis,
                            baseline=self.baseline_name, budget=self.budget, need=self.need,
                            target_rank=base.hottest_pp_rank,
                            done={self.baseline_name: rules.Verdict(passes, "as modelled")},
                            costs={self.baseline_name: base.cost_pct}, step_times={}, against_model={},
                            runs_left=self.opts.max_runs - 1, allowed=self.allowed)
        return rules.next_round(s)

    # ------------------------------------------------------------ building and launching
    def build(self, candidates: list, launch: bool):
        from mbridge_recompute.runs import harness

        o = self.opts
        settings = [RecomputeSetting.parse(c, "tune") for c in candidates]
        sweep = harness.build_sweep(o.repo, settings, o.passthrough, out_dir=str(o.root), launcher=o.launcher,
                                    gbs=o.gbs, seq=o.seq, env=o.env, name_prefix=o.name_prefix,
                                    python=o.python, torchrun=o.torchrun, launch=launch,
                                    release=o.bridge_release)
        for note in list(sweep.notes) + list(sweep.unchecked):
            if note not in self.sweep_notes:
                self.sweep_notes.append(note)
        return sweep

    def _parser_check(self, sweep) -> dict:
        from mbridge_recompute.runs import parsercheck

        if not self.opts.parser_check:
            return {"checked": False, "reason": "--no-parser-check", "runs": {}}
        return parsercheck.check_runs(sweep.repo, sweep.runs)

    def launch(self, state: TuneState, records: list, guard) -> Optional[dict]:
        """Run `records` one after another; returns a stop ({reason, why}) or None."""
        from mbridge_recompute.runs import launch as launcher

        sweep = self.build([r.candidate for r in records], launch=True)
        check = self._parser_check(sweep)
        rejected = {n: r["problems"] for n, r in check["runs"].items() if not r["ok"]}
        if rejected:
            name, probs = next(iter(rejected.items()))
            return {"reason": "refused", "why": f"the checkout's argument parser rejects {name}: {probs[0]}"}
        own = {r.name for r in state.runs if r.state == "interrupted"}
        for run in sweep.runs:
            one = type(sweep)(repo=sweep.repo, launcher=sweep.launcher, passthrough=sweep.passthrough,
                              runs=[run], release=sweep.release)
            # a directory this tune started before (an interrupted run) is ours to clear
            launcher.prepare_run_dirs(one, force=self.opts.force or run.name in own)
        base = {"repo": sweep.repo, "launcher": sweep.launcher, "revisions": launcher.revisions(sweep.repo),
                "bridge_release": sweep.release.key if sweep.release else None,
                "passthrough": list(sweep.passthrough), "parser_checked": bool(check.get("checked"))}
        if not check["checked"]:
            self.progress(f"argv not parser-checked ({check['reason']})")
        by_name = {r.name: r for r in records}
        for run in sweep.runs:
            rec = by_name[run.name]
            if guard.pending is not None:
                return {"reason": "interrupted", "why": f"{guard.signal_name} between runs; the same command "
                                                        "resumes the tune"}
            self.progress(f"step {rec.step}: {rec.role} {rec.candidate} -> {run.run_dir}")
            rec.state = "interrupted"        # until it ends: a tool killed mid-run leaves it to re-run
            state.save(self.opts.root)
            tag = {"tune": {"root": str(self.opts.root), "step": rec.step}}
            manifest = launcher.launch_run(run, {**base, **tag}, self.opts.timeout, self.opts.grace, guard)
            self.progress(f"step {rec.step}: {rec.candidate}: {manifest['status']} (exit "
                          f"{manifest['returncode']}, {manifest['duration_s']} s)")
            if manifest["interrupted"]:
                state.save(self.opts.root)
                return {"reason": "interrupted", "why": f"{manifest['signal']} during {rec.candidate}; "
                                                        "the same command resumes the tune and runs it again"}
            stop = self.record(state, rec)
            state.save(self.opts.root)
            if stop is not None:
                return stop
        return None

    def baseline_log(self, state: TuneState):
        if self._baseline_log is None:
            rec = state.run(self.baseline_name)
            if rec is not None and rec.state == "finished":
                self._baseline_log, _ = read_run(Path(rec.run_dir))
        return self._baseline_log

    def record(self, state: TuneState, rec: RunRecord) -> Optional[dict]:
        """Read a finished run into the record; a stop when its verdict forces one."""
        run, manifest = read_run(Path(rec.run_dir))
        is_base = rec.candidate == self.baseline_name
        if is_base:
            self._baseline_log = run
        m = measure(run, manifest, None if is_base else self.baseline_log(state), self.w, rec.candidate)
        hot = max(m.steady or m.first_iteration, key=lambda p: p.allocated_gb, default=None)
        ran = RecomputeSetting.parse(rec.candidate, "tune.json")
        residual = self.models.extra(ran, hot.pp_rank if hot else 0)
        v = rules.judge(m, self.budget, self.need, residual, is_base)
        rec.measurement, rec.verdict = m.to_dict(), {"passed": v.passed, "why": v.why, "final": v.final,
                                                     "stop": v.stop}
        rec.state = "finished" if v.final else "interrupted"
        self.progress(f"step {rec.step}: {rec.candidate}: {v.why}")
        if v.stop:
            return {"reason": v.stop, "why": f"{rec.candidate}: {v.why}"}
        return None

    # ------------------------------------------------------------ the loop
    def run(self, state: TuneState, launch: bool, guard) -> TuneState:
        if state.stop and state.stop.get("reason") in RESUMABLE:
            state.stop = None
        if state.stop and state.stop.get("reason") == "run-budget" \
                and state.runs_started < self.opts.max_runs:
            state.stop = None            # a larger --max-runs goes on
        while state.stop is None:
            pending = state.pending()
            if pending:
                if not launch:
                    break
                stop = self.launch(state, pending, guard)
                if stop is not None:
                    self._stop(state, stop, launch)
                continue
            if guard is not None and guard.pending is not None:
                self._stop(state, {"reason": "interrupted", "why": f"{guard.signal_name}: the same command "
                                                                    "resumes the tune"}, launch)
                break
            decision, cal = self.decide(state)
            n = len(state.steps) + 1
            state.steps.append({"step": n, "at": now(), "calibration": cal, "decision": decision.to_dict()})
            if decision.stop:
                self._stop(state, {"reason": decision.stop, "why": decision.why}, launch)
                break
            for choice in decision.runs:
                setting = RecomputeSetting.parse(choice.candidate, "tune")
                state.runs.append(RunRecord(candidate=choice.candidate, name=setting.slug(),
                                            run_dir=str(self.opts.root / setting.slug()), step=n,
                                            role=choice.role))
            if not launch:
                break
            state.save(self.opts.root)
        return state

    def _stop(self, state: TuneState, stop: dict, launch: bool) -> None:
        state.stop = {**stop, "at": now()}
        state.answer = None if stop["reason"] in NO_ANSWER else self.answer(state)
        if launch:
            state.save(self.opts.root)

    # ------------------------------------------------------------ the answer
    def answer(self, state: TuneState) -> Optional[dict]:
        from mbridge_recompute.write.snippets import render_all

        done = {r.candidate: r for r in state.finished() if r.verdict and r.verdict.get("passed")}
        if not done:
            return None
        ms = {c: Measurement.from_dict(r.measurement) for c, r in done.items()}
        best = min(done, key=lambda c: (ms[c].step_time_ms if ms[c].step_time_ms is not None else math.inf,
                                        self._cost(c, [])))
        m, setting = ms[best], RecomputeSetting.parse(best, "tune.json")
        base = state.run(self.baseline_name)
        base_m = Measurement.from_dict(base.measurement) if base and base.measurement else None
        if best == self.baseline_name:
            vs = "it is the baseline"
        elif m.delta_time_pct is None:
            vs = (f"not measured against the baseline {self.baseline_name}, which did not complete "
                  f"({base_m.status if base_m else 'not run'})")
        else:
            vs = f"{m.delta_time_pct:+.2f} % step time against the baseline {self.baseline_name}"
        return {"candidate": best, "describe": setting.describe(), "setting": setting.as_fields(),
                "run_dir": done[best].run_dir,
                "measured": {"ranks": [p.__dict__ for p in m.steady], "peak_allocated_gb": m.steady_peak_gb,
                             "first_iteration_ranks": [p.__dict__ for p in m.first_iteration],
                             "step_time_ms": m.step_time_ms, "tflops_per_gpu": m.tflops_per_gpu,
                             "delta_time_pct": m.delta_time_pct, "delta_peak_gb": m.delta_peak_gb,
                             "delta_at": m.delta_at},
                "step_time_cost": vs, "modelled_cost_pct": round(self._cost(best, []), 3),
                "formats": render_all(setting)}


def check_passthrough_matches(w, passthrough: list) -> list:
    """Rejected when the harness arguments run another job than the workload plans (the plan
    would be of a different job); the sizes they leave to the recipe, as notes."""
    from mbridge_recompute.inputs.harness_argv import HarnessArgv

    pairs = (("-ng", "--num_gpus", w.num_gpus, "cluster.num_gpus"),
             ("-tp", "--tensor_model_parallel_size", w.tensor_model_parallel_size,
              "model.tensor_model_parallel_size"),
             ("-pp", "--pipeline_model_parallel_size", w.pipeline_model_parallel_size,
              "model.pipeline_model_parallel_size"),
             ("-cp", "--context_parallel_size", w.context_parallel_size, "model.context_parallel_size"),
             ("-ep", "--expert_model_parallel_size", w.expert_model_parallel_size,
              "model.expert_model_parallel_size"),
             ("-mb", "--micro_batch_size", w.micro_batch_size, "train.micro_batch_size"),
             ("-gb", "--global_batch_size", w.global_batch_size, "train.global_batch_size"),
             ("-sl", "--seq_length", w.seq_length, "model.seq_length"))
    hargv = HarnessArgv.parse(passthrough)
    notes = []
    for flag, canonical, planned, name in pairs:
        given = hargv.value(canonical)
        if given is None:
            if flag in ("-tp", "-pp", "-ep", "-mb"):
                notes.append(f"{flag} is left to the recipe: the plan takes {name}={planned}; "
                             "make them agree")
            continue
        if planned is None:
            continue
        try:
            value = int(given)
        except ValueError:
            continue                  # the harness refuses it with its own reason
        if value != planned:
            raise Rejected(flag, f"the harness arguments run {flag} {value}, the workload plans "
                                   f"{name}={planned}: the plan and the runs must be the same job")
    return notes
