"""The model catalog (`--model NAME`): every entry loads, validates and cites its source."""

from __future__ import annotations

import pytest
import yaml

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import catalog
from mbridge_recompute.inputs.loading import load_workload

from conftest import ROOT

REQUIRED = {"llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b",
            "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v3", "moonlight-16b", "nemotron-3-nano",
            "gpt3-175b"}


def test_catalog_covers_the_dense_moe_mla_and_hybrid_models_named_in_the_guide():
    assert REQUIRED <= set(catalog.names())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_catalog_model_loads_as_a_valid_workload(name):
    w = load_workload(model=name)
    assert w.num_layers > 0 and w.hidden_size > 0
    assert len(w.layer_kinds()) == w.num_layers


def test_every_entry_and_every_layout_cites_a_source():
    data = yaml.safe_load((ROOT / "scripts/mbridge_recompute/data/models.yaml").read_text())
    for name, entry in data["models"].items():
        assert len(entry.get("source", "")) > 20, name
        if "layout" in entry:
            assert len(entry["layout"].get("source", "")) > 20, name


def test_architecture_facts_land_in_mcore_fields():
    dsv3 = load_workload(model="deepseek-v3")
    assert dsv3.multi_latent_attention and dsv3.q_lora_rank == 1536 and dsv3.kv_lora_rank == 512
    # first_k_dense_replace 3: three dense layers, then MoE
    assert dsv3.layer_kinds()[:4] == ["attn+mlp"] * 3 + ["attn+moe"]
    moonlight = load_workload(model="moonlight-16b")
    assert moonlight.q_lora_rank is None and moonlight.layer_kinds().count("attn+mlp") == 1
    nano = load_workload(model="nemotron-3-nano")
    kinds = nano.layer_kinds()
    assert (kinds.count("mamba"), kinds.count("moe"), kinds.count("attn")) == (23, 23, 6)
    assert load_workload(model="qwen3-30b-a3b").layer_kinds() == ["attn+moe"] * 48


def test_layouts_only_where_a_recipe_or_study_fixes_them():
    with_layout = {n for n in catalog.names() if catalog.has_layout(n)}
    assert {"moonlight-16b", "nemotron-3-nano", "llama3-70b", "deepseek-v3"} <= with_layout
    assert "qwen3-8b" not in with_layout
    sections = catalog.model_sections("qwen3-8b")
    assert set(sections) == {"model"}
    assert "tensor_model_parallel_size" not in sections["model"]


def test_names_tolerate_case_underscores_and_aliases():
    assert catalog.resolve("Moonlight_16B") == "moonlight-16b"
    assert catalog.resolve("dsv3") == "deepseek-v3"
    assert catalog.resolve("llama3-405b") == "llama3.1-405b"


def test_unknown_model_is_an_input_error_listing_known_names():
    with pytest.raises(InputError) as exc:
        catalog.model_sections("llama9-1t")
    assert exc.value.field == "--model"
    assert "unknown model 'llama9-1t'" in exc.value.reason and "deepseek-v3" in exc.value.reason


def test_unknown_model_exits_2_with_one_line(run_tool):
    p = run_tool("plan", "--model", "nope")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: --model: unknown model 'nope'; known: " + ", ".join(catalog.names())]


def test_a_workload_file_overrides_the_catalog_layout(tmp_path):
    f = tmp_path / "w.yaml"
    # TP 1 on the layout's 8 GPUs is DP 8, so the global batch must hold 8 micro-batches of 1
    f.write_text("model: {tensor_model_parallel_size: 1, expert_model_parallel_size: 4}\n"
                 "train: {global_batch_size: 8}\n")
    w = load_workload(str(f), model="moonlight-16b")
    assert w.tensor_model_parallel_size == 1 and w.expert_model_parallel_size == 4
    assert w.num_layers == 27       # architecture still from the catalog


@pytest.mark.mcore
def test_every_catalog_model_passes_the_installed_transformer_config():
    """The live validator constructs megatron-core's own TransformerConfig for each entry.

    Llama providers turn on apply_rope_fusion, whose 0.16.1 check only asks whether TE's fused
    RoPE kernel imports on the checking machine; the live validator reports it as undecided
    (info) here, so every entry must come out with no error at all.
    """
    from mbridge_recompute.rules import check_workload

    for name in catalog.names():
        report = check_workload(load_workload(model=name), validator="live")
        assert report["validator"] == "live"
        errors = [f for f in report["findings"] if f["severity"] == "error"]
        assert not errors, (name, errors)


def test_the_cli_reference_lists_every_catalog_model():
    from mbridge_recompute.inputs import catalog

    from conftest import ROOT

    row = next(line for line in (ROOT / "references" / "cli-reference.md").read_text().splitlines()
               if line.startswith("| `--model NAME`"))
    assert [n.strip("` |") for n in row.split(":", 1)[1].split(",")] == list(catalog.names())
