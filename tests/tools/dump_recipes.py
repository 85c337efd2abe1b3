"""Build Megatron Bridge recipes and write their ConfigContainer dumps; run in the Bridge env.

    python tests/tools/dump_recipes.py OUT_DIR NAME...     # the named recipes
    python tests/tools/dump_recipes.py OUT_DIR --census    # every recipe function of 0.6.2

Each recipe goes through the tool's own `--recipe` path (mbridge_recompute.inputs.recipe), so
the dump is what `plan --recipe NAME` reads. Prints one JSON object: {name: {"status": "ok" |
"failed", "reason": ..., "dump": path}}.

--census lists every public `*_config` function of megatron.bridge.recipes and perf_recipes
(found by importing every module, not from a stored list), tries each, and loads every dump
it could write with the tool's loader ("load": "ok" or the one-line error). A
recipe whose config.json is missing from the offline cache makes Bridge retry with sleeps of
1, 2 and 4 s (`safe_config_loader.py:124-127` @ megatron-bridge 0.6.2); the census sets those
sleeps to zero so a full pass takes seconds, not an hour. Nothing else is changed.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import pkgutil
import sys
import warnings
from pathlib import Path


def _recipe_functions() -> list[str]:
    out = []
    for package in ("megatron.bridge.recipes", "megatron.bridge.perf_recipes"):
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if info.ispkg:
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 - counted by the caller as an import failure
                out.append(f"{info.name}:<import>")
                continue
            for name, fn in vars(module).items():
                if (name.endswith("_config") and not name.startswith("_") and inspect.isfunction(fn)
                        and fn.__module__ == info.name):
                    out.append(f"{info.name}:{name}")
    return sorted(set(out))


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = argv[1:]
    census = names == ["--census"]
    if census:
        import types

        import megatron.bridge.models.hf_pretrained.safe_config_loader as scl

        real = scl.time
        scl.time = types.SimpleNamespace(sleep=lambda s: None, time=real.time)
        names = _recipe_functions()
    from mbridge_recompute.errors import InputError
    from mbridge_recompute.inputs.recipe import build_yaml

    result = {}
    for name in names:
        if name.endswith(":<import>"):
            result[name] = {"status": "failed", "reason": "module import failed"}
            continue
        try:
            text = build_yaml(name)
        except InputError as exc:
            result[name] = {"status": "failed", "reason": exc.reason}
            continue
        dump = out_dir / (name.rsplit(":", 1)[-1] + ".yaml")
        dump.write_text(text, encoding="utf-8")
        result[name] = {"status": "ok", "dump": str(dump)}
        if census:
            from mbridge_recompute.inputs.loading import load_workload

            try:
                load_workload(str(dump), mcore_version="0.19.2")
                result[name]["load"] = "ok"
            except InputError as exc:
                result[name]["load"] = exc.line()
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
