"""`--recipe NAME`: a Megatron Bridge recipe, built by Bridge itself, as a ConfigContainer dump.

A recipe is a function of `megatron.bridge.recipes.*` or `megatron.bridge.perf_recipes.*` that
returns a `ConfigContainer` (e.g. `llama3_8b_pretrain_2gpu_h100_bf16_config`, defined at
`recipes/llama/h100/llama3.py:235` in megatron-bridge 0.6.2). NAME is the function's name, or
`package.module:function`. The recipe is called with no arguments, the `--set` overrides that
are not ours are applied by Bridge's own override code (`process_config_with_overrides`,
`training/utils/omegaconf_utils.py:105-160` @ megatron-bridge 0.6.2: Hydra's override grammar on
an OmegaConf copy, written back onto the dataclasses), and the result is written with
`ConfigContainer.to_yaml` (`megatron/training/config/container.py:196-213` @ megatron-core
0.19.2), the writer behind `logger.save_config_filepath`. That text then goes through the same
reader as a dump a user passes, so a recipe and its dump load alike.

Bridge is imported here and nowhere else, and only when `--recipe` is given: it pulls torch,
megatron-core and Transformer Engine. Where it does not import, `--recipe` is unusable input
(exit 2) with the one line saying what is missing.

Only Bridge's recipes are called: NAME resolves inside `megatron.bridge.recipes` /
`megatron.bridge.perf_recipes` of the installed Bridge (never a `megatron/bridge` under the
current directory), `megatron.bridge` itself is imported first, and the object called must be a
function defined in one of those packages (its `__module__`). Whatever the call raises, SystemExit
included, is one error line (exit 2).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

from mbridge_recompute.errors import InputError

WHERE = "--recipe"
# Recipe packages, searched in this order for a bare function name.
PACKAGES = ("megatron.bridge.recipes", "megatron.bridge.perf_recipes")
_NAME = re.compile(r"^[A-Za-z_]\w*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _in_packages(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PACKAGES)


def _without_cwd() -> list:
    """sys.path without the current directory (`python -m` and `python -c` put it first)."""
    cwd = Path(os.getcwd()).resolve()
    return [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != cwd]


def _bridge_root() -> Path:
    """The installed megatron.bridge package directory (found without importing it, and never
    one under the current directory)."""
    import importlib.machinery

    cwd = Path(os.getcwd()).resolve()
    for entry in _without_cwd():
        megatron = importlib.machinery.PathFinder.find_spec("megatron", [entry])
        for loc in (megatron.submodule_search_locations or []) if megatron is not None else []:
            root = Path(loc) / "bridge"
            if (root / "__init__.py").is_file():
                if root.resolve().is_relative_to(cwd):
                    raise InputError(WHERE, f"the megatron.bridge found ({root}) lies inside the current "
                                            "directory; it is not imported (run from elsewhere)")
                return root
    raise InputError(WHERE, "megatron-bridge is not installed in this Python "
                            "(run where Bridge imports, e.g. its container; or pass the "
                            "config its logger.save_config_filepath / cfg.to_yaml() wrote)")


def _modules_defining(name: str) -> tuple[list[str], bool]:
    """(modules, defined): the recipe modules with a `def name(`, else those that re-export it
    (`... import x as name`, as `recipes/llama/llama3.py:23` does for llama3_8b_pretrain_config)."""
    root = _bridge_root()
    defs, aliases = [], []
    define = re.compile(rf"^def {re.escape(name)}\(", re.M)
    alias = re.compile(rf"\bas {re.escape(name)}\b")
    for package in PACKAGES:
        base = root / package.split(".", 2)[2]
        for path in sorted(base.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if name not in text:
                continue
            rel = path.relative_to(root).with_suffix("")
            module = "megatron.bridge." + ".".join(p for p in rel.parts if p != "__init__")
            if define.search(text):
                defs.append(module)
            elif alias.search(text):
                aliases.append(module)
    return (defs, True) if defs else (aliases, False)


def resolve(name: str) -> tuple[str, str]:
    """(module, function) for a recipe NAME or `module:function`."""
    text = (name or "").strip()
    if not text:
        raise InputError(WHERE, "is empty")
    if ":" in text:
        module, _, function = text.partition(":")
        if not _MODULE.match(module) or not _NAME.match(function):
            raise InputError(WHERE, f"{name!r} is not module:function")
        if not _in_packages(module):
            raise InputError(WHERE, f"{module} is not a module of {' or '.join(PACKAGES)}: only Bridge's "
                                    "own recipes are built and called")
        return module, function
    if not _NAME.match(text):
        raise InputError(WHERE, f"{name!r} is not a recipe function name "
                                "(e.g. llama3_8b_pretrain_2gpu_h100_bf16_config, or module:function)")
    modules, defined = _modules_defining(text)
    if not modules:
        raise InputError(WHERE, f"no recipe function {text!r} in {' or '.join(PACKAGES)}")
    if defined and len(modules) > 1:
        raise InputError(WHERE, f"{text!r} is defined in {', '.join(modules)}; name one as module:function")
    return modules[0], text


def _call(what: str, fn, *args, **kwargs):
    """`fn(*args)` with Bridge's prints kept off stdout; anything it raises (SystemExit, a
    debugger's BdbQuit) becomes one error line. Ctrl-C stays an interruption."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except InputError:
        raise
    except BaseException as exc:   # noqa: BLE001 - what Bridge raised is the reason
        raise InputError(WHERE, f"{what} raised {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}" if text else type(exc).__name__


def build_yaml(name: str, overrides: list[str] = ()) -> str:
    """The ConfigContainer dump (YAML text) of recipe `name` with Bridge `overrides` applied.
    Everything Bridge imports on the way, lazily too, is looked up without the current directory."""
    module_name, function = resolve(name)
    # torch's CUDA build logs a warning at import on a machine without a GPU runtime
    # (torch/utils/cpp_extension.py); the tool's stderr stays its own one-line contract
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    root = _bridge_root()
    saved = list(sys.path)
    sys.path[:] = _without_cwd()
    try:
        return _build(root, module_name, function, overrides)
    finally:
        sys.path[:] = saved


def _build(root: Path, module_name: str, function: str, overrides) -> str:
    bridge = _call("importing megatron.bridge", importlib.import_module, "megatron.bridge")
    if not Path(bridge.__file__).resolve().is_relative_to(root.resolve()):
        raise InputError(WHERE, f"megatron.bridge imported from {bridge.__file__}, not from {root}")
    module = _call(f"importing {module_name}", importlib.import_module, module_name)
    fn = getattr(module, function, None)
    if not inspect.isfunction(fn) or not _in_packages(getattr(fn, "__module__", "") or ""):
        raise InputError(WHERE, f"{module_name}.{function} is not a recipe function of "
                                f"{' or '.join(PACKAGES)}")
    cfg = _call(f"{function}()", fn)
    if not hasattr(cfg, "to_yaml"):
        raise InputError(WHERE, f"{function}() returned {type(cfg).__name__}, not a ConfigContainer")
    if overrides:
        try:
            from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
        except Exception as exc:   # noqa: BLE001 - hydra-core missing, for one
            raise InputError("--set", "Bridge's override code did not import (megatron.bridge."
                                      f"training.utils.omegaconf_utils): {_one_line(exc)}") from None
        try:
            cfg = _call("Bridge's override code", process_config_with_overrides, cfg,
                        cli_overrides=list(overrides))
        except InputError as exc:   # Hydra's own message names the key
            raise InputError("--set " + " ".join(overrides), f"Bridge refused the overrides: "
                                                            f"{exc.reason}") from None
    fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix="recipe-")
    os.close(fd)
    try:
        _call("ConfigContainer.to_yaml", cfg.to_yaml, tmp)
        return Path(tmp).read_text(encoding="utf-8")
    finally:
        Path(tmp).unlink(missing_ok=True)
