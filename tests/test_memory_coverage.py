"""No silent fields: every key the loader accepts is modelled, has no memory effect, or is named
in the plan as not modelled when its value matters (data/coverage.yaml, memory/coverage.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import fields as upstream_fields
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import coverage
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.workload import FIELD_NAMES, Workload

from conftest import EXAMPLES, ROOT

PACKAGE = ROOT / "scripts" / "mbridge_recompute"


SECTIONS = ("model", "train", "ddp", "optimizer", "comm_overlap", "mixed_precision", "cluster")


def accepted_keys() -> set:
    """Every key the loader accepts (inputs/fields.py: some release or Bridge 0.6.2 has it):
    model keys by bare name, the other sections' keys as section.key."""
    keys = set(FIELD_NAMES)
    for section in SECTIONS:
        for name in upstream_fields.known(section):
            if section != "model" and name in FIELD_NAMES:
                continue
            keys.add(name if section == "model" else f"{section}.{name}")
    return keys - {"first_k_dense_replace"}      # read into moe_layer_freq


def _unclassified_model_keys() -> list:
    return sorted(k for k in accepted_keys() if coverage.category(k) is None and "." not in k)


def test_every_accepted_field_is_modelled_or_named_as_not_modelled():
    """Each accepted key is classified in data/coverage.yaml, or is a model key of some Bridge
    provider that the loader names whenever it is set away from that provider's default (the
    next test shows it does, key by key)."""
    data = coverage.load()
    missing = sorted(k for k in accepted_keys() if coverage.category(k) is None and "." in k)
    assert not missing, missing
    twice = [k for k in accepted_keys() if sum(k in data[c] for c in coverage.CATEGORIES) > 1]
    assert not twice, twice


def _other_value(key: str):
    from mbridge_recompute.inputs.fields import _default_of

    default = (_default_of(key, None) or {}).get("value")
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    return "set-by-test"


@pytest.mark.parametrize("key", _unclassified_model_keys())
def test_an_unclassified_provider_key_set_away_from_its_default_is_named(key, tmp_path):
    path = Path(tmp_path) / "w.yaml"
    path.write_text(yaml.safe_dump({"model": {"num_layers": 2, key: _other_value(key)}}))
    try:
        w = load_workload(str(path))
    except InputError:
        return            # a value megatron-core's own type rejects: refused, not dropped
    assert any(n.startswith(f"model.{key}=") for n in w.not_modelled), (key, w.not_modelled)


def test_modelled_keys_are_read_by_the_memory_model():
    """A key listed as modelled appears in the source of the memory model, the placement, the
    Workload's derived sizes or the loader (first_k_dense_replace becomes moe_layer_freq)."""
    sources = "".join(p.read_text() for p in list((PACKAGE / "memory").glob("*.py"))
                      + [PACKAGE / "placement.py", PACKAGE / "workload.py",
                         PACKAGE / "inputs" / "loading.py"]
                      if p.name != "coverage.py")
    unread = [k for k in coverage.load()["modelled"] if k not in sources]
    assert not unread, unread


def test_not_modelled_entries_say_what_they_change_and_when_they_are_inert():
    for key, entry in coverage.load()["not_modelled"].items():
        assert entry["changes"].strip(), key
        assert isinstance(entry.get("inert", []), list), key


def test_default_workload_names_nothing_as_not_modelled():
    assert coverage.unmodelled(Workload()) == []


def test_legacy_cpu_offloading_is_named_in_plan_assumptions_and_as_a_warning():
    w = Workload(num_layers=4, cpu_offloading=True, cpu_offloading_num_layers=2, bf16=True)
    report = plan(w).to_dict()
    named = {f["field"] for f in report["warnings"]}
    assert {"cpu_offloading", "cpu_offloading_num_layers"} <= named
    assert all(f["severity"] == "warning" for f in report["warnings"])
    assert any(a.startswith("not modelled: cpu_offloading=true") for a in report["assumptions"])


def test_a_setting_that_only_matters_with_another_is_not_named_alone():
    w = Workload(cpu_offloading_num_layers=2)          # offloading itself is off
    assert [u.key for u in coverage.unmodelled(w)] == []


def test_other_sections_keys_are_judged_too(tmp_path):
    path = Path(tmp_path) / "w.yaml"
    model = "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4}\n"   # a whole model
    path.write_text(model + "optimizer: {optimizer_cpu_offload: true, optimizer_offload_fraction: 0.5}\n")
    w = load_workload(str(path))
    named = {u.key: u for u in coverage.unmodelled(w)}
    assert "optimizer.optimizer_cpu_offload" in named
    assert "host" in named["optimizer.optimizer_cpu_offload"].changes      # its coverage.yaml text
    path.write_text(model + "optimizer: {some_future_knob: 3}\n")
    with pytest.raises(InputError):                   # known to no release: refused, not dropped
        load_workload(str(path))


@pytest.mark.parametrize("condition, expect", [
    ("fp8", False), ("bf16", True), ("tensor_model_parallel_size > 1", True),
    ("moe_token_dispatcher_type=alltoall/flex", True), ("moe_token_dispatcher_type != alltoall", False),
    ("bf16 and fp8", False), ("fp8 or bf16", True), ("value==bf16", True),
    ("the unfused activation path", True)])
def test_coverage_conditions(condition, expect):
    w = Workload(bf16=True, tensor_model_parallel_size=2, num_attention_heads=16,
                 moe_token_dispatcher_type="alltoall")
    assert coverage.holds(w, condition, own=True) is expect


def test_the_example_workloads_name_only_settings_they_set():
    from mbridge_recompute.workload import FIELDS

    for path in sorted(EXAMPLES.glob("*.yaml")):
        w = load_workload(str(path))
        for u in coverage.unmodelled(w):
            if u.key in FIELDS:
                assert coverage.lookup(w, u.key) == u.value
            else:                                      # named by the loader, as read
                assert any(n.startswith((u.key, "model." + u.key)) for n in w.not_modelled), u
