"""Inputs -> Workload: the only place where input is parsed and validated.

Sources, applied in this order (later wins): the embedded default, a catalog model (`--model`),
a Hugging Face `config.json` (`--hf-config`), a Bridge recipe built by Bridge (`--recipe`), a
Megatron-LM argument list (`--mlm-args`), a workload file (our schema or a Bridge
ConfigContainer dump), then `--set key=value` overrides in Hydra syntax.

Whose defaults fill what is left unset (`defaults_source`, inputs/defaults.py): a ConfigContainer
dump or a recipe -> bridge, an argument list -> megatron-lm, our YAML -> mcore unless its
top-level `source:` says otherwise. A Bridge dump is read as Bridge runs it (inputs/bridge.py):
its mixed-precision recipe and comm_overlap section are applied as `runtime_config_update` does.

Every problem raises `InputError(field, reason)`: exit 2, one line, the field named as the user
wrote it. A readable workload that the chosen megatron-core release rejects (an unknown recompute
label, say) is not a problem here: `check` reports it as a finding (exit 1). Nothing here imports
torch or megatron; `--recipe` imports Bridge (inputs/recipe.py), and `--mlm-args` Megatron-LM's
parser where it imports (inputs/mlm_args.py).
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Iterable, Optional

from mbridge_recompute import DATA_DIR, yamlio
from mbridge_recompute.errors import InputError
from mbridge_recompute.facts import card, releases
from mbridge_recompute.inputs import fields as upstream_fields
from mbridge_recompute.inputs import values
from mbridge_recompute.workload import FIELD_NAMES, FIELDS, Workload, section_fields

DATA = DATA_DIR

# Sections of a Bridge ConfigContainer dump that hold nothing the memory model reads (their
# memory-relevant switches, e.g. dist.use_torch_fsdp2, are named through coverage.yaml),
# and section names of earlier Bridge releases. Their keys are not checked.
OLD_SECTIONS = frozenset({"mixed_precision_config", "train_config", "energy_monitor", "dataset_config",
                          "inference"})
# Top-level keys of ours: `source:` (whose defaults apply) and `cluster:` (the machine).
OURS_TOP = frozenset({"source", "cluster"})


def _suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------- sources
def read_yaml_text(text: str, where: str) -> dict:
    """A workload document: a non-empty mapping of sections."""
    data = yamlio.load_text(text, where)
    if data is None or data == {}:
        raise InputError(where, "is empty: a workload holds sections such as model:, train:, cluster: "
                                "(or is a Bridge ConfigContainer dump)")
    if not isinstance(data, dict):
        raise InputError(where, "must be a mapping with sections such as model:, train:, cluster:")
    return data


def _read_yaml(path: Path, where: str) -> dict:
    from mbridge_recompute import files

    return read_yaml_text(files.read_text(path, where, "workload"), where)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one Hydra-style `key=value`. Values use YAML scalars/flow lists: null, true, [a,b]."""
    if len(text) > values.MAX_SET_CHARS:
        raise InputError(f"--set {text[:40]}...",
                         f"is {len(text)} characters; at most {values.MAX_SET_CHARS}")
    if "=" not in text:
        raise InputError(f"--set {text}", "expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not key:
        raise InputError(f"--set {text}", "empty key")
    if raw.strip():
        try:
            value = yamlio.load_text(raw, f"--set {key}")
        except InputError as exc:
            if "not valid YAML" not in exc.reason:
                raise
            value = raw          # not YAML: the text itself (a Hydra string)
    else:
        value = ""
    if key.endswith("recompute_modules") and isinstance(value, str) and value not in ("",):
        value = [v.strip() for v in value.split(",")]  # the harness flag's comma form
    return key, value


def _override_path(key: str) -> list[str]:
    parts = key.split(".")
    if len(parts) == 1:
        section = next((sec for sec in ("cluster", "train") if parts[0] in section_fields(sec)), "model")
        parts = [section, parts[0]]
    if len(parts) != 2 or not all(parts):
        raise InputError(f"--set {key}", "expected section.key (e.g. model.recompute_modules)")
    return parts


def _apply_overrides(data: dict, overrides: Iterable[str]) -> None:
    for text in overrides:
        key, value = parse_override(text)
        section, name = _override_path(key)
        if data.get(section) is None:
            data[section] = {}
        if not isinstance(data[section], dict):
            raise InputError(f"--set {key}", f"section {section} is not a mapping")
        data[section][name] = value


def _took(origins: dict, piece: dict, label: str) -> dict:
    """Note `label` as the source of every field the sections of `piece` set; returns `piece`."""
    for body in piece.values() if isinstance(piece, dict) else ():
        if isinstance(body, dict):
            origins.update((key, label) for key in body if isinstance(key, str))
    return piece


def _merge(base: dict, top: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def split_recipe_sets(sets: Iterable[str]) -> tuple[list[str], list[str]]:
    """(ours, Bridge's): with --recipe, `cluster.*` (and bare cluster keys) are ours; every other
    override goes to Bridge's override code as the user wrote it (`model.x=1`, `+train.y=2`, a
    nested `model.generation_config.max_new_tokens=5`: Hydra's grammar takes any depth)."""
    ours, theirs = [], []
    for text in sets:
        key = text.split("=", 1)[0].strip().lstrip("+~")
        if "=" not in text or not key:
            theirs.append(text)            # Bridge's own parser names what is wrong with it
            continue
        section = key.split(".", 1)[0] if "." in key else _override_path(key)[0]
        if section == "cluster":
            ours.append(text)
        elif "." not in key:
            stripped = text.strip()
            prefix = stripped[:len(stripped) - len(stripped.lstrip("+~"))]   # Hydra's +, ++ or ~
            theirs.append(f"{prefix}{section}.{stripped[len(prefix):]}")
        else:
            theirs.append(text)
    return ours, theirs


# The sizes megatron-core has no usable default for: TransformerConfig's are 0, and a model without
# them is no model (a workload that left them out would be planned as the Workload's placeholder).
REQUIRED_SIZES = ("num_layers", "hidden_size", "num_attention_heads")


def _require_model(data: dict, path: Optional[str]) -> None:
    """A workload names its model: a `model:` mapping (from the file, a catalog model, a config.json,
    a recipe or an argument list) with its layer count, width and heads. Nothing is made up."""
    model = data.get("model")
    sources = "--model NAME, --hf-config, --recipe or --mlm-args"
    if model is None:
        where = f"{path}: model" if path else "model"
        raise InputError(where, "missing (or null): a workload states its model -- a model: section with "
                                f"num_layers, hidden_size and num_attention_heads, or {sources}")
    if not isinstance(model, dict):
        return                       # the section reader names the wrong type
    hybrid = model.get("hybrid_override_pattern") or model.get("hybrid_layer_pattern")
    for name in REQUIRED_SIZES:
        if name not in model and not (name == "num_layers" and hybrid):
            raise InputError(f"model.{name}", "missing: megatron-core has no default for it "
                                              "(TransformerConfig's 0 is no model); give it, or use "
                                              f"{sources}")


# ---------------------------------------------------------------- source of defaults
def _source_of(data: dict, where: str, given: Optional[str]) -> str:
    from mbridge_recompute.inputs import defaults

    stated = data.pop("source", None)
    if stated is not None:
        if stated not in defaults.SOURCES:
            raise InputError(f"{where}: source" if where else "source",
                             f"must be one of {', '.join(defaults.SOURCES)}, got {values.short(stated)}")
        return stated
    if given:
        return given
    from mbridge_recompute.inputs import bridge

    return "bridge" if bridge.is_dump(data) else "mcore"


def _apply_defaults(data: dict, source: str) -> None:
    from mbridge_recompute.inputs import defaults

    model = data.get("model") if isinstance(data.get("model"), dict) else None
    if model is None:
        return
    hybrid = bool(model.get("hybrid_override_pattern") or model.get("hybrid_layer_pattern"))
    for name, (value, _why) in defaults.table(source, hybrid=hybrid).items():
        model.setdefault(name, value)


# ---------------------------------------------------------------- sections -> fields
def _sections_to_fields(data: dict, provider: Optional[str]) -> tuple[dict, dict, list]:
    """Map the file's sections onto Workload fields. Returns (fields, extra_model, not_modelled).
    The model section is read first, so a field's own section, read later, wins."""
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    notes: list[str] = []
    read = ("model", "train", "ddp", "optimizer", "comm_overlap", "cluster", "rerun_state_machine", "rng")
    bridge_sections = upstream_fields.sections()
    for section in data:
        if not isinstance(section, str):
            raise InputError("workload", f"section names must be text, got {values.short(section)}")
        if section in read or section in OURS_TOP or section.startswith("_"):
            continue
        if section == "env_vars":
            out["env_vars"] = _env_vars(data[section])
            continue
        if section in bridge_sections or section in OLD_SECTIONS:
            body = data[section]
            if isinstance(body, dict) and section in ("dist", "dataset"):
                notes += upstream_fields.not_modelled(section, body)
            continue
        top = set(read) | set(bridge_sections) | OURS_TOP
        raise InputError(section, f"unknown section{_suggest(section, top)}")
    for section in read:
        body = data.get(section)
        where = section
        if body is None:
            continue               # `comm_overlap: null` in a dump: the section is absent
        if not isinstance(body, dict):
            raise InputError(where, "must be a mapping of TransformerConfig fields" if section == "model"
                             else "must be a mapping")
        known = upstream_fields.known(section)
        ours = FIELD_NAMES if section == "model" else section_fields(section)
        for key, value in body.items():
            kw = f"{where}.{key}"
            if not isinstance(key, str):
                raise InputError(f"{where}.{values.short(key)}", "keys must be text")
            if key == "mtp_num_layers" and value == 0 and not isinstance(value, bool):
                value = None     # 0 is no MTP: megatron-core tests `if config.mtp_num_layers`
                #                  (models/gpt/gpt_model.py:686 @ core_v0.19.2); Hybrid providers default to 0
            if key in ours:
                out[key] = normalise(key, values.coerce(key, value, kw))
            elif key == "first_k_dense_replace":
                out["_first_k_dense"] = (value, kw)
            elif key in known:
                if section == "model":
                    extra[key] = values.coerce_extra(key, value, kw)
            else:
                raise InputError(kw, f"unknown {section} field{_suggest(key, known)}")
        if section != "cluster":
            notes += upstream_fields.not_modelled(section, body, provider)
    return out, extra, notes


def _env_vars(body) -> dict:
    """Bridge 0.6's `env_vars:` (name -> scalar), as the text the process environment gets
    (apply_environment_variables, training/config.py:1832-1850 @ megatron-bridge 0.6.2)."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InputError("env_vars", "must be a mapping of environment variable names to values")
    out = {}
    for name, value in body.items():
        if not isinstance(name, str) or not name:
            raise InputError("env_vars", f"names must be non-empty text, got {values.short(name)}")
        if isinstance(value, bool):
            value = str(value)
        if not isinstance(value, (str, int, float)):
            raise InputError(f"env_vars.{name}", f"must be a scalar, got {values.short(value)}")
        out[name] = str(value)
    return out


def normalise(name: str, value: Any) -> Any:
    """A coerced value as megatron-core itself rewrites it before use."""
    if name == "moe_expert_capacity_factor" and value is not None and value < 0:
        # any factor below 0 becomes None, i.e. no token dropping (transformer_config.py:1106-1107
        # @ core_v0.16.1; :1661-1662 @ core_v0.19.2)
        return None
    return value


def load_workload(path: str | None = None, sets: Iterable[str] = (), model: str | None = None,
                  hf_config: str | None = None, mcore_version: releases.ReleaseLike | None = None,
                  default: bool = False, recipe: str | None = None,
                  mlm_args: Optional[list] = None, document: Optional[dict] = None,
                  mlm_parser: str = "builtin") -> Workload:
    """Build and validate a Workload. `default=True` starts from the embedded default workload
    when no other source is given. `document`: the file at `path`, already read (a run's config
    dump, which logs/rundir.py reads once for every use)."""
    sets = list(sets)
    data: dict = {}
    origins: dict = {}               # field -> the input that set it (Workload.origins)
    source: Optional[str] = None
    if default and not (path or model or hf_config or recipe or mlm_args is not None):
        data = _read_yaml(DATA / "default_workload.yaml", "default workload")
        _took(origins, data, "the embedded default workload")
    if model:
        from mbridge_recompute.inputs import catalog

        data = _merge(data, _took(origins, catalog.model_sections(model), f"catalog model {model}"))
    if hf_config:
        from mbridge_recompute.inputs import hf_config as hf

        data = _merge(data, _took(origins, {"model": hf.model_fields(Path(hf_config))}, "--hf-config"))
    if recipe:
        from mbridge_recompute.inputs import recipe as recipes

        sets, bridge_sets = split_recipe_sets(sets)
        text = recipes.build_yaml(recipe, bridge_sets)
        data = _merge(data, _took(origins, read_yaml_text(text, f"--recipe {recipe}"),
                                  f"--recipe {recipe}"))
        source = "bridge"
    mlm_notes: list[str] = []
    input_notes: list[str] = []
    launch = None
    if mlm_args is not None:
        from mbridge_recompute.inputs import mlm_args as mlm

        parsed = mlm.sections(mlm_args, mcore_version, mlm_parser)
        info = parsed.pop("_mlm")
        mlm_notes = [f"{flag} (a Megatron-LM flag the conversion does not read)" for flag in info["unread"]]
        input_notes += info["notes"]
        launch = info["launch"]
        data = _merge(data, _took(origins, parsed, "--mlm-args"))
        source = "megatron-lm"
    if path:
        doc = copy.deepcopy(document) if document is not None else _read_yaml(Path(path), path)
        data = _merge(data, _took(origins, doc, path))
    source = _source_of(data, path or "", source)
    from mbridge_recompute.inputs import bridge

    runtime_notes: list[str] = []
    if source == "bridge" or bridge.is_dump(data):
        runtime_notes = bridge.as_run(data, path or (f"--recipe {recipe}" if recipe else ""))
        # what Bridge's runtime update derives (the mixed-precision recipe's bf16, ...) is the dump's
        _took(origins, {k: {f: None for f in v if f not in origins} for k, v in data.items()
                        if isinstance(v, dict)}, path or f"--recipe {recipe}")
    _apply_overrides(data, sets)
    for text in sets:
        _took(origins, {"": {_override_path(parse_override(text)[0])[1]: None}}, "--set")
    runtime_notes += bridge.normalise_model(data)
    _apply_defaults(data, source)
    provider = bridge.provider_family(data)
    comm = data.get("comm_overlap")
    dump_dp = comm.get("data_parallel_size") if isinstance(comm, dict) else None
    from mbridge_recompute.inputs import peft as peft_reader

    peft, peft_notes = peft_reader.read(data.get("peft"))
    input_notes += peft_notes
    input_notes += _fsdp_notes(data)
    fields, extra, notes = _sections_to_fields(data, provider)
    first_k = fields.pop("_first_k_dense", None)
    if first_k is not None and "moe_layer_freq" not in fields:
        value, where = first_k
        n = fields.get("num_layers", Workload.num_layers)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= n:
            raise InputError(where, f"must be an integer from 0 to num_layers={n}, got {values.short(value)}")
        fields["moe_layer_freq"] = [0] * value + [1] * (n - value)
    fields.update(_hybrid_layers(fields, extra, mcore_version))
    from mbridge_recompute.inputs import world

    fields["num_gpus"], world_from, world_notes = world.resolve(fields, dump_dp, launch, recipe)
    if world_from != world.GIVEN:
        origins["num_gpus"] = world_from
    workload = Workload(**fields, extra_model=extra, defaults_source=source, origins=origins,
                        num_gpus_from=world_from, input_notes=world_notes + input_notes, peft=peft,
                        not_modelled=sorted(set(runtime_notes + notes + mlm_notes)))
    validate(workload, releases.resolve(mcore_version))
    _require_model(data, path)      # last: a wrong value in what is given is named first
    return workload


def _fsdp_notes(data: dict) -> list:
    """Megatron-FSDP or torch FSDP2 in a dump: named first as not modelled (they shard parameters,
    gradients and optimizer state over the data-parallel ranks; the static figures are the
    unsharded data-parallel ones)."""
    ddp = data.get("ddp") if isinstance(data.get("ddp"), dict) else {}
    dist = data.get("dist") if isinstance(data.get("dist"), dict) else {}
    if ddp.get("use_megatron_fsdp") is True or ddp.get("use_custom_fsdp") is True:
        how = f"ddp.use_megatron_fsdp, sharding {ddp.get('data_parallel_sharding_strategy')}"
    elif dist.get("use_torch_fsdp2") is True:
        how = "dist.use_torch_fsdp2"
    else:
        return []
    return [f"FSDP ({how}) is not modelled: it shards parameters, gradients and optimizer state over "
            "the data-parallel ranks, and the static figures here are the unsharded data-parallel ones "
            "(an upper bound)"]


def load_from_args(args, mcore_version: releases.ReleaseLike | None = None,
                   default: bool = False) -> Workload:
    """load_workload with the options add_workload_arguments declares."""
    mlm = None
    files, argv = getattr(args, "mlm_args", None), getattr(args, "mlm_argv", None)
    if files is not None or argv is not None:       # FILE... then -- and the tokens (mlm_args.split_spec)
        mlm = [*(files or []), *(["--", *argv] if argv is not None else [])]
    return load_workload(args.workload, args.sets, model=args.model, hf_config=args.hf_config,
                         mcore_version=mcore_version, default=default,
                         recipe=getattr(args, "recipe", None), mlm_args=mlm,
                         mlm_parser=getattr(args, "mlm_parser", "builtin"))


def has_workload(args) -> bool:
    """Whether the options name a workload (the tools that can run without one check this)."""
    return bool(args.workload or args.model or args.hf_config or args.sets
                or getattr(args, "recipe", None) or getattr(args, "mlm_args", None) is not None
                or getattr(args, "mlm_argv", None) is not None)


def _hybrid_layers(fields: dict, extra: dict, version: Optional[releases.ReleaseLike]) -> dict:
    """Check a hybrid layer pattern against the symbols megatron-core knows, and derive the layer
    count and MTP depth from it (what Bridge's HybridModelProvider does, hybrid_provider.py:196-217
    @ megatron-bridge 0.6.2)."""
    pattern = fields.get("hybrid_override_pattern")
    if pattern is None:
        return {}
    name = "hybrid_layer_pattern" if "hybrid_layer_pattern" in extra else "hybrid_override_pattern"
    where = f"model.{name}"
    if not pattern:
        raise InputError(where, "must not be empty")
    release = releases.resolve(version)
    anywhere = releases.enum_union("hybrid_layer_symbols")
    row = releases.enum_row("hybrid_layer_symbols", release)
    allowed = set(row["values"])
    for ch in pattern:
        if ch not in anywhere:
            raise InputError(where, f"{ch!r} is not a layer symbol of any megatron-core release "
                                    f"(valid: {' '.join(sorted(anywhere))})")
        if ch not in allowed:
            raised_at = card.citation(row["raised_at"], release.key)
            raise InputError(where, f"{ch!r} is not a layer symbol of megatron-core {release.key} "
                                    f"(valid there: {' '.join(sorted(allowed))}; it raises "
                                    f"ValueError, {raised_at})")
    main, _, mtp = pattern.partition("/")
    layers = main.replace("|", "")
    unmodelled = sorted(set(layers) - set(values.MODELLED_SYMBOLS))
    if unmodelled:
        raise InputError(where, f"layer symbol(s) {' '.join(unmodelled)} (DSA / MLA layers of a hybrid "
                                "stack) are not modelled by the memory model yet")
    # the '|' separators stay: they are the pipeline stages from 0.17 (placement.py)
    out = {"hybrid_override_pattern": main}
    if len(layers) > FIELDS["num_layers"].metadata["limit"]:
        raise InputError(where, f"has {len(layers)} layers; at most {FIELDS['num_layers'].metadata['limit']}")
    out["num_layers"] = len(layers)
    if mtp and fields.get("mtp_num_layers") is None:
        out["mtp_num_layers"] = len([s for s in mtp.split("/") if s])
    return out


def revalidate(w: Workload, version: releases.ReleaseLike) -> Workload:
    """A workload changed after loading (a candidate's @FIELD=VALUE changes) checked as a loaded one
    is: values megatron-core rewrites are rewritten, an assumed world size is assumed again for the
    new layout, and every load-time check runs (exit 2 where loading would exit 2)."""
    from mbridge_recompute.inputs import world

    changed = {n: normalise(n, getattr(w, n)) for n in FIELD_NAMES}
    changed = {n: v for n, v in changed.items() if v != getattr(w, n)}
    if w.num_gpus_from.startswith(world.ASSUMED):
        changed["num_gpus"] = world.smallest({n: getattr(w, n) for n in FIELD_NAMES})
    w = w.replace(**changed) if changed else w
    validate(w, version)
    return w


def _divides(field: str, part: int, whole_name: str, whole: int) -> None:
    """`part` must divide `whole`, as TransformerConfig / the model's shapes require."""
    if whole % part:
        raise InputError(field, f"{part} does not divide {whole_name}={whole}")


def validate(w: Workload, version: releases.ReleaseLike) -> None:
    """Consistency checks that make a workload meaningless (exit 2), not constraint findings."""
    if w.gpu is not None:
        from mbridge_recompute.facts.gpus import resolve

        resolve(w.gpu)           # an unknown GPU name: exit 2 listing the known ones
    tp = w.tensor_model_parallel_size
    _divides("model.tensor_model_parallel_size", tp, "num_attention_heads", w.num_attention_heads)
    if w.num_query_groups:
        _divides("model.num_query_groups", w.num_query_groups, "num_attention_heads",
                 w.num_attention_heads)
    groups = w.heads_kv
    if not w.multi_latent_attention and groups % tp and tp % groups:
        # TP ranks split the query groups, or share one (groups < TP): TransformerConfig raises
        # 'num_query_groups (G) must be a multiple or divisor of tensor_model_parallel_size (T).'
        # (transformer_config.py:939-946 @ core_v0.16.1; :1338-1345 @ core_v0.19.2)
        raise InputError("model.num_query_groups",
                         f"num_query_groups ({groups}) must be a multiple or divisor of "
                         f"tensor_model_parallel_size ({tp}) (transformer_config.py:1338-1345 @ "
                         "core_v0.19.2)")
    # Where layers sit (and which splits megatron-core rejects) is placement.py's: a rejected
    # split is a checker finding with megatron-core's message, not unusable input.
    for field, name in (("model.cuda_graph_scope", "cuda_graph_scope"),
                        ("model.cuda_graph_modules", "cuda_graph_modules")):
        known = releases.enum(name, version)
        given = getattr(w, name)
        if given is None or not known:
            continue      # not set, or not a field of this release (a checker finding)
        names = [x.strip() for x in (given.split(",") if isinstance(given, str) else given)]
        unknown = [x for x in names if x not in known]
        if unknown:
            # megatron-core raises a bare KeyError (CudaGraphScope[name], tc:1711 @ core_v0.16.1;
            # CudaGraphModule[name], cgc:57 @ core_v0.18.2)
            raise InputError(field, f"unknown name {unknown[0]!r}{_suggest(unknown[0], known)} for "
                                    f"megatron-core {releases.resolve_version(version)}; valid: "
                                    f"{', '.join(known)}")
    if isinstance(w.moe_layer_freq, list) and len(w.moe_layer_freq) != w.num_layers:
        raise InputError("model.moe_layer_freq",
                         f"has {len(w.moe_layer_freq)} entries for num_layers={w.num_layers}")
    if w.is_moe:
        _divides("model.expert_model_parallel_size", w.expert_model_parallel_size, "num_moe_experts",
                 w.num_moe_experts)
    if w.is_moe and w.moe_router_topk > w.num_moe_experts:
        raise InputError("model.moe_router_topk",
                         f"{w.moe_router_topk} exceeds num_moe_experts={w.num_moe_experts}")
    if w.num_gpus:
        from mbridge_recompute.inputs import world

        world.check(w.num_gpus, {n: getattr(w, n) for n in FIELD_NAMES}, "cluster.num_gpus")
    _batch(w)
    _sequence(w)
    if not w.use_precision_aware_optimizer:
        # MCore asserts these (optimizer/optimizer_config.py:414-426 @ core_v0.16.1)
        for name in values.DTYPE_FIELDS:
            if getattr(w, name) != "fp32":
                raise InputError(f"optimizer.{name}",
                                 f"{getattr(w, name)} needs use_precision_aware_optimizer=true "
                                 "(megatron-core allows only fp32 without it)")
    elif not w.use_distributed_optimizer:
        # optimizer/optimizer_config.py:379-381 @ core_v0.16.1
        raise InputError("optimizer.use_precision_aware_optimizer",
                         "needs the distributed optimizer (use_distributed_optimizer=true)")
    if w.recompute_granularity not in (None, "selective", "full"):
        # MCore raises too, but with a typo'd message; name the field here.
        raise InputError("model.recompute_granularity",
                         f"must be selective, full or null, got {w.recompute_granularity!r}")
    if w.recompute_method not in (None, "uniform", "block"):
        raise InputError("model.recompute_method",
                         f"must be uniform, block or null, got {w.recompute_method!r}")
    # Recompute labels are not checked here: a label the release does not know is a checker
    # finding (modules-invalid-label, exit 1) with that release's own message.


def _batch(w: Workload) -> None:
    """The global batch must split into whole micro-batches on every data-parallel rank: megatron-core
    asserts 'global batch size ({}) is not divisible by micro batch size ({}) times data parallel
    size ({})' (num_microbatches_calculator.py:380-385 @ core_v0.19.0; :339-343 @ core_v0.16.1)
    before training starts; the memory model would otherwise floor the count and plan a run that
    cannot start. Unusable input (exit 2), not a release-dependent finding: every release raises."""
    mbs, dp = w.micro_batch_size, w.data_parallel_size
    gbs = w.global_batch_size
    if gbs is not None and gbs % (mbs * dp):
        dp_text = (f"{dp}" if not w.world_assumed else
                   f"{dp}, on the {w.num_gpus or w.model_parallel_size} GPUs assumed as cluster.num_gpus "
                   "is not given")
        raise InputError("train.global_batch_size",
                         f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times "
                         f"data parallel size ({dp_text}); megatron-core refuses it "
                         "(num_microbatches_calculator.py:380-385 @ core_v0.19.0)")
    if w.num_microbatches > values.MAX_MICROBATCHES:
        raise InputError("train.global_batch_size",
                         f"{w.global_batch_size} makes {w.num_microbatches} micro-batches per step; "
                         f"at most {values.MAX_MICROBATCHES}")


def _sequence(w: Workload) -> None:
    """How the sequence splits: over 2*CP chunks (Bridge config.py:1435-1438 @ megatron-bridge 0.6.2,
    Megatron-LM arguments.py:1295-1298 @ core_v0.19.0), and, with sequence parallelism, each CP
    rank's part over the TP ranks (tensor_parallel/mappings.py:70-74 @ core_v0.19.0 asserts 'First
    dimension of the tensor should be divisible by tensor parallel size' at the first forward)."""
    s, cp, tp = w.seq_length, w.context_parallel_size, w.tensor_model_parallel_size
    if cp > 1 and s % (2 * cp):
        raise InputError("model.seq_length",
                         f"{s} is not a multiple of 2 * context_parallel_size = {2 * cp}: 'Sequence length "
                         "must be divisible by 2 * context parallel size if context parallel is used.' "
                         "(Bridge config.py:1435-1438; Megatron-LM arguments.py:1295-1298)")
    if w.sequence_parallel and tp > 1 and (s // cp) % tp:
        raise InputError("model.seq_length",
                         f"{s} tokens per sample give {s // cp} per context-parallel rank, not a multiple of "
                         f"tensor_model_parallel_size={tp}: with sequence_parallel megatron-core asserts "
                         "'First dimension of the tensor should be divisible by tensor parallel size' "
                         "(tensor_parallel/mappings.py:70-74 @ core_v0.19.0)")


def add_workload_arguments(parser, mlm_args: bool = True) -> None:
    """Options shared by every workload-taking tool. `mlm_args=False` for a tool whose own
    arguments follow a bare `--` (tune's harness arguments), where `--mlm-args -- ARGS` would
    take them."""
    parser.add_argument("workload", nargs="?", metavar="WORKLOAD.yaml",
                        help="workload file: our schema or a Bridge ConfigContainer dump "
                             "(logger.save_config_filepath, cfg.to_yaml())")
    parser.add_argument("--model", metavar="NAME", help="start from a catalog model")
    parser.add_argument("--hf-config", metavar="PATH", help="architecture from a Hugging Face config.json")
    parser.add_argument("--recipe", metavar="NAME",
                        help="a Megatron Bridge recipe function (llama3_8b_pretrain_2gpu_h100_bf16_config, "
                             "or module:function), built by Bridge where it imports; --set overrides "
                             "then go through Bridge's own override code")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override, Hydra syntax: 'model.recompute_modules=[moe_act]' "
                             "(repeatable; quoted, or the shell may glob the brackets)")
    parser.add_argument("--mcore-version", metavar="VER",
                        help="megatron-core version to check labels against "
                             "(default: the installed one, else the newest the card covers)")
    if not mlm_args:
        return
    parser.add_argument("--mlm-args", action="append", metavar="FILE",
                        help="a Megatron-LM pretrain_gpt.py argument list in a file (the command line, or a "
                             "functional-test model_config.yaml; repeatable, read in order); or give the "
                             "arguments themselves after -- (last on the line, read after any file); read "
                             "with Megatron-LM's own argument definitions")
    parser.add_argument("--mlm-parser", choices=("builtin", "installed"), default="builtin",
                        help="whose definitions read --mlm-args: builtin (written down from Megatron-LM "
                             "0.17.1 / 0.18.2 / 0.19.2, the default) or installed (this Python's "
                             "megatron.training, never one in the current directory)")
