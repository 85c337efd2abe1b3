"""Each recompute label's facts are one card entry (`labels:`), and the code asks the card:
which releases accept it, whether it needs Transformer Engine, what the memory model says it
drops per attention core (or that it has no terms for it), which layers it needs, and the
smallest workload it applies to (config's check of a bare setting). Adding a label is a card
entry, its saved-tensor and replay terms (memory/tensors.py, memory/cost.py) and tests.
"""

from __future__ import annotations

import copy

import pytest

from mbridge_recompute.commands.config import baseline_workload
from mbridge_recompute.facts import card, releases
from mbridge_recompute.inputs.fields import all_transformer_config_fields
from mbridge_recompute.memory.effects import what_it_drops
from mbridge_recompute.rules import check_workload
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.workload import FIELD_NAMES, Workload

LABEL_RELEASES = [(e["label"], key) for e in card.load()["labels"] for key in releases.keys()
                  if releases.in_range(key, e["releases"])]


def test_every_label_says_what_the_memory_model_makes_of_it():
    for e in card.load()["labels"]:
        memory = e["memory"]
        assert ("not_modelled" in memory) != ("drops" in memory), e["label"]
        known = set(FIELD_NAMES) | all_transformer_config_fields()
        assert set(e.get("baseline") or {}) <= known, e["label"]


@pytest.mark.parametrize("label,key", LABEL_RELEASES, ids=[f"{lb}-{k}" for lb, k in LABEL_RELEASES])
def test_a_one_label_setting_is_legal_on_the_baseline_the_card_builds_for_it(label, key):
    """write_config checks a bare setting on the baseline model its labels' `baseline:` fields
    build; the label's own gate must pass there on every release that has it (0.19 refused
    gdn_norm_out when the baseline said gdn, a main-only spelling)."""
    setting = RecomputeSetting.selective(label)
    w = setting.apply(baseline_workload(setting))
    report = check_workload(w, validator="builtin", version=key)
    assert [f["id"] for f in report["findings"] if f["severity"] == "error"] == []


def test_what_a_label_drops_is_the_cards_text_for_the_attention_core():
    dense = Workload(num_layers=4, hidden_size=256, num_attention_heads=4)
    local = dense.replace(transformer_impl="local")
    core_attn = card.label("core_attn")["memory"]["drops"]
    assert what_it_drops(dense, "core_attn") == (True, core_attn["te_fused"])
    assert what_it_drops(local, "core_attn") == (True, core_attn["mcore"])
    assert what_it_drops(dense, "gdn_norm_out") == (False, "no GatedDeltaNet layers in this model")
    assert what_it_drops(dense, "mhc") == (False, card.label("mhc")["memory"]["not_modelled"])
    assert what_it_drops(dense, "no_such_label") == (False, "label not modelled")


def test_a_new_label_is_read_from_the_card_without_code(monkeypatch):
    """A label the code has never heard of, added to (a copy of) the card, is offered by the
    release that has it, described by the memory model and given its baseline."""
    data = copy.deepcopy(card.load())
    data["labels"].append({
        "label": "future_norm", "releases": "main", "boundary": "a future norm", "mechanism": "x",
        "applies_to": ["attention"], "replay_cost": "norm forward", "needs_te": True, "source": "x",
        "baseline": {"qk_layernorm": True},
        "memory": {"needs_layers": {"attn": "no attention layers in this model"},
                   "drops": {"any": "discards the future norm's output"}}})
    monkeypatch.setattr(card, "load", lambda: data)
    assert "future_norm" in releases.labels_for("main") and "future_norm" not in releases.labels_for("0.19")
    w = Workload(num_layers=4, hidden_size=256, num_attention_heads=4)
    assert what_it_drops(w, "future_norm") == (True, "discards the future norm's output")
    setting = RecomputeSetting.selective("future_norm")
    assert baseline_workload(setting).qk_layernorm is True
