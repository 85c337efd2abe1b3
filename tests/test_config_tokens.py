"""Override, harness and Megatron-LM tokens parse back to the setting they were written for.

- overrides: parsed with the loader's own Hydra-style `parse_override`.
- harness: parsed the way Bridge's perf harness does it (flat path, Bridge 067f987):
  `--recompute_modules` is a comma-split string (argument_parser.py:41-43,863-868),
  `-rl/--recompute_num_layers` an int; anything argparse does not know is a Hydra
  override; the recipe's values are overridden by Hydra, then by the flags
  (run_script.py:76-79), `-rl` setting full/block/N and `--recompute_modules`
  setting the labels and selective (overrides.py:174-180). The harness itself
  needs Bridge and a GPU stack, so this replica of its parsing stands in for it.
- mlm: Megatron-LM's own parser when megatron.training is importable. It is not
  part of the megatron-core wheel, so here the recompute flags are rebuilt from the
  installed TransformerConfig's field types with the rules Megatron-LM's
  ArgumentGroupFactory applies at core_v0.16.1 (argument_utils.py:71-83 names,
  :112-131 Optional/List/Literal, :166-167 bools; arguments.py:1621-1622).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import typing

import pytest

from mbridge_recompute.inputs.loading import parse_override
from mbridge_recompute.setting import RecomputeSetting as R
from mbridge_recompute.write import snippets

SETTINGS = [
    R.off(), R.selective(), R(granularity="selective"), R.selective("core_attn"),
    R.selective("moe_act"), R.selective("moe_act", "layernorm"),
    R.selective("mla_up_proj", "moe_act", "shared_experts", "layernorm"),
    R.full("uniform", 1), R.full("uniform", 3), R.full("block", 1), R.full("block", 6),
    R.full("uniform", 2, distribute=True), R.full("block", 4, distribute=True),
]
IDS = [f"{s.slug()}{'-dist' if s.distribute_saved_activations else ''}"
       f"{'-default' if s.granularity == 'selective' and s.modules is None else ''}" for s in SETTINGS]

# what a recipe may already hold: full/block/5 and leftover labels, distribute on
RECIPE = {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 5,
          "recompute_modules": ["moe"], "distribute_saved_activations": True}


def overrides_to_fields(tokens: list) -> dict:
    out = {}
    for t in tokens:
        key, value = parse_override(t)
        section, _, name = key.partition(".")
        assert section == "model", t
        out[name] = value
    return out


def harness_parse(tokens: list, recipe: dict) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--recompute_modules", type=lambda s: s.split(","), default=None)
    p.add_argument("-rl", "--recompute_num_layers", type=int, default=None)
    args, hydra = p.parse_known_args(tokens)
    model = dict(recipe)
    model.update(overrides_to_fields(hydra))
    if args.recompute_num_layers is not None:
        model.update(recompute_granularity="full", recompute_method="block",
                     recompute_num_layers=args.recompute_num_layers)
    if args.recompute_modules is not None:
        model.update(recompute_modules=args.recompute_modules, recompute_granularity="selective")
    return model


# ---------------------------------------------------------------- overrides
@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_overrides_parse_back_to_the_setting(setting):
    tokens = snippets.render(setting, "overrides")
    assert overrides_to_fields(tokens) == snippets.written_fields(setting)


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_tokens_carry_no_shell_quoting(setting):
    for fmt in ("overrides", "harness"):
        for t in snippets.render(setting, fmt):
            assert "'" not in t and '"' not in t and " " not in t, (fmt, t)


def test_shell_join_quotes_list_overrides_for_display_only():
    tokens = snippets.render(R.selective(), "overrides")
    line = snippets.shell_join(tokens)
    assert "'model.recompute_modules=[]'" in line
    assert "model.recompute_granularity=selective " in line  # plain tokens stay unquoted
    assert shlex.split(line) == tokens


# ---------------------------------------------------------------- harness
@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_harness_argv_parses_back_to_the_setting_over_any_recipe(setting):
    got = harness_parse(snippets.render(setting, "harness"), RECIPE)
    assert got == snippets.written_fields(setting)


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_harness_labels_flag_is_one_comma_token_and_never_empty(setting):
    tokens = snippets.render(setting, "harness")
    if "--recompute_modules" in tokens:
        value = tokens[tokens.index("--recompute_modules") + 1]
        assert value == ",".join(setting.modules)
        assert value and "[" not in value and " " not in value
    if setting.granularity == "selective" and setting.modules is not None and not setting.modules:
        assert "--recompute_modules" not in tokens
        assert "model.recompute_modules=[]" in tokens
        assert "model.recompute_granularity=selective" in tokens


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_harness_rl_flag_only_for_full_block(setting):
    tokens = snippets.render(setting, "harness")
    assert ("-rl" in tokens) == (setting.granularity == "full" and setting.method == "block")
    assert not ("-rl" in tokens and "--recompute_modules" in tokens)


def test_harness_uniform_and_off_go_through_overrides_only():
    for s in (R.full("uniform", 2), R.off()):
        tokens = snippets.render(s, "harness")
        assert all(not t.startswith("-") for t in tokens)
    assert "model.recompute_granularity=null" in snippets.render(R.off(), "harness")


def test_harness_distribute_saved_activations_only_by_override():
    tokens = snippets.render(R.full("block", 2, distribute=True), "harness")
    assert "model.distribute_saved_activations=true" in tokens
    assert not any("distribute" in t for t in tokens if t.startswith("-"))


# ---------------------------------------------------------------- Megatron-LM
MLM_FIELDS = ("recompute_granularity", "recompute_method", "recompute_num_layers",
              "distribute_saved_activations", "recompute_modules")


@pytest.fixture(scope="module")
def mlm_parser():
    """Megatron-LM's own parser when megatron.training is importable (a Megatron-LM
    checkout on the path; not the case with the megatron-core wheel alone); else the
    five recompute flags rebuilt from the installed TransformerConfig as
    ArgumentGroupFactory builds them."""
    if importlib.util.find_spec("megatron.training") is not None:
        from megatron.training.arguments import add_megatron_arguments

        return add_megatron_arguments(argparse.ArgumentParser(exit_on_error=False))
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    p = argparse.ArgumentParser(exit_on_error=False)
    for f in dataclasses.fields(TransformerConfig):
        if f.name not in MLM_FIELDS:
            continue
        t = f.type
        if typing.get_origin(t) is typing.Union:  # Optional[X] -> X
            t = typing.get_args(t)[0]
        kw: dict = {"dest": f.name, "default": f.default}
        if t is bool:
            kw["action"] = "store_true" if f.default is False else "store_false"
        elif typing.get_origin(t) is typing.Literal:
            kw.update(type=str, choices=typing.get_args(t))
        elif typing.get_origin(t) is list:
            kw.update(type=typing.get_args(t)[0], nargs="+")
        else:
            kw["type"] = t
        p.add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def test_mlm_flag_spellings_match_the_installed_config(mlm_parser):
    flags = {o for a in mlm_parser._actions for o in a.option_strings}
    assert flags >= {"--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                     "--distribute-saved-activations", "--recompute-modules"}
    used = {t for st in SETTINGS if st.modules != () for t in snippets.render(st, "mlm")
            if t.startswith("--")}
    assert used <= flags
    modules = next(a for a in mlm_parser._actions if a.dest == "recompute_modules")
    assert modules.nargs == "+"  # space separated, at least one label


@pytest.mark.parametrize("setting", [s for s in SETTINGS if not (
    s.granularity == "selective" and s.modules is not None and not s.modules)], ids=lambda s: s.slug())
def test_mlm_flags_parse_back_to_the_setting(mlm_parser, setting):
    ns, rest = mlm_parser.parse_known_args(snippets.render(setting, "mlm"))
    assert rest == []
    ns = vars(ns)
    want = snippets.written_fields(setting)
    for k in ("recompute_granularity", "recompute_method", "recompute_num_layers",
              "distribute_saved_activations"):
        assert ns[k] == want[k], k
    if setting.granularity == "selective":
        assert ns["recompute_modules"] == want["recompute_modules"]
        # Megatron-LM asserts selective has no method (arguments.py:899-902 @ core_v0.16.1)
        assert ns["recompute_method"] is None


def test_mlm_cannot_express_the_empty_label_list(mlm_parser):
    with pytest.raises(snippets.NotExpressible, match="nargs='\\+'"):
        snippets.render(R.selective(), "mlm")
    # and the parser agrees: the flag with no value is an error
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        mlm_parser.parse_args(["--recompute-granularity", "selective", "--recompute-modules"])
    everything = snippets.render_all(R.selective())
    assert everything["mlm"] == [] and "mlm" in everything["unexpressible"]


def test_mlm_off_passes_no_flags():
    assert snippets.render(R.off(), "mlm") == []


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown format"):
        snippets.render(R.off(), "toml")


def test_a_label_that_would_split_tokens_is_rejected():
    with pytest.raises(ValueError, match="not a label"):
        snippets.render(R.selective("core_attn,mlp"), "harness")


# ---------------------------------------------------------------- any setting
LABELS_0_16_1 = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe", "shared_experts")


def _settings():
    from hypothesis import strategies as st

    selective = st.lists(st.sampled_from(LABELS_0_16_1), unique=True, max_size=7).map(
        lambda mods: R.selective(*mods))
    full = st.builds(R.full, st.sampled_from(["uniform", "block"]), st.integers(1, 64), st.booleans())
    return st.one_of(st.just(R.off()), st.just(R(granularity="selective")), selective, full)


def test_every_setting_round_trips_through_overrides_and_harness():
    from hypothesis import given, settings

    @settings(max_examples=120, deadline=None)
    @given(_settings())
    def check(setting):
        want = snippets.written_fields(setting)
        assert overrides_to_fields(snippets.render(setting, "overrides")) == want
        assert harness_parse(snippets.render(setting, "harness"), RECIPE) == want
        harness = snippets.render(setting, "harness")
        assert shlex.split(snippets.shell_join(harness)) == harness

    check()
