"""A recompute setting written out for the place it goes: Bridge Python, YAML,
Hydra overrides, the Bridge performance harness, or Megatron-LM flags.

    render(setting, fmt) -> str | list[str]     fmt in FORMATS
    render_all(setting) -> {"python", "yaml", "overrides", "harness", "mlm", "unexpressible"}
    written_fields(setting) -> the five config values the Bridge formats set
    shell_join(tokens) -> one display line, quoted for a POSIX shell

Every Bridge format (python, yaml, overrides, harness) sets every recompute
key, not only the ones that differ from megatron-core's defaults: recipes set
their own values (e.g. full/block/5 on some perf recipes), and a key the
snippet leaves alone keeps the recipe's value -- a selective setting on top of
a full-recompute recipe then fails `__post_init__` with "recompute_num_layers
must be None" (tc:1179-1185 @ core_v0.16.1). Megatron-LM has no recipe layer
(its argparse defaults are TransformerConfig's), so `mlm` passes only what
differs from them.

Token lists (overrides, harness, mlm) are argv tokens: one list item is one
argument, never shell-quoted. Quoting is a display matter (`shell_join`).

Nothing here checks legality; `rules.check_workload` does. The renderer only
refuses what a format cannot say (`NotExpressible`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Union

from mbridge_recompute.output import shell_line

FORMATS = ("python", "yaml", "overrides", "harness", "mlm")
TEXT_FORMATS = ("python", "yaml")

TEMPLATES = Path(__file__).resolve().parent / "templates"

# A label is one identifier; anything else would split or merge argv tokens
# (the harness flag is split on "," by list_of_strings, argument_parser.py:41-43).
_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class NotExpressible(ValueError):
    """The format has no way to say this setting (never approximated silently)."""

    def __init__(self, fmt: str, reason: str):
        super().__init__(f"{fmt}: {reason}")
        self.fmt = fmt
        self.reason = reason


# ---------------------------------------------------------------- the values
def written_fields(setting) -> dict:
    """The five values every format writes for `setting`.

    Labels are only read under selective (tc:1196 @ core_v0.16.1), so for
    "off" and "full" the list is cleared to [] rather than left to the recipe:
    a leftover `moe` would still trip main's EP-overlap check, which looks at
    the list at any granularity (main tc:3030-3032). Under selective, None
    stays None: that is megatron-core's own default (["core_attn"], tc:1193-1194).
    """
    mods = setting.modules
    if mods is None:
        modules = None if setting.granularity == "selective" else []
    else:
        modules = list(mods)
    for m in modules or ():
        if not isinstance(m, str) or not _LABEL.match(m):
            raise ValueError(f"recompute_modules: {m!r} is not a label")
    return {
        "recompute_granularity": setting.granularity,
        "recompute_modules": modules,
        "recompute_method": setting.method,
        "recompute_num_layers": setting.num_layers,
        "distribute_saved_activations": bool(setting.distribute_saved_activations),
    }


def _py(value) -> str:
    """A Python literal, written by `repr` (never pasted: a value cannot end the string it is in)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise TypeError(f"cannot write {value!r} as a Python literal")


def _scalar(value) -> str:
    """A Hydra override value: null, true, 4, selective, [a,b]; a string that would read as
    something else (a number, null, a layout with '|' or '*') is quoted. Checked by reading it back
    with the override grammar (inputs/harness_argv.parse_value)."""
    from mbridge_recompute.inputs.harness_argv import parse_value

    text = _hydra_text(value)
    if _plain(parse_value(text)) != _plain(value):
        raise NotExpressible("overrides", f"{value!r} cannot be written as a Hydra override value")
    return text


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _hydra_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        words = ("null", "true", "false", "inf", "nan")       # these would read as another type
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-/]*", value) and value.lower() not in words:
            return value
        if "\\" in value or ("'" in value and '"' in value):
            raise NotExpressible("overrides", f"{value!r} holds a backslash or both quote characters")
        quote = '"' if "'" in value else "'"
        return quote + value + quote
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_text(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as a scalar")


def _yaml_value(value) -> str:
    """A value as the YAML formats write it, by `yaml.safe_dump` (flow lists, one line)."""
    import yaml

    # dumped inside a one-item flow list, which keeps a scalar on one line with no document-end
    # marker; the brackets are then taken off again
    text = yaml.safe_dump([_plain(value)], default_flow_style=True, width=2**31 - 1, allow_unicode=False)
    text = text.rstrip("\n")[1:-1]
    if "\n" in text:
        raise NotExpressible("yaml", f"{value!r} does not fit one YAML line")
    return text


def comment(text: str) -> str:
    """`text` for a comment line: one line, every character that is not printable escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


# The fields an alternative changes whose Megatron-LM flag is renamed (arguments.py @ core_v0.16.1);
# every other field's flag is "--" + its name with "_" -> "-".
MLM_FLAGS = {"virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
             "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
             "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers"}


def changed_fields(setting) -> list:
    """(Bridge config section, field, value) for each Workload field the setting changes beside
    its recompute keys. Bridge reads the distributed optimizer from both ddp and optimizer
    (training/config.py:1955-1967 @ v0.6.2 turns it on for both when either says so), so both
    are written."""
    from mbridge_recompute.workload import FIELDS

    out = []
    for field, value in getattr(setting, "changes", ()):
        value = list(value) if isinstance(value, tuple) else value
        section = FIELDS[field].metadata["section"]
        out.append((section, field, value))
        if field == "use_distributed_optimizer":
            out.append(("optimizer", field, value))
    return out


def _changes_text(fmt: str, setting) -> str:
    rows = changed_fields(setting)
    if not rows:
        return ""
    if fmt == "python":
        return "".join(f"cfg.{sec}.{f} = {_py(v)}\n" for sec, f, v in rows)
    # YAML: the model keys continue the template's model block; other sections follow, once each
    def line(f, v):
        return f"  {f}: {_yaml_value(v)}\n"
    out = "".join(line(f, v) for sec, f, v in rows if sec == "model")
    for section in dict.fromkeys(sec for sec, _, _ in rows if sec != "model"):
        out += f"{section}:\n" + "".join(line(f, v) for sec, f, v in rows if sec == section)
    return out


def _changes_overrides(setting) -> list:
    return [f"{sec}.{f}={_scalar(v)}" for sec, f, v in changed_fields(setting)]


def _changes_mlm(setting) -> list:
    out = []
    for sec, f, v in changed_fields(setting):
        if sec == "optimizer":
            continue
        flag = MLM_FLAGS.get(f, "--" + f.replace("_", "-"))
        if isinstance(v, bool):
            if not v:
                raise NotExpressible("mlm", f"{flag} is a store_true flag: false is its default, "
                                            "pass nothing")
            out.append(flag)
        elif isinstance(v, list):
            out += [flag, *map(str, v)]
        elif v is not None:
            out += [flag, str(v)]
    return out


# ---------------------------------------------------------------- templates
@lru_cache(maxsize=1)
def _env():
    import jinja2  # imported on first render only

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["py"] = _py
    env.filters["yaml"] = _yaml_value
    return env


def _render_text(fmt: str, setting) -> str:
    text = _env().get_template(f"{fmt}.j2").render(f=written_fields(setting), header=_header(setting))
    extra = _changes_text(fmt, setting)
    if extra:
        text += ("# Beside the recompute keys, the layout / offloading / optimizer change:\n"
                 if fmt == "python" else "  # beside the recompute keys:\n") + extra
    return text


def _header(setting) -> str:
    """The snippet's first comment, `# Activation recompute: TITLE`, in lines of 100 columns
    (whitespace of any kind becomes a space, so no line of the title leaves the comment)."""
    import textwrap

    return "\n".join("# " + line for line in textwrap.wrap(
        "Activation recompute: " + comment(_title(setting)), 98, break_long_words=False,
        break_on_hyphens=False))


def _title(setting) -> str:
    if getattr(setting, "changes", ()):
        return _title(setting.recompute) + "; with " + ", ".join(
            f"{f}={_py(v)}" for _, f, v in changed_fields(setting) if _ != "optimizer")
    if setting.granularity is None:
        return "off (no activation recompute)"
    if setting.granularity == "full":
        return f"full recompute, {setting.method}, {setting.num_layers} layer(s) per model chunk"
    if setting.modules is None:
        return "selective, megatron-core default labels ([core_attn])"
    if not setting.modules:
        return "selective with no labels (matched no-recompute control)"
    return "selective [" + ", ".join(setting.modules) + "]"


# ---------------------------------------------------------------- token lists
def _overrides(fields: dict) -> list[str]:
    """Hydra `key=value` tokens for Bridge's `model:` section, all five keys.

    Bridge applies them in OmegaConf struct mode (omegaconf_utils.py:163-186 @
    Bridge 067f987), so only real field names may appear -- these are
    TransformerConfig fields (tc:383-411 @ core_v0.16.1).
    """
    order = ("recompute_granularity", "recompute_modules", "recompute_method",
             "recompute_num_layers", "distribute_saved_activations")
    return [f"model.{k}={_scalar(fields[k])}" for k in order]


def _harness(fields: dict) -> list[str]:
    """Perf-harness argv: a flag where one exists, Hydra overrides for the rest.

    Facts (Megatron Bridge 067f987; bridge-harness.md:30,32,130-131,141,147-159):
    - `--recompute_modules a,b` is ONE comma-separated token (`list_of_strings`,
      scripts/performance/argument_parser.py:41-43,863-868) and also sets
      granularity "selective" (overrides.py:178-180).
    - an empty list cannot go through that flag: `--recompute_modules ""`
      parses to [''], an invalid label; the control is Hydra-only
      (`model.recompute_granularity=selective 'model.recompute_modules=[]'`).
    - `-rl N` always means full + block + N (overrides.py:174-177): uniform
      is reachable only through overrides.
    - the flags leave other keys as the recipe set them, so method /
      num_layers / labels / distribute_saved_activations are cleared or set by
      override next to the flag (a recipe with full/block/5 plus
      `--recompute_modules` fails tc:1179-1185 otherwise).
    - flat path precedence is argparse > Hydra > recipe (run_script.py:76-79),
      so an override never undoes a flag: the two never name the same key.
    - flat path only: with --use_recipes the flags are ignored (run_recipe.py:45-208,
      bridge-harness.md:37); there the `overrides` format says the same thing.
    """
    g, mods = fields["recompute_granularity"], fields["recompute_modules"]
    method, n = fields["recompute_method"], fields["recompute_num_layers"]
    dist = f"model.distribute_saved_activations={_scalar(fields['distribute_saved_activations'])}"
    if g == "selective" and mods and method is None and n is None:
        return ["--recompute_modules", ",".join(mods),
                "model.recompute_method=null", "model.recompute_num_layers=null", dist]
    if g == "full" and method == "block" and n is not None:
        return ["-rl", str(n), f"model.recompute_modules={_scalar(mods)}", dist]
    # off, the [] control, selective with the default labels, full uniform:
    # no flag can say these (test_override_precedence.py:203-216 disables this way).
    return _overrides(fields)


def _mlm(fields: dict) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` flags at core_v0.16.1.

    The recompute flags are generated from TransformerConfig's fields by
    ArgumentGroupFactory (megatron/training/arguments.py:1621-1622; none of the
    five is in the exclude list at :1537-1620): the name is "--" + field name
    with "_" -> "-" (argument_utils.py:71-83); Optional[Literal[...]] gives
    `choices` (:112-115, :127-131); Optional[List[str]] gives nargs="+"
    (:119-123); a bool defaulting to False gives store_true (:166-167). Fields:
    recompute_granularity tc:383, recompute_method tc:394, recompute_num_layers
    tc:402, distribute_saved_activations tc:408, recompute_modules tc:411.
    """
    g, mods = fields["recompute_granularity"], fields["recompute_modules"]
    method, n = fields["recompute_method"], fields["recompute_num_layers"]
    out: list[str] = []
    if g is None:
        # the argparse default is None = no recompute (tc:383): nothing to pass
        pass
    else:
        out += ["--recompute-granularity", g]
    if g == "selective":
        if mods is not None and not mods:
            raise NotExpressible(
                "mlm", "Megatron-LM argparse cannot express selective with an empty "
                "recompute_modules list: --recompute-modules takes nargs='+' (at least one "
                "label; argument_utils.py:119-123 @ core_v0.16.1) and leaving it out gives "
                "the default [core_attn] (tc:1193-1194). The same runtime effect is no "
                "recompute: pass no recompute flags.")
        if mods:
            out += ["--recompute-modules", *mods]
    if method is not None:
        out += ["--recompute-method", method]
    if n is not None:
        out += ["--recompute-num-layers", str(n)]
    if fields["distribute_saved_activations"]:
        out.append("--distribute-saved-activations")
    return out


# ---------------------------------------------------------------- public API
def render(setting, fmt: str) -> Union[str, list]:
    """`setting` in format `fmt`: text for python/yaml, argv tokens otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt in TEXT_FORMATS:
        return _render_text(fmt, setting)
    fields = written_fields(setting)
    tokens = {"overrides": _overrides, "harness": _harness, "mlm": _mlm}[fmt](fields)
    return tokens + (_changes_mlm(setting) if fmt == "mlm" else _changes_overrides(setting))


def render_all(setting) -> dict:
    """Every format. A format that cannot say the setting gets [] and a reason
    under "unexpressible" (so a JSON consumer never mistakes it for a snippet)."""
    out: dict = {}
    unexpressible: dict = {}
    for fmt in FORMATS:
        try:
            out[fmt] = render(setting, fmt)
        except NotExpressible as exc:
            out[fmt] = "" if fmt in TEXT_FORMATS else []
            unexpressible[fmt] = exc.reason
    out["unexpressible"] = unexpressible
    return out


def shell_join(tokens: list) -> str:
    """One line for display: `'model.recompute_modules=[]'` is quoted, plain tokens are not."""
    return shell_line(tokens)


def as_text(value: Union[str, list]) -> str:
    """What `config --format F` prints: the text, or the tokens as one shell line."""
    if isinstance(value, str):
        return value if value.endswith("\n") else value + "\n"
    return shell_join(value) + "\n"

