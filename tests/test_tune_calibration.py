"""How tune reads its runs and calibrates from them: the published Nemotron 3 Nano logs read as
measurements, the rules of the offset (largest observation per rank, OOMs as floors, a failure
the model contradicts kept as that setting's own), and the verdict of a run. Invariants are
checked with hypothesis over generated runs of a pipelined workload."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbridge_recompute.facts import releases
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan.pricing import Pricer
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.tune import decide
from mbridge_recompute.tune.calibrate import Models, observe
from mbridge_recompute.tune.evidence import Measurement, OOMPoint, Peak, measure, read_run
from mbridge_recompute.units import GB

from conftest import EXAMPLES

NEMOTRON = EXAMPLES / "logs" / "nemotron3nano"


@pytest.fixture(scope="module")
def nano():
    release = releases.target(None)
    w = load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"), [], mcore_version=release.requested)
    return w, Models(Pricer(w, release.key))


def published(w, name: str, baseline=None) -> Measurement:
    run, manifest = read_run(NEMOTRON / name)
    setting = {"empty": "[]", "moe+layernorm": "moe,layernorm"}.get(name, name.replace("+", ","))
    return measure(run, manifest, baseline, w, setting)


def test_a_published_oom_is_read_as_its_point_and_its_iteration_1_peak(nano):
    w, _ = nano
    m = published(w, "moe_act")
    assert m.status == "oom" and m.survived == 1 and m.steady == []
    assert [(p.rank, p.after, p.allocated_gb) for p in m.first_iteration] == [(0, 1, 62.103)]
    o = m.ooms[0]
    assert (o.iteration, o.stage, o.gpu) == (2, "forward", 3)
    assert o.demand_gb == pytest.approx((72.90 + 2.00) * 2**30 / GB, abs=0.01)     # held + asked
    assert m.diagnosis["kind"] == "activations"


def test_an_oom_in_an_iteration_a_heavier_run_got_through_is_that_settings_own(nano):
    """layernorm,moe_act ran out of memory in iteration 1, which [] got through although the model
    gives [] more memory there: the model misses memory of that setting (published: CUDA-graph
    private pools), so it is not carried to the other settings."""
    w, models = nano
    base = read_run(NEMOTRON / "empty")[0]
    runs = [published(w, "empty"), published(w, "moe_act", base)]
    without = observe(runs, models)
    with_it = observe(runs + [published(w, "layernorm+moe_act", base)], models)
    own = [o for o in with_it.observations if o.candidate == "layernorm,moe_act"]
    assert own and not any(o.applied for o in own)
    assert "[]" in with_it.against_model["layernorm,moe_act"]
    assert with_it.per_rank == without.per_rank
    # a setting holding all its labels waits; one that does not (moe,layernorm) does not
    assert decide.holds_labels(RecomputeSetting.parse("layernorm,moe_act,shared_experts"),
                               RecomputeSetting.parse("layernorm,moe_act"))
    assert not decide.holds_labels(RecomputeSetting.parse("moe,layernorm"),
                                   RecomputeSetting.parse("layernorm,moe_act"))


def test_the_offset_is_the_largest_observation_so_an_oom_lifts_it(nano):
    w, models = nano
    base = read_run(NEMOTRON / "empty")[0]
    control = observe([published(w, "empty")], models)
    both = observe([published(w, "empty"), published(w, "moe_act", base)], models)
    oom = next(o for o in both.observations if o.candidate == "moe_act" and o.kind == "oom")
    assert both.per_rank == (oom.offset_bytes,) and oom.offset_bytes > control.per_rank[0]


# ------------------------------------------------------------------ the verdict of a run

def _m(**kw) -> Measurement:
    base = dict(name="x", candidate="moe_act", launch_status="ok", returncode=0, status="pass",
                steady=[Peak(0, 0, 2, 60.0)], step_time_ms=500.0, delta_peak_gb=-1.0)
    base.update(kw)
    return Measurement(**base)


def test_a_run_passes_only_with_its_peak_and_the_residual_inside_the_budget():
    assert decide.judge(_m(), budget=int(62 * GB), need=None, residual=int(1.6 * GB), baseline=False).passed
    over = decide.judge(_m(), budget=int(61 * GB), need=None, residual=int(1.6 * GB), baseline=False)
    assert not over.passed and "over the 61.00 GB budget" in over.why


def test_a_run_that_frees_less_than_asked_does_not_pass():
    v = decide.judge(_m(delta_peak_gb=-0.4), budget=int(80 * GB), need=int(0.5 * GB), residual=0,
                     baseline=False)
    assert not v.passed and "less than the 0.50 GB asked" in v.why


def test_an_unmatched_run_stops_the_tune():
    v = decide.judge(_m(matched=False, unmatched=["revision of megatron_bridge differs"]),
                     budget=int(80 * GB), need=None, residual=0, baseline=False)
    assert v.stop == "unmatched" and not v.passed


def test_a_static_oom_stops_the_tune_because_recompute_cannot_help(nano, tmp_path):
    w, _ = nano
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "log.txt").write_bytes((EXAMPLES / "logs" / "oom" / "optimizer_state_init.log").read_bytes())
    run, manifest = read_run(run_dir)
    m = measure(run, manifest, None, w, "[]")
    v = decide.judge(m, budget=int(80 * GB), need=None, residual=0, baseline=True)
    assert m.diagnosis["kind"] == "static" and v.stop == "cannot-help"


def test_a_baseline_that_fails_without_training_stops_the_tune():
    m = _m(status="incomplete", launch_status="failed", returncode=2, steady=[], survived=0,
           last_line="ModuleNotFoundError: No module named 'nemo_run'")
    v = decide.judge(m, budget=int(80 * GB), need=None, residual=0, baseline=True)
    assert v.stop == "baseline-failed" and "nemo_run" in v.why


# ------------------------------------------------------------------ invariants

@pytest.fixture(scope="module")
def pipelined():
    """Llama3 70B FP8 on TP4 PP4 VPP5: four pipeline ranks with different peaks."""
    release = releases.target(None)
    w = load_workload(str(EXAMPLES / "llama3_70b_fp8.yaml"), [], mcore_version=release.requested)
    return Models(Pricer(w, release.key))


SETTINGS = ["[]", "core_attn", "mlp", "block:1", "uniform:1"]
peak = st.builds(lambda rank, after, gb: (rank, after, gb), st.integers(0, 3), st.sampled_from([1, 2]),
                 st.floats(20.0, 90.0))
oom = st.builds(lambda rank, it, gb: (rank, it, gb), st.one_of(st.none(), st.integers(0, 3)),
                st.sampled_from([1, 2]), st.floats(30.0, 95.0))
run = st.tuples(st.sampled_from(SETTINGS), st.lists(peak, max_size=4), st.lists(oom, max_size=2),
                st.integers(0, 20))


def _measurement(i: int, spec) -> Measurement:
    setting, peaks, ooms, survived = spec
    # Bridge prints one report per model-parallel rank of DP rank 0: global rank = pp_rank here
    first = {r: Peak(r, r, 1, gb) for r, after, gb in peaks if after == 1}
    steady = {r: Peak(r, r, 2, gb) for r, after, gb in peaks if after == 2}
    points = [OOMPoint(rank=r, gpu=0, pp_rank=r, iteration=it, stage="forward", allocated_gb=gb - 2.0,
                       requested_gb=2.0) for r, it, gb in ooms]
    if points:
        survived = min(survived, min(p.iteration for p in points) - 1)
    return Measurement(f"run{i}", setting, "ok" if not points else "failed", 0 if not points else 1,
                       "pass" if not points else "oom", first_iteration=list(first.values()),
                       steady=list(steady.values()), survived=survived, ooms=points)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(run, min_size=1, max_size=5))
def test_offsets_never_fall_below_what_a_run_was_seen_to_need(pipelined, specs):
    ms = [_measurement(i, s) for i, s in enumerate(specs)]
    offsets = observe(ms, pipelined)
    applied = [o for o in offsets.observations if o.applied]
    if not applied:
        assert offsets.per_rank == ()
        return
    assert len(offsets.per_rank) == pipelined.ranks
    for o in applied:
        # the calibrated prediction of what ran is at least what it showed, rank by rank
        assert offsets.per_rank[o.pp_rank] >= o.offset_bytes
        assert o.model_bytes + offsets.per_rank[o.pp_rank] >= o.measured_bytes
    # the offset of a rank is its largest applied observation (an unapplied one moves nothing);
    # a rank no report covers takes the largest over all ranks
    for r, off in enumerate(offsets.per_rank):
        own = [o.offset_bytes for o in applied if o.pp_rank == r]
        assert off == (max(own) if own else max(o.offset_bytes for o in applied))


@pytest.fixture(scope="module")
def moonlight_plan():
    from mbridge_recompute.plan.planner import plan

    release = releases.target(None)
    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"), [], mcore_version=release.requested)
    report = plan(w, version=release)
    return report, Models(Pricer(w, release.key))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_round_never_repeats_a_run_and_only_runs_what_is_predicted_to_pass_cheaper(moonlight_plan, data):
    report, models = moonlight_plan
    names = [c.name for c in report.candidates if c.allowed and c.name != "[]"]
    ran = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=6))
    done = {"[]": decide.Verdict(data.draw(st.booleans()), "baseline")}
    done.update({c: decide.Verdict(data.draw(st.booleans()), "drawn") for c in ran})
    costs = {c.name: c.cost_pct for c in report.candidates}
    times = {c: data.draw(st.floats(400.0, 600.0)) for c in done}
    need = data.draw(st.sampled_from([None, int(0.5 * GB)]))
    base = next(c for c in report.candidates if c.name == "[]")
    s = decide.Situation(candidates=report.candidates, base=base, diagnosis=None, baseline="[]",
                         budget=report.budget_bytes, need=need, target_rank=0, done=done,
                         costs={c: costs[c] for c in done}, step_times=times, against_model={},
                         runs_left=data.draw(st.integers(0, 4)))
    d = decide.next_round(s)
    best = decide.best_passed(s)
    by_name = {c.name: c for c in report.candidates}
    assert len(d.runs) <= max(s.runs_left, 0) and (d.stop is None) == bool(d.runs)
    if d.stop == "answer":
        assert best is not None
    for choice in d.runs:
        c = by_name[choice.candidate]
        assert choice.candidate not in done
        if best is not None:
            assert c.cost_pct < costs[best]
        if choice.role == "candidate":
            assert decide.fits(s, c)
        else:
            assert decide.point_fits(s, c) and c.cost_pct <= by_name[d.runs[0].candidate].cost_pct


def _situation(report, models, cands, runs_left: int) -> decide.Situation:
    base = next(c for c in cands if c.name == "[]")
    return decide.Situation(candidates=cands, base=base, diagnosis=None, baseline="[]",
                            budget=report.budget_bytes, need=None, target_rank=0,
                            done={"[]": decide.Verdict(False, "ran out of memory")}, costs={"[]": 0.0},
                            step_times={}, against_model={}, runs_left=runs_left)


def test_with_two_runs_left_the_cheaper_neighbour_that_fits_at_the_point_estimate_runs_too(moonlight_plan):
    """What a band does to a plan (its upper edge over the budget, the point estimate under it) is
    set by hand: `none`, `layernorm` and `mlp` become tight, `moe_act` stays the cheapest fit.
    The neighbour is the next cheaper setting on the frontier: `layernorm`, since `mlp` (cheaper
    than moe_act, dearer and heavier than layernorm) is dominated."""
    from dataclasses import replace

    report, models = moonlight_plan
    tight = ("none", "layernorm", "mlp")
    cands = [replace(c, fits=c.fits and c.name not in tight) for c in report.candidates]
    two = decide.next_round(_situation(report, models, cands, runs_left=2))
    assert [(c.candidate, c.role) for c in two.runs] == [("moe_act", "candidate"), ("layernorm", "neighbour")]
    one = decide.next_round(_situation(report, models, cands, runs_left=1))
    assert [c.candidate for c in one.runs] == ["moe_act"]
