"""`--mlm-args`: Megatron-LM argument lists read with Megatron-LM's own argument definitions.

Where megatron.training imports (megatron-core 0.17+ ships it; the 0.19.2 environment here) its
own `add_megatron_arguments` parses the list; where it does not (this venv: megatron-core 0.16.1
ships no megatron.training) the same definitions, written down from it (data/mlm_arguments.json),
do. Both must give the same workload, with Megatron-LM's training defaults (not the
TransformerConfig dataclass's). The functional-test files are copies of Megatron-LM's own
(tests/fixtures/mlm/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_releases import release_env

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import defaults, mlm_args
from mbridge_recompute.inputs.loading import load_workload

from conftest import ROOT, SCRIPTS, need_mirror, run_script

MLM = ROOT / "tests" / "fixtures" / "mlm"
MOE_SELECTIVE = MLM / "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental.model_config.yaml"
DENSE_FULL = MLM / "gpt3_mcore_te_tp1_pp1_uniform_full_recompute.model_config.yaml"
SMALL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
         "--max-position-embeddings", "512", "--micro-batch-size", "1"]


def test_a_functional_test_model_config_reads_as_its_launcher_passes_it():
    """MODEL_ARGS: `true` is the bare flag, "[a b c]" the words, "(...)" one token
    (_run_training.sh:123-160 @ d98e8a6)."""
    w = load_workload(mlm_args=[str(MOE_SELECTIVE)], mcore_version="0.19")
    assert w.defaults_source == "megatron-lm"
    assert w.recompute_granularity == "selective"
    assert w.recompute_modules == ["layernorm", "mla_up_proj", "mlp", "moe_act"]
    assert w.moe_layer_freq == [0] * 3 + [1] * 13           # --moe-layer-freq: ([0]*3+[1]*13)
    assert w.multi_latent_attention and w.q_lora_rank == 1536 and w.num_moe_experts == 32
    parallel = (w.tensor_model_parallel_size, w.pipeline_model_parallel_size, w.expert_model_parallel_size)
    assert parallel == (2, 2, 4)
    assert w.swiglu and not w.add_bias_linear and w.attention_backend == "unfused"
    assert w.micro_batch_size == 4 and w.global_batch_size == 32 and w.mtp_num_layers == 1
    assert w.pipeline_model_parallel_layout == "Et*3|(tt|)*6tmL"      # read by placement.py
    w = load_workload(mlm_args=[str(DENSE_FULL)], mcore_version="0.19")
    assert (w.recompute_granularity, w.recompute_method, w.recompute_num_layers) == ("full", "uniform", 1)


def test_megatron_lm_training_defaults_apply_not_the_dataclass_defaults():
    """Unset flags take what pretrain_gpt.py's parser and core_transformer_config_from_args give
    (inputs/defaults.py MEGATRON_LM), e.g. pipeline outputs deallocated and softmax fusion on."""
    w = load_workload(mlm_args=["--", *SMALL, "--position-embedding-type", "rope"], mcore_version="0.19")
    for name, (value, _why) in defaults.MEGATRON_LM.items():
        got = getattr(w, name) if hasattr(w, name) else w.extra_model.get(name)
        if name == "position_embedding_type":
            assert got == "rope"                 # given
        else:
            assert got == value, name
    assert w.ffn_hidden_size == 1024 and w.kv_channels == 64    # 4h, h / heads (validate_args)


def test_swiglu_gets_megatron_lms_ffn_width():
    w = load_workload(mlm_args=["--", *SMALL, "--swiglu"], mcore_version="0.19")
    assert w.swiglu and w.ffn_hidden_size == int((4 * 256 * 2 / 3) / 64) * 64     # arguments.py:1283-1287


def test_the_two_command_line_forms_are_the_same_list(tmp_path):
    a = run_script("check", "--validator", "builtin", "--json", "--mlm-args", "--", *SMALL)
    b = run_script("check", "--validator", "builtin", "--json", "--", *SMALL)
    args_file = tmp_path / "cmd.sh"
    args_file.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py \\\n  " + " ".join(SMALL) + "\n")
    c = run_script("check", "--mlm-args", args_file, "--validator", "builtin", "--json")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr + b.stderr + c.stderr
    assert json.loads(a.stdout) == json.loads(b.stdout) == json.loads(c.stdout)
    assert json.loads(a.stdout)["input"]["defaults_source"] == "megatron-lm"


def test_false_in_model_args_is_refused_naming_the_flag(tmp_path):
    path = tmp_path / "model_config.yaml"
    path.write_text("MODEL_ARGS:\n  --num-layers: 2\n  --bf16: false\n")
    with pytest.raises(InputError) as exc:
        load_workload(mlm_args=[str(path)])
    assert "MODEL_ARGS.--bf16" in exc.value.field


def _sections_in(release: str, spec: list) -> dict:
    env_spec = release_env(release)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), env_spec["pythonpath"]]))
    code = ("import json, sys\n"
            "from mbridge_recompute.inputs import mlm_args\n"
            "s = mlm_args.sections(sys.argv[1:], '0.19', 'installed')\n"
            "print(json.dumps(s, default=str))\n")
    proc = subprocess.run([env_spec["python"], "-W", "ignore", "-c", code, *spec], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_megatron_lms_own_parser_and_the_written_down_definitions_agree():
    """Asked for (--mlm-parser installed), the 0.19.2 environment parses with
    megatron.training.arguments itself; this venv has no megatron.training (megatron-core 0.16.1)
    and refuses the ask; the default is data/mlm_arguments.json. Same list, same sections."""
    with pytest.raises(InputError, match="no megatron.training"):
        mlm_args.sections(["--", *SMALL], "0.19", "installed")
    for spec in ([str(MOE_SELECTIVE)], [str(DENSE_FULL)], ["--", *SMALL, "--swiglu", "--bf16"]):
        real = _sections_in("0.19.2", spec)
        assert real.pop("_mlm")["how"].startswith("Megatron-LM's parser")
        here = json.loads(json.dumps(mlm_args.sections(spec, "0.19"), default=str))
        assert here.pop("_mlm")["how"].startswith("Megatron-LM 0.19.2's argument definitions")
        keys = set(here["model"]) | set(real["model"])
        assert here == real, {k: (here["model"].get(k), real["model"].get(k)) for k in keys
                              if here["model"].get(k) != real["model"].get(k)}


@pytest.mark.parametrize("release", ["0.17.1", "0.18.2", "0.19.2"])
def test_the_written_down_definitions_are_that_releases_parser(release, tmp_path):
    """Megatron-LM's add_megatron_arguments of the release's wheel, and the ModelOpt group its
    pretrain_gpt.py adds (megatron/post_training/arguments.py at the release's tag, from the
    Megatron-LM mirror: the wheels do not ship it)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from gen_mlm_arguments import POST_TRAINING_TAG, post_training_dir

    need_mirror("Megatron-LM", POST_TRAINING_TAG[release])
    env_spec = release_env(release)
    extra = post_training_dir(release, tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([env_spec["pythonpath"], str(extra)]))
    tool = ROOT / "tests" / "tools" / "gen_mlm_arguments.py"
    proc = subprocess.run([env_spec["python"], "-W", "ignore", str(tool), "--part"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    part = json.loads(proc.stdout.strip().splitlines()[-1])
    key = ".".join(release.split(".")[:2])
    assert part[key] == mlm_args._definitions()[key]
