"""`--mlm-args` reads an argument list as Megatron-LM's validate_args leaves it, per release.

The same lists go through the real thing in each release's environment: megatron-core 0.17.1,
0.18.2 and 0.19.2 ship megatron/training (parse_args, validate_args, the tokenizer builder); the
argument group pretrain_gpt.py adds (ModelOpt's add_modelopt_args) is read from the Megatron-LM
mirror at the release's tag (tests/tools/gen_mlm_arguments.post_training_dir). The reader here
(data/mlm_arguments.json, no torch) must derive what those leave: the gradient dtype, VPP from
both flags, --recompute-activations, kv_channels, the tokenizer's vocabulary, and refuse what
validate_args asserts. Nothing is stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_releases import release_env

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import mlm_args
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory.shape import padded_vocab

from conftest import ROOT, SCRIPTS, need_mirror

sys.path.insert(0, str(ROOT / "tests" / "tools"))
from gen_mlm_arguments import POST_TRAINING_TAG, post_training_dir  # noqa: E402

SMALL = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
         "--max-position-embeddings", "512", "--micro-batch-size", "1"]
PP2 = [*SMALL, "--pipeline-model-parallel-size", "2"]
# name -> (argument list, world size)
CASES = {
    "bf16 accumulates and reduces gradients in fp32": ([*SMALL, "--bf16"], 8),
    "bf16 with --grad-reduce-in-bf16": ([*SMALL, "--bf16", "--grad-reduce-in-bf16",
                                         "--use-distributed-optimizer"], 8),
    "fp16 keeps the flag's default": ([*SMALL, "--fp16"], 8),
    "fp32 with the flag": ([*SMALL, "--accumulate-allreduce-grads-in-fp32"], 8),
    "vpp from layers per virtual stage": ([*PP2, "--num-layers-per-virtual-pipeline-stage", "2"], 8),
    "vpp from stages per rank": ([*PP2, "--num-virtual-stages-per-pipeline-rank", "4"], 8),
    "vpp of one is none": ([*PP2, "--num-virtual-stages-per-pipeline-rank", "1"], 8),
    "vpp counts the embedding and loss stages": (
        ["--num-layers", "6", *SMALL[2:], "--pipeline-model-parallel-size", "2",
         "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
         "--num-layers-per-virtual-pipeline-stage", "2"], 8),
    "vpp not dividing the stage": ([*PP2, "--num-layers-per-virtual-pipeline-stage", "3"], 8),
    "vpp from both flags": ([*PP2, "--num-layers-per-virtual-pipeline-stage", "2",
                             "--num-virtual-stages-per-pipeline-rank", "2"], 8),
    "recompute activations is selective": ([*SMALL, "--recompute-activations"], 8),
    "hidden not a multiple of the heads": (["--num-layers", "8", "--hidden-size", "1000",
                                            "--num-attention-heads", "3", "--seq-length", "512",
                                            "--max-position-embeddings", "512"], 8),
    # (TP 2 would make validate_args ask for a GPU: the padding multiple comes from the other factor)
    "null tokenizer vocabulary": ([*SMALL, "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
                                   "--make-vocab-size-divisible-by", "256"], 8),
    "a modelopt flag pretrain_gpt accepts": ([*SMALL, "--export-te-mcore-model", "--export-kd-teacher-load",
                                              "/ckpt/teacher"], 8),
}
RELEASES = {"0.17.1": "0.17", "0.18.2": "0.18", "0.19.2": "0.19"}


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """release -> case -> what Megatron-LM's own code made of it."""
    need_mirror("Megatron-LM", *(POST_TRAINING_TAG[r] for r in RELEASES))
    cases = tmp_path_factory.mktemp("cases") / "cases.json"
    cases.write_text(json.dumps({k: {"argv": v[0], "world_size": v[1]} for k, v in CASES.items()}))
    out = {}
    for release in RELEASES:
        spec = release_env(release)
        extra = post_training_dir(release, tmp_path_factory.mktemp(f"post-{release}"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([spec["pythonpath"], str(extra)]))
        tool = ROOT / "tests" / "tools" / "mlm_validate.py"
        proc = subprocess.run([spec["python"], "-W", "ignore", str(tool), str(cases)], capture_output=True,
                              text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[release] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _ours(name: str, key: str):
    """(sections, padded vocabulary) as the reader makes them, or the InputError it raises."""
    argv = CASES[name][0]
    try:
        s = mlm_args.sections(["--", *argv], key)
        w = load_workload(mlm_args=["--", *argv, "--global-batch-size", "16"], mcore_version=key,
                          sets=["cluster.num_gpus=8"])
    except InputError as exc:
        return exc
    return s, padded_vocab(w)


@pytest.mark.parametrize("release", list(RELEASES))
@pytest.mark.parametrize("name", list(CASES))
def test_the_reading_is_what_validate_args_leaves(real, release, name):
    theirs = real[release][name]
    ours = _ours(name, RELEASES[release])
    if "error" in theirs:
        assert isinstance(ours, InputError), (theirs, ours)
        assert theirs["error"].startswith(("AssertionError", "SystemExit")), theirs
        return
    assert not isinstance(ours, InputError), (ours, theirs)
    s, vocab = ours
    got = theirs["ok"]
    model = s["model"]
    assert model.get("virtual_pipeline_model_parallel_size") == got["virtual_pipeline_model_parallel_size"]
    assert s["ddp"]["grad_reduce_in_fp32"] == got["accumulate_allreduce_grads_in_fp32"]
    assert model.get("recompute_granularity") == got["recompute_granularity"]
    assert model["kv_channels"] == got["kv_channels"] and model["ffn_hidden_size"] == got["ffn_hidden_size"]
    if got["padded_vocab_size"] is not None:
        assert vocab == got["padded_vocab_size"], (vocab, got)
    else:
        assert model["vocab_size"] is None and any("vocabulary unknown" in n for n in s["_mlm"]["notes"])


def test_the_null_tokenizer_is_one_larger_on_0_17_as_its_tokenizer_builds_it(real):
    got = {r: real[r]["null tokenizer vocabulary"]["ok"]["padded_vocab_size"] for r in RELEASES}
    assert got == {"0.17.1": 1280, "0.18.2": 1024, "0.19.2": 1024}


def test_a_negative_vpp_is_refused_although_validate_args_passes_it_on(real):
    """validate_args leaves --num-virtual-stages-per-pipeline-rank -2 as VPP -2 (no assertion; no
    schedule can run it): the reader refuses it (exit 2) rather than plan it."""
    with pytest.raises(InputError, match="must be positive"):
        mlm_args.sections(["--", *PP2, "--num-virtual-stages-per-pipeline-rank", "-2"], "0.19")


def test_a_gpt2_tokenizer_has_gpt2s_vocabulary(tmp_path):
    """GPT2BPETokenizer loads GPT-2's vocab.json (megatron_hf_tokenizer.py:40-44 @ megatron-core 0.19.2),
    50257 entries: the vocab_size of transformers' GPT2Config in the Bridge environment."""
    from bridge_env import run_in_bridge

    proc = run_in_bridge(["-c", "from transformers import GPT2Config; print(GPT2Config().vocab_size)"],
                         tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.strip().splitlines()[-1]) == mlm_args.GPT2_VOCAB
    w = load_workload(mlm_args=["--", *SMALL, "--tokenizer-type", "GPT2BPETokenizer"])
    assert w.vocab_size == 50257 and not any("vocabulary" in n for n in w.input_notes)


def test_an_unknown_vocabulary_is_said_first_and_never_zero():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "plan.py"), "--mlm-args", "--", *SMALL,
                           "--tokenizer-type", "HuggingFaceTokenizer",
                           "--tokenizer-model", "meta-llama/Llama-3-8B"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    first = proc.stdout.split("\nworkload:")[0]          # the lines before the workload summary
    assert first.startswith("note: ")
    assert "note: vocabulary unknown: --tokenizer-type HuggingFaceTokenizer" in first
    assert "vocab 0" not in proc.stdout


def test_megatron_fsdp_is_named_first_as_not_modelled():
    w = load_workload(mlm_args=["--", *SMALL, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                "optim_grads_params", "--use-distributed-optimizer"])
    assert any(n.startswith("Megatron-FSDP (--use-megatron-fsdp, --data-parallel-sharding-strategy "
                            "optim_grads_params) is not modelled") for n in w.input_notes)


def test_the_light_path_reads_an_argument_list_without_megatron_where_megatron_imports(tmp_path):
    """In the 0.19.2 environment megatron.training imports; the default reading still imports
    neither it nor torch (--mlm-parser installed is the opt-in)."""
    spec = release_env("0.19.2")
    code = ("import sys, json, contextlib, io\n"
            "from mbridge_recompute.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main(['plan', '--json', '--mlm-args', '--', *{SMALL!r}])\n"
            "    except SystemExit as e:\n"
            "        code = e.code\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron'))\n"
            "print(json.dumps({'code': code, 'heavy': heavy}))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), spec["pythonpath"]]))
    proc = subprocess.run([spec["python"], "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}, (result, proc.stderr[-2000:])
