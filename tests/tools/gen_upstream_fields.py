"""Write scripts/mbridge_recompute/data/upstream_fields.json from the real packages.

    python tests/tools/gen_upstream_fields.py --part          # in one env: print its part as JSON
    python tests/tools/gen_upstream_fields.py --write         # run --part in every env, merge, write

What the file holds, per megatron-core release the card covers ("0.16" ... "0.19", read from the
installed package of tests/envs/build.sh's environment for that release; "main" read from the
source of Megatron-LM at the card's main commit, without importing it):
  the field names of TransformerConfig, MLATransformerConfig, DistributedDataParallelConfig and
  OptimizerConfig, and TransformerConfig's defaults where they are plain values;
and for megatron-bridge 0.6.2 (its environment):
  the ConfigContainer sections and the field names of the class(es) each holds; every model
  provider class, split into decoder language models (GPTModelProvider / HybridModelProvider
  and their subclasses) and the others; the defaults of GPTModelProvider, HybridModelProvider and
  MLAModelProvider where they are plain values; and every registered mixed-precision recipe
  (`MIXED_PRECISION_RECIPES`, training/mixed_precision.py:164-181) as the field values
  `runtime_config_update` applies (after `finalize()`, config.py:1873-1877).

The loader reads this file (no import of torch or megatron); tests/test_upstream_fields.py
checks it against each environment again, so it cannot drift from the packages.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "scripts" / "mbridge_recompute" / "data" / "upstream_fields.json"
from mirrors import MLM_MIRROR  # noqa: E402


def _plain(value):
    """A JSON value for a dataclass default, or None when it is not a plain value."""
    if isinstance(value, enum.Enum):
        return {"enum": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:
            return None
        return {"value": value}
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return {"value": list(value)}
    module = getattr(value, "__module__", "") or ""
    if module.startswith("torch") and "dtype" in type(value).__name__:
        return {"dtype": str(value).removeprefix("torch.")}
    return None


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            plain = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            try:
                plain = _plain(f.default_factory())
            except Exception:  # noqa: BLE001
                plain = None
        else:
            plain = None
        if plain is not None:
            out[f.name] = plain
    return out


def _names(cls) -> list:
    return sorted(f.name for f in dataclasses.fields(cls))


def mcore_part() -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from importlib import metadata

    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    version = metadata.version("megatron-core")
    key = ".".join(version.split(".")[:2])
    return {"mcore": {key: {
        "version": version,
        "TransformerConfig": _names(TransformerConfig),
        "MLATransformerConfig": _names(MLATransformerConfig),
        "DistributedDataParallelConfig": _names(DistributedDataParallelConfig),
        "OptimizerConfig": _names(OptimizerConfig),
        "TransformerConfig_defaults": _defaults(TransformerConfig),
    }}}


def _section_classes(annotation) -> list:
    import typing

    args = typing.get_args(annotation)
    if args:
        out = []
        for a in args:
            out += _section_classes(a)
        return out
    return [annotation] if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else []


def bridge_part() -> dict:
    import importlib
    import logging
    import pkgutil
    import typing
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from importlib import metadata

    import megatron.bridge.models as models_pkg
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
    from megatron.bridge.models.mla_provider import MLAModelProvider
    from megatron.bridge.models.model_provider import ModelProviderMixin
    from megatron.bridge.training import mixed_precision as mp
    from megatron.bridge.training.config import ConfigContainer

    hints = typing.get_type_hints(ConfigContainer)
    sections = {}
    for f in dataclasses.fields(ConfigContainer):
        if f.name.startswith("_"):
            continue
        classes = _section_classes(hints.get(f.name))
        sections[f.name] = {
            "classes": sorted(f"{c.__module__}.{c.__qualname__}" for c in classes),
            "fields": sorted({n for c in classes for n in _names(c)}),
        }
    packages = [(models_pkg.__path__, "megatron.bridge.models.")]
    try:
        import megatron.bridge.diffusion.models as diffusion_pkg  # Wan, FLUX: not decoder LMs

        packages.append((diffusion_pkg.__path__, "megatron.bridge.diffusion.models."))
    except Exception:  # noqa: BLE001
        pass
    for path, prefix in packages:
        for info in pkgutil.walk_packages(path, prefix):
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 - a provider module that needs more than this env has
                continue
    decoders, others, decoder_fields = set(), set(), set()
    seen = set()
    todo = [ModelProviderMixin]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            if not dataclasses.is_dataclass(sub):
                continue
            name = f"{sub.__module__}.{sub.__qualname__}"
            if issubclass(sub, (GPTModelProvider, HybridModelProvider)):
                decoders.add(name)
                decoder_fields |= set(_names(sub))
            else:
                others.add(name)
    recipes = {}
    for name, factory in sorted(mp.MIXED_PRECISION_RECIPES.items()):
        if "-" in name:
            continue                   # the hyphen spelling of the same recipe (mixed_precision.py:176-179)
        cfg = factory()
        try:
            cfg.finalize()
        except Exception:  # noqa: BLE001 - fp4 recipes ask for TE >= 2.7 here; their values stand
            pass
        recipes[name] = {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    return {"bridge": {metadata.version("megatron-bridge"): {
        "sections": sections,
        "decoder_providers": sorted(decoders),
        "other_providers": sorted(others),
        "decoder_provider_fields": sorted(decoder_fields),
        "GPTModelProvider_defaults": _defaults(GPTModelProvider),
        "HybridModelProvider_defaults": _defaults(HybridModelProvider),
        "MLAModelProvider_defaults": _defaults(MLAModelProvider),
        "mixed_precision_fields": _names(mp.MixedPrecisionConfig),
        "mixed_precision_recipes": recipes,
    }}}


def _ast_fields(source: str, classes: set) -> dict:
    """Field names of dataclasses `classes` in `source`, with their in-file bases folded in."""
    tree = ast.parse(source)
    own, bases = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            own[node.name] = [n.target.id for n in node.body
                              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                              and not n.target.id.startswith("_")]
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    out = {}
    for name in classes:
        names, todo = set(), [name]
        while todo:
            c = todo.pop()
            names |= set(own.get(c, []))
            todo += bases.get(c, [])
        out[name] = names
    return out


def main_part(commit: str) -> dict:
    """Field names at Megatron-LM `commit`, read from its source (main is installed nowhere)."""
    def show(path):
        return subprocess.run(["git", "--git-dir", str(MLM_MIRROR), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, check=True).stdout

    tc = _ast_fields(show("megatron/core/transformer/transformer_config.py"),
                     {"TransformerConfig", "MLATransformerConfig"})
    mpc = _ast_fields(show("megatron/core/model_parallel_config.py"), {"ModelParallelConfig"})
    ddp = _ast_fields(show("megatron/core/distributed/distributed_data_parallel_config.py"),
                      {"DistributedDataParallelConfig"})
    opt = _ast_fields(show("megatron/core/optimizer/optimizer_config.py"), {"OptimizerConfig"})
    base = mpc["ModelParallelConfig"]
    return {"mcore": {"main": {
        "version": f"main@{commit}",
        "TransformerConfig": sorted(tc["TransformerConfig"] | base),
        "MLATransformerConfig": sorted(tc["MLATransformerConfig"] | tc["TransformerConfig"] | base),
        "DistributedDataParallelConfig": sorted(ddp["DistributedDataParallelConfig"]),
        "OptimizerConfig": sorted(opt["OptimizerConfig"]),
        "TransformerConfig_defaults": {},
    }}}


def _merge(into: dict, part: dict) -> None:
    for k, v in part.items():
        into.setdefault(k, {}).update(v)


def write() -> None:
    envs = json.loads((Path(os.environ.get("MBR_ENVS", Path.home() / ".cache/mbridge-recompute/envs"))
                       / "envs.json").read_text())
    sys.path.insert(0, str(ROOT / "tests"))
    data: dict = {"about": "Generated by tests/tools/gen_upstream_fields.py from the installed packages "
                           "(and Megatron-LM main's source); do not edit by hand."}
    for name, spec in envs.items():
        env = dict(os.environ)
        path = [p for p in spec["pythonpath"].split(os.pathsep) if p and not p.endswith("tests/standins")]
        if name.startswith("bridge"):
            path.append(str(ROOT / "tests" / "standins"))
        env["PYTHONPATH"] = os.pathsep.join(path)
        python = str(ROOT / spec["python"])  # relative: this checkout's own venv
        extra = ["--bridge"] if name.startswith("bridge") else []
        proc = subprocess.run([python, "-W", "ignore", __file__, "--part", *extra],
                              capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode:
            raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
        part = json.loads(proc.stdout)
        if name.startswith("bridge"):
            part.pop("mcore", None)         # the bridge env's megatron-core is 0.19.2's, read already
        _merge(data, part)
    sys.path.insert(0, str(ROOT / "scripts"))
    from mbridge_recompute.facts import releases

    _merge(data, main_part(releases.meta("main")["commit"]))
    data["mcore"] = dict(sorted(data["mcore"].items(), key=lambda kv: releases.keys().index(kv[0])))
    OUT.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(OUT)


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    elif "--part" in sys.argv:
        part = mcore_part()
        if "--bridge" in sys.argv:
            part.update(bridge_part())
        sys.stdout.write(json.dumps(part))
    else:
        raise SystemExit(__doc__)
