"""Layout, offloading and optimizer alternatives on the recompute frontier (plan --alternatives)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from mbridge_recompute import memory
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory.cost import bubble_fraction
from mbridge_recompute.placement import layout_key
from mbridge_recompute.plan.alternatives import layout_string
from mbridge_recompute.rules import check_workload
from mbridge_recompute.rules.findings import errors
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.write.snippets import render_all

from conftest import EXAMPLES, ROOT, run_script

LLAMA = EXAMPLES / "llama3_70b_fp8.yaml"


@pytest.fixture(scope="module")
def llama_alternatives():
    res = run_script("plan", str(LLAMA), "--alternatives", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("p, v, m, expected", [
    (4, 5, 16, 3 / 80), (4, 10, 16, 3 / 160), (4, 1, 16, 3 / 16), (8, 2, 32, 7 / 64),
    (1, 1, 8, 0.0), (16, 1, 512, 15 / 512)])
def test_bubble_fraction_is_p_minus_1_over_v_m(p, v, m, expected):
    assert bubble_fraction(p, v, m) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p, v, m, expected", [(4, 8, 1, 3.0), (4, 1, 1, 3.0), (4, 2, 2, 1 + 1 / 4),
                                               (4, 1, 2, 3 / 2)])
def test_with_fewer_micro_batches_than_stages_interleaving_cannot_hide_the_bubble(p, v, m, expected):
    """One micro-batch crosses all p x v virtual stages alone: VPP 8 leaves PP 4's bubble at
    300 % (the (p-1)/(v*m) formula, which assumes m >= p, said 37.5 %)."""
    assert bubble_fraction(p, v, m) == pytest.approx(expected, rel=1e-12)
    if m < p:
        assert bubble_fraction(p, v, m) >= bubble_fraction(p, v, p)


def test_vpp_10_shortens_the_llama3_70b_step_by_the_bubble_alone():
    """TP4 PP4 VPP5, 16 micro-batches: (1 + 3/160) / (1 + 3/80) - 1 = -1.807 %."""
    w = RecomputeSetting.off().apply(load_workload(str(LLAMA)))
    v10 = w.replace(virtual_pipeline_model_parallel_size=10)
    assert memory.step_cost_pct(v10, w) == pytest.approx(100 * ((1 + 3 / 160) / (1 + 3 / 80) - 1),
                                                         rel=1e-9)


def test_llama3_70b_lists_vpp_10_with_its_bubble_beside_mlp_and_full_recompute(llama_alternatives):
    rows = {a["name"]: a for a in llama_alternatives["alternatives"]}
    vpp10 = next(a for n, a in rows.items() if n.endswith("@virtual_pipeline_model_parallel_size=10"))
    assert vpp10["kind"].startswith("vpp") and "bubble 3.75 % -> 1.88 %" in vpp10["detail"]
    assert vpp10["frees_bytes"] > 0
    # the current setting is selective [core_attn]: a label row adds the label to it
    assert "core_attn,mlp" in rows and ("uniform:1" in rows or "block:1" in rows)
    assert rows["core_attn,mlp"]["relation"] == "added to the current labels"
    assert rows["core_attn,mlp"]["cost_pct"] > vpp10["cost_pct"]


def test_every_listed_alternative_is_legal_per_the_checker(llama_alternatives):
    w = load_workload(str(LLAMA))
    for a in llama_alternatives["alternatives"]:
        setting = RecomputeSetting.parse(a["name"])
        found = check_workload(setting.apply(w), validator="builtin")["findings"]
        assert not errors(found), (a["name"], errors(found))


def test_the_frontier_marks_each_points_kind(llama_alternatives):
    kinds = {c["kind"] for c in llama_alternatives["candidates"]}
    assert "recompute" in kinds and any(k.startswith(("vpp", "cp", "layout", "offload")) for k in kinds)
    rr = llama_alternatives["recompute_recommendation"]
    assert rr is not None and rr["kind"] == "recompute"


def test_a_layout_string_round_trips_through_megatrons_grammar():
    for counts in ([3, 4, 4, 4, 5], [1, 4, 4, 4, 4, 1], [2, 3], [5]):
        s = layout_string(counts, 1)
        assert [stage.count("t") for stage in layout_key(s)] == counts
        assert layout_key(s)[-1].endswith("mL") and layout_key(s)[0].startswith("E")


def test_alternative_candidates_round_trip_and_write_their_keys_in_every_format():
    text = "mlp@pipeline_model_parallel_layout=Et*3|(t*4|)*3t*5L@use_distributed_optimizer=true"
    s = RecomputeSetting.parse(text)
    assert s.candidate() == text and RecomputeSetting.parse(s.candidate()) == s
    out = render_all(s)
    doc = yaml.safe_load(out["yaml"])
    assert doc["model"]["pipeline_model_parallel_layout"] == "Et*3|(t*4|)*3t*5L"
    assert doc["ddp"]["use_distributed_optimizer"] is True
    assert "model.pipeline_model_parallel_layout='Et*3|(t*4|)*3t*5L'" in out["overrides"]
    assert "cfg.model.pipeline_model_parallel_layout = 'Et*3|(t*4|)*3t*5L'" in out["python"]
    assert out["mlm"][-3:] == ["--pipeline-model-parallel-layout", "Et*3|(t*4|)*3t*5L",
                               "--use-distributed-optimizer"]


def test_bad_change_syntax_is_bad_input_naming_the_candidate():
    from mbridge_recompute.errors import InputError

    with pytest.raises(InputError):
        RecomputeSetting.parse("mlp@no_such_field=3")
    with pytest.raises(InputError):
        RecomputeSetting.parse("mlp@virtual_pipeline_model_parallel_size")


def test_the_harness_sweeps_an_alternative_with_its_overrides(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
    import standin

    repo = standin.make_checkout(tmp_path / "bridge", "main", parser=False)
    pinned = ["-m", "llama", "-mr", "llama3_70b", "-ng", "32", "-g", "h100", "-c", "fp8_cs",
              "-gb", "32", "-sl", "4096"]
    proc = run_script("harness", "--repo", repo, "--json", "--out", tmp_path / "runs", "--candidates",
                      "core_attn@virtual_pipeline_model_parallel_size=10", "--", *pinned)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    argv = next(r for r in runs if "vpp10" in r["name"] or "virtual" in json.dumps(r))["argv"]
    assert "model.virtual_pipeline_model_parallel_size=10" in argv


def test_a_change_value_is_checked_against_its_field():
    """'@context_parallel_size=abc' was written into every format as-is (exit 0)."""
    from conftest import run_script

    p = run_script("config", "--candidate", "mlp@context_parallel_size=abc", "--format", "overrides")
    assert p.returncode == 2 and "context_parallel_size" in p.stderr and "integer" in p.stderr
