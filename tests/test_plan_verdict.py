"""The verdict a plan gives: `fits` only when the error band's upper edge fits the budget,
`tight` when the band crosses it (and then: calibrate first, with the command), `no` when even
its lower edge is over; calibration narrows the band. The band holds every measured peak of
the accuracy table, so a plan never says `fits` for a budget the measured run exceeded."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.plan.budget import settle, verdict
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.plan.pricing import Pricer
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.units import GB

from conftest import EXAMPLES, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import measured_peaks  # noqa: E402


def _llama():
    return load_workload(str(EXAMPLES / "llama3_70b_fp8.yaml"))


def test_fits_only_when_the_bands_upper_edge_is_within_the_budget():
    r = plan(_llama()).to_dict()
    rec = r["recommendation"]
    assert rec["verdict"] == "fits" and rec["fits"] and r["fits"]
    assert rec["band_lower_bytes"] < rec["peak_bytes"] < rec["band_upper_bytes"] <= r["budget_bytes"]
    for c in r["candidates"]:
        if c["allowed"] and c["peak_bytes"] is not None:
            assert c["fits"] == (c["band_upper_bytes"] <= r["budget_bytes"])


def test_tight_when_the_band_crosses_the_budget_and_the_plan_says_calibrate_first():
    cands = [c for c in plan(_llama()).to_dict()["candidates"] if c["allowed"] and c["peak_bytes"]]
    lowest_top = min(c["band_upper_bytes"] for c in cands)
    budget = (lowest_top - 0.5 * GB) / GB          # under every band's top, over some peaks
    assert any(c["peak_bytes"] <= budget * GB for c in cands)
    r = plan(_llama(), budget_gb=budget)
    assert r.verdict == "tight" and not r.fits and r.recommendation.peak_bytes <= r.budget_bytes
    assert r.calibrate_first.startswith("calibrate first")
    assert "run_harness.py --candidates" in r.calibrate_first and "-ms 2" in r.calibrate_first
    assert "--measured-peak-gb" in r.calibrate_first and "--measured-iteration 1" in r.calibrate_first
    j = r.to_dict()
    assert j["verdict"] == "tight" and j["recommendation"]["calibrate_first"] == r.calibrate_first


def test_no_when_even_the_bands_lower_edge_is_over_the_budget():
    r = plan(_llama(), budget_gb=20).to_dict()
    assert r["verdict"] == "no" and not r["fits"] and r["recommendation"]["verdict"] == "no"
    assert r["recommendation"]["band_lower_bytes"] > r["budget_bytes"]


def test_a_calibration_narrows_the_band_to_what_changes_between_settings():
    w = _llama()
    plain = plan(w).to_dict()["current"]
    measured = plain["allocated_peak_bytes"] / GB
    cal = plan(w, measured_peak_gb=measured).to_dict()["current"]
    width = lambda c: c["band_upper_bytes"] - c["band_lower_bytes"]   # noqa: E731
    assert width(cal) < width(plain) / 3


def test_the_band_terms_are_named_in_the_plans_output():
    """A MoE workload on the flex dispatcher with CUDA graphs: each term it carries is named."""
    r = plan(load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"))).to_dict()
    names = {t["name"] for t in r["ranks"][0]["band"]["terms"]}
    assert {"model", "routing imbalance", "MoE static residue", "CUDA-graph pool",
            "flex dispatcher buffers"} <= names
    from mbridge_recompute.commands.plan import render_text

    text = " ".join(render_text(plan(load_workload(str(EXAMPLES / "nemotron_3_nano.yaml")))).split())
    for name in names:
        assert name in text


CASES = {c["id"]: c for c in measured_peaks.cases()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_measured_case_is_said_to_fit_a_budget_its_run_exceeded(case):
    """With the budget just under what the run held (its measured peak allocated plus what the
    allocator does not count), the plan's verdict for the setting that ran is never `fits`."""
    c = CASES[case]
    w = measured_peaks.workload_of(c)
    ran = RecomputeSetting.from_workload(w)
    pricer = Pricer(w, None)
    cand = pricer.price(ran)
    rank = c.get("pp_rank", -1) % len(cand.rank_peaks)
    outside = cand.rank_peaks[rank] - cand.rank_allocated[rank]
    measured = max(c["peak_after_iteration"].values())
    budget = measured + outside - 1
    settle([cand], budget, None)
    # the band of the measured rank reaches above what was measured
    assert cand.band_edges(rank)[1] > budget, (case, cand.band_edges(rank), budget)
    assert verdict(cand, budget) != "fits"


def test_a_workload_rejected_under_every_setting_never_fits_and_exits_1():
    """MXFP8 on H100 is refused whatever recompute does (mxfp8-needs-sm100): the memory figures
    may all fit, but the plan says `fits` false and exits 1, with the refusal on its first lines
    and the recommendation worded as holding only once the workload is fixed."""
    from conftest import run_script

    args = [str(EXAMPLES / "llama3_70b_fp8.yaml"), "--set", "model.fp8_recipe=mxfp8",
            "--set", "cluster.gpu=H100"]
    r = plan(load_workload(args[0], sets=args[2::2])).to_dict()
    assert [f["id"] for f in r["workload_findings"]] == ["mxfp8-needs-sm100"]
    assert not r["fits"] and r["verdict"] == "no"
    rec = r["recommendation"]             # its memory alone would fit: the refusal decides
    assert rec["band_upper_bytes"] <= r["budget_bytes"] and not rec["fits"]
    text = run_script("plan", *args)
    assert text.returncode == 1, text.stderr
    first = text.stdout.splitlines()[:4]
    assert first[0].startswith("REJECTED under every recompute setting")
    assert any("mxfp8-needs-sm100" in line for line in first)
    assert "recommendation once the workload is fixed:" in text.stdout
    assert "\nrecommendation: " not in text.stdout
    # the same workload on Blackwell is accepted and fits
    ok = run_script("plan", args[0], "--set", "model.fp8_recipe=mxfp8", "--set", "cluster.gpu=B200")
    assert ok.returncode == 0 and "REJECTED" not in ok.stdout, ok.stdout[-2000:]


# ------------------------------------------------------------ the band as memory-model.md says

def _band_section() -> str:
    text = (ROOT / "references" / "memory-model.md").read_text()
    return text.split("## The error band and the verdict", 1)[1].split("\n## ", 1)[0]


def _band_rows() -> dict:
    """term name -> the cells of its row in memory-model.md's band table."""
    rows = {}
    for line in _band_section().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            rows[re.match(r"`([^`]+)`", cells[0]).group(1)] = cells
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:g} %"


def _terms_met() -> dict:
    """name -> (device_only, kept) of every band term the measured cases and the examples carry."""
    from mbridge_recompute import memory
    from mbridge_recompute.memory import band

    workloads = [measured_peaks.workload_of(c) for c in CASES.values()]
    workloads += [load_workload(str(p)) for p in sorted(EXAMPLES.glob("*.yaml"))]
    workloads.append(workloads[-1].replace(num_gpus=None))          # no GPU count given
    met = {}
    for w in workloads:
        est = memory.estimate(w)
        for rank in est.ranks:
            for t in band.terms(w, est, rank, release_key="0.19"):
                name = "known bug ID" if t.name.startswith("known bug ") else t.name
                met[name] = (t.device_only, t.kept)
    return met


def test_memory_model_lists_every_band_term_with_the_sizes_band_py_sets():
    """references/memory-model.md's band table: one row per term band.py can add, each with the
    size band.py gives it, `(device only)` on the terms that widen only the device peak, and the
    calibration paragraph naming exactly the terms a calibration keeps, with its constants."""
    from mbridge_recompute.memory import band

    rows = _band_rows()
    named = set(re.findall(r'Term\("([^"]+)"', Path(band.__file__).read_text())) | {"known bug ID"}
    assert set(rows) == named
    sizes = {
        "model": (f"{_pct(band.MODEL_OVER)} of the allocated peak",
                  f"{_pct(band.MODEL_UNDER)} of the allocated peak"),
        "workspaces": ("0", f"{band.WORKSPACES / GB:g} GB"),
        "routing imbalance": ("0", f"{_pct(band.IMBALANCE)} of the rank's MoE activations"),
        "MoE static residue": ("0", f"{_pct(band.MOE_STATIC_RESIDUE)} of its allocated static memory"),
        "loss-stage stack": tuple(f"{x:g} fp32 `[T, V/t]` logits per loss"
                                  for x in band.LOSS_STACK_LOGITS),
        "activation offloading": (f"{_pct(band.OFFLOAD_LOWER)} of activations + transient",
                                  f"{_pct(band.OFFLOAD_UPPER)} of activations + transient"),
        "CUDA-graph pool": ("0", f"{_pct(band.GRAPH_POOL_SLACK)} of the graphed activations"),
    }
    for name, (below, above) in sizes.items():
        assert (rows[name][2], rows[name][3].split(" (")[0]) == (below, above), name
    met = _terms_met()
    assert {"model", "routing imbalance", "activation offloading", "CUDA-graph pool",
            "flex dispatcher buffers", "world size assumed"} <= set(met)
    prose = " ".join(_band_section().split())
    for name, (device_only, kept) in met.items():
        assert ("(device only)" in rows[name][0]) == device_only, name
        assert (f"except `{name}`" in prose or f"and `{name}`;" in prose) == kept, name
    assert f"kept at {_pct(band.CALIBRATED_DRIFT)} of its size" in prose
    below, above = band.CALIBRATED_DELTA
    assert f"{_pct(below)} below and {_pct(above)} above of its modelled change" in prose


def test_memory_model_says_the_band_coverage_is_in_sample_and_what_the_table_lacks():
    """The band's constants were sized on the accuracy table the tests check it against; the
    classes the page says the table lacks are absent from it."""
    prose = " ".join(_band_section().split())
    rows = measured_peaks.rows()
    assert f"{len(rows)}/{len(rows)} coverage there is in-sample" in prose
    assert all(r["in_band"] for r in rows)
    workloads = [measured_peaks.workload_of(c) for c in CASES.values()]
    assert "no context parallelism (CP > 1), no LoRA / DoRA" in prose
    assert all(w.context_parallel_size == 1 and w.peft is None for w in workloads)
    gpus = {c["platform"].split(" x ")[-1].replace("dgx_", "").upper()[:5] for c in CASES.values()}
    assert {g[:4] for g in gpus} == {"H100", "A100", "GB20"}
    assert "only H100, A100 and GB200 runs" in prose


def test_an_error_of_recompute_itself_is_not_a_rejection_of_the_workload():
    """Layer-level CPU offloading refuses any recompute (cpu-offloading-with-recompute), the []
    control included, but not recompute off: the workload is not rejected, no recompute is the
    answer, and every recompute candidate is rejected by that rule."""
    from conftest import run_script

    sets = ["model.cpu_offloading=true", "model.cpu_offloading_num_layers=1",
            "model.recompute_granularity=null", "model.recompute_method=null",
            "model.recompute_num_layers=null", "model.recompute_modules=[]",
            "model.seq_length=1024", "model.num_layers=8"]
    path = str(EXAMPLES / "check_recipe_leftover_full.yaml")
    r = plan(load_workload(path, sets=sets)).to_dict()
    assert r["workload_findings"] == [] and r["fits"]
    assert r["recommendation"]["name"] == "none"
    recomputing = [c for c in r["candidates"] if c["name"] != "none"]
    assert recomputing and all("cpu-offloading-with-recompute" in c["rejected_by"] for c in recomputing)
    text = run_script("plan", path, *[a for s in sets for a in ("--set", s)])
    assert text.returncode == 0 and "REJECTED" not in text.stdout, text.stdout[-1500:]


def test_a_rejected_pipeline_split_names_only_what_no_recompute_setting_fixes():
    """32 layers on PP 3 (pp-does-not-divide-layers) with a recipe's leftover full-recompute keys
    under selective: only the split is 'under every setting'; no figures follow the banner."""
    from conftest import run_script

    path = str(EXAMPLES / "check_recipe_leftover_full.yaml")
    sets = ["model.pipeline_model_parallel_size=3", "cluster.num_gpus=24"]
    r = plan(load_workload(path, sets=sets)).to_dict()
    ids = [f["id"] for f in r["workload_findings"]]
    assert ids == ["pp-does-not-divide-layers"], ids
    text = run_script("plan", path, *[a for s in sets for a in ("--set", s)])
    assert text.returncode == 1
    first = text.stdout.splitlines()[0]
    assert first.startswith("REJECTED") and "figures below" not in first, first
