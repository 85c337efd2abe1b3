"""The live validator separates 'illegal config' from 'cannot be decided on this machine'."""

from __future__ import annotations

import pytest

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.rules import check_workload
from mbridge_recompute.rules.mcore_config import te_importable

pytestmark = pytest.mark.mcore


def test_rope_fusion_without_te_here_is_not_an_error_and_hides_no_later_check():
    """apply_rope_fusion only asks whether TE's kernel imports locally (tc:1544-1552 @ core_v0.16.1).

    Without TE on the checking machine it is reported as undecided (info), and the checks after
    it in __post_init__ still run: full recompute under TE CUDA graphs is still rejected.
    """
    assert not te_importable()   # this machine: no Transformer Engine
    w = load_workload(default=True, sets=[
        "model.apply_rope_fusion=true", "model.cuda_graph_impl=transformer_engine",
        "model.recompute_granularity=full", "model.recompute_method=uniform",
        "model.recompute_num_layers=1"])
    report = check_workload(w, validator="live")
    ids = {f["id"]: f for f in report["findings"]}
    assert ids["rope-fusion-not-decided-here"]["severity"] == "info"
    assert "mcore-config-error" not in ids
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and all("full iteration" in (f["upstream_message"] or "") or f["source"] == "builtin"
                          for f in errors), errors
    assert any(f["source"] == "live" for f in errors)


def test_default_example_with_bridge_fusions_checks_clean_live():
    w = load_workload("examples/llama3_70b_fp8.yaml")
    report = check_workload(w, validator="live")
    assert report["ok"], [f for f in report["findings"] if f["severity"] == "error"]
