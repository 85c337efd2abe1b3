"""The GPU decides which FP8 / FP4 recipes run: the card's GPU facts and the checks Transformer
Engine makes when megatron-core enters the first FP8 / FP4 region.

Transformer Engine cannot be imported here; its thresholds are read from its source
(quantization.py:149-185,720-759 @ v2.17.1, fp8.py:64-72 @ v2.8) into the card, and these tests
hold the checker to them. EXPECTED below is written out by hand from those checks, not computed
from the card, so a wrong threshold in the card fails here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_recompute.facts import card, gpus
from mbridge_recompute.rules import builtin, check_workload
from mbridge_recompute.workload import Workload

BASE = {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "bf16": True}
GPU_RULES = {"fp8-needs-sm89", "fp8-blockwise-needs-sm90", "mxfp8-needs-sm100", "nvfp4-needs-sm100"}
ISSUE_GPUS = ("h100", "h200", "h20", "b200", "b300", "gb200", "gb300", "a100-40gb", "a100-80gb", "l40s")
ALL = ["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]
HOPPER = ["delayed", "tensorwise", "blockwise"]
EXPECTED = {
    "a100-40gb": [], "a100-80gb": [],                       # 8.0: below FP8's 8.9
    "l40s": ["delayed", "tensorwise"],                      # 8.9: FP8, not block-scaled FP8
    "h100-80gb": HOPPER, "h100-nvl": HOPPER, "h20": HOPPER, "h200": HOPPER,     # 9.0
    "b200": ALL, "gb200": ALL, "b300": ALL, "gb300": ALL,   # 10.0 / 10.3
}


def wl(gpu: str | None = None, recipe: str = "tensorwise", **kw) -> Workload:
    precision = {"fp4": "e2m1"} if recipe == "nvfp4" else {"fp8": "hybrid", "fp8_recipe": recipe}
    return Workload(**{**BASE, **precision, **({"gpu": gpu} if gpu else {}), **kw})


def findings(w, version="0.19", **kw) -> dict:
    return {f["id"]: f for f in builtin.check(w, version=version, **kw)["findings"]}


def gpu_errors(w, **kw) -> set:
    return {cid for cid, f in findings(w, **kw).items() if cid in GPU_RULES and f["severity"] == "error"}


def test_the_gpu_table_has_every_gpu_named_with_capacity_architecture_and_compute_capability():
    for name in ISSUE_GPUS:
        e = gpus.table()[gpus.resolve(name)]
        assert e["capacity"] in ("cited", "derived") and e["source"], name
        assert e["compute_capability"] and e["cc_source"] and e["architecture"], name
        assert 0 < e["total_gib"] < e["marketed_gb"], name


def test_recipe_support_per_gpu_follows_transformer_engines_compute_capability_checks():
    assert {name: gpus.recipes_for(name) for name in EXPECTED} == EXPECTED


def test_mxfp8_on_h100_is_rejected_with_transformer_engines_message_and_line():
    f = findings(wl("h100", "mxfp8"))["mxfp8-needs-sm100"]
    assert f["severity"] == "error" and f["kind"] == "runtime"
    assert f["upstream_message"] == "Device compute capability 10.0 or higher required for MXFP8 execution."
    assert "fp8_utils.py:806-808 @ core_v0.19.0" in f["citation"]
    assert "transformer_engine/pytorch/quantization.py:162-168,753 @ v2.17.1" in f["citation"]


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "gb300"])
def test_mxfp8_and_nvfp4_on_blackwell_are_accepted(gpu):
    assert gpu_errors(wl(gpu, "mxfp8")) == set()
    assert gpu_errors(wl(gpu, "nvfp4")) == set()


@pytest.mark.parametrize("gpu", ["h100", "h200", "h20"])
def test_nvfp4_on_hopper_is_rejected(gpu):
    f = findings(wl(gpu, "nvfp4"))["nvfp4-needs-sm100"]
    assert f["severity"] == "error"
    assert f["upstream_message"] == "Device compute capability 10.0 or higher required for NVFP4 execution."


@pytest.mark.parametrize("recipe", ALL)
def test_every_fp8_and_fp4_recipe_on_a100_is_rejected_by_the_fp8_check_first(recipe):
    # autocast_enter asserts FP8 support before the recipe's own check (quantization.py:750)
    assert gpu_errors(wl("a100", recipe)) == {"fp8-needs-sm89"}


def test_fp8_on_l40s_runs_delayed_and_tensorwise_but_not_blockwise_or_mxfp8():
    assert gpu_errors(wl("l40s", "delayed")) == gpu_errors(wl("l40s", "tensorwise")) == set()
    assert gpu_errors(wl("l40s", "blockwise")) == {"fp8-blockwise-needs-sm90"}
    assert gpu_errors(wl("l40s", "mxfp8")) == {"mxfp8-needs-sm100"}


def test_blockwise_on_blackwell_needs_transformer_engine_2_9_or_later():
    old = findings(wl("b200", "blockwise", te_version="2.8.0"))["fp8-blockwise-needs-sm90"]
    assert old["severity"] == "error"
    assert old["upstream_message"] == "FP8 block scaled GEMM requires Hopper and CUDA >= 12.9."
    assert gpu_errors(wl("b200", "blockwise", te_version="2.9.0")) == set()
    unknown = findings(wl("b200", "blockwise"))["fp8-blockwise-needs-sm90"]
    assert unknown["severity"] == "warning" and "cluster.te_version" in unknown["message"]
    assert gpu_errors(wl("h100", "blockwise", te_version="2.8.0")) == set()


def test_a_recipe_only_some_gpus_run_is_a_warning_when_the_gpu_is_not_named():
    # 80 GB is both A100 (8.0) and H100 (9.0): the default size decides nothing
    f = findings(wl(None, "mxfp8"))
    assert f["precision-recipe-gpu-not-named"]["severity"] == "warning"
    assert not GPU_RULES & set(f)
    assert "precision-recipe-gpu-not-named" not in findings(wl(None, "tensorwise"))


def test_gpu_memory_gb_decides_when_every_gpu_of_that_size_has_one_architecture():
    # 141 GB is the H200 alone; 288 GB is B300 only (GB300 is 279)
    assert gpu_errors(wl(None, "mxfp8", gpu_memory_gb=141)) == {"mxfp8-needs-sm100"}
    assert gpu_errors(wl(None, "mxfp8", gpu_memory_gb=288)) == set()


def test_a_gpu_transformer_engines_checks_do_not_cover_is_not_decided():
    f = findings(wl("mi300x", "mxfp8"))
    assert f["precision-recipe-gpu-not-named"]["severity"] == "warning"
    assert "not decided" in f["precision-recipe-gpu-not-named"]["message"]
    assert gpus.recipes_for("mi300x") is None


def test_the_check_command_rejects_mxfp8_on_h100_with_exit_1(run_tool):
    r = run_tool("check", "--validator", "builtin", "--set", "model.fp8=hybrid",
                 "--set", "model.fp8_recipe=mxfp8", "--set", "cluster.gpu=h100", "--json")
    assert r.returncode == 1, r.stderr
    import json

    report = json.loads(r.stdout)
    assert "mxfp8-needs-sm100" in {f["id"] for f in report["findings"] if f["severity"] == "error"}


def test_gpu_rules_hold_for_every_release_the_card_covers():
    for key in card.load()["releases"]:
        assert "mxfp8-needs-sm100" in {f["id"] for f in check_workload(
            wl("h100", "mxfp8"), validator="builtin", version=key)["findings"]}, key


@settings(max_examples=60, deadline=None)
@given(gpu=st.sampled_from(sorted(EXPECTED)), recipe=st.sampled_from(ALL),
       te=st.sampled_from([None, "2.8.0", "2.9.0", "2.17.1"]))
def test_a_recipe_is_rejected_on_a_gpu_exactly_when_the_gpu_does_not_run_it(gpu, recipe, te):
    errors = gpu_errors(wl(gpu, recipe, te_version=te))
    old_te_blackwell_blockwise = (recipe == "blockwise" and gpus.table()[gpu]["architecture"] == "blackwell"
                                  and te == "2.8.0")
    assert bool(errors) == (recipe not in EXPECTED[gpu] or old_te_blackwell_blockwise)
