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

from conftest import EXAMPLES, ROOT, run_in_process, run_script

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
    # world sizes megatron-core would refuse below the recipe's: EP over TP*PP*CP
    "deepseek_v2_lite_pretrain_8gpu_h100_bf16_config": "mla",
    "gpt_oss_20b_pretrain_16gpu_h100_bf16_config": "moe",
    "megatron.bridge.perf_recipes.qwen.h100.qwen3_moe:"
    "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config": "moe",
    "megatron.bridge.perf_recipes.llama.h100.llama3:llama3_70b_pretrain_64gpu_h100_fp8cs_config": "dense",
    # fine-tuning: SFT (every parameter trains) and LoRA (a frozen base)
    "llama3_8b_sft_2gpu_h100_bf16_config": "dense",
    "megatron.bridge.perf_recipes.llama.h100.llama3:llama3_8b_sft_8gpu_h100_bf16_config": "dense",
    "megatron.bridge.recipes.llama.h100.llama3:llama3_70b_peft_8gpu_h100_bf16_config": "dense",
    "glm45_air_106b_peft_8gpu_h100_bf16_config": "moe",
    "nemotron_nano_12b_v2_peft_1gpu_h100_bf16_config": "hybrid",
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


def test_the_sweep_holds_16_recipes_with_sft_lora_and_perf_recipes(dumps):
    assert len(dumps) >= 16
    assert sum("_sft_" in s for s in dumps) >= 2 and sum("_peft_" in s for s in dumps) >= 3
    assert sum(k.startswith("megatron.bridge.perf_recipes.") for k in SWEEP) >= 4


def _recipe_gpus(stem: str) -> int:
    from mbridge_recompute.inputs import world

    return world.from_recipe_name(stem)[0]


# Recipes whose name gives a GPU count megatron-core refuses for the recipe's own layout: its
# docstring calls it a "1024-GPU layout" (perf_recipes/deepseek/h100/deepseek_v3.py:161 @ 0.6.2),
# and PP 8 x EP 64 x ETP 1 = 512 does not divide 64.
NAME_COUNT_REFUSED = {"deepseek_v3_pretrain_64gpu_h100_bf16_config": 512}


def test_every_dump_plans_on_its_recipes_gpu_count(dumps):
    """Each recipe is laid out for the GPUs its name gives (Bridge 0.6.2 names every recipe so,
    e.g. llama3_70b_pretrain_64gpu_h100_fp8cs_config); planned there, each exits 0 with that world
    size and its data-parallel size (or 1 with the reason where nothing fits it, or 2 where
    megatron-core refuses the name's count)."""
    exits = {}
    for stem, path in dumps.items():
        gpus = _recipe_gpus(stem)
        code, out, err = run_in_process("plan", path, "--mcore-version", VERSION, "--set",
                                        f"cluster.num_gpus={gpus}", "--json")
        report = json.loads(out)
        exits[stem] = code
        if stem in NAME_COUNT_REFUSED:
            assert code == 2 and "is not divisible by PP*EP*ETP" in report["error"]["message"], stem
            continue
        assert "error" not in report, (stem, report["error"])
        wl = report["workload"]
        assert wl["num_gpus"] == gpus and wl["num_gpus_from"] == "cluster.num_gpus", stem
        assert wl["dp"] == gpus // (wl["tp"] * wl["pp"] * wl["cp"]), stem
        if code == 1:
            assert report["diagnosis"], stem
    # (exit 1 is the memory model's answer for a layout whose static memory alone is over the GPU,
    # e.g. Llama3 8B on 2 GPUs with CP 2: 16 GB weights + 32 GB fp32 gradient buffer + 48 GB Adam
    # state over 2 ranks)
    assert sum(c == 0 for c in exits.values()) >= 16, exits


def test_without_a_gpu_count_every_dump_assumes_a_world_size_megatron_core_accepts(dumps):
    """No GPU count in a dump: the smallest world size both of megatron-core's rank grids divide
    (TP*PP*CP and PP*EP*ETP, parallel_state.py:822-823, 881-884 @ megatron-core 0.19.2), said first."""
    for stem, path in dumps.items():
        w = load_workload(str(path), mcore_version=VERSION)
        etp = w.expert_tensor_parallel_size or w.tensor_model_parallel_size
        dense = w.model_parallel_size
        expert = w.pipeline_model_parallel_size * w.expert_model_parallel_size * etp
        assert w.num_gpus % dense == 0 and w.num_gpus % expert == 0, stem
        assert w.num_gpus_from.startswith("assumed") and w.input_notes[0].startswith("world size:"), stem
        assert w.num_gpus == NAME_COUNT_REFUSED.get(stem, min(w.num_gpus, _recipe_gpus(stem))), stem


@pytest.mark.parametrize("stem, gpus, was", [
    ("deepseek_v2_lite_pretrain_8gpu_h100_bf16_config", 8, 1),              # EP 8
    ("glm45_air_106b_peft_8gpu_h100_bf16_config", 8, 2),                    # PP 2 EP 4
    ("gpt_oss_20b_pretrain_16gpu_h100_bf16_config", 16, 8),                 # TP 2 PP 4 EP 4 (ETP 1)
    ("qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", 256, 16),          # TP 2 PP 8 EP 32 (ETP 1)
])
def test_an_expert_parallel_recipe_is_not_planned_on_fewer_gpus_than_megatron_core_accepts(
        dumps, stem, gpus, was):
    code, out, _ = run_in_process("plan", dumps[stem], "--mcore-version", VERSION, "--json")
    wl = json.loads(out)["workload"]
    assert wl["num_gpus"] == gpus and gpus > was, (stem, wl["num_gpus"])
    assert wl["tp"] * wl["pp"] * wl["cp"] == was, stem          # what TP x PP x CP alone gave
    assert code in (0, 1)


def test_the_llama3_70b_fp8cs_perf_recipe_on_its_64_gpus_needs_no_recompute(dumps):
    """On the 32 GPUs TP 4 x PP 8 alone gives (one data-parallel replica) the optimizer state is
    unsharded and full block:1 recompute looks necessary; on the recipe's 64 it is not."""
    path = dumps["llama3_70b_pretrain_64gpu_h100_fp8cs_config"]
    at64, at32 = (json.loads(run_in_process("plan", path, "--mcore-version", VERSION, "--set",
                                            f"cluster.num_gpus={n}", "--json")[1]) for n in (64, 32))
    assert at64["recommendation"]["name"] == "none" and at64["workload"]["dp"] == 2
    assert at32["recommendation"]["name"] != "none"
    assert at64["ranks"][0]["static"]["optimizer"] < at32["ranks"][0]["static"]["optimizer"]


@pytest.mark.parametrize("stem, gpus", [("glm45_air_106b_peft_8gpu_h100_bf16_config", 8),
                                        ("nemotron_nano_12b_v2_peft_1gpu_h100_bf16_config", 1)])
def test_a_lora_recipe_plans_as_lora_on_the_gpus_it_runs_on(dumps, stem, gpus):
    """GLM-4.5-Air LoRA on 8 GPUs and Nemotron Nano 12B v2 LoRA on 1 (real Bridge 0.6.2 recipes that
    run there) fit: the base keeps only its weights; gradients and optimizer state are the
    adapters' (12 bytes per adapter parameter without the distributed optimizer, mixed precision)."""
    code, out, err = run_in_process("plan", dumps[stem], "--mcore-version", VERSION, "--set",
                                    f"cluster.num_gpus={gpus}", "--json")
    report = json.loads(out)
    assert code == 0 and report["fits"], (stem, report.get("diagnosis"), report.get("error"))
    w = load_workload(str(dumps[stem]), mcore_version=VERSION, sets=[f"cluster.num_gpus={gpus}"])
    for rank in report["ranks"]:
        static = rank["static"]
        adapters = static["lora_adapters"] / 2                     # bf16 adapters
        assert 0 < adapters < 0.02 * static["weights"] / 2, stem   # a small fraction of the base
        grad_bytes = 4 if w.grad_reduce_in_fp32 else 2
        assert abs(static["grads"] - adapters * grad_bytes) <= 8, (stem, static)
        if not w.use_distributed_optimizer:
            assert abs(static["optimizer"] - adapters * 12) <= 16, (stem, static)
        assert rank["activations"].get("lora", 0) > 0


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
    assert peft.peft["scheme"] == "lora" and peft.peft["dim"] == 32     # read (inputs/peft.py)
    assert any(n.startswith("LoRA rank 32 on") for n in peft.input_notes)
    ds = load_workload(str(dumps["deepseek_v3_pretrain_64gpu_h100_bf16_config"]), mcore_version=VERSION)
    # the layout is read (placement.py): a Workload field, not a not-modelled note
    assert ds.pipeline_model_parallel_layout is not None
    assert not any(n.startswith("model.pipeline_model_parallel_layout=") for n in ds.not_modelled)
    gdn = load_workload(str(dumps["qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16_config"]),
                        mcore_version=VERSION)
    assert any(n.startswith("model.linear_attention_freq=") for n in gdn.not_modelled)


def test_every_dump_checks_with_no_edit(dumps):
    proc = run_script("check", dumps["llama3_8b_pretrain_2gpu_h100_bf16_config"], "--validator", "builtin",
                      "--mcore-version", VERSION, "--json")     # once as the script, then in-process
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for stem, path in dumps.items():
        code, out, err = run_in_process("check", path, "--validator", "builtin", "--mcore-version", VERSION,
                                        "--json")
        assert code in (0, 1) and err == "", (stem, err)
        report = json.loads(out)
        error_ids = {f["id"] for f in report["findings"] if f["severity"] == "error"}
        assert error_ids == KNOWN_ERRORS.get(stem, set()), (stem, error_ids)
        assert report["input"]["defaults_source"] == "bridge"


def test_every_dump_plans_with_no_edit(dumps):
    for stem, path in dumps.items():
        code, out, err = run_in_process("plan", path, "--mcore-version", VERSION, "--json")
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


def test_a_recipe_by_name_is_planned_on_the_gpus_its_name_gives(tmp_path):
    home = hf_cache(tmp_path / "hf")
    perf = "megatron.bridge.perf_recipes.llama.h100.llama3:llama3_70b_pretrain_64gpu_h100_fp8cs_config"
    proc = bridge_tool(home, "plan", "--recipe", perf, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["workload"]["num_gpus"] == 64 and "recipe's name" in report["workload"]["num_gpus_from"]
    assert report["recommendation"]["name"] == "none"
    # a name whose count megatron-core refuses for the recipe's layout: said first, and planned on
    # the smallest world size it accepts instead
    ds = "megatron.bridge.perf_recipes.deepseek.h100.deepseek_v3:deepseek_v3_pretrain_64gpu_h100_bf16_config"
    proc = bridge_tool(home, "plan", "--recipe", ds, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode in (0, 1) and report["workload"]["num_gpus"] == 512, proc.stderr[-3000:]
    assert any("says 64 GPUs, which megatron-core refuses" in n for n in report["workload"]["input_notes"])


def test_hostile_36_a_nested_override_with_a_recipe_reaches_bridges_override_code(tmp_path):
    """Hydra's grammar takes any depth: the key goes to Bridge as written, and what Bridge says
    about it is the answer (here: accepted, or refused by Bridge's own code, never by ours)."""
    proc = bridge_tool(tmp_path, "plan", "--recipe", VANILLA, *SIZES, "--set",
                       "model.generation_config.max_new_tokens=5", "--json")
    assert "expected section.key" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0 or "Bridge refused the overrides" in proc.stderr, proc.stderr[-2000:]


def test_hostile_3_a_megatron_bridge_planted_in_the_current_directory_is_not_imported(tmp_path):
    """`python -m` puts the current directory first on sys.path: Bridge is still the installed one,
    and a recipe module that only the planted package has is not found."""
    planted = tmp_path / "megatron" / "bridge" / "recipes"
    planted.mkdir(parents=True)
    marker = tmp_path / "PWNED"
    for pkg in (tmp_path / "megatron" / "bridge", planted):
        (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    (planted / "evil.py").write_text(f"open({str(marker)!r}, 'w')\ndef x_config():\n    return None\n")
    proc = run_in_bridge(["-m", "mbridge_recompute", "plan", "--recipe",
                          "megatron.bridge.recipes.evil:x_config"], tmp_path, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not marker.exists()


# what every dump used to be warned about at values that do nothing on any of them (the
# distributed optimizer making optimizer.bf16 moot, no local CUDA graphs, bf16 weights, an
# allocator setting); comm_overlap.defer_embedding_wgrad_compute=null was the eighth, and null
# is never a warning
INERT_ON_EVERY_DUMP = {"env_vars.PYTORCH_CUDA_ALLOC_CONF", "cuda_graph_use_single_mempool",
                       "params_dtype", "optimizer.bf16", "optimizer.fp16", "optimizer.fp8_recipe",
                       "optimizer.use_distributed_optimizer"}


def test_no_dump_is_warned_about_a_setting_at_a_value_that_does_nothing(dumps):
    """Each dump got 8-19 not-modelled warnings, seven of them on every dump for values that do
    nothing; the ones that remain can move the peak, largest possible effect first."""
    counts = {}
    for stem, path in dumps.items():
        code, out, err = run_in_process("plan", path, "--mcore-version", VERSION, "--json")
        warnings = json.loads(out)["warnings"]
        assert not {f["field"] for f in warnings} & INERT_ON_EVERY_DUMP, stem
        assert all(f["value"] != "null" for f in warnings), stem
        sized = [f["effect_bytes"] for f in warnings if f.get("effect_bytes") is not None]
        assert all(b > 0 for b in sized) and sized == sorted(sized, reverse=True), stem
        assert [f.get("effect_bytes") is None for f in warnings] == sorted(
            f.get("effect_bytes") is None for f in warnings), stem      # the unsized ones last
        counts[stem] = len(warnings)
    assert max(counts.values()) <= 8 and min(counts.values()) == 0, counts


def test_the_peft_dump_warns_only_about_its_own_layer_spec(dumps):
    """LoRA is planned (inputs/peft.py, memory/lora.py), so it is no warning; OLMoE's own layer
    spec is the one setting left, and the model cannot size it."""
    code, out, err = run_in_process("plan", dumps["olmoe_7b_peft_1gpu_h100_bf16_config"], "--mcore-version",
                                    VERSION, "--json")
    warnings = json.loads(out)["warnings"]
    assert [f["field"] for f in warnings] == ["transformer_layer_spec"]
    assert warnings[0]["effect_bytes"] is None and "not sized" in warnings[0]["message"]
