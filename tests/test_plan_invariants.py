"""The report invariants (plan/invariants.py) over generated workloads, the metamorphic relations
of the model, and the cases that broke them.

Workloads are generated across the architectures and features the planner prices (dense GQA,
MoE with EP and shared experts, MLA, MTP, hybrid Mamba stacks, fine-grained offloading, CUDA
graphs, uneven and interleaved layouts); every plan must come back with its invariants held
(`planner.plan` checks them before returning) or be refused for a reason that is not one.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mbridge_recompute import memory
from mbridge_recompute.errors import Rejected
from mbridge_recompute.plan import invariants
from mbridge_recompute.plan.invariants import INVARIANTS, InvariantViolation
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.setting import RecomputeSetting
from mbridge_recompute.workload import Workload

from conftest import EXAMPLES, run_script

BOUNDED = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OFFLOADABLE = ["core_attn", "attn_proj", "expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear"]


@st.composite
def workloads(draw, fused_attention: bool = False):
    arch = draw(st.sampled_from(["dense", "moe", "mla", "hybrid"]))
    t = draw(st.sampled_from([1, 2, 4]))
    heads = draw(st.sampled_from([8, 16]))
    hidden = heads * 64
    kw = dict(hidden_size=hidden, num_attention_heads=heads, kv_channels=64,
              num_query_groups=draw(st.sampled_from([g for g in (2, 4, 8) if heads % g == 0 and g % t == 0]
                                                    or [heads])),
              ffn_hidden_size=hidden * draw(st.sampled_from([2, 4])),
              gated_linear_unit=draw(st.booleans()), activation_func="silu",
              normalization=draw(st.sampled_from(["RMSNorm", "LayerNorm"])), add_bias_linear=False,
              seq_length=draw(st.sampled_from([1024, 2048, 4096])), vocab_size=8192,
              attention_dropout=0.0 if fused_attention else draw(st.sampled_from([0.0, 0.1])),
              hidden_dropout=draw(st.sampled_from([0.0, 0.1])), bf16=True,
              tensor_model_parallel_size=t, sequence_parallel=t > 1 and draw(st.booleans()),
              micro_batch_size=draw(st.sampled_from([1, 2])),
              use_distributed_optimizer=draw(st.booleans()))
    if fused_attention:
        kw["transformer_impl"] = "transformer_engine"
    else:
        kw["transformer_impl"] = draw(st.sampled_from(["transformer_engine", "local"]))
    p = draw(st.sampled_from([1, 2, 4]))
    v = draw(st.sampled_from([1, 2])) if p > 1 and arch != "hybrid" else 1
    layers = p * v * draw(st.integers(1, 3))
    if arch in ("moe", "mla"):
        ep = draw(st.sampled_from([1, 2, 4]))
        kw.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=hidden // 2,
                  moe_shared_expert_intermediate_size=draw(st.sampled_from([None, hidden])),
                  moe_grouped_gemm=True, expert_model_parallel_size=ep,
                  moe_token_dispatcher_type="alltoall", sequence_parallel=t > 1)
    if arch == "mla":
        kw.update(multi_latent_attention=True, q_lora_rank=draw(st.sampled_from([None, 256])),
                  kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)
    if arch == "hybrid":
        unit = draw(st.sampled_from(["M*M-", "M-M*", "ME*M"]))
        pattern = unit * (p * draw(st.integers(1, 2)))
        layers = len(pattern)
        kw.update(hybrid_override_pattern=pattern, position_embedding_type="none",
                  extra_model={"mamba_num_heads": heads, "mamba_head_dim": 64,
                               "mamba_state_dim": 64, "mamba_num_groups": 2})
        if "E" in pattern:
            kw.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=hidden // 2,
                      moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall")
    if arch != "hybrid" and draw(st.booleans()):
        kw["mtp_num_layers"] = 1
    if arch != "hybrid" and p > 2 and v == 1 and draw(st.booleans()):
        middle = (layers - 2) // (p - 2) if (layers - 2) % (p - 2) == 0 else None
        if middle:
            kw.update(num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1)
    if draw(st.booleans()):
        kw.update(fine_grained_activation_offloading=True,
                  offload_modules=draw(st.lists(st.sampled_from(OFFLOADABLE), min_size=1, max_size=3,
                                                unique=True)))
    if draw(st.integers(0, 4)) == 0:
        kw.update(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = kw.get("expert_model_parallel_size", 1)
    gpus = t * p * dp
    assume(gpus % (p * ep) == 0)
    kw.update(num_layers=layers, pipeline_model_parallel_size=p,
              virtual_pipeline_model_parallel_size=v if v > 1 else None, num_gpus=gpus,
              global_batch_size=kw["micro_batch_size"] * dp * draw(st.sampled_from([1, 2, 4, 8])),
              recompute_granularity=draw(st.sampled_from([None, "selective", "full"])))
    if kw["recompute_granularity"] == "selective":
        kw["recompute_modules"] = draw(st.sampled_from([[], ["core_attn"], ["mlp"], ["moe_act"],
                                                        ["layernorm", "moe_act"]]))
    elif kw["recompute_granularity"] == "full":
        kw.update(recompute_method=draw(st.sampled_from(["uniform", "block"])), recompute_num_layers=1)
    return Workload(**kw)


def _plan(w, **options):
    """A plan, or None when megatron-core-level input rules refuse it (not an invariant)."""
    try:
        return plan(w, **options)
    except InvariantViolation:
        raise
    except Rejected:          # a calibration refused for its reason: not an invariant
        return None


@BOUNDED
@given(workloads())
def test_every_generated_plan_holds_the_invariants(w):
    report = _plan(w)
    invariants.check(report)            # plan() checked it already; check the returned object too
    r = report.to_dict()
    for c in r["candidates"]:
        assert c["replay_pct"] >= 0 and c["offload_pct"] >= 0 and c["host_bytes"] >= 0


@BOUNDED
@given(workloads(), st.floats(0.9, 1.4))
def test_a_calibrated_plan_holds_the_invariants_or_is_refused_with_its_reason(w, factor):
    base = plan(w)
    if base.current is None:
        return
    hot = base.current.hottest_pp_rank
    residual = base.estimate.ranks[hot].static["residual"]
    measured = (base.current.rank_peaks[hot] - residual) * factor / 1e9
    try:
        r = plan(w, measured_peak_gb=measured).to_dict()
    except InvariantViolation:
        raise
    except Rejected as e:
        assert e.field == "--measured-peak-gb" and ("static" in e.reason)
        return
    cal = r["calibration"]
    assert cal["offset_bytes"] == cal["measured_allocated_bytes"] - cal["predicted_allocated_bytes"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_alternatives_and_free_gb_plans_hold_the_invariants(w):
    report = _plan(w, alternatives=True, free_gb=0.5)
    if report is None:
        return
    for row in report.side_by_side:
        assert row["frees_bytes"] == report.current.peak_bytes - row["peak_bytes"]


# --- metamorphic relations --------------------------------------------------------------

def _activations(w) -> list:
    return [r.activation_bytes for r in memory.estimate(w).ranks]


@BOUNDED
@given(workloads(fused_attention=True))
def test_doubling_the_sequence_roughly_doubles_the_activations(w):
    """Under fused attention nothing is quadratic in the sequence: every saved tensor is per
    token, so twice the tokens keep about twice the bytes (constant-size tensors aside).
    Without offloading, whose 1M-element threshold moves tensors off the GPU as they grow."""
    assume(w.seq_length <= 2048)
    w = w.replace(attention_backend="fused", fine_grained_activation_offloading=False)
    for a, b in zip(_activations(w), _activations(w.replace(seq_length=2 * w.seq_length))):
        assert 1.9 * a <= b <= 2.1 * a


@BOUNDED
@given(workloads(), st.sampled_from(["core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp",
                                     "moe", "shared_experts"]),
       st.sampled_from([(), ("moe_act",), ("layernorm",), ("mlp",), ("core_attn",)]))
def test_a_label_never_makes_the_replay_cost_negative_or_smaller(w, label, have):
    before = RecomputeSetting.selective(*have).apply(w)
    after = RecomputeSetting.selective(*sorted(set(have) | {label})).apply(w)
    a, b = memory.replay_cost_pct(before), memory.replay_cost_pct(after)
    assert a >= 0 and b >= a - 1e-9


@BOUNDED
@given(workloads())
def test_doubling_pp_at_fixed_gpus_never_raises_per_rank_static_without_the_distributed_optimizer(w):
    """Half the layers per rank, the same data-parallel sharding of nothing: weights, gradients
    and optimizer state of each rank shrink or stay. Two exceptions are upstream behaviour and
    have tests of their own below: the distributed optimizer (the data-parallel size halves) and
    MTP with tied embeddings (the MTP stage's own embedding copy)."""
    w = w.replace(use_distributed_optimizer=False, mtp_num_layers=None,
                  num_layers_in_first_pipeline_stage=None,
                  num_layers_in_last_pipeline_stage=None, virtual_pipeline_model_parallel_size=None,
                  hybrid_override_pattern=None, fine_grained_activation_offloading=False)
    dp = w.data_parallel_size
    assume(dp % 2 == 0 and w.num_layers % (2 * w.pipeline_model_parallel_size) == 0)
    assume(w.num_gpus % (2 * w.pipeline_model_parallel_size * w.expert_model_parallel_size) == 0)
    twice = w.replace(pipeline_model_parallel_size=2 * w.pipeline_model_parallel_size)
    before = max(r.static_bytes for r in memory.estimate(w).ranks)
    after = max(r.static_bytes for r in memory.estimate(twice).ranks)
    assert after <= before


def test_doubling_pp_raises_the_first_ranks_static_when_the_distributed_optimizer_shards_a_large_embedding():
    """The relation has an exception the model keeps: the distributed optimizer shards
    optimizer state over the data-parallel ranks, which halve when PP doubles at a fixed GPU
    count. A rank's layers halve too (their state per rank stays the same), but the embedding
    on the first rank does not, so its optimizer share doubles: with a vocabulary much larger
    than a stage's layers, rank 0's static memory grows."""
    w = Workload(num_layers=4, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                 vocab_size=256000, share_embeddings_and_output_weights=True, bf16=True,
                 pipeline_model_parallel_size=1, num_gpus=4, global_batch_size=8,
                 use_distributed_optimizer=True)
    twice = w.replace(pipeline_model_parallel_size=2)
    assert memory.estimate(twice).ranks[0].static_bytes > memory.estimate(w).ranks[0].static_bytes
    off = w.replace(use_distributed_optimizer=False)
    assert memory.estimate(off.replace(pipeline_model_parallel_size=2)).ranks[0].static_bytes < \
        memory.estimate(off).ranks[0].static_bytes


def test_doubling_pp_gives_a_tied_mtp_model_a_second_embedding_copy_on_its_last_stage():
    """With MTP on the last stage and tied embeddings, that stage builds the MTP's embedding
    (gpt_model.py:167 @ core_v0.19.0) and its output layer allocates a weight of its own
    (skip_weight_param_allocation only on the first stage, :281-282): at PP 1 there is one
    [V, h] tensor, at PP 2 the last stage holds two."""
    w = Workload(num_layers=2, hidden_size=512, num_attention_heads=8, vocab_size=128000,
                 share_embeddings_and_output_weights=True, mtp_num_layers=1, bf16=True,
                 pipeline_model_parallel_size=1, num_gpus=2, global_batch_size=4)
    one = memory.estimate(w).ranks[0]
    last = memory.estimate(w.replace(pipeline_model_parallel_size=2)).ranks[-1]
    assert last.static_bytes > one.static_bytes


# --- cases ---------------------------------------------------------------------------------

def test_the_invariants_are_listed_once_with_a_statement_each():
    assert len(INVARIANTS) >= 10 and all(isinstance(s, str) and len(s) > 20 for s in INVARIANTS.values())
    for name in ("peak-above-static", "terms-non-negative", "label-saving-within-tensors",
                 "negative-saving-has-cause", "costs-non-negative", "finite", "frees-is-peak-difference"):
        assert name in INVARIANTS


def test_a_report_that_breaks_an_invariant_is_refused_naming_it(monkeypatch):
    """Forge a broken figure after planning: the checker refuses it with exit 1 and the
    invariant's name, instead of letting it be printed."""
    report = plan(Workload(num_layers=2, hidden_size=512, num_attention_heads=8, bf16=True))
    report.labels[0].cost_pct = -21.24
    with pytest.raises(InvariantViolation) as exc:
        invariants.check(report)
    assert exc.value.exit_code == 1 and exc.value.field == "invariant costs-non-negative"
    report.labels[0].cost_pct = 0.0
    report.candidates[0].rank_peaks = tuple(float("nan") for _ in report.candidates[0].rank_peaks)
    with pytest.raises(InvariantViolation) as exc:
        invariants.check(report)
    assert exc.value.invariant == "finite"


def test_offloading_replay_cost_is_never_negative_and_copy_time_is_its_own_column():
    """Moonlight with moe_act and expert_fc1 offloaded printed 'replay cost -21.24 %' style
    figures (recomputing an offloaded module saved its copies, netted into the replay)."""
    p = run_script("plan", str(EXAMPLES / "moonlight_16b.yaml"), "--set",
                   "model.fine_grained_activation_offloading=true", "--set",
                   "model.offload_modules=[moe_act,expert_fc1]", "--json")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    assert all(e["cost_pct"] >= 0 for e in r["labels"])
    assert all(c["replay_pct"] >= 0 and c["offload_pct"] >= 0 for c in r["candidates"])
    cur = r["current"]
    assert cur["offload_pct"] > 0 and cur["host_bytes"] > 0 and cur["replay_pct"] == 0
    assert all(v >= 0 for rank in r["ranks"] for v in rank["activations"].values())
    moe = next(c for c in r["candidates"] if c["name"] == "moe")
    assert moe["offload_pct"] < cur["offload_pct"] and moe["replay_pct"] > 0
    text = run_script("plan", str(EXAMPLES / "moonlight_16b.yaml"), "--set",
                      "model.fine_grained_activation_offloading=true", "--set",
                      "model.offload_modules=[moe_act,expert_fc1]").stdout
    assert "replay cost -" not in text and "offload copies" in text
    alt = json.loads(run_script("plan", str(EXAMPLES / "moonlight_16b.yaml"), "--set",
                                "model.fine_grained_activation_offloading=true", "--set",
                                "model.offload_modules=[moe_act,expert_fc1]", "--alternatives",
                                "--json").stdout)
    # the alternatives rows were at -30 %: the offload copies a recomputed module no longer makes
    assert alt["alternatives"] and all(a["replay_pct"] >= 0 and a["offload_pct"] >= 0
                                       for a in alt["alternatives"])
    assert all(a["cost_pct"] >= 0 for a in alt["alternatives"] if not a["kind"].startswith(("vpp", "cp")))


def test_core_attn_adds_memory_under_te_fused_attention_and_says_why():
    """The embedded Llama3 70B workload: core_attn's checkpoint pins the fused QKV buffer, a
    negative saving with its cause named."""
    p = run_script("plan", "--json")
    r = json.loads(p.stdout)
    core = next(e for e in r["labels"] if e["label"] == "core_attn")
    assert core["saving_bytes"] < 0 and "fused QKV buffer pinned" in core["adds_memory_because"]
    others = [e for e in r["labels"] if e["applicable"] and e["saving_bytes"] >= 0
              and min(e["rank_saving_bytes"]) >= 0]
    assert all(not e["adds_memory_because"] for e in others)


def test_alternatives_frees_is_for_the_stated_option_not_instead_of_the_current_labels():
    """Each alone on the current setting showed 'layernorm ... frees -23.45 GB' for layernorm
    in place of the current labels; a label row now adds the label to them and says so."""
    current = ["--set", "model.recompute_granularity=selective", "--set",
               "model.recompute_modules=[moe_act,mla_up_proj]"]
    p = run_script("plan", "--model", "deepseek-v3", *current, "--alternatives", "--json")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    cur = r["current"]
    for row in r["alternatives"]:
        assert row["frees_bytes"] == cur["peak_bytes"] - row["peak_bytes"]
        if row["kind"] == "recompute" and row["name"] not in ("block:1", "uniform:1"):
            assert row["relation"] == "added to the current labels"
            assert {"moe_act", "mla_up_proj"} <= set(row["name"].split(","))
            if "core_attn" not in row["name"]:         # the others only discard tensors
                assert row["frees_bytes"] >= 0, row
    assert any(row["relation"] == "added to the current labels" for row in r["alternatives"])
    text = run_script("plan", "--model", "deepseek-v3", *current, "--alternatives").stdout
    assert "peak(current) - peak(option)" in text
