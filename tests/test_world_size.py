"""The world size a plan uses is one megatron-core accepts, read from the input where it says.

megatron-core divides the world by TP x PP x CP (dense grid) and by PP x EP x ETP (expert grid)
and raises when either does not divide it (parallel_state.py:740-741, 792-795 @ core_v0.16.1;
:822-823, 881-884 @ megatron-core 0.19.2). Sources, first that holds one: cluster.num_gpus, a
harness dump's comm_overlap.data_parallel_size, the launch line of an --mlm-args file, a recipe's
name; else the smallest size both grids divide, said first (inputs/world.py). The real recipes
are planned in tests/test_bridge_recipes.py.
"""

from __future__ import annotations

import json

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import world
from mbridge_recompute.inputs.loading import load_workload

from conftest import EXAMPLES, run_script

MOE = """model:
  num_layers: 4
  hidden_size: 1024
  num_attention_heads: 16
  num_moe_experts: 16
  moe_router_topk: 2
  moe_grouped_gemm: true
  tensor_model_parallel_size: 2
  sequence_parallel: true
  pipeline_model_parallel_size: 2
  expert_model_parallel_size: 8
  expert_tensor_parallel_size: 1
train: {micro_batch_size: 1, global_batch_size: 64}
"""
SMALL = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 1"


def _load(tmp_path, text: str, *sets):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return load_workload(str(path), sets=list(sets))


def test_without_a_gpu_count_the_world_is_the_smallest_both_grids_divide(tmp_path):
    w = _load(tmp_path, MOE)
    # TP*PP*CP = 4 (the dense grid alone would take 4 GPUs); PP*EP*ETP = 16
    assert w.num_gpus == 16 and w.data_parallel_size == 4 and w.world_assumed
    assert w.input_notes[0].startswith("world size: 16 GPUs assumed") and "TP*PP*CP=4 and PP*EP*ETP=16" \
        in w.input_notes[0]


def test_a_given_world_size_either_grid_refuses_is_exit_2_with_megatron_cores_words(tmp_path):
    with pytest.raises(InputError) as exc:
        _load(tmp_path, MOE, "cluster.num_gpus=8")         # 8 % (PP 2 x EP 8 x ETP 1) != 0
    assert exc.value.field == "cluster.num_gpus"
    assert "expert_tensor_model_pipeline_parallel size (16)" in exc.value.reason
    with pytest.raises(InputError) as exc:
        _load(tmp_path, MOE, "cluster.num_gpus=18")
    assert "is not divisible by TP*PP*CP=4" in exc.value.reason
    assert _load(tmp_path, MOE, "cluster.num_gpus=32").data_parallel_size == 8


def test_a_harness_dumps_data_parallel_size_gives_the_world(tmp_path):
    """Bridge writes comm_overlap.data_parallel_size at run time (set_data_parallel_size,
    config.py:1029-1041 @ megatron-bridge 0.6.2); a dump written after it holds the run's world."""
    text = (EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text()
    assert "\ncomm_overlap: null\n" in text
    dumped = text.replace("\ncomm_overlap: null\n", "\ncomm_overlap:\n  data_parallel_size: 4\n"
                                                    "  tp_comm_overlap: false\n")
    w = _load(tmp_path, dumped)
    assert w.num_gpus == 4 * w.model_parallel_size and not w.world_assumed
    assert w.num_gpus_from.startswith("comm_overlap.data_parallel_size 4 x TP*PP*CP")
    given = _load(tmp_path, dumped, "cluster.num_gpus=16")             # the user's own count wins
    assert given.num_gpus == 16 and any("is planned, not the" in n for n in given.input_notes)


@pytest.mark.parametrize("prefix, gpus", [
    ("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py", 16),
    ("torchrun --nproc_per_node=4 pretrain_gpt.py", 4),
    ("python -m torch.distributed.run --nnodes=4 --nproc_per_node 8 pretrain_gpt.py", 32),
    ("srun -N 4 --ntasks-per-node 8 python pretrain_gpt.py", 32),
    ("srun --ntasks=64 python pretrain_gpt.py", 64),
    ("GPUS_PER_NODE=8\nNNODES=2\ntorchrun --nproc_per_node $GPUS_PER_NODE --nnodes ${NNODES} pretrain_gpt.py",
     16),
    ("export SLURM_NNODES=2\nexport SLURM_NTASKS_PER_NODE=8\npython pretrain_gpt.py", 16),
])
def test_an_argument_files_launch_line_gives_the_world(tmp_path, prefix, gpus):
    path = tmp_path / "cmd.sh"
    path.write_text(f"{prefix} {SMALL}\n")
    proc = run_script("plan", "--mlm-args", path, "--json")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    wl = json.loads(proc.stdout)["workload"]
    assert wl["num_gpus"] == gpus and wl["num_gpus_from"].startswith("the launch line"), wl["num_gpus_from"]


def test_a_launch_line_megatron_core_would_refuse_is_exit_2(tmp_path):
    path = tmp_path / "cmd.sh"
    path.write_text(f"torchrun --nproc-per-node 3 pretrain_gpt.py {SMALL} --tensor-model-parallel-size 2\n")
    proc = run_script("plan", "--mlm-args", path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --mlm-args: world size 3"), proc.stderr


def test_an_elastic_node_range_is_no_world_size():
    assert world.from_launch(["torchrun", "--nnodes", "1:4", "--nproc-per-node", "8"], "x") is None
    one_node = world.from_launch(["torchrun", "--nproc-per-node", "8"], "x")
    assert one_node == (8, "--nproc-per-node 8 x one node (x)")
    assert world.from_launch(["torchrun", "--nnodes", "1:4"], "x") is None


def test_a_recipes_name_gives_its_gpus():
    assert world.from_recipe_name("llama3_70b_pretrain_64gpu_h100_fp8cs_config")[0] == 64
    named = "megatron.bridge.recipes.x:deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config"
    assert world.from_recipe_name(named)[0] == 256
    assert world.from_recipe_name("vanilla_gpt_pretrain_config") is None


def test_a_candidate_change_of_an_assumed_world_is_assumed_again(tmp_path):
    """With the world assumed, a candidate that doubles EP is checked on the smallest world its own
    layout allows, not refused for the old one (inputs/loading.revalidate)."""
    path = tmp_path / "w.yaml"
    path.write_text(MOE)
    proc = run_script("config", path, "--candidate", "[]@expert_model_parallel_size=16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    given = tmp_path / "g.yaml"
    given.write_text(MOE + "cluster: {num_gpus: 16}\n")
    proc = run_script("config", given, "--candidate", "[]@expert_model_parallel_size=16", "--json")
    assert proc.returncode == 2 and "cluster.num_gpus" in proc.stderr, proc.stderr


def test_an_assumed_world_says_what_twice_the_data_parallel_replicas_would_change(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(MOE)
    report = json.loads(run_script("plan", path, "--json").stdout)
    notes = report["workload"]["input_notes"]
    twice = next(n for n in notes if n.startswith("with 32 GPUs (data-parallel 8)"))
    before, after = (float(x.split(" ")[0]) for x in twice.split("static ")[1].split(" -> ")[:2])
    assert after < before                     # the distributed optimizer's shards get smaller
    given = tmp_path / "g.yaml"
    given.write_text(MOE + "cluster: {num_gpus: 16}\n")
    assert not any(n.startswith("with ") for n in json.loads(run_script("plan", given, "--json").stdout)[
        "workload"]["input_notes"])


def test_fsdp_in_a_dump_is_named_first_as_not_modelled(tmp_path):
    text = (EXAMPLES / "bridge_dump_llama3_8b.yaml").read_text()
    assert "  use_megatron_fsdp: false\n" in text
    w = _load(tmp_path, text.replace("  use_megatron_fsdp: false\n", "  use_megatron_fsdp: true\n", 1))
    assert any(n.startswith("FSDP (ddp.use_megatron_fsdp, sharding ") and "not modelled" in n
               for n in w.input_notes)


def test_an_assumed_world_size_with_a_rejected_split_is_refused_without_a_traceback(tmp_path):
    """No GPU count and 81 layers on PP 4: the what-more-replicas-change sentence cannot be
    priced, so it is left out, and the plan is the refusal of the split (exit 1)."""
    from conftest import EXAMPLES, run_script

    text = (EXAMPLES / "llama3_70b_fp8.yaml").read_text()
    path = tmp_path / "no_gpus.yaml"
    path.write_text("\n".join(ln for ln in text.splitlines() if "num_gpus" not in ln) + "\n")
    p = run_script("plan", path, "--set", "model.num_layers=81")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-1500:]
    assert p.stdout.startswith("REJECTED") and "pp-does-not-divide-layers" in p.stdout
    assert "world size: 16 GPUs assumed" in " ".join(p.stdout.split())
