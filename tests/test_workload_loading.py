"""The loader: real field names, Bridge dumps, overrides, and the edge checks that make input unusable."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs.fields import transformer_config_fields
from mbridge_recompute.inputs.loading import load_workload, parse_override
from mbridge_recompute.workload import FIELD_NAMES, Workload

from conftest import EXAMPLES

# the sizes a workload must state (a model is never made up: inputs/loading.py REQUIRED_SIZES)
SIZES = ["model.num_layers=2", "model.hidden_size=256", "model.num_attention_heads=4"]


def test_field_list_matches_installed_transformer_config():
    """The 0.16 field list (data/upstream_fields.json) is exactly the installed megatron-core's
    TransformerConfig (+MLA) fields."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    installed = {f.name for f in dataclasses.fields(TransformerConfig)}
    installed |= {f.name for f in dataclasses.fields(MLATransformerConfig)}
    assert transformer_config_fields("0.16") == installed


def test_workload_model_fields_are_real_transformer_config_fields():
    """Every field the live validator receives is a real TransformerConfig/MLATransformerConfig
    field, except fields of later releases the card names (cuda_graph_modules: 0.18+)."""
    from mbridge_recompute.facts import releases

    fields = set(Workload().model_fields())
    later = {name for name in ("cuda_graph_modules",) if not releases.enum(name, releases.target_version())}
    names = transformer_config_fields("0.16")
    assert fields - later <= names, sorted(fields - later - names)


def test_workload_defaults_are_megatron_core_defaults():
    """Defaults equal megatron-core 0.16.1's, so an unset key means what it means upstream."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    upstream = {f.name: f.default for f in dataclasses.fields(TransformerConfig)
                if f.default is not dataclasses.MISSING}
    ours = Workload()
    checked = 0
    for name in FIELD_NAMES & set(upstream):
        if name in ("num_layers", "hidden_size", "num_attention_heads", "activation_func",
                    "cuda_graph_scope", "moe_layer_freq"):
            continue  # required upstream, a function object, or an enum-normalised value
        expected = getattr(upstream[name], "name", upstream[name])  # enums compare by name
        assert getattr(ours, name) == expected, name
        checked += 1
    assert checked > 40


def test_bridge_config_dump_loads_as_is():
    """megatron-bridge 0.6.2's own 800-line dump of llama3_8b_pretrain_2gpu_h100_bf16_config loads
    with no edit (comm_overlap: null, env_vars:, the ddp and model fields of 0.19); model keys keep
    Bridge names and the run-time mixed-precision recipe applies."""
    w = load_workload(str(EXAMPLES / "bridge_dump_llama3_8b.yaml"))
    assert w.activation_func == "silu" and w.swiglu and w.num_layers == 32 and w.num_query_groups == 8
    assert w.micro_batch_size == 1 and w.global_batch_size == 512 and w.context_parallel_size == 2
    assert w.recompute_granularity is None and w.recompute_modules is None
    assert w.bf16 is True and w.defaults_source == "bridge"
    assert w.extra_model["apply_rope_fusion"] is True   # real MCore field, passed through


def test_first_k_dense_replace_becomes_a_layer_pattern():
    w = load_workload(sets=["model.num_layers=4", "model.hidden_size=256", "model.num_attention_heads=4",
                            "model.num_moe_experts=8", "model.first_k_dense_replace=1"])
    assert w.layer_kinds() == ["attn+mlp", "attn+moe", "attn+moe", "attn+moe"]


def test_overrides_win_over_the_file_and_accept_the_harness_comma_form():
    w = load_workload(default=True, sets=["model.recompute_modules=core_attn,mlp"])
    assert w.recompute_modules == ["core_attn", "mlp"]
    w = load_workload(default=True, sets=["model.recompute_modules=[]"])
    assert w.recompute_modules == []
    w = load_workload(default=True, sets=["model.recompute_granularity=null"])
    assert w.recompute_granularity is None


def test_bare_keys_go_to_their_section():
    assert parse_override("recompute_num_layers=2") == ("recompute_num_layers", 2)
    w = load_workload(default=True, sets=["micro_batch_size=2", "gpu_memory_gb=141"])
    assert w.micro_batch_size == 2 and w.gpu_memory_gb == 141


@pytest.mark.parametrize("sets, field", [
    (["model.num_layers=-1"], "model.num_layers"),
    (["model.tensor_model_parallel_size=3"], "model.tensor_model_parallel_size"),
    (["model.hiden_size=10"], "model.hiden_size"),
    (["cluster.num_gpus=33"], "cluster.num_gpus"),
    (["model.sequence_parallel=yes please"], "model.sequence_parallel"),
    (["model.seq_length=99999999999999999999"], "model.seq_length"),
    (["cluster.gpu_memory_gb=.nan"], "cluster.gpu_memory_gb"),
    (["model.microbatch_group_size_per_vp_stage=-3"], "model.microbatch_group_size_per_vp_stage"),
    (["model.mamba_head_dim=abc"], "model.mamba_head_dim"),
    (["model.bias_activation_fusion=maybe"], "model.bias_activation_fusion"),
    (["model.num_layers=20000", "model.pipeline_model_parallel_size=1"], "model.num_layers"),
    (["train.global_batch_size=2000000000", "train.micro_batch_size=1"], "train.global_batch_size"),
    (["model.first_k_dense_replace=99999999999999999999"], "model.first_k_dense_replace"),
])
def test_unusable_input_names_the_field(sets, field):
    with pytest.raises(InputError) as info:
        load_workload(default=True, sets=sets)
    assert info.value.field == field


def test_unknown_key_gets_a_suggestion():
    with pytest.raises(InputError) as info:
        load_workload(default=True, sets=["model.recompute_module=[mlp]"])
    assert "did you mean 'recompute_modules'" in info.value.reason


def test_a_label_the_release_does_not_know_is_readable_input():
    """gdn_norm_out exists in main, not in 0.16.1: that is the checker's finding
    (modules-invalid-label, exit 1), not unusable input, so the loader accepts it for both."""
    sets = ["model.recompute_granularity=selective", "model.recompute_modules=[gdn_norm_out]"]
    for version in ("0.16.1", "main"):
        w = load_workload(default=True, sets=sets, mcore_version=version)
        assert w.recompute_modules == ["gdn_norm_out"]


def test_embedded_default_workload_is_the_llama3_70b_example():
    """The README's main command runs on the same workload the example file documents."""
    import yaml

    from mbridge_recompute.inputs.loading import DATA

    embedded = yaml.safe_load((DATA / "default_workload.yaml").read_text())
    example = yaml.safe_load((EXAMPLES / "llama3_70b_fp8.yaml").read_text())
    assert embedded == example


def test_te_version_must_stay_text():
    """YAML reads 2.10 as the number 2.1; a version given as a bare number is refused."""
    with pytest.raises(InputError) as info:
        load_workload(default=True, sets=["cluster.te_version=2.10"])
    assert info.value.field == "cluster.te_version" and "2.1" in info.value.reason
    assert load_workload(default=True, sets=["cluster.te_version=2.10.0"]).te_version == "2.10.0"


def test_coercion_follows_the_declared_type_whatever_its_spelling():
    """`Optional[int]` and `int | None` read the same: null is allowed, text is not (the loader
    dispatches on the type, not on its annotation's text)."""
    from mbridge_recompute.inputs import values

    for hint in (typing.Optional[int], int | None):
        optional, base = values._optional(hint)
        assert optional and base is int
        assert values._coerce_type(base, 8, "model.num_query_groups", {"bound": "positive"}) == 8
        with pytest.raises(InputError, match="must be an integer"):
            values._coerce_type(base, "abc", "model.num_query_groups", {})
    w = load_workload(sets=[*SIZES, "model.num_query_groups=null"])
    assert w.num_query_groups is None
    with pytest.raises(InputError, match="must be an integer"):
        load_workload(sets=[*SIZES, "model.num_query_groups=abc"])


def test_every_workload_field_declares_its_section_origin_and_a_docstring():
    import ast
    import dataclasses
    from pathlib import Path

    from mbridge_recompute import workload as wmod

    for f in dataclasses.fields(Workload):
        assert f.metadata.get("section") is not None and f.metadata.get("origin"), f.name
    tree = ast.parse(Path(wmod.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Workload")
    undocumented = [n.target.id for i, n in enumerate(cls.body) if isinstance(n, ast.AnnAssign)
                    and not (i + 1 < len(cls.body) and isinstance(cls.body[i + 1], ast.Expr)
                             and isinstance(cls.body[i + 1].value, ast.Constant))]
    assert undocumented == []


# ------------------------------------------------------------------ Bridge dumps, read as Bridge runs them
DUMP = "_target_: megatron.bridge.training.config.ConfigContainer\n"
GPT = ("  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n"
       "  hidden_size: 256\n  num_attention_heads: 4\n")


def _dump(tmp_path, text: str) -> str:
    path = tmp_path / "dump.yaml"
    path.write_text(DUMP + text)
    return str(path)


def test_whose_defaults_is_detected_and_can_be_stated(tmp_path):
    """A dump -> bridge; our YAML -> mcore unless `source:` says otherwise (inputs/defaults.py)."""
    ours = tmp_path / "w.yaml"
    ours.write_text("model: {num_layers: 2, hidden_size: 256, num_attention_heads: 4}\n")
    w = load_workload(str(ours))
    assert w.defaults_source == "mcore" and w.masked_softmax_fusion is False and w.attention_softmax_in_fp32
    ours.write_text("source: bridge\nmodel: {num_layers: 2, hidden_size: 256, num_attention_heads: 4}\n")
    w = load_workload(str(ours))
    assert w.defaults_source == "bridge" and w.masked_softmax_fusion is True
    assert w.attention_softmax_in_fp32 is False and w.extra_model["deallocate_pipeline_outputs"] is True
    ours.write_text("source: megatron-lm\nmodel: {num_layers: 2, hidden_size: 256, num_attention_heads: 4}\n")
    w = load_workload(str(ours))
    assert w.defaults_source == "megatron-lm" and w.extra_model["bias_activation_fusion"] is True
    ours.write_text("source: nemo\nmodel: {num_layers: 2}\n")
    with pytest.raises(InputError) as exc:
        load_workload(str(ours))
    assert exc.value.field.endswith("source")


def test_a_comm_overlap_section_applies_as_bridge_applies_it(tmp_path):
    """Present: Bridge starts EP overlap and delayed wgrad off and lets non-null user values win
    (comm_overlap.py:433-441, 594-602 @ 0.6.2); null: the model's own values stand."""
    model = "model:\n" + GPT + "  num_layers: 2\n  delay_wgrad_compute: true\n"
    w = load_workload(_dump(tmp_path, model + "comm_overlap: null\n"))
    assert w.delay_wgrad_compute is True
    w = load_workload(_dump(tmp_path, model + "comm_overlap:\n  tp_comm_overlap: false\n"
                                              "  delay_wgrad_compute: null\n"))
    assert w.delay_wgrad_compute is False
    w = load_workload(_dump(tmp_path, model + "comm_overlap:\n  tp_comm_overlap: false\n"
                                              "  overlap_moe_expert_parallel_comm: true\n"))
    assert w.overlap_moe_expert_parallel_comm is True


def test_the_mixed_precision_recipe_of_a_dump_sets_the_model_precision(tmp_path):
    """runtime_config_update applies it (config.py:1873-1877 @ 0.6.2); the dump's model may still
    say bf16: false when written before."""
    body = "model:\n" + GPT + "  num_layers: 2\n  bf16: false\n  fp8: null\n"
    w = load_workload(_dump(tmp_path, body + "mixed_precision: bf16_with_fp8_current_scaling_mixed\n"))
    assert (w.bf16, w.fp8, w.fp8_recipe, w.fp8_param) == (True, "hybrid", "tensorwise", True)
    w = load_workload(_dump(tmp_path, body + "mixed_precision: {bf16: true, fp8: e4m3, fp8_recipe: mxfp8,"
                                             " fp8_param_gather: false}\n"))
    assert (w.bf16, w.fp8, w.fp8_recipe, w.fp8_param) == (True, "e4m3", "mxfp8", False)


def test_hybrid_layer_patterns_of_0_6_2_are_read(tmp_path):
    hyb = ("model:\n  _target_: megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider\n"
           "  hidden_size: 256\n  num_attention_heads: 4\n")
    w = load_workload(_dump(tmp_path, hyb + "  hybrid_layer_pattern: M-M*|M-M*/*-\n"
                                            "  mtp_num_layers: null\n"), mcore_version="0.19")
    # the stage separators stay (placement.py reads them from 0.17); the MTP part is split off
    assert w.hybrid_override_pattern == "M-M*|M-M*" and w.num_layers == 8 and w.mtp_num_layers == 1
    with pytest.raises(InputError) as exc:
        load_workload(_dump(tmp_path, hyb + "  hybrid_layer_pattern: M-M*\n"
                                            "  hybrid_override_pattern: M-M*\n"))
    assert exc.value.field == "model.hybrid_layer_pattern"
    with pytest.raises(InputError) as exc:    # '|' is a 0.17+ symbol
        load_workload(_dump(tmp_path, hyb + "  hybrid_layer_pattern: M-|M*\n"), mcore_version="0.16.1")
    assert "megatron-core 0.16" in exc.value.reason


def test_bridge_spellings_of_values_are_read_as_megatron_core_reads_them(tmp_path):
    body = ("model:\n" + GPT + "  num_layers: 2\n  mtp_num_layers: 0\n  attention_backend: null\n"
            "  moe_router_dtype: {_target_: torch.float32, _call_: false}\n"
            "  cuda_graph_modules:\n  - {_target_: megatron.core.transformer.enums.CudaGraphModule,"
            " _call_: true, _args_: [1], _name_: attn}\n")
    w = load_workload(_dump(tmp_path, body), mcore_version="0.19")
    assert w.mtp_num_layers is None and w.attention_backend == "auto" and w.cuda_graph_modules == ["attn"]
    assert w.moe_router_dtype is None
    assert any(n.startswith("model.moe_router_dtype=torch.float32") for n in w.not_modelled)


def test_a_non_decoder_provider_is_refused_by_name(tmp_path):
    with pytest.raises(InputError) as exc:
        load_workload(_dump(tmp_path, "model:\n  _target_: megatron.bridge.diffusion.models.wan.wan_provider."
                                      "WanModelProvider\n  crossattn_emb_size: 4096\n"))
    assert exc.value.field == "model._target_" and "not a decoder language model" in exc.value.reason


def test_a_pipe_or_device_as_the_workload_is_refused_without_reading_it(tmp_path, run_tool):
    """A FIFO would block the reader forever and /dev/zero reports size 0: neither is read."""
    import os

    fifo = tmp_path / "w.yaml"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        p = run_tool("plan", str(path), timeout=30)
        assert p.returncode == 2 and "not a regular file" in p.stderr, p.stderr
