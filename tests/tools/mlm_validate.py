"""Megatron-LM's own reading of argument lists: parse_args, validate_args and build_tokenizer.

    python tests/tools/mlm_validate.py CASES.json     # run in one release's environment

CASES.json maps a case name to {"argv": [...], "world_size": N}. Each list is parsed as
pretrain_gpt.py parses it (`parse_args(extra_args_provider=add_modelopt_args)`, pretrain_gpt.py:513
@ core_v0.19.0; megatron/post_training must be on PYTHONPATH, see gen_mlm_arguments.post_training_dir),
then `validate_args` runs, then, for a NullTokenizer, the tokenizer is built and the vocabulary
padded (`build_tokenizer`, what set_global_variables does next). Prints one JSON object: per case
either {"ok": {what validate_args left}} or {"error": "<exception type>: <message>"}. Nothing here
needs a GPU for these lists.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

FIELDS = ("virtual_pipeline_model_parallel_size", "accumulate_allreduce_grads_in_fp32",
          "recompute_granularity", "kv_channels", "ffn_hidden_size", "data_parallel_size")


def run(argv: list, world_size: int) -> dict:
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0")
    from megatron.post_training.arguments import add_modelopt_args
    from megatron.training import arguments

    sys.argv = ["pretrain_gpt.py", *argv]
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            args = arguments.parse_args(extra_args_provider=add_modelopt_args)
            arguments.validate_args(args)
            out = {name: getattr(args, name, None) for name in FIELDS}
            out["padded_vocab_size"] = None
            if args.tokenizer_type == "NullTokenizer":
                from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

                build_tokenizer(args)
                out["padded_vocab_size"] = args.padded_vocab_size
    except BaseException as exc:   # noqa: BLE001 - an assertion or argparse's SystemExit is the answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"ok": out}


def main(path: str) -> int:
    warnings.filterwarnings("ignore")
    cases = json.loads(open(path, encoding="utf-8").read())
    result = {name: run(case["argv"], case["world_size"]) for name, case in cases.items()}
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
