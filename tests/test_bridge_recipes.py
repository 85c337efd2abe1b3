"""Real Megatron Bridge 0.6.2 dumps load, check and plan with no edit; recipes load by name.

A set of Bridge's own recipes (dense, MoE, MLA, hybrid Mamba and GDN stacks; pretraining, FP8
perf recipes and a LoRA recipe) is built by megatron-bridge 0.6.2 itself, in its environment
(tests/bridge_env.py), offline against the config.json facts of tests/fixtures/hf_configs, and
written with ConfigContainer.to_yaml -- the file logger.save_config_filepath writes. The tools
then read each file as a user would hand it over. The build runs once per test session (both
xdist workers share it through a lock).

Transformer Engine is the one stand-in (tests/standins/transformer_engine: a CUDA-only library,
import-only placeholder); nothing here computes with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bridge_env import hf_cache, run_in_bridge

from mbridge_recompute.inputs import fields as upstream_fields
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.workload import FIELD_NAMES, section_fields

from conftest import EXAMPLES, ROOT, run_script

# recipe -> what kind of stack it is
SWEEP = {
    "llama3_8b_pretrain_2gpu_h100_bf16_config": "dense",
    "megatron.bridge.perf_recipes.llama.h100.llama3:llama3_8b_pretrain_8gpu_h100_fp8cs_config": "dense",
    "gpt3_175b_pretrain_32gpu_h100_bf16_config": "dense",
    "gemma3_1b_pretrain_1gpu_h100_bf16_config": "dense",
    "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config": "moe",
    "megatron.bridge.perf_recipes.qwen.h100.qwen3_moe:"
    "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config": "moe",
    "olmoe_7b_pretrain_8gpu_h100_bf16_config": "moe",
    "olmoe_7b_peft_1gpu_h100_bf16_config": "moe",
    "megatron.bridge.perf_recipes.deepseek.h100.deepseek_v3:"
    "deepseek_v3_pretrain_64gpu_h100_bf16_config": "mla",
    "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config": "mla",
    "nemotronh_8b_pretrain_2gpu_h100_bf16_config": "hybrid",
    "nemotron_nano_9b_v2_pretrain_2gpu_h100_bf16_config": "hybrid",
    "nemotronh_56b_pretrain_64gpu_h100_fp8cs_config": "hybrid",
    "nemotron_3_nano_pretrain_8gpu_h100_bf16_config": "hybrid",
    "nemotron_3_5_lightning_pretrain_16gpu_h100_bf16_config": "hybrid",
    "qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16_config": "gdn",
}
# Error findings the checker gives on a real dump, each with why; everything else must check clean.
# (DeepSeek-V3 places its 61 layers with pipeline_model_parallel_layout, which placement.py reads.)
KNOWN_ERRORS: dict = {}
VERSION = "0.19.2"     # the megatron-core these dumps were built with


def _stem(name: str) -> str:
    return name.rsplit(":", 1)[-1]


@pytest.fixture(scope="session")
def dumps(tmp_path_factory) -> dict:
    """recipe stem -> path of its dump, built once for the whole session."""
    import os

    from filelock import FileLock

    # one build per session: under xdist the workers' base temps share a parent (the recipe the
    # xdist docs give); without xdist the base temp itself is this session's own
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "bridge-dumps"
    shared.mkdir(exist_ok=True)
    result_file = shared / "result.json"
    with FileLock(str(shared / ".lock")):
        if not result_file.exists():
            home = hf_cache(shared / "hf")
            work = shared / "cwd"
            work.mkdir(exist_ok=True)
            proc = run_in_bridge([ROOT / "tests" / "tools" / "dump_recipes.py", shared / "out", *SWEEP], home,
                                 cwd=work)
            assert proc.returncode == 0, proc.stderr[-3000:]
            result_file.write_text(proc.stdout)
    result = json.loads(result_file.read_text())
    failed = {k: v["reason"] for k, v in result.items() if v["status"] != "ok"}
    assert not failed, failed
    return {_stem(k): Path(v["dump"]) for k, v in result.items()}


def test_the_sweep_covers_at_least_12_recipes_of_every_kind_of_stack(dumps):
    assert len(dumps) >= 12
    assert set(SWEEP.values()) >= {"dense", "moe", "mla", "hybrid"}


def test_every_dump_loads_unchanged_as_a_bridge_workload(dumps):
    for stem, path in dumps.items():
        w = load_workload(str(path), mcore_version=VERSION)
        assert w.defaults_source == "bridge", stem
        assert w.num_layers > 0 and w.hidden_size > 0, stem


def test_every_field_a_dump_carries_is_read_or_classified(dumps):
    """Each key of the sections the tools read is a Workload field, read by the memory model, or
    listed in data/coverage.yaml (not memory relevant, or not modelled and named when set)."""
    import yaml

    unclassified = {}
    for stem, path in dumps.items():
        data = yaml.safe_load(path.read_text())
        for section in ("model", "train", "ddp", "optimizer", "comm_overlap", "mixed_precision"):
            body = data.get(section)
            if not isinstance(body, dict):
                continue
            ours = FIELD_NAMES if section == "model" else section_fields(section)
            listed = set(upstream_fields.not_relevant(section)) | set(upstream_fields.inert_values(section))
            read = ours | (upstream_fields.READ_BY_MODEL if section == "model" else set())
            for key in body:
                if key not in read and key not in listed:
                    unclassified.setdefault(f"{section}.{key}", stem)
    assert not unclassified, unclassified


def test_the_model_reads_what_bridge_runs_not_the_raw_dump(dumps):
    """The 0.6.2 names and run-time steps are applied: the layer pattern of a hybrid provider, the
    mixed-precision recipe's bf16, a null comm_overlap section, MTP depth 0."""
    w = load_workload(str(dumps["nemotronh_8b_pretrain_2gpu_h100_bf16_config"]), mcore_version=VERSION)
    assert w.hybrid_override_pattern and w.num_layers == len(w.hybrid_override_pattern)
    assert w.layer_kinds().count("mamba") > 0 and w.mtp_num_layers is None
    w = load_workload(str(dumps["llama3_8b_pretrain_2gpu_h100_bf16_config"]), mcore_version=VERSION)
    assert w.bf16 is True and w.swiglu and w.num_query_groups == 8 and w.num_layers == 32
    w = load_workload(str(dumps["qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config"]), mcore_version=VERSION)
    assert w.is_moe and w.num_moe_experts == 128 and w.fp8 == "hybrid" and w.delay_wgrad_compute is False
    w = load_workload(str(dumps["deepseek_v3_pretrain_64gpu_h100_bf16_config"]), mcore_version=VERSION)
    assert w.multi_latent_attention and w.q_lora_rank == 1536 and w.layer_kinds().count("attn+mlp") == 3


def test_fields_that_can_change_memory_are_named_not_dropped(dumps):
    peft = load_workload(str(dumps["olmoe_7b_peft_1gpu_h100_bf16_config"]), mcore_version=VERSION)
    assert any(n.startswith("peft=") for n in peft.not_modelled)
    ds = load_workload(str(dumps["deepseek_v3_pretrain_64gpu_h100_bf16_config"]), mcore_version=VERSION)
    # the layout is read (placement.py): a Workload field, not a not-modelled note
    assert ds.pipeline_model_parallel_layout is not None
    assert not any(n.startswith("model.pipeline_model_parallel_layout=") for n in ds.not_modelled)
    gdn = load_workload(str(dumps["qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16_config"]),
                        mcore_version=VERSION)
    assert any(n.startswith("model.linear_attention_freq=") for n in gdn.not_modelled)


def _tool(*argv) -> tuple:
    """(exit code, stdout, stderr) of one tool run in-process, as its script runs it."""
    import contextlib
    import io

    from mbridge_recompute.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            return exc.code, out.getvalue(), err.getvalue()
    return None, out.getvalue(), err.getvalue()


def test_every_dump_checks_with_no_edit(dumps):
    proc = run_script("check", dumps["llama3_8b_pretrain_2gpu_h100_bf16_config"], "--validator", "builtin",
                      "--mcore-version", VERSION, "--json")     # once as the script, then in-process
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for stem, path in dumps.items():
        code, out, err = _tool("check", path, "--validator", "builtin", "--mcore-version", VERSION, "--json")
        assert code in (0, 1) and err == "", (stem, err)
        report = json.loads(out)
        error_ids = {f["id"] for f in report["findings"] if f["severity"] == "error"}
        assert error_ids == KNOWN_ERRORS.get(stem, set()), (stem, error_ids)
        assert report["input"]["defaults_source"] == "bridge"


def test_every_dump_plans_with_no_edit(dumps):
    for stem, path in dumps.items():
        code, out, err = _tool("plan", path, "--mcore-version", VERSION, "--json")
        assert code in (0, 1) and "Traceback" not in err, (stem, err)
        report = json.loads(out)
        if stem in KNOWN_ERRORS:   # plan estimates nothing for a workload with an error finding
            assert code == 1 and {f["id"] for f in report["workload_findings"]} == KNOWN_ERRORS[stem]
        else:
            assert report["ranks"] and report["recommendation"], stem


def test_every_dump_passes_the_real_transformer_config_of_its_release(dumps, tmp_path):
    """In the Bridge environment (megatron-core 0.19.2 installed) check answers with the live
    validator: megatron-core's own TransformerConfig is built from each dump."""
    script = tmp_path / "live.py"
    script.write_text(
        "import contextlib, io, json, sys\n"
        "from mbridge_recompute.cli import main\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    buf = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(buf):\n"
        "            main(['check', path, '--json'])\n"
        "    except SystemExit as e:\n"
        "        out[path] = [e.code, buf.getvalue()]\n"
        "print(json.dumps(out))\n")
    proc = run_in_bridge([script, *map(str, dumps.values())], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for path, (code, text) in results.items():
        stem = Path(path).stem
        report = json.loads(text)
        assert report["validator"] == "live", stem
        error_ids = {f["id"] for f in report["findings"] if f["severity"] == "error"}
        assert error_ids == KNOWN_ERRORS.get(stem, set()), (stem, report["findings"])
        assert code == (1 if stem in KNOWN_ERRORS else 0), stem


def test_the_example_dump_is_the_one_bridge_writes(dumps):
    """examples/bridge_dump_llama3_8b.yaml is megatron-bridge 0.6.2's own dump of
    llama3_8b_pretrain_2gpu_h100_bf16_config, written from /tmp/bridge-dump (its paths say so)."""
    fresh = dumps["llama3_8b_pretrain_2gpu_h100_bf16_config"].read_text()
    cwd = str(dumps["llama3_8b_pretrain_2gpu_h100_bf16_config"].parent.parent / "cwd")
    example = (EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text()
    body = "\n".join(line for line in example.splitlines() if not line.startswith("#")) + "\n"
    assert body == fresh.replace(cwd, "/tmp/bridge-dump")


# ------------------------------------------------------------------ --recipe NAME
VANILLA = "vanilla_gpt_pretrain_1gpu_h100_bf16_config"     # a bare GPTModelProvider: sizes 0
SIZES = ["--set", "model.num_layers=4", "--set", "model.hidden_size=256",
         "--set", "model.num_attention_heads=4", "--set", "model.recompute_granularity=selective"]


def bridge_tool(home, *argv):
    """A tool run as `python -m mbridge_recompute ...` in the Bridge environment."""
    return run_in_bridge(["-m", "mbridge_recompute", *map(str, argv)], home)


def test_plan_by_recipe_name_applies_set_through_bridges_override_code(tmp_path):
    """The bare recipe is unusable as built, and usable once Bridge's own Hydra override code has
    applied the sizes; a label given the same way reaches the model Bridge built."""
    bare = bridge_tool(tmp_path, "plan", "--recipe", VANILLA, "--json")
    assert bare.returncode == 2 and "model.hidden_size" in bare.stderr, bare.stderr[-2000:]
    sized = bridge_tool(tmp_path, "plan", "--recipe", VANILLA, *SIZES, "--set",
                        "model.recompute_modules=[mlp]", "--set", "cluster.gpu_memory_gb=40", "--json")
    assert sized.returncode == 0, sized.stderr[-3000:]
    report = json.loads(sized.stdout)
    # cluster.gpu_memory_gb 40 reaches the plan: a 40 GB GPU is the table's A100 40GB (39.59 GiB)
    assert report["ranks"] and report["workload"]["gpu_capacity_bytes"] == int(39.59 * 2**30)
    check = bridge_tool(tmp_path, "check", "--recipe", VANILLA, *SIZES, "--set",
                        "model.recompute_modules=[moe_act]", "--validator", "builtin", "--json")
    ids = {f["id"] for f in json.loads(check.stdout)["findings"]}
    assert "moe-act-needs-grouped-gemm" in ids


def test_a_key_bridge_does_not_have_is_refused_with_one_line_naming_it(tmp_path):
    proc = bridge_tool(tmp_path, "check", "--recipe", VANILLA, "--set", "model.not_a_field=1")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "--set model.not_a_field=1" in proc.stderr and "Traceback" not in proc.stderr


def test_config_and_check_take_a_recipe_too(tmp_path):
    home = hf_cache(tmp_path / "hf")
    proc = bridge_tool(home, "config", "--recipe", "llama3_8b_pretrain_2gpu_h100_bf16_config",
                       "--granularity", "selective", "--modules", "mlp", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    olmoe = "megatron.bridge.recipes.olmoe.h100.olmoe_7b:olmoe_7b_pretrain_8gpu_h100_bf16_config"
    proc = bridge_tool(home, "check", "--recipe", olmoe, "--validator", "builtin", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = {f["id"] for f in json.loads(proc.stdout)["findings"]}
    assert "modules-none-promoted" in ids    # OLMoE's recipe leaves recompute_modules None (olmoe_7b.py:66)


def test_an_unknown_recipe_name_is_one_line(tmp_path):
    proc = bridge_tool(tmp_path, "plan", "--recipe", "llama3_9b_pretrain_config")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: --recipe: no recipe function"), proc.stderr


def test_the_gpt_oss_recipe_checks_clean_with_the_live_validator(tmp_path):
    """GPT-OSS's provider sets activation_func to fused_bias_geglu.quick_gelu with
    bias_activation_fusion (models/gpt_oss/gpt_oss_bridge.py:37,82 @ 0.6.2); megatron-core 0.19.2
    accepts that, and so must check."""
    home = hf_cache(tmp_path / "hf")
    proc = bridge_tool(home, "check", "--recipe", "gpt_oss_20b_pretrain_16gpu_h100_bf16_config", "--json")
    report = json.loads(proc.stdout)
    assert report["validator"] == "live", proc.stderr[-3000:]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    assert proc.returncode == 0
