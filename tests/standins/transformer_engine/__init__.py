"""A stand-in for NVIDIA Transformer Engine, for the tests only: TE is a CUDA-only library that
cannot be imported on a machine without CUDA, and megatron-bridge's config and recipe modules
import it at top level (megatron.bridge.peft.lora_layers, ...).

Every `transformer_engine.*` submodule is created on first import, and every public name of one
is a placeholder class (callable, a context manager, falsy as an instance). Nothing here
computes: it only lets Bridge's ConfigContainer and recipe modules import, so that recipes can
be built and dumped on a CPU. With it on the path megatron-core believes TE is installed
(`__version__` 2.12.0), so it is used for imports and configs only, never for a check whose
answer depends on TE. No shipped code imports it; tests/envs/build.sh puts its folder on the
PYTHONPATH of the Bridge environment alone. Set TE_STUB_LOG=FILE to list what was asked for.
"""
import importlib.abc
import importlib.machinery
import os
import sys
import types

_LOG = os.environ.get("TE_STUB_LOG")


def _log(msg):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(msg + "\n")

__version__ = "2.12.0"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)

    def __bool__(cls):
        return True


class _Stub(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)()

    def __bool__(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_cache = {}


def _make(name):
    if name not in _cache:
        _cache[name] = _Meta(name, (_Stub,), {"__module__": __name__})
    return _cache[name]


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    _log("attr " + name)
    return _make(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            _log("module " + fullname)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _module_getattr
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
__getattr__ = _module_getattr
