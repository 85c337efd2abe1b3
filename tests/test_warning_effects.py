"""Warnings only where a setting changes something, largest possible effect first.

A not-modelled setting at a value that does nothing (null, an inert value, a condition that is
not met, a bound of 0) is no warning; the others carry a bound in bytes sized on the workload
(memory/bounds.py, `bound:` in data/coverage.yaml) and come largest first. The real Bridge 0.6.2
dumps are checked in tests/test_bridge_recipes.py (they are built there); here the example dump
and hand-made workloads.
"""

from __future__ import annotations

import json

import pytest
import yaml

from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import bounds, coverage
from mbridge_recompute.units import GB

from conftest import EXAMPLES, run_script

# what every Bridge dump used to be warned about, each at a value that does nothing there
INERT_ON_EVERY_DUMP = {"comm_overlap.defer_embedding_wgrad_compute", "comm_overlap.wgrad_deferral_limit",
                       "env_vars.PYTORCH_CUDA_ALLOC_CONF", "cuda_graph_use_single_mempool",
                       "params_dtype", "optimizer.bf16", "optimizer.fp16", "optimizer.fp8_recipe",
                       "optimizer.use_distributed_optimizer"}


def test_every_bound_in_the_coverage_file_can_be_evaluated():
    data = coverage.load()
    values = dict.fromkeys(bounds.figures(load_workload(default=True), None), 1.0)
    for section in ("not_modelled", "notes"):
        for key, entry in data[section].items():
            assert "bound" in entry, key
            bounds.check(entry["bound"])
            got = bounds.evaluate(entry["bound"], values, 2)
            assert got is None if entry["bound"] == bounds.UNKNOWN else got >= 0, key


def test_the_example_bridge_dump_names_no_setting_that_does_nothing():
    """examples/bridge_dump_llama3_8b.yaml used to get nine warnings, all at values that change
    nothing there (PP 1, bf16, the distributed optimizer, no CUDA graphs)."""
    w = load_workload(str(EXAMPLES / "bridge_dump_llama3_8b.yaml"))
    assert {n.split("=")[0].removeprefix("model.") for n in w.not_modelled} & INERT_ON_EVERY_DUMP
    assert coverage.unmodelled(w) == []
    report = json.loads(run_script("plan", EXAMPLES / "bridge_dump_llama3_8b.yaml", "--json").stdout)
    assert report["warnings"] == []


def _dump(tmp_path, **sections) -> str:
    """The example dump with some values changed (section -> {key: value})."""
    data = yaml.safe_load((EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text())
    for section, values in sections.items():
        if not isinstance(data.get(section), dict):
            data[section] = {}
        data[section].update(values)
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_value_that_does_something_is_named_with_its_bound(tmp_path):
    w = load_workload(_dump(tmp_path, model={"tensor_model_parallel_size": 2, "sequence_parallel": True},
                            comm_overlap={"tp_comm_overlap": True}))
    named = {u.key: u for u in coverage.unmodelled(w)}
    u = named["comm_overlap.tp_comm_overlap"]
    th = 2 * w.seq_length * w.micro_batch_size / w.context_parallel_size * w.hidden_size
    assert u.bound == "12 * th" and u.effect_bytes == pytest.approx(12 * th)
    assert "bound: up to" in u.sentence() and f"{12 * th / GB:.2f} GB" in u.sentence()


def test_a_condition_on_another_sections_key_is_read_from_the_loaders_notes(tmp_path):
    """tp_comm_overlap_cfg matters only with tp_comm_overlap on (both comm_overlap keys, which
    no Workload field holds)."""
    cfg = {"_target_": "megatron.bridge.training.comm_overlap.TransformerLayerTPOverlapCfg"}
    off = load_workload(_dump(tmp_path, comm_overlap={"tp_comm_overlap_cfg": cfg}))
    assert "comm_overlap.tp_comm_overlap_cfg" not in {u.key for u in coverage.unmodelled(off)}
    on = load_workload(_dump(tmp_path, model={"tensor_model_parallel_size": 2},
                             comm_overlap={"tp_comm_overlap_cfg": cfg, "tp_comm_overlap": True}))
    assert "comm_overlap.tp_comm_overlap_cfg" in {u.key for u in coverage.unmodelled(on)}


def test_warnings_come_largest_possible_effect_first_and_unsized_last(tmp_path):
    fsdp = {"use_megatron_fsdp": True}
    model = {"tensor_model_parallel_size": 2, "fp32_residual_connection": True,
             "transformer_layer_spec": {"_target_": "my.own_spec"}}
    w = load_workload(_dump(tmp_path, model=model, comm_overlap={"tp_comm_overlap": True}, ddp=fsdp))
    named = coverage.unmodelled(w)
    sized = [u.effect_bytes for u in named if u.effect_bytes is not None]
    assert sized == sorted(sized, reverse=True) and len(sized) >= 3
    assert named[-1].key == "transformer_layer_spec" and named[-1].effect_bytes is None
    path = _dump(tmp_path, model={"tensor_model_parallel_size": 2, "fp32_residual_connection": True},
                 ddp=fsdp)
    report = json.loads(run_script("plan", path, "--json").stdout)
    effects = [f["effect_bytes"] for f in report["warnings"]]
    assert effects == sorted(effects, reverse=True)
    first = report["warnings"][0]             # FSDP shards weights, grads and optimizer state
    assert first["field"] == "ddp.use_megatron_fsdp"
    assert first["effect_bound"] == "optimizer + grads + weights"
    sharded = ("optimizer", "grads", "weights")
    rank = max(report["ranks"], key=lambda r: sum(r["static"][k] for k in sharded))
    assert first["effect_bytes"] == int(sum(rank["static"][k] for k in sharded))


def test_soft_capping_is_named_with_what_it_keeps(tmp_path):
    """Gemma 2's soft-capping (gemma2_provider.py:242, 414 @ 0.6.2): the attention cap keeps two
    more score tensors in its unfused attention, the final one two more [T, V/t] logits."""
    w = load_workload(_dump(tmp_path, model={"attn_logit_softcapping": 50.0,
                                             "final_logit_softcapping": 30.0}))
    named = {u.key: u for u in coverage.unmodelled(w)}
    assert named["attn_logit_softcapping"].bound == "2 * scores"
    assert named["final_logit_softcapping"].bound == "logits"
    attn, final = named["attn_logit_softcapping"], named["final_logit_softcapping"]
    assert attn.effect_bytes > final.effect_bytes > 0
    zero = load_workload(_dump(tmp_path, model={"attn_logit_softcapping": None,
                                                "final_logit_softcapping": 0.0}))
    capped = {"attn_logit_softcapping", "final_logit_softcapping"}
    assert not capped & {u.key for u in coverage.unmodelled(zero)}


def test_an_allocator_setting_moves_no_allocated_peak_and_is_no_warning(tmp_path):
    w = load_workload(_dump(tmp_path, env_vars={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}))
    assert any(n.startswith("env_vars.PYTORCH_CUDA_ALLOC_CONF=") for n in w.not_modelled)
    assert "env_vars.PYTORCH_CUDA_ALLOC_CONF" not in {u.key for u in coverage.unmodelled(w)}


def test_the_plan_text_shows_each_warnings_bound_as_its_json_figure(tmp_path):
    path = _dump(tmp_path, model={"tensor_model_parallel_size": 2, "fp32_residual_connection": True,
                                  "transformer_layer_spec": {"_target_": "my.own_spec"}},
                 ddp={"use_megatron_fsdp": True})
    text = run_script("plan", path).stdout
    report = json.loads(run_script("plan", path, "--json").stdout)
    from test_text_figures import _table, tables

    rows = _table(tables(text), "settings the memory model does not read")
    assert [r["setting"] for r in rows] == [f"{f['field']}={f['value']}" for f in report["warnings"]]
    for row, f in zip(rows, report["warnings"]):
        size = f["effect_bytes"]
        assert row["up to GB"] == ("not sized" if size is None else f"{size / GB:.2f}")
    assert max(map(len, text.splitlines())) <= 100
