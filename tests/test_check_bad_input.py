"""Unusable input to `check_config.py`: exit 2, one line on stderr naming the field,
with --json one error object on stdout, never a traceback."""

from __future__ import annotations

import json

import pytest

from conftest import run_script

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
    "unknown label": ("model:\n  recompute_granularity: selective\n  recompute_modules: [bogus]\n", [],
                      "model.recompute_modules"),
    "label of another version": ("model:\n  recompute_granularity: selective\n  recompute_modules: [mhc]\n",
                                 ["--mcore-version", "0.16.1"], "model.recompute_modules"),
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
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_naming_the_field(name, tmp_path):
    text, argv, field = CASES[name]
    args = list(argv)
    if text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        args.insert(0, str(path))
    if "--validator" not in args:
        args += ["--validator", "builtin"]
    proc = run_script("check", *args, "--json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["error"]["exit"] == 2     # --json: one error object on stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and field in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_the_bad_input_table_has_at_least_15_cases():
    assert len(CASES) >= 15


def test_a_non_utf8_file_is_bad_input(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"model:\n  num_layers: 8\n  # caf\xe9 \xff\n")
    proc = run_script("check", path, "--validator", "builtin")
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert str(path) in proc.stderr
