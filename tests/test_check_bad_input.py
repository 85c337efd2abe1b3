"""Unusable input to `check_config.py`: exit 2, one line on stderr naming the field,
with --json one error object on stdout, never a traceback -- including input built to break a
YAML or JSON reader (deep nesting, alias bombs, integers past Python's conversion limit, non-text
keys)."""

from __future__ import annotations

import json
import time

import pytest

from conftest import run_script

ALIAS_BOMB = "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10 if p else ["x"] * 10) + "]\n"
                     for p, c in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh"))
DUMP = "_target_: megatron.bridge.training.config.ConfigContainer\n"

# name -> (workload file text or None, extra argv, the field the one stderr line must name)
CASES = {
    "bad YAML": ("model: [unclosed\n", [], "bad.yaml"),
    "unknown key with suggestion": ("model:\n  recompute_modles: [core_attn]\n", [],
                                    "model.recompute_modles"),
    "wrong type": ("model:\n  num_layers: eighty\n", [], "model.num_layers"),
    "negative size": ("model:\n  hidden_size: -1\n", [], "model.hidden_size"),
    "size past any index": ("model:\n  num_layers: 99999999999999999999\n", [], "model.num_layers"),
    "infinite GPU memory": ("cluster:\n  gpu_memory_gb: .inf\n", [], "cluster.gpu_memory_gb"),
    "zero size": ("train:\n  micro_batch_size: 0\n", [], "train.micro_batch_size"),
    "TP not dividing heads": ("model:\n  num_attention_heads: 64\n  tensor_model_parallel_size: 3\n", [],
                              "model.tensor_model_parallel_size"),
    "string instead of list for recompute_modules": (
        "model:\n  recompute_granularity: selective\n  recompute_modules: core_attn\n", [],
        "model.recompute_modules"),
    "empty label": ("model:\n  recompute_modules: ['']\n", [], "model.recompute_modules"),
    "unknown section": ("modle:\n  num_layers: 2\n", [], "modle"),
    "not a mapping": ("- a\n- b\n", [], "bad.yaml"),
    "bad enum value": ("model:\n  fp8_recipe: bogus\n", [], "model.fp8_recipe"),
    "bad granularity": ("model:\n  recompute_granularity: sometimes\n", [], "model.recompute_granularity"),
    "bad method": ("model:\n  recompute_granularity: full\n  recompute_method: all\n", [],
                   "model.recompute_method"),
    "bool as number": ("model:\n  sequence_parallel: 2\n", [], "model.sequence_parallel"),
    "dropout out of range": ("model:\n  attention_dropout: 1.5\n", [], "model.attention_dropout"),
    "unknown cuda graph scope": ("model:\n  cuda_graph_scope: [atn]\n", [], "model.cuda_graph_scope"),
    "num_gpus not a multiple": ("model:\n  tensor_model_parallel_size: 2\ncluster:\n  num_gpus: 3\n", [],
                                "cluster.num_gpus"),
    "missing file": (None, ["/nonexistent/workload.yaml"], "/nonexistent/workload.yaml"),
    "bad --set syntax": (None, ["--set", "recompute_modules"], "--set recompute_modules"),
    "too deep --set key": (None, ["--set", "model.a.b=1"], "--set model.a.b"),
    "bad --validator": (None, ["--validator", "bogus"], "--validator"),
    "bad --mcore-version": (None, ["--mcore-version", "bogus"], "--mcore-version"),
    "live for a version not installed": (None, ["--validator", "live", "--mcore-version", "main"],
                                         "--mcore-version"),
    "unknown --model": (None, ["--model", "no-such-model"], "--model"),
    # the hostile-input pass: each of these was accepted, or a traceback
    "empty file": ("", [], "bad.yaml"),
    "only comments": ("# model: {num_layers: 2}\n", [], "bad.yaml"),
    "empty mapping": ("{}\n", [], "bad.yaml"),
    "integer of 5000 digits": ("model:\n  num_layers: " + "9" * 5000 + "\n", [], "model.num_layers"),
    "integer of 5000 digits in a section not read": ("dataset:\n  seed: " + "9" * 5000 + "\n", [],
                                                     "dataset.seed"),
    "integer of 5000 digits in --set": (None, ["--set", "model.num_layers=" + "9" * 5000],
                                        "--set model.num_layers"),
    "20000 nested [": ("model: " + "[" * 20000 + "\n", [], "bad.yaml"),
    "5000 nested {": ("model: " + "{" * 5000 + "\n", [], "bad.yaml"),
    "self-referencing anchor": ("model: &m\n  num_layers: 2\n  me: *m\n", [], "bad.yaml"),
    "alias bomb": (ALIAS_BOMB, [], "bad.yaml"),
    "integer key": ("1: foo\n", [], "bad.yaml"),
    "boolean key": ("true: {num_layers: 2}\n", [], "bad.yaml"),
    "integer key inside model": ("model: {1: 2}\n", [], "model"),
    "null key": ("~: 1\nmodel: {num_layers: 2}\n", [], "bad.yaml"),
    "duplicate key": ("model:\n  num_layers: 2\n  num_layers: 4\n", [], "model.num_layers"),
    "te_version not a version": ("cluster:\n  te_version: banana\n", [], "cluster.te_version"),
    "global batch not a multiple of micro batch x DP": (
        "train:\n  micro_batch_size: 2\n  global_batch_size: 3\n", [], "train.global_batch_size"),
    "sequence not a multiple of 2 x CP": (
        "model:\n  seq_length: 4097\n  tensor_model_parallel_size: 4\n  sequence_parallel: true\n"
        "  context_parallel_size: 3\n", [], "model.seq_length"),
    "sequence per CP rank not a multiple of TP with SP": (
        "model:\n  seq_length: 4098\n  tensor_model_parallel_size: 4\n  sequence_parallel: true\n", [],
        "model.seq_length"),
    "invalid hybrid layer symbol": ("model:\n  hybrid_override_pattern: M*X-\n", [],
                                    "model.hybrid_override_pattern"),
    "moe_layer_freq 0": ("model:\n  num_moe_experts: 8\n  moe_layer_freq: 0\n", [], "model.moe_layer_freq"),
    "unknown mixed-precision recipe": (DUMP + "mixed_precision: bf17_mixed\nmodel: {num_layers: 2}\n", [],
                                       "mixed_precision"),
    "not a decoder provider": (
        DUMP + "model:\n  _target_: megatron.bridge.models.t5_provider.T5ModelProvider\n", [],
        "model._target_"),
    "field unknown to Bridge too": (DUMP + "model:\n  num_layers: 2\n  not_a_field_anywhere: 1\n", [],
                                    "model.not_a_field_anywhere"),
    "--recipe where Bridge is not installed": (None, ["--recipe", "llama3_8b_pretrain_2gpu_h100_bf16_config"],
                                               "--recipe"),
    "--mlm-args flag Megatron-LM does not have": (None, ["--mlm-args", "--", "--num-layerz", "2"],
                                                  "--mlm-args"),
    "--mlm-args with nothing": (None, ["--mlm-args"], "--mlm-args"),
    "--run that does not exist": (None, ["--run", "/nonexistent/run"], "--run"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_naming_the_field(name, tmp_path):
    text, argv, field = CASES[name]
    args = list(argv)
    if text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        args.insert(0, str(path))
    front = ["--json"] + ([] if "--validator" in args else ["--validator", "builtin"])
    proc = run_script("check", *front, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["error"]["exit"] == 2     # --json: one error object on stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and field in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_the_bad_input_table_has_at_least_15_cases():
    assert len(CASES) >= 15


HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu", "rms_norm_eps": 1e-5}
HF_CASES = {
    "hybrid pattern not a string": ({"hybrid_override_pattern": 5}, "hybrid_override_pattern"),
    "hybrid pattern with a symbol no release has": ({"hybrid_override_pattern": "M*Q"},
                                                    "hybrid_override_pattern"),
    "mlp_only_layers not a list": ({"num_experts": 8, "mlp_only_layers": 5}, "mlp_only_layers"),
    "mlp_only_layers nested": ({"num_experts": 8, "mlp_only_layers": [[1]]}, "mlp_only_layers"),
    "10**12 layers": ({"num_hidden_layers": 10**12}, "num_hidden_layers"),
    "hidden_size of the wrong type": ({"hidden_size": "4096"}, "hidden_size"),
    "head_dim zero": ({"head_dim": 0}, "head_dim"),
    "moe_layer_freq 0": ({"n_routed_experts": 8, "moe_layer_freq": 0}, "moe_layer_freq"),
    "integer of 5000 digits": (None, "5000 digits"),
    "duplicate key": (None, "twice"),
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_a_bad_hf_config_names_its_config_json_key(name, tmp_path):
    """An HF config.json error names the config.json key (not the Megatron field it maps to)."""
    change, named = HF_CASES[name]
    path = tmp_path / "config.json"
    if name == "integer of 5000 digits":
        path.write_text(json.dumps(HF_LLAMA)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}")
    elif name == "duplicate key":
        path.write_text(json.dumps(HF_LLAMA)[:-1] + ', "hidden_size": 8}')
    else:
        path.write_text(json.dumps({**HF_LLAMA, **change}))
    t0 = time.monotonic()
    proc = run_script("check", "--hf-config", path, "--validator", "builtin")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "--hf-config" in lines[0] and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - t0 < 20


def test_a_6_mb_yaml_with_a_3m_item_list_is_refused_at_once(tmp_path):
    """It took 121 s and 2 GB to read with the pure-Python YAML reader; now the size bound answers first."""
    path = tmp_path / "big.yaml"
    path.write_text("model: {num_layers: 2}\ndataset:\n  blend: [" + ",".join(["1"] * 3_000_000) + "]\n")
    t0 = time.monotonic()
    proc = run_script("check", path, "--validator", "builtin")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert time.monotonic() - t0 < 10


def test_a_bomb_under_the_size_bound_is_refused_by_the_node_count_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB + "model: {num_layers: 2}\n")
    t0 = time.monotonic()
    proc = run_script("check", path, "--validator", "builtin")
    assert proc.returncode == 2 and "aliases are expanded" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 10


def test_a_non_utf8_file_is_bad_input(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"model:\n  num_layers: 8\n  # caf\xe9 \xff\n")
    proc = run_script("check", path, "--validator", "builtin")
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert str(path) in proc.stderr
