"""Write scripts/mbridge_recompute/data/mlm_arguments.json from Megatron-LM's own parser.

    python tests/tools/gen_mlm_arguments.py --part     # in one env: its parser's actions as JSON
    python tests/tools/gen_mlm_arguments.py --write    # every env whose megatron-core ships megatron.training

megatron-core 0.17.1, 0.18.2 and 0.19.2 ship `megatron/training` (0.16.1 does not), so their
`add_megatron_arguments` (arguments.py) is run and every action of the parser it builds is
written down: option strings, dest, action kind, nargs, const, default (plain values only) and
type (int / float / str; other callables as their name). The argument group the release's
pretrain_gpt.py adds, ModelOpt's `add_modelopt_args` (megatron/post_training/arguments.py, passed
as extra_args_provider: pretrain_gpt.py:70,513 @ core_v0.19.0), is not in the wheels: it is read
from the Megatron-LM mirror at the release's tag (`POST_TRAINING_TAG`; 0.19.2 is untagged there and
its training sources are core_v0.19.0's) into a temporary directory and run the same way, and
written down as the release's "extra" actions. `--mlm-args` builds the same parser from this
file (inputs/mlm_args.py); tests/test_mlm_args.py checks the file against each environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from mirrors import MLM_MIRROR  # noqa: E402

POST_TRAINING_TAG = {"0.17.1": "core_v0.17.1", "0.18.2": "core_v0.18.2", "0.19.2": "core_v0.19.0"}
OUT = ROOT / "scripts" / "mbridge_recompute" / "data" / "mlm_arguments.json"
KINDS = {argparse._StoreTrueAction: "store_true", argparse._StoreFalseAction: "store_false",
         argparse._StoreConstAction: "store_const", argparse._StoreAction: "store",
         argparse._AppendAction: "append", argparse._CountAction: "count"}


def _plain(v):
    import enum

    if isinstance(v, enum.Enum):
        return v.name               # AttnBackend.auto -> "auto", as the conversion reads it
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
        return list(v)
    return None


def post_training_dir(release: str, into: Path) -> Path:
    """Megatron-LM's megatron/post_training/{__init__,arguments}.py at the release's tag, written
    under `into` (a directory to put on PYTHONPATH: megatron is a namespace package)."""
    tag = POST_TRAINING_TAG[release]
    target = into / "megatron" / "post_training"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("__init__.py", "arguments.py"):
        text = subprocess.run(["git", f"--git-dir={MLM_MIRROR}", "show",
                               f"{tag}:megatron/post_training/{name}"],
                              capture_output=True, text=True, check=True).stdout
        (target / name).write_text(text)
    return into


def _actions(parser, skip=()) -> list:
    actions = []
    for a in parser._actions:
        if a in skip:
            continue
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        kind = next((k for cls, k in KINDS.items() if type(a) is cls), None)
        if kind is None:
            kind = "store" if a.nargs != 0 else "store_true"
        t = a.type
        tname = None if t is None else (t.__name__ if t in (int, float, str)
                                        else getattr(t, "__name__", "callable"))
        actions.append([list(a.option_strings), a.dest, kind,
                        a.nargs if isinstance(a.nargs, (int, str)) or a.nargs is None else None,
                        _plain(a.const), _plain(a.default), tname,
                        [c for c in a.choices] if a.choices is not None and all(
                            isinstance(c, (str, int, float)) for c in a.choices) else None])
    return actions


def part() -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from importlib import metadata

    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    base = list(parser._actions)
    actions = _actions(parser)
    from megatron.post_training.arguments import add_modelopt_args

    extra = _actions(add_modelopt_args(parser), skip=base)
    version = metadata.version("megatron-core")
    return {".".join(version.split(".")[:2]): {"version": version, "actions": actions, "extra": extra,
                                                 "validate": validate_facts(version)}}


# validate_args rules --mlm-args follows, found in the release's own arguments.py by the line
# that starts each (cited as file:line @ megatron-core VERSION)
ANCHORS = {"recompute": "if args.recompute_activations:",
           "vpp": "# Uneven virtual pipeline parallelism",
           "grads": "args.accumulate_allreduce_grads_in_fp32 = True",
           "kv": "if args.kv_channels is None:"}


def validate_facts(version: str) -> dict:
    """Per release: where each rule sits, and how many tokens NullTokenizer adds to --vocab-size
    (its vocab_size property, built here as build_tokenizer builds it)."""
    import inspect

    from megatron.core.tokenizers.text.libraries import null_tokenizer
    from megatron.training import arguments

    lines = inspect.getsource(arguments).splitlines()
    out = {}
    for name, anchor in ANCHORS.items():
        n = next(i for i, line in enumerate(lines, 1) if line.strip() == anchor)
        out[name] = f"arguments.py:{n} @ megatron-core {version}"
    extra = null_tokenizer.NullTokenizer(1024).vocab_size - 1024
    src = inspect.getsource(null_tokenizer).splitlines()
    n = next(i for i, line in enumerate(src, 1) if "def vocab_size" in line)
    out["null"] = (f"core/tokenizers/text/libraries/null_tokenizer.py:{n} @ megatron-core {version} "
                   f"(--vocab-size{f' + {extra}' if extra else ''})")
    out["null_tokenizer_extra"] = extra
    return out


def write() -> None:
    envs = json.loads((Path(os.environ.get("MBR_ENVS", Path.home() / ".cache/mbridge-recompute/envs"))
                       / "envs.json").read_text())
    data = {"about": "Generated by tests/tools/gen_mlm_arguments.py from Megatron-LM's own parser "
                     "(megatron.training.arguments.add_megatron_arguments); do not edit by hand."}
    import tempfile

    for name in ("0.17.1", "0.18.2", "0.19.2"):
        spec = envs[name]
        with tempfile.TemporaryDirectory() as tmp:
            extra = post_training_dir(name, Path(tmp))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([spec["pythonpath"], str(extra)]))
            proc = subprocess.run([spec["python"], "-W", "ignore", __file__, "--part"], capture_output=True,
                                  text=True, env=env, timeout=900)
            if proc.returncode:
                raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
            data.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(OUT)


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    elif "--part" in sys.argv:
        sys.stdout.write(json.dumps(part()) + "\n")
    else:
        raise SystemExit(__doc__)
