"""`plan.py` as an agent runs it: JSON contract, exit codes, calibration input, plot file safety."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES

MOONLIGHT = str(EXAMPLES / "moonlight_16b.yaml")
RANK_KEYS = {"pp_rank", "static_bytes", "activation_bytes", "peak_bytes"}
LABEL_KEYS = {"label", "saving_bytes", "cost_pct", "applicable", "reason"}
REC_KEYS = {"recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers",
            "peak_bytes", "cost_pct", "fits"}


@pytest.fixture(scope="module")
def moonlight_json():
    from conftest import run_script

    p = run_script("plan", MOONLIGHT, "--json")
    assert p.returncode in (0, 1), p.stderr
    return p, json.loads(p.stdout)


def test_json_has_the_design_keys_with_sizes_in_bytes(moonlight_json):
    _, r = moonlight_json
    assert {"ranks", "labels", "frontier", "recommendation", "assumptions"} <= set(r)
    assert r["ranks"] and all(RANK_KEYS <= set(x) for x in r["ranks"])
    assert all(isinstance(x["peak_bytes"], int) and x["peak_bytes"] > 10**9 for x in r["ranks"])
    assert r["labels"] and all(LABEL_KEYS <= set(x) for x in r["labels"])
    assert r["frontier"] and all(REC_KEYS - {"fits"} <= set(x) for x in r["frontier"])
    assert REC_KEYS <= set(r["recommendation"])
    assert set(r["recommendation"]["snippets"]) >= {"python", "yaml", "overrides", "harness", "mlm"}
    assert all(isinstance(a, str) for a in r["assumptions"]) and r["assumptions"]
    assert r["harness_candidates"][0] == "[]"


def test_exit_code_follows_whether_the_recommendation_fits(moonlight_json):
    p, r = moonlight_json
    assert p.returncode == (0 if r["recommendation"]["fits"] else 1)


def test_no_arguments_plans_the_embedded_default_workload(run_tool):
    p = run_tool("plan", "--json")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    assert r["workload"]["num_layers"] == 80 and r["workload"]["pp"] == 4 and r["workload"]["vpp"] == 5
    assert len(r["ranks"]) == 4


def test_no_arguments_text_shows_ranks_labels_frontier_and_a_snippet(run_tool):
    p = run_tool("plan")
    assert p.returncode in (0, 1), p.stderr
    for heading in ("memory per pipeline rank", "recompute labels", "frontier", "recommendation:",
                    "assumptions:"):
        assert heading in p.stdout
    assert "recompute_granularity" in p.stdout          # the YAML or override snippet


def test_budget_too_small_exits_1_and_says_it_does_not_fit(run_tool):
    p = run_tool("plan", MOONLIGHT, "--budget-gb", "2", "--json")
    assert p.returncode == 1
    r = json.loads(p.stdout)
    assert r["recommendation"]["fits"] is False and r["fits"] is False


@pytest.mark.parametrize("args, field", [
    (["--budget-gb", "-3"], "--budget-gb"),
    (["--measured-peak-gb", "0"], "--measured-peak-gb"),
    (["--budget-gb", "1e300"], "--budget-gb"),
    (["--measured-peak-gb", "1e300"], "--measured-peak-gb"),
    (["--top", "0"], "--top"),
])
def test_bad_numbers_exit_2_naming_the_option(run_tool, args, field):
    p = run_tool("plan", MOONLIGHT, *args, "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["error"]["exit"] == 2
    assert p.stderr.startswith(f"error: {field}:")


def test_measured_compare_report_anchors_the_control(run_tool, tmp_path, moonlight_json):
    _, plain = moonlight_json
    cmp_file = tmp_path / "compare.json"
    cmp_file.write_text(json.dumps({"control": "empty", "runs": [
        {"name": "empty", "status": "pass", "peak_allocated_gb": 36.618},
        {"name": "moe_act", "status": "pass", "peak_allocated_gb": 35.941}]}))
    p = run_tool("plan", MOONLIGHT, "--measured", str(cmp_file), "--json")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    control = next(c for c in r["candidates"] if c["name"] == "[]")
    residual = r["ranks"][0]["static"]["residual"]
    assert control["peak_bytes"] == 36_618_000_000 + residual     # allocated + what it leaves out
    assert r["calibration"]["setting"] == "[]"
    offset = r["calibration"]["offset_bytes"]
    before = {c["name"]: c["peak_bytes"] for c in plain["candidates"]}
    assert all(c["peak_bytes"] == before[c["name"]] + offset for c in r["candidates"])


def test_measured_and_measured_peak_are_exclusive(run_tool, tmp_path):
    p = run_tool("plan", MOONLIGHT, "--measured", str(tmp_path / "x.json"), "--measured-peak-gb", "3")
    assert p.returncode == 2


def test_top_keeps_the_frontier_points_nearest_the_recommendation(run_tool, moonlight_json):
    _, full = moonlight_json
    rec_cost = full["recommendation"]["cost_pct"]
    p = run_tool("plan", MOONLIGHT, "--top", "3", "--json")
    top = json.loads(p.stdout)["frontier"]
    assert len(top) == min(3, len(full["frontier"]))
    assert full["recommendation"]["name"] in [c["name"] for c in top]
    kept = max(abs(c["cost_pct"] - rec_cost) for c in top)
    dropped = [c for c in full["frontier"] if c["name"] not in {t["name"] for t in top}]
    assert all(abs(c["cost_pct"] - rec_cost) >= kept for c in dropped)


def test_plot_writes_a_png_and_refuses_to_overwrite_without_force(run_tool, tmp_path):
    png = tmp_path / "frontier.png"
    p = run_tool("plan", MOONLIGHT, "--plot", str(png), "--json")
    assert p.returncode in (0, 1), p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.write_bytes(b"user data")
    p = run_tool("plan", MOONLIGHT, "--plot", str(png))
    assert p.returncode == 2 and "exists; pass --force" in p.stderr
    assert png.read_bytes() == b"user data"
    p = run_tool("plan", MOONLIGHT, "--plot", str(png), "--force", "--json")
    assert p.returncode in (0, 1) and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("target", ["a_file/x.png", "a_dir.png"])
def test_a_plot_target_that_cannot_be_a_file_is_bad_input(run_tool, tmp_path, target):
    (tmp_path / "a_file").write_text("user data")
    (tmp_path / "a_dir.png").mkdir()
    p = run_tool("plan", MOONLIGHT, "--plot", str(tmp_path / target), "--force")
    assert p.returncode == 2 and p.stderr.startswith("error: --plot:") and p.stderr.count("\n") == 1


def test_the_harness_takes_the_plan_json_directly(tmp_path, moonlight_json):
    from mbridge_recompute.runs import harness
    from mbridge_recompute.setting import RecomputeSetting

    _, r = moonlight_json
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(r))
    settings = harness.candidates_from_plan(str(f))
    assert settings[0] == RecomputeSetting.selective()
    rec = r["recommendation"]
    rec_setting = RecomputeSetting(rec["recompute_granularity"],
                                   tuple(rec["recompute_modules"]) if rec["recompute_modules"] is not None
                                   else None, rec["recompute_method"], rec["recompute_num_layers"])
    # "no recompute needed" is swept as the [] control alone (same memory, same cost)
    assert rec_setting in settings or (rec_setting == RecomputeSetting.off()
                                       and settings == [RecomputeSetting.selective()])
    assert [s.candidate() for s in settings] == r["harness_candidates"]


def test_plan_never_imports_torch():
    """The planner is a light path: no torch and no megatron, even with the full candidate search."""
    import subprocess
    import sys

    from conftest import SCRIPTS

    probe = ("import runpy, sys, atexit\n"
             "atexit.register(lambda: sys.stderr.write('HEAVY=' + str(sorted(m for m in ('torch', "
             "'megatron') if m in sys.modules)) + chr(10)))\n"
             "sys.argv = ['plan.py', '--json']\n"
             "runpy.run_path(" + repr(str(SCRIPTS / "plan.py")) + ", run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 1), p.stderr
    assert "HEAVY=[]" in p.stderr, p.stderr


def test_compare_output_of_the_moonlight_sweep_calibrates_the_plan(run_tool, tmp_path):
    """compare_runs.py --json on the example sweep logs feeds plan --measured unchanged."""
    sweep = EXAMPLES / "logs" / "moonlight16b"
    p = run_tool("compare", *[sweep / n / "log.txt" for n in ("empty", "moe_act")], "--json")
    assert p.returncode in (0, 1), p.stderr
    cmp_file = tmp_path / "compare.json"
    cmp_file.write_text(p.stdout)
    measured_control = next(r for r in json.loads(p.stdout)["runs"] if r["control"])["peak_allocated_gb"]
    p = run_tool("plan", MOONLIGHT, "--measured", str(cmp_file), "--json")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    assert r["calibration"]["measured_allocated_bytes"] == int(measured_control * 1e9)
    assert r["calibration"]["setting"] == "[]"               # the control run's own record
    cands = {c["name"]: c for c in r["candidates"]}
    delta = cands["moe_act"]["model_peak_bytes"] - cands["[]"]["model_peak_bytes"]
    residual = r["ranks"][0]["static"]["residual"]
    assert cands["moe_act"]["peak_bytes"] == int(measured_control * 1e9) + residual + delta


def test_plot_draws_per_rank_stacked_bars_next_to_the_frontier(tmp_path):
    """The figure has the per-rank panel (one bar per PP rank, stacked static + activations +
    transient) and the frontier panel."""
    import matplotlib

    matplotlib.use("Agg")
    from mbridge_recompute.commands import plan as plan_cmd
    from mbridge_recompute.inputs.loading import load_workload
    from mbridge_recompute.plan.planner import plan

    report = plan(load_workload(default=True))
    drawn = {}
    import matplotlib.pyplot as plt

    real_savefig = plt.Figure.savefig

    def capture(fig, *a, **k):
        drawn["axes"] = fig.axes
        return real_savefig(fig, *a, **k)

    plt.Figure.savefig = capture
    try:
        plan_cmd._plot(report, tmp_path / "p.png")
    finally:
        plt.Figure.savefig = real_savefig
    bars, frontier = drawn["axes"]
    pp = len(report.estimate.ranks)
    assert pp == 4
    static = [p for p in bars.patches[:pp]]
    assert [round(p.get_height() * 1e9) for p in static] == \
        [pytest.approx(r.static_bytes, rel=1e-6) for r in report.estimate.ranks]
    assert len(bars.patches) > 2 * pp          # static + at least one activation part + transient
    assert frontier.get_xlabel().startswith("modelled replay cost")


def test_top_sets_how_many_neighbours_the_matched_sweep_takes(run_tool):
    """plan --top N: the [] control, the recommendation and its N nearest fitting neighbours."""
    args = ("examples/moonlight_16b.yaml", "--measured-peak-gb", "36.618", "--budget-gb", "36.1", "--json")
    sweeps = {}
    for top in (1, 3):
        p = run_tool("plan", *args, "--top", str(top))
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)
        sweeps[top] = r["harness_candidates"]
        assert sweeps[top][:2] == ["[]", r["recommendation"]["name"]]
    assert len(sweeps[1]) == 3 and len(sweeps[3]) == 5
    assert sweeps[3][:3] == sweeps[1]
