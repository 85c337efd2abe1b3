"""LoRA on a frozen base, as Megatron Bridge 0.6.2's PEFT code builds it (memory/lora.py).

Freezing (peft/base.py:135-160 @ megatron-bridge 0.6.2) leaves the base with its 16-bit weights
only: megatron-core allocates gradient buffers and optimizer state for requires_grad parameters
alone. Each adapted linear adds (in + out) x rank parameters split over TP (peft/utils.py
ParallelLinearAdapter), grouped experts one shared adapter per EP rank, and each adapter keeps
its rank-wide intermediate, the gathered input under sequence parallelism, and dropout's mask.
The real recipes (GLM-4.5-Air and Nemotron Nano 12B v2 LoRA) are planned in
tests/test_bridge_recipes.py.
"""

from __future__ import annotations

import json

import pytest

from mbridge_recompute import memory
from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs.loading import load_workload
from mbridge_recompute.memory import lora
from mbridge_recompute.memory.shape import shape_of as _shape_of
from mbridge_recompute.memory.tensors import layer_tensors
from mbridge_recompute.memory.types import DEFAULT_KNOBS

from conftest import run_script

DENSE = """model:
  num_layers: 4
  hidden_size: 1024
  num_attention_heads: 16
  num_query_groups: 4
  ffn_hidden_size: 2816
  gated_linear_unit: true
  activation_func: silu
  bf16: true
  seq_length: 2048
  vocab_size: 32000
  tensor_model_parallel_size: 2
train: {micro_batch_size: 1, global_batch_size: 8}
ddp: {use_distributed_optimizer: false, grad_reduce_in_fp32: true}
cluster: {num_gpus: 2}
"""
LORA = """peft:
  _target_: megatron.bridge.peft.lora.LoRA
  dim: 16
  target_modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]
"""
MOE = DENSE.replace("  tensor_model_parallel_size: 2\n",
                    "  tensor_model_parallel_size: 1\n  num_moe_experts: 8\n  moe_router_topk: 2\n"
                    "  moe_ffn_hidden_size: 512\n  moe_grouped_gemm: true\n  expert_model_parallel_size: 2\n")


def shape_of(w):
    return _shape_of(w, DEFAULT_KNOBS)


def _load(tmp_path, text: str, *sets):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return load_workload(str(path), sets=list(sets))


def test_the_frozen_base_keeps_its_weights_and_no_gradient_or_optimizer_state(tmp_path):
    full = memory.estimate(_load(tmp_path, DENSE)).ranks[0].static
    w = _load(tmp_path, DENSE + LORA)
    peft = memory.estimate(w).ranks[0].static
    assert peft["weights"] == full["weights"]                       # the base is still there, 16-bit
    adapters = peft["lora_adapters"] / 2
    assert adapters > 0
    assert peft["grads"] == round(adapters * 4)                     # grad_reduce_in_fp32: fp32 buffers
    assert peft["optimizer"] == round(adapters * 12)                # master copy + two moments, unsharded
    assert full["grads"] > 50 * peft["grads"] and full["optimizer"] > 50 * peft["optimizer"]


def test_an_adapter_holds_in_plus_out_times_the_rank_split_over_tp(tmp_path):
    w = _load(tmp_path, DENSE + LORA)
    sh = shape_of(w)
    h, a, g, d, f, r, t = 1024, 16, 4, 64, 2816, 16, 2
    per_layer = ((h + (a + 2 * g) * d) + (a * d + h) + (h + 2 * f) + (f + h)) * r / t
    assert lora.layer_adapter_params(sh, "attn+mlp") == (per_layer, 0.0)
    assert memory.estimate(w).ranks[0].static["lora_adapters"] == round(4 * per_layer * 2)


def test_grouped_experts_share_one_adapter_per_ep_rank(tmp_path):
    w = _load(tmp_path, MOE + LORA)
    sh = shape_of(w)
    h, f_e, r = 1024, 512, 16
    dense, expert = lora.layer_adapter_params(sh, "attn+moe")
    assert expert == (h + 2 * f_e) * r + (f_e + h) * r               # one fc1 and one fc2 adapter
    apart = _load(tmp_path, MOE + LORA + "  share_expert_adapters: false\n")
    assert lora.layer_adapter_params(shape_of(apart), "attn+moe")[1] == expert * 8 / 2   # per local expert
    normalized = _load(tmp_path, MOE + LORA + "  normalize_moe_lora: true\n")
    assert lora.layer_adapter_params(shape_of(normalized), "attn+moe")[1] == expert / 2  # rank 16 // top-2


def test_each_adapter_keeps_its_rank_wide_intermediate(tmp_path):
    w = _load(tmp_path, DENSE + LORA)
    sh = shape_of(w)
    kept = {x.name: x.nbytes for x in layer_tensors(sh, "attn+mlp", frozenset())
            if x.component == "lora"}
    assert len(kept) == 4 and all(v == 2 * 16 * 2048 for v in kept.values())     # bf16 x r x tokens


SP = DENSE.replace("  tensor_model_parallel_size: 2\n",
                   "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n")


def test_under_sequence_parallelism_lora_a_keeps_the_gathered_input_unless_it_regathers(tmp_path):
    gathered = [x for x in layer_tensors(shape_of(_load(tmp_path, SP + LORA)), "attn+mlp", frozenset())
                if "gathered" in x.name]
    assert sorted(x.name.split(":")[0] for x in gathered) == ["LoRA linear_fc1", "LoRA linear_qkv"]
    assert all(x.nbytes == 2 * 1024 * 2048 for x in gathered)            # full sequence, not /TP
    again = _load(tmp_path, SP + LORA + "  sequence_parallel_input_regather: true\n")
    shards = [x for x in layer_tensors(shape_of(again), "attn+mlp", frozenset())
              if "sequence shard" in x.name]
    assert all(x.nbytes == 2 * 1024 * 2048 / 2 for x in shards) and len(shards) == 2


def test_lora_dropout_keeps_a_mask_and_the_dropped_input(tmp_path):
    w = _load(tmp_path, DENSE + LORA + "  dropout: 0.1\n")
    kept = [x for x in layer_tensors(shape_of(w), "attn+mlp", frozenset())
            if x.component == "lora" and "dropout" in x.name]
    assert len(kept) == 4
    qkv = next(x for x in kept if x.name.startswith("LoRA linear_qkv"))
    assert qkv.nbytes == (1 + 2) * 1024 * 2048


def test_an_mlp_recompute_replays_the_mlp_adapters_too(tmp_path):
    sh = shape_of(_load(tmp_path, DENSE + LORA))
    kept = {x.name for x in layer_tensors(sh, "attn+mlp", frozenset({"mlp"}))
            if x.component == "lora"}
    assert kept == {"LoRA linear_qkv: lora_B input (r = 16)", "LoRA linear_proj: lora_B input (r = 16)"}


def test_the_plan_says_first_that_the_base_is_frozen(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(DENSE + LORA)
    proc = run_script("plan", path, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = json.loads(proc.stdout)["workload"]["input_notes"]
    assert notes[0].startswith("LoRA rank 16 on linear_fc1, linear_fc2, linear_proj, linear_qkv: the base")


def test_a_peft_scheme_that_is_not_lora_is_said_first_as_full_fine_tuning(tmp_path):
    w = _load(tmp_path, DENSE + "peft:\n  _target_: megatron.bridge.peft.canonical_lora.CanonicalLoRA\n")
    assert w.peft is None
    assert w.input_notes[0].startswith(
        "PEFT megatron.bridge.peft.canonical_lora.CanonicalLoRA is not modelled")


@pytest.mark.parametrize("extra, field", [("  dim: 0\n", "peft.dim"), ("  dropout: 2\n", "peft.dropout"),
                                          ("  target_modules: linear_qkv\n", "peft.target_modules"),
                                          ("  dropout_position: middle\n", "peft.dropout_position")])
def test_a_bad_peft_value_is_exit_2_naming_it(tmp_path, extra, field):
    with pytest.raises(InputError) as exc:
        _load(tmp_path, DENSE + LORA.replace("  dim: 16\n", "").replace(
            "  target_modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]\n", "") + extra)
    assert exc.value.field == field
