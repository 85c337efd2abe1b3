"""How many GPUs the job runs on: read from the input, or the smallest megatron-core accepts.

megatron-core lays its ranks out twice and refuses a world size either layout does not divide:
the dense grid TP x CP x DP x PP ('world_size (W) is not divisible by TP*PP*CP') and the expert
grid ETP x EP x DP_expert x PP ('world_size (W) is not divisible by
expert_tensor_model_pipeline_parallel size (ETP*EP*PP)'), parallel_state.py:740-741 and 792-795
@ core_v0.16.1; :822-823 and 881-884 @ megatron-core 0.19.2.

Where the number comes from, the first source that holds one:
1. `cluster.num_gpus` (the workload file or `--set`);
2. a Bridge dump written after `runtime_config_update`: `comm_overlap.data_parallel_size`, which
   `set_data_parallel_size` fills from the world size (config.py:1029-1041 @ megatron-bridge 0.6.2),
   times TP x PP x CP;
3. the launch line of an `--mlm-args` file: torchrun's --nproc-per-node x --nnodes, Slurm's
   srun -n/--ntasks or -N/--nodes x --ntasks-per-node, or the same sizes as SLURM_* / WORLD_SIZE
   assignments in the file;
4. the recipe (`--recipe`): Bridge 0.6.2 names each recipe function after the GPUs it is laid out
   for (`llama3_70b_pretrain_64gpu_h100_fp8cs_config`: 64; the docstrings say the same, e.g.
   perf_recipes/llama/h100/llama3.py:157-158);
5. else the smallest world size both grids divide, their least common multiple, with one
   data-parallel replica of the dense grid or as many as the expert grid needs. The plan says so
   first and what more data-parallel replicas would change.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from mbridge_recompute.errors import InputError

ASSUMED = "assumed"
GIVEN = "cluster.num_gpus"
# parallel_state.py's two divisibility checks, for the error lines
CHECKS = "parallel_state.py:822-823, 881-884 @ megatron-core 0.19.2 (:740-741, 792-795 @ core_v0.16.1)"
_RECIPE_GPUS = re.compile(r"_(\d{1,6})gpus?_")


def _size(fields: dict, name: str) -> int:
    from mbridge_recompute.workload import FIELDS

    value = fields.get(name, FIELDS[name].default)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def grids(fields: dict) -> tuple:
    """(TP x PP x CP, PP x EP x ETP) of coerced Workload fields (ETP None is TP)."""
    tp, pp, cp = (_size(fields, n) for n in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                              "context_parallel_size"))
    ep = _size(fields, "expert_model_parallel_size")
    etp = fields.get("expert_tensor_parallel_size") or tp
    return tp * pp * cp, pp * ep * etp


def smallest(fields: dict) -> int:
    dense, expert = grids(fields)
    return math.lcm(dense, expert)


def check(world: int, fields: dict, where: str) -> None:
    """InputError naming `where` when megatron-core's rank generators refuse `world`."""
    dense, expert = grids(fields)
    if world % dense:
        raise InputError(where, f"world size {world} is not divisible by TP*PP*CP={dense}: megatron-core "
                                f"raises 'world_size ({world}) is not divisible by {dense}' ({CHECKS})")
    if world % expert:
        raise InputError(where, f"world size {world} is not divisible by PP*EP*ETP={expert}: megatron-core "
                                f"raises 'world_size ({world}) is not divisible by "
                                f"expert_tensor_model_pipeline_parallel size ({expert})' ({CHECKS})")


# ---------------------------------------------------------------- launch lines
_TORCHRUN_PER_NODE = ("--nproc-per-node", "--nproc_per_node")
_NODES = ("--nnodes", "-N", "--nodes")
_TASKS = ("-n", "--ntasks")
_TASKS_PER_NODE = ("--ntasks-per-node",)
_ENV = {"WORLD_SIZE": "tasks", "SLURM_NTASKS": "tasks", "SLURM_NPROCS": "tasks", "SLURM_NNODES": "nodes",
        "SLURM_JOB_NUM_NODES": "nodes", "SLURM_NTASKS_PER_NODE": "per_node", "NNODES": "nodes",
        "NUM_NODES": "nodes", "GPUS_PER_NODE": "per_node", "NPROC_PER_NODE": "per_node"}
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Z_][A-Z0-9_]*)=(\S+)$")


def _value(tokens: list, i: int, option: str) -> tuple:
    """(the option's value, the index after it) for `--opt V` and `--opt=V`."""
    tok = tokens[i]
    if tok.startswith(option + "="):
        return tok.split("=", 1)[1], i + 1
    return (tokens[i + 1] if i + 1 < len(tokens) else ""), i + 2


def _count(text: str, env: dict, what: str, where: str) -> Optional[int]:
    text = text.strip()
    m = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", text)
    if m:
        text = env.get(m.group(1), "")
    if re.fullmatch(r"\d{1,7}", text or "") and int(text) > 0:
        return int(text)
    if text and not re.fullmatch(r"\$\{?\w+\}?", text):
        if ":" in text:
            return None           # torchrun's elastic MIN:MAX nodes: no one world size
        raise InputError(where, f"the launch line's {what} {text!r} is not a positive count")
    return None


def from_launch(tokens: list, where: str) -> Optional[tuple]:
    """(world size, how it was read) from launcher tokens (and NAME=VALUE assignments), or None."""
    env = {}
    for tok in tokens:
        m = _ASSIGN.match(tok)
        if m:
            env[m.group(1)] = m.group(2)
    sizes: dict[str, tuple] = {}
    elastic = False
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        for options, key in ((_TORCHRUN_PER_NODE, "per_node"), (_TASKS_PER_NODE, "per_node"),
                             (_NODES, "nodes"), (_TASKS, "tasks")):
            option = next((o for o in options if tok == o or tok.startswith(o + "=")), None)
            if option is not None:
                text, i = _value(tokens, i, option)
                elastic |= key == "nodes" and ":" in text      # torchrun's MIN:MAX: no one size
                n = _count(text, env, option, where)
                if n is not None:
                    sizes[key] = (n, f"{option} {n}")
                break
        else:
            i += 1
    for name, key in _ENV.items():
        if key not in sizes and name in env:
            n = _count(env[name], env, name, where)
            if n is not None:
                sizes[key] = (n, f"{name}={n}")
    if elastic and "tasks" not in sizes:
        return None
    if "tasks" in sizes:
        n, said = sizes["tasks"]
        return n, f"{said} ({where})"
    if "per_node" in sizes:
        per, said = sizes["per_node"]
        nodes, said_nodes = sizes.get("nodes", (1, "one node"))
        return per * nodes, f"{said} x {said_nodes} ({where})"
    return None


def from_recipe_name(name: Optional[str]) -> Optional[tuple]:
    """(GPUs, how) from a Bridge recipe function's name, or None."""
    if not name:
        return None
    function = name.rsplit(":", 1)[-1]
    m = _RECIPE_GPUS.search(function + "_")
    return (int(m.group(1)), f"the recipe's name ({function})") if m and int(m.group(1)) > 0 else None


# ---------------------------------------------------------------- the world size
def resolve(fields: dict, dump_dp: Any = None, launch: Optional[tuple] = None,
            recipe: Optional[str] = None) -> tuple:
    """(num_gpus, where it came from, input notes) for coerced Workload `fields`."""
    from mbridge_recompute.inputs.values import coerce

    dense, expert = grids(fields)
    notes: list[str] = []
    derived = None
    if dump_dp is not None:
        dp = coerce("num_gpus", dump_dp, "comm_overlap.data_parallel_size")
        derived = (dp * dense, f"comm_overlap.data_parallel_size {dp} x TP*PP*CP {dense}",
                   "comm_overlap.data_parallel_size")
    elif launch is not None:
        derived = (launch[0], f"the launch line: {launch[1]}", "--mlm-args")
    else:
        named = from_recipe_name(recipe)
        if named is not None:
            derived = (named[0], named[1], "--recipe")
    given = fields.get("num_gpus")
    if given is not None:
        if derived is not None and derived[0] != given:
            notes.append(f"cluster.num_gpus {given} is planned, not the {derived[0]} GPUs of {derived[1]}")
        return given, GIVEN, notes
    if derived is not None:
        try:
            check(derived[0], fields, derived[2])
            return derived[0], derived[1], notes
        except InputError as exc:
            if derived[2] != "--recipe":
                raise              # a dump's or a launch line's world size: what the job runs on
            # a name is a label: Bridge 0.6.2's deepseek_v3_pretrain_64gpu_h100_bf16_config holds
            # a "1024-GPU layout" (perf_recipes/deepseek/h100/deepseek_v3.py:161) whose expert grid
            # alone needs 512 GPUs
            notes.append(f"{derived[1]} says {derived[0]} GPUs, which megatron-core refuses for this "
                         f"layout: {exc.reason}")
    world = math.lcm(dense, expert)
    dp = world // dense
    notes.append(f"world size: {world} GPU{'s' if world != 1 else ''} assumed -- no input gives it "
                 f"(cluster.num_gpus, a harness dump's comm_overlap.data_parallel_size, a launch line, a "
                 f"recipe name); the smallest megatron-core accepts: TP*PP*CP={dense} and PP*EP*ETP={expert} "
                 f"both divide it ({CHECKS}), data-parallel size {dp}. More data-parallel replicas shard "
                 "the distributed optimizer's state finer (less static memory per GPU), split the global "
                 "batch into fewer micro-batches per replica (fewer in flight once below the pipeline "
                 "depth) and leave each micro-batch's activations as they are; give "
                 "--set cluster.num_gpus=N for the job's own")
    return world, f"{ASSUMED}: the smallest world size megatron-core accepts", notes


def more_replicas(w) -> Optional[str]:
    """For an assumed world size: what twice as many data-parallel replicas change on the hottest
    rank under the current setting (static memory and the peak), in one sentence; None when the
    world is given or the global batch does not split over twice the replicas."""
    if not w.world_assumed or not w.num_gpus:
        return None
    dp = w.data_parallel_size
    gbs = w.global_batch_size
    if gbs is not None and gbs % (w.micro_batch_size * 2 * dp):
        return (f"with {2 * w.num_gpus} GPUs the global batch {gbs} would not split over {2 * dp} "
                f"data-parallel replicas of micro-batch {w.micro_batch_size}")
    from mbridge_recompute.memory.coverage import estimate_or_none

    both = [estimate_or_none(x) for x in (w, w.replace(num_gpus=2 * w.num_gpus))]
    if None in both:
        return None          # a layout the model cannot place (a rejected split): the plan says why
    now, twice = (e.hottest for e in both)
    return (f"with {2 * w.num_gpus} GPUs (data-parallel {2 * dp}) the hottest rank would hold static "
            f"{now.static_bytes / 1e9:.2f} -> {twice.static_bytes / 1e9:.2f} GB and peak "
            f"{now.peak_bytes / 1e9:.2f} -> {twice.peak_bytes / 1e9:.2f} GB under the current setting")
