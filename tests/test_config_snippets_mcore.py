"""The Python and YAML snippets, applied to a real megatron-core 0.16.1 TransformerConfig.

Each legal setting is rendered, the Python snippet is executed against a stand-in
`cfg` whose `cfg.model` records the assignments, the YAML snippet is parsed, and
both are fed to the installed `TransformerConfig` on a model where the setting's
labels apply. Its `__post_init__` must accept them and keep what they say.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import yaml

from mbridge_recompute.facts import releases
from mbridge_recompute.setting import RecomputeSetting as R
from mbridge_recompute.write import snippets

BASE = dict(num_layers=8, hidden_size=64, num_attention_heads=4)
DENSE: dict = {}
MOE = dict(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_grouped_gemm=True)
SHARED = dict(MOE, moe_shared_expert_intermediate_size=32)
MLA = dict(multi_latent_attention=True)
MLA_MOE = dict(MOE, multi_latent_attention=True)
TP2_NO_SP = dict(tensor_model_parallel_size=2, sequence_parallel=False)

# (setting, model on which every label of the setting is legal)
MATRIX = [
    (R.off(), DENSE),
    (R.selective(), DENSE),
    (R.selective("core_attn"), DENSE),
    (R.selective("mlp"), DENSE),
    (R.selective("layernorm"), MOE),
    (R.selective("moe_act"), MOE),
    (R.selective("moe"), MOE),
    (R.selective("shared_experts"), SHARED),
    (R.selective("mla_up_proj"), MLA),
    (R.selective("moe_act", "layernorm"), MOE),
    (R.selective("moe_act", "shared_experts", "layernorm"), SHARED),
    (R.selective("mla_up_proj", "moe_act", "layernorm"), MLA_MOE),
    (R.selective("core_attn", "mlp"), DENSE),
    (R.selective("moe", "layernorm"), MOE),
    (R.full("uniform", 1), DENSE),
    (R.full("uniform", 2), MOE),
    (R.full("uniform", 4), DENSE),
    (R.full("block", 1), DENSE),
    (R.full("block", 3), MLA),
    (R.full("block", 8), DENSE),
    (R.full("uniform", 2, distribute=True), TP2_NO_SP),
    (R.full("block", 4, distribute=True), TP2_NO_SP),
]
IDS = [f"{s.slug()}{'-dist' if s.distribute_saved_activations else ''}" for s, _ in MATRIX]


@pytest.fixture(scope="module")
def mcore():
    import torch  # noqa: F401  (megatron-core needs it; imported once per module)
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return SimpleNamespace(TransformerConfig=TransformerConfig, MLA=MLATransformerConfig)


class _Recorder:
    """Stands in for Bridge's `cfg.model`: records what the snippet assigns."""

    def __init__(self):
        object.__setattr__(self, "assigned", {})

    def __setattr__(self, key, value):
        self.assigned[key] = value


def exec_python_snippet(code: str) -> dict:
    model = _Recorder()
    exec(compile(code, "<snippet>", "exec"), {"__builtins__": {}}, {"cfg": SimpleNamespace(model=model)})
    return dict(model.assigned)


def yaml_model_section(text: str) -> dict:
    data = yaml.safe_load(text)
    assert list(data) == ["model"], "the YAML snippet is one model: section"
    return data["model"]


def build(mcore, model_kw: dict, keys: dict):
    cls = mcore.MLA if model_kw.get("multi_latent_attention") else mcore.TransformerConfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the core_attn advice and the default-scope notice
        return cls(**BASE, **model_kw, **keys)


def assert_config_keeps(cfg, setting):
    assert cfg.recompute_granularity == setting.granularity
    assert cfg.recompute_method == setting.method
    assert cfg.recompute_num_layers == setting.num_layers
    assert cfg.distribute_saved_activations == setting.distribute_saved_activations
    if setting.granularity == "selective":
        assert cfg.recompute_modules == list(setting.modules)
    else:
        # labels are ignored outside selective; the snippet clears them
        assert cfg.recompute_modules == []


def test_matrix_covers_every_label_of_0_16_1():
    alone = {s.modules[0] for s, _ in MATRIX if s.granularity == "selective" and len(s.modules or ()) == 1}
    assert alone == set(releases.labels_for("0.16.1"))


@pytest.mark.parametrize("setting,model_kw", MATRIX, ids=IDS)
def test_python_snippet_validates_in_transformer_config(mcore, setting, model_kw):
    keys = exec_python_snippet(snippets.render(setting, "python"))
    assert keys == snippets.written_fields(setting)
    assert_config_keeps(build(mcore, model_kw, keys), setting)


@pytest.mark.parametrize("setting,model_kw", MATRIX, ids=IDS)
def test_yaml_snippet_validates_in_transformer_config(mcore, setting, model_kw):
    keys = yaml_model_section(snippets.render(setting, "yaml"))
    assert keys == snippets.written_fields(setting)
    assert_config_keeps(build(mcore, model_kw, keys), setting)


def test_empty_module_list_is_a_valid_control(mcore):
    keys = exec_python_snippet(snippets.render(R.selective(), "python"))
    cfg = build(mcore, DENSE, keys)
    # [] stays [], it is not replaced by the ["core_attn"] default (tc:1193-1194)
    assert cfg.recompute_granularity == "selective" and cfg.recompute_modules == []


@pytest.mark.parametrize("fmt", ["python", "yaml"])
def test_selective_snippet_clears_a_full_recompute_recipe(mcore, fmt):
    """A recipe with full/block/5 (as some perf recipes have) plus the selective snippet
    must validate: the snippet resets method and num_layers (tc:1179-1185)."""
    recipe = dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=5)
    text = snippets.render(R.selective("moe_act"), fmt)
    keys = exec_python_snippet(text) if fmt == "python" else yaml_model_section(text)
    cfg = build(mcore, MOE, {**recipe, **keys})
    assert (cfg.recompute_granularity, cfg.recompute_method, cfg.recompute_num_layers) == \
        ("selective", None, None)
    # and without the reset the same recipe is rejected, so the reset is what matters
    with pytest.raises(ValueError, match="recompute_num_layers must be None"):
        build(mcore, MOE, {**recipe, "recompute_granularity": "selective",
                           "recompute_modules": ["moe_act"]})


def test_full_snippet_clears_a_selective_recipes_labels(mcore):
    recipe = dict(recompute_granularity="selective", recompute_modules=["moe", "moe_act"])
    keys = exec_python_snippet(snippets.render(R.full("uniform", 1), "python"))
    cfg = build(mcore, MOE, {**recipe, **keys})
    assert cfg.recompute_granularity == "full" and cfg.recompute_modules == []


def test_off_snippet_disables_a_recipes_recompute(mcore):
    recipe = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
                  distribute_saved_activations=True, tensor_model_parallel_size=2)
    keys = yaml_model_section(snippets.render(R.off(), "yaml"))
    cfg = build(mcore, DENSE, {**recipe, **keys})
    assert cfg.recompute_granularity is None and cfg.recompute_method is None
    assert cfg.distribute_saved_activations is False


def test_default_labels_snippet_means_core_attn(mcore):
    """A selective setting without labels writes None, megatron-core's own default."""
    keys = exec_python_snippet(snippets.render(R(granularity="selective"), "python"))
    assert keys["recompute_modules"] is None
    assert build(mcore, DENSE, keys).recompute_modules == ["core_attn"]


@pytest.mark.parametrize("setting,model_kw", MATRIX, ids=IDS)
def test_no_workload_baseline_accepts_the_setting_in_the_installed_megatron_core(mcore, setting,
                                                                                 model_kw):
    """With no workload, `config` checks against a baseline built for the setting; the
    installed megatron-core (live validator) must accept that baseline as written, so a
    refusal there can only come from the setting itself."""
    from mbridge_recompute.commands.config import baseline_workload
    from mbridge_recompute.rules import check_workload

    w = baseline_workload(setting).replace(**snippets.written_fields(setting))
    live = check_workload(w, validator="live", version="0.16.1")
    assert live["validator"] == "live"
    assert [f["id"] for f in live["findings"] if f["severity"] == "error"] == []


def test_the_baseline_check_would_catch_a_model_where_the_label_is_illegal(mcore):
    """The test above can fail: the same check rejects moe_act once grouped GEMM is off."""
    from mbridge_recompute.commands.config import baseline_workload
    from mbridge_recompute.rules import check_workload

    setting = R.selective("moe_act")
    w = baseline_workload(setting).replace(moe_grouped_gemm=False, **snippets.written_fields(setting))
    live = check_workload(w, validator="live", version="0.16.1")
    assert "moe-act-needs-grouped-gemm" in [f["id"] for f in live["findings"] if f["severity"] == "error"]
