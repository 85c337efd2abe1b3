"""Known memory bugs of megatron-core are facts of the releases they hold for (card
`memory_bugs:`): a workload that meets one gets a warning naming it, its issue and fix, and an
error band widened by what it keeps (memory/bugs.py)."""

from __future__ import annotations

import pytest

from mbridge_recompute.facts import card
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import estimate
from mbridge_recompute.memory.bugs import hits
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.types import DEFAULT_KNOBS
from mbridge_recompute.plan.planner import plan

from conftest import EXAMPLES

FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
            recompute_modules=None)


def _moonlight(**kw):
    return load_workload(str(EXAMPLES / "moonlight_16b.yaml")).replace(**kw)


def _ids(w, release: str) -> dict:
    sh = shape_of(w, DEFAULT_KNOBS)
    return {h.id: h for r in estimate(w).ranks for h in hits(w, sh, r, release)}


def test_every_memory_bug_names_its_releases_issue_fix_and_upstream_lines():
    bugs = card.load()["memory_bugs"]
    assert {b["id"] for b in bugs} >= {"moe-full-recompute-unpermute-kept",
                                       "deepep-token-probs-kept-with-recompute"}
    for b in bugs:
        assert "github.com/NVIDIA/Megatron-LM" in b["issue"] + b["fix"]
        lo, _, hi = b["releases"].partition("-")
        assert set(b["at"]) >= {lo, hi or lo}


@pytest.mark.parametrize("release", ["0.16", "0.17", "0.18", "0.19", "main"])
def test_full_recompute_on_moe_with_the_unfused_permute_keeps_one_unpermute_set_per_moe_layer(release):
    """Issue 3221: PR 5197 is on main only, and deleting locals before return does not change
    their lifetime, so every release is affected."""
    w = _moonlight(**FULL)
    hit = _ids(w, release)["moe-full-recompute-unpermute-kept"]
    sh = shape_of(w, DEFAULT_KNOBS)
    rank = estimate(w).ranks[0]
    # 26 MoE layers x (fp32 router: 4 bytes) x h x (routed tokens + unpermuted tokens)
    assert hit.nbytes == pytest.approx(26 * 4 * 2048 * (sh.n_routed() + sh.Tr * sh.etp))
    assert rank.moe_layers == 26
    assert "issues/3221" in hit.sentence and "pull/5197" in hit.sentence


def test_the_fused_permute_and_selective_recompute_do_not_meet_the_unpermute_bug():
    fused = _moonlight(**FULL, extra_model={**_moonlight().extra_model, "moe_permute_fusion": True})
    assert "moe-full-recompute-unpermute-kept" not in _ids(fused, "0.19")
    assert "moe-full-recompute-unpermute-kept" not in _ids(_moonlight(), "0.19")


def test_deepep_with_recompute_keeps_the_moe_input_and_its_gradient_per_moe_layer():
    w = load_workload(str(EXAMPLES / "nemotron_3_nano.yaml"))
    deepep = w.replace(extra_model={**w.extra_model, "moe_flex_dispatcher_backend": "deepep"},
                       recompute_modules=["moe"])
    hit = _ids(deepep, "0.19")["deepep-token-probs-kept-with-recompute"]
    assert hit.nbytes == pytest.approx(23 * 2 * 2 * 2688 * 8192)
    assert "deepep-token-probs-kept-with-recompute" not in _ids(w.replace(recompute_modules=["moe"]), "0.19")


def test_a_plan_that_meets_a_memory_bug_names_it_and_widens_its_band_by_it():
    w = _moonlight(**FULL)
    r = plan(w).to_dict()
    warn = [f for f in r["warnings"] if f["id"] == "known-memory-bug"]
    assert [f["field"] for f in warn] == ["moe-full-recompute-unpermute-kept"]
    terms = {t["name"]: t for t in r["ranks"][0]["band"]["terms"]}
    assert terms["known bug moe-full-recompute-unpermute-kept"]["above_bytes"] > 0
    clean = plan(_moonlight(**FULL, extra_model={**_moonlight().extra_model,
                                                  "moe_permute_fusion": True})).to_dict()
    assert not any(f["id"] == "known-memory-bug" for f in clean["warnings"])
