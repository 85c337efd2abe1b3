"""Hostile input, round 3: the input surfaces (argument lists, config.json files, recipes,
candidate changes, releases). Each test is named after its problem in the hostile-input record
(#N) and drives the tools as a user does, through real subprocesses where the problem was one of
a process (what gets imported, what is printed, the exit code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import mlm_args
from mbridge_recompute.inputs.loading import load_workload

from conftest import EXAMPLES, SCRIPTS, run_script

SMALL = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
         "--max-position-embeddings", "2048"]
MOONLIGHT = EXAMPLES / "moonlight_16b.yaml"


def run_module(*args, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m mbridge_recompute ARGS` from `cwd`: -m puts the current directory first on
    sys.path, which is what a planted package relies on."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    return subprocess.run([sys.executable, "-m", "mbridge_recompute", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def _one_error(proc, field: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ #3 --recipe calls only Bridge's recipes
@pytest.mark.parametrize("name", ["os:fork", "os:abort", "sys:exit", "code:interact", "builtins:breakpoint",
                                  "evil:x", "megatron.bridge.training.config:ConfigContainer"])
def test_hostile_3_recipe_outside_bridges_recipe_packages_is_refused_before_anything_is_imported(
        tmp_path, name):
    (tmp_path / "evil.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w')\ndef x(): return 1\n")
    proc = run_module("plan", "--recipe", name, "--json", cwd=tmp_path)
    _one_error(proc, "--recipe")
    assert len(proc.stdout.strip().splitlines()) == 1 and "error" in json.loads(proc.stdout)
    assert "not a module of megatron.bridge.recipes or megatron.bridge.perf_recipes" in proc.stderr
    assert not (tmp_path / "PWNED").exists()


def test_hostile_3_whatever_a_recipe_call_raises_is_one_error_line():
    """SystemExit, a debugger's BdbQuit, anything a BaseException: one InputError (exit 2);
    Ctrl-C stays an interruption (exit 130 in cli.main)."""
    import bdb

    from mbridge_recompute.inputs import recipe

    def exits():
        raise SystemExit(0)

    def quits():
        raise bdb.BdbQuit()

    for fn in (exits, quits):
        with pytest.raises(InputError) as exc:
            recipe._call("llama3_8b_pretrain_config()", fn)
        assert exc.value.field == "--recipe" and "raised" in exc.value.reason

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        recipe._call("x()", interrupted)


# ------------------------------------------------------------------ #4 no megatron from the current directory
def _planted_megatron(root) -> None:
    training = root / "megatron" / "training"
    training.mkdir(parents=True)
    (training / "arguments.py").write_text(
        f"open({str(root / 'PWNED')!r}, 'w')\nimport argparse\n"
        "def add_megatron_arguments(p):\n    p.add_argument('--num-layers', type=int, dest='num_layers')\n"
        "    return p\n")


def test_hostile_4_mlm_args_never_imports_a_megatron_from_the_current_directory(tmp_path):
    _planted_megatron(tmp_path)
    proc = run_module("plan", "--json", "--mlm-args", "--", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["workload"]["num_layers"] == 8
    assert not (tmp_path / "PWNED").exists()
    # the real parser is an opt-in, and then never the one in the current directory
    proc = run_module("plan", "--mlm-parser", "installed", "--mlm-args", "--", *SMALL, cwd=tmp_path)
    _one_error(proc, "--mlm-parser")
    assert not (tmp_path / "PWNED").exists()


# ------------------------------------------------------------------ #10 #34 #35 #39 --hf-config
def _hf(tmp_path, config: dict, text: str | None = None):
    path = tmp_path / "config.json"
    path.write_text(text if text is not None else json.dumps(config), encoding="utf-8")
    return path


def test_hostile_10_hf_config_with_null_layers_and_experts_is_one_error_line(tmp_path):
    path = _hf(tmp_path, {"num_hidden_layers": None, "hidden_size": 256, "num_attention_heads": 4,
                          "num_experts": 8})
    proc = run_script("plan", "--hf-config", path)
    _one_error(proc, "--hf-config")
    assert "num_hidden_layers must be a positive integer" in proc.stderr


def test_hostile_34_hf_config_with_a_utf8_byte_order_mark_is_read(tmp_path):
    config = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}
    path = _hf(tmp_path, {}, "\ufeff" + json.dumps(config))
    w = load_workload(hf_config=str(path))
    assert (w.num_layers, w.hidden_size, w.vocab_size) == (4, 256, 1000)


def test_hostile_35_the_ignored_keys_note_is_bounded_and_escapes_format_characters(tmp_path):
    config = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
              "a_evil\u202e_key": 1, **{f"extra_{i}": i for i in range(150_000)}}    # 3.4 MB
    path = _hf(tmp_path, config)
    proc = run_script("plan", "--hf-config", path, "--json")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    # the note is wrapped to the text width, where its path falls: read it with the wrapping undone
    note = " ".join(proc.stderr.split())
    head = f"note: --hf-config {path}: ignored keys not used by the memory model: "
    assert note.startswith(head), note[:300]
    assert len(proc.stderr) - len(str(path)) < 3000, len(proc.stderr)      # the note is bounded
    assert note.endswith(" and 149981 more") and "\u202e" not in proc.stderr and "\\u202e" in note


def test_hostile_35_text_output_escapes_every_unicode_format_character():
    import unicodedata

    from mbridge_recompute.output import safe_text

    for code in range(0x110000):
        c = chr(code)
        if unicodedata.category(c) == "Cf" or (unicodedata.category(c) == "Cc" and c not in "\n\t"):
            assert c not in safe_text(f"a{c}b"), hex(code)
    assert safe_text("rtl\u202eltr") == "rtl\\u202eltr" and safe_text("tag\U000e0041") == "tag\\U000e0041"


def test_hostile_39_hf_config_with_more_dense_layers_than_layers_is_refused(tmp_path):
    path = _hf(tmp_path, {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                          "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                          "first_k_dense_replace": 99})
    proc = run_script("check", "--hf-config", path, "--validator", "builtin")
    _one_error(proc, "--hf-config")
    assert "first_k_dense_replace must be an integer from 0 to num_hidden_layers=4, got 99" in proc.stderr


# ------------------------------------------------------------------ #14 #15 #17 #18 #24 #25 #28 --mlm-args
def test_hostile_14_mtp_num_layers_is_bounded_like_num_layers_wherever_it_enters(tmp_path):
    started = time.monotonic()
    _one_error(run_script("plan", "--set", "model.mtp_num_layers=1000000", "--json"), "model.mtp_num_layers")
    _one_error(run_script("check", "--set", "model.mtp_num_layers=2147483647"), "model.mtp_num_layers")
    path = _hf(tmp_path, {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                          "num_nextn_predict_layers": 1_000_000})
    _one_error(run_script("plan", "--hf-config", path), "--hf-config")
    _one_error(run_script("plan", "--mlm-args", "--", *SMALL, "--mtp-num-layers", "1000000"),
               "model.mtp_num_layers")
    assert time.monotonic() - started < 60


def test_hostile_15_an_argument_list_of_more_than_4096_tokens_is_refused_fast(tmp_path):
    path = tmp_path / "cmd.txt"
    path.write_text(" ".join(["pretrain_gpt.py", *SMALL] + ["--eval-iters 1"] * 200_000))
    started = time.monotonic()
    proc = run_script("plan", "--mlm-args", path)
    _one_error(proc, "--mlm-args")
    assert "at most 4096" in proc.stderr and time.monotonic() - started < 20


def test_hostile_17_moe_layer_freq_is_counted_before_it_is_expanded():
    import tracemalloc

    text = "[" + ",".join(["1"] * 20_000) + "]*99999"
    tracemalloc.start()
    with pytest.raises(InputError, match="more than 10000 layers"):
        mlm_args._layer_freq(text)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 * 2**20                     # the expansion would be 16 GB
    assert mlm_args._layer_freq("([0]*3+[1]*13)") == [0] * 3 + [1] * 13


def test_hostile_18_mlm_args_file_keeps_the_workload_positional_and_later_files(tmp_path):
    workload = tmp_path / "w4.yaml"
    workload.write_text("model:\n  num_layers: 4\n  hidden_size: 512\n  num_attention_heads: 8\n")
    cmd = tmp_path / "cmd.txt"
    cmd.write_text("pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4\n")
    more = tmp_path / "more.txt"
    more.write_text("--hidden-size 384\n")
    for argv in ([workload, "--mlm-args", cmd], ["--mlm-args", cmd, workload], ["--mlm-args", cmd, "--json",
                                                                                 workload]):
        proc = run_script("plan", *argv, *([] if "--json" in argv else ["--json"]))
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        assert json.loads(proc.stdout)["workload"]["hidden_size"] == 512, argv     # the file wins
    # two files: both read, in order; a file then -- ARGS: the ARGS are read after the file
    proc = run_script("plan", "--mlm-args", cmd, "--mlm-args", more, "--json")
    assert json.loads(proc.stdout)["workload"]["hidden_size"] == 384, proc.stderr[-2000:]
    proc = run_script("plan", "--json", "--mlm-args", cmd, "--", "--num-layers", "6")
    report = json.loads(proc.stdout)["workload"]
    assert (report["num_layers"], report["hidden_size"]) == (6, 256), proc.stderr[-2000:]


def test_hostile_24_hidden_size_not_a_multiple_of_the_heads_is_refused_as_validate_args_asserts():
    proc = run_script("plan", "--mlm-args", "--", "--num-layers", "8", "--hidden-size", "1000",
                      "--num-attention-heads", "3", "--seq-length", "2048",
                      "--max-position-embeddings", "2048")
    _one_error(proc, "--mlm-args")
    assert "hidden_size % num_attention_heads == 0" in proc.stderr
    # with --kv-channels validate_args does not assert, and neither does the reader
    w = load_workload(mlm_args=["--", "--num-layers", "8", "--hidden-size", "1000", "--num-attention-heads",
                                "4", "--kv-channels", "256", "--seq-length", "2048"])
    assert w.kv_channels == 256


PP2 = [*SMALL, "--global-batch-size", "16", "--pipeline-model-parallel-size", "2"]


def test_hostile_25_both_megatron_lm_vpp_flags_set_vpp_and_bad_values_are_refused():
    for flag in (["--num-layers-per-virtual-pipeline-stage", "2"],
                 ["--num-virtual-stages-per-pipeline-rank", "2"]):
        proc = run_script("plan", "--json", "--mlm-args", "--", *PP2, *flag)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        report = json.loads(proc.stdout)
        assert report["workload"]["vpp"] == 2, flag
        assert not any("virtual" in f["message"] for f in report["warnings"]), report["warnings"]
    for flag in (["--num-layers-per-virtual-pipeline-stage", "3"],
                 ["--num-layers-per-virtual-pipeline-stage", "-2"],
                 ["--num-virtual-stages-per-pipeline-rank", "-2"],
                 ["--num-virtual-stages-per-pipeline-rank", "2",
                  "--num-layers-per-virtual-pipeline-stage", "2"]):
        _one_error(run_script("plan", "--mlm-args", "--", *PP2, *flag), "--mlm-args")


def test_hostile_28_mlm_args_help_is_not_printed_as_the_tools_output():
    for asked in ("--help", "-h"):
        proc = run_script("plan", "--json", "--mlm-args", "--", asked)
        _one_error(proc, "--mlm-args")
        assert "usage:" not in proc.stdout
        assert list(json.loads(proc.stdout)) == ["error"] and len(proc.stdout.strip().splitlines()) == 1


# ------------------------------------------------------------------ #19 #37 candidate changes
@pytest.mark.parametrize("change, field", [
    ("tensor_model_parallel_size=3", "model.tensor_model_parallel_size"),
    ("expert_model_parallel_size=1024", "model.expert_model_parallel_size"),
    ("num_moe_experts=1", "model.expert_model_parallel_size"),
    ("micro_batch_size=7", "train.global_batch_size"),
    ("context_parallel_size=7", "cluster.num_gpus"),
    ("seq_length=1", "model.seq_length"),
    ("num_layers=7", "model.moe_layer_freq"),
])
def test_hostile_19_a_candidate_change_is_checked_as_a_loaded_workload_is(change, field):
    proc = run_script("config", MOONLIGHT, "--candidate", f"[]@{change}", "--json")
    _one_error(proc, field)
    # and the same value in the workload itself is refused the same way
    section = "train" if change.startswith("micro_batch_size") else "model"
    loaded = run_script("check", MOONLIGHT, "--set", f"{section}.{change}", "--validator", "builtin")
    assert loaded.returncode == 2 and loaded.stderr.startswith(f"error: {field}"), loaded.stderr


def test_hostile_37_a_candidate_can_change_a_float_field():
    proc = run_script("config", MOONLIGHT, "--candidate", "[]@moe_expert_capacity_factor=1.5", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["description"] == "selective [] with moe_expert_capacity_factor=1.5"
    assert "moe_expert_capacity_factor: 1.5" in report["formats"]["yaml"]


def test_hostile_37_yaml_1_1_exponent_strings_are_read_as_numbers_not_refused_as_text():
    proc = run_script("plan", "--set", "cluster.gpu_memory_gb=1e308")
    _one_error(proc, "cluster.gpu_memory_gb")
    assert "must be a number" not in proc.stderr and "finite number of at most" in proc.stderr
    w = load_workload(default=True, sets=["cluster.gpu_memory_gib=1.5e2"])
    assert w.gpu_memory_gib == 150.0


# ------------------------------------------------------------------ #21 #23 #26 loaded values
def test_hostile_21_a_negative_capacity_factor_is_no_token_dropping_as_megatron_core_reads_it():
    from mbridge_recompute import memory

    low = load_workload(model="deepseek-v3", sets=["model.moe_expert_capacity_factor=-1"])
    dropless = load_workload(model="deepseek-v3")
    assert low.moe_expert_capacity_factor is None
    assert memory.estimate(low).hottest.peak_bytes == memory.estimate(dropless).hottest.peak_bytes
    assert all(v >= 0 for r in memory.estimate(low).ranks for v in r.activations.values())


def test_hostile_23_query_groups_neither_a_multiple_nor_a_divisor_of_tp_are_refused():
    """TransformerConfig's own rule (transformer_config.py:1338-1345 @ core_v0.19.2): groups a
    multiple of TP split over the TP ranks, groups that divide TP are shared; anything else raises."""
    base = ["model.tensor_model_parallel_size=4", "model.num_attention_heads=24", "model.hidden_size=6144",
            "cluster.num_gpus=64"]
    proc = run_script("plan", "--model", "llama3-70b", *[a for s in [*base, "model.num_query_groups=6"]
                                                          for a in ("--set", s)])
    _one_error(proc, "model.num_query_groups")
    assert "must be a multiple or divisor of tensor_model_parallel_size (4)" in proc.stderr
    w = load_workload(model="llama3-70b", sets=[*base, "model.num_query_groups=2"])   # 4 % 2 == 0: accepted
    assert w.num_query_groups == 2


@pytest.mark.parametrize("text", ["cluster:\n  num_gpus: 8\n", "model: null\ncluster:\n  num_gpus: 8\n",
                                  "model: {}\n", "model:\n  num_layers: 4\n"])
def test_hostile_26_a_workload_without_a_model_is_refused_not_made_up(tmp_path, text):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    proc = run_script("plan", path, "--json")
    assert proc.returncode == 2 and "model" in json.loads(proc.stdout)["error"]["field"], proc.stderr


def test_hostile_26_a_bridge_dump_with_a_null_model_is_refused(tmp_path):
    lines = (EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text().splitlines(keepends=True)
    out, skipping = [], False
    for line in lines:
        if line.startswith("model:"):
            out.append("model: null\n")
            skipping = True
            continue
        if skipping and (line.startswith(" ") or line.startswith("-")):
            continue
        skipping = False
        out.append(line)
    path = tmp_path / "dump.yaml"
    path.write_text("".join(out))
    proc = run_script("plan", path)
    _one_error(proc, f"{path}: model")


# ------------------------------------------------------------------ #38 releases the card does not list
@pytest.mark.parametrize("asked, facts, said", [
    ("0.20", "main", "not a released megatron-core"),
    ("0.19.99", "0.19", "not a release the card lists"),
    ("00.016.0001", "0.16", "read as 0.16.1")])
def test_hostile_38_an_unlisted_release_names_the_facts_it_is_read_with(asked, facts, said):
    proc = run_script("plan", "--mcore-version", asked, "--json")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    release = json.loads(proc.stdout)["release"]
    assert release["key"] == facts and said in release["how"], release
    text = run_script("check", "--mcore-version", asked, "--validator", "builtin")
    first = " ".join(text.stdout.split("\ndefaults:")[0].split())      # the validator line, unwrapped
    assert first.startswith("validator:") and said in first, text.stdout[:500]


def test_hostile_36_nested_overrides_go_to_bridge_as_written():
    from mbridge_recompute.inputs.loading import split_recipe_sets

    ours, theirs = split_recipe_sets(["model.generation_config.max_new_tokens=5", "num_layers=4",
                                      "+train.x=1", "cluster.num_gpus=8", "gpu_memory_gb=40",
                                      "+num_layers=2"])
    assert ours == ["cluster.num_gpus=8", "gpu_memory_gb=40"]
    assert theirs == ["model.generation_config.max_new_tokens=5", "model.num_layers=4", "+train.x=1",
                      "+model.num_layers=2"]
