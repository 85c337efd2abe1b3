"""Pipeline schedules (in-flight micro-batches) and full recompute per model chunk."""

from __future__ import annotations

import pytest

from mbridge_recompute.memory import estimate
from mbridge_recompute.memory.schedule import inflight_vectors
from mbridge_recompute.memory.shape import shape_of
from mbridge_recompute.memory.tensors import layer_bytes
from mbridge_recompute.memory.types import DEFAULT_KNOBS
from mbridge_recompute.workload import Workload


def dense(**kw) -> Workload:
    base = dict(num_layers=16, hidden_size=1024, num_attention_heads=16, num_query_groups=4,
                kv_channels=64, ffn_hidden_size=4096, gated_linear_unit=True,
                activation_func="silu", normalization="RMSNorm", add_bias_linear=False,
                seq_length=2048, vocab_size=32000, attention_dropout=0.0, hidden_dropout=0.0,
                tensor_model_parallel_size=2, sequence_parallel=True, bf16=True,
                micro_batch_size=1, global_batch_size=32,
                extra_model={"bias_activation_fusion": True, "deallocate_pipeline_outputs": True})
    base.update(kw)
    return Workload(**base)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_1f1b_keeps_p_minus_rank_microbatches_in_flight(p):
    """Warm-up p - rank - 1 forwards plus the first steady-state forward."""
    for rank in range(p):
        assert inflight_vectors(p, 1, 64, rank, p) == ((p - rank,),)


def test_1f1b_in_flight_is_capped_by_num_microbatches():
    assert inflight_vectors(8, 1, 3, 0, 8) == ((3,),)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 5), (8, 3)])
def test_interleaved_warmup_count_in_chunk_units(p, v):
    """2(p - rank - 1) + (v - 1) * group warm-up chunk forwards + 1 steady-state forward
    (schedules.py:773-774 @ core_v0.16.1), group = p by default."""
    M = 4 * p
    for rank in range(p):
        live = max(sum(vec) for vec in inflight_vectors(p, v, M, rank, p))
        assert live == 2 * (p - rank - 1) + (v - 1) * p + 1


def test_interleaved_warmup_is_capped_by_all_chunk_forwards():
    """When warm-up would exceed M*v chunk forwards, all of them are in flight."""
    assert inflight_vectors(4, 4, 1, 0, 4) == ((1, 1, 1, 1),)


def test_ep_overlap_warmup_forward_stands_in_for_the_steady_state_one():
    """EP overlap runs one more warm-up forward (schedules.py:775-779 @ core_v0.16.1) and then
    pairs every forward with a backward in one combined step (combined_1f1b.py:22-45): the
    most live forwards equal the plain schedule's warm-up + 1, reached by the warm-up itself."""
    plain = inflight_vectors(4, 2, 16, 0, 4, 0)
    overlap = inflight_vectors(4, 2, 16, 0, 4, 1)
    warm = 2 * (4 - 0 - 1) + (2 - 1) * 4
    assert max(sum(v) for v in plain) == warm + 1
    assert max(sum(v) for v in overlap) == warm + 1
    assert all(sum(v) <= warm + 1 for v in overlap)


def test_first_stage_holds_the_most_microbatches():
    est = estimate(dense(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2))
    counts = [r.in_flight_microbatches for r in est.ranks]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_embedding_on_first_stage_and_logits_on_last_stage():
    est = estimate(dense(pipeline_model_parallel_size=4))
    assert "embedding" in est.ranks[0].activations
    assert all("embedding" not in r.activations for r in est.ranks[1:])
    assert "logits" in est.ranks[-1].activations
    assert all("logits" not in r.activations for r in est.ranks[:-1])
    assert est.ranks[-1].transients["logits+cross-entropy (fp32) on the last stage"] > 0
    assert all("logits+cross-entropy (fp32) on the last stage" not in r.transients
               for r in est.ranks[:-1])


def test_logits_cross_entropy_keeps_fp32_softmax_per_microbatch():
    """Last stage (PP 1): 4 * V/t * T bytes of fp32 softmax for cross-entropy, V padded to
    a multiple of 128 * t (32000 -> 32000), plus its target mask and indices (9 T)."""
    w = dense()
    est = estimate(w)
    sh = shape_of(w, DEFAULT_KNOBS)
    final = 2 * sh.h * sh.Tr * 2 + 4 * sh.Tr      # final-norm input + output + rsigma
    assert est.ranks[0].activations["logits"] == 4 * 32000 // 2 * 2048 + final + 9 * 2048


# --- full recompute per chunk ------------------------------------------------------------

def _full(method, n, **kw):
    return dense(recompute_granularity="full", recompute_method=method, recompute_num_layers=n,
                 **kw)


def test_full_uniform_keeps_one_input_per_group_per_chunk():
    """PP 2, VPP 2: 16 layers -> 4 per chunk; uniform 2 -> 2 groups per chunk; the first stage
    holds 2(p-1) + (v-1)p + 1 = 5 chunk forwards -> 10 checkpoints of 2hTr, plus the fp32
    rotary frequencies [s, 1, 1, d] the checkpoints keep, one per chunk forward."""
    w = _full("uniform", 2, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    sh = shape_of(w, DEFAULT_KNOBS)
    est = estimate(w)
    freqs = 4 * 64 * 2048
    assert est.ranks[0].activations["checkpoints"] == 5 * (2 * 2 * sh.h * sh.Tr + freqs)


def test_full_block_larger_than_the_chunk_recomputes_every_layer():
    """recompute_num_layers applies per chunk; block n > chunk size = all layers of it."""
    a = estimate(_full("block", 99, pipeline_model_parallel_size=2,
                       virtual_pipeline_model_parallel_size=2))
    b = estimate(_full("block", 4, pipeline_model_parallel_size=2,
                       virtual_pipeline_model_parallel_size=2))
    assert a.ranks[0].activation_bytes == b.ranks[0].activation_bytes
    assert set(a.ranks[0].activations) <= {"checkpoints", "embedding"}


def test_full_block_keeps_full_activations_for_the_rest_of_the_chunk():
    """block 1 with 4 layers per chunk: 1 checkpoint (+ fp32 rotary frequencies) + 3 full
    layers per chunk forward."""
    w = _full("block", 1, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    sh = shape_of(w, DEFAULT_KNOBS)
    est = estimate(w)
    per_chunk = 2 * sh.h * sh.Tr + 4 * 64 * 2048 + 3 * layer_bytes(sh, "attn+mlp", frozenset())
    layer_part = sum(v for k, v in est.ranks[1].activations.items() if k != "logits")
    assert layer_part == 3 * per_chunk      # rank 1 (last): 2*0 + 1*2 + 1 = 3 chunk forwards


def test_uniform_replay_working_set_is_n_layers_block_is_one():
    """Backward replay: uniform n re-materialises n layers at once, block one layer."""
    sh = shape_of(dense(), DEFAULT_KNOBS)
    layer = layer_bytes(sh, "attn+mlp", frozenset())
    uni = estimate(_full("uniform", 4))
    blk = estimate(_full("block", 4))
    t_uni = [v for k, v in uni.ranks[0].transients.items() if "4 layers" in k]
    t_blk = [v for k, v in blk.ranks[0].transients.items() if "1 layer " in k]
    assert t_uni and t_blk
    assert t_uni[0] - t_blk[0] == 3 * layer


def test_distribute_saved_activations_shards_the_checkpoint_without_sp():
    """distribute_saved_activations (needs SP off) keeps 1/t of each checkpointed input."""
    w = _full("uniform", 1, sequence_parallel=False, distribute_saved_activations=True,
              position_embedding_type="learned_absolute")
    plain = w.replace(distribute_saved_activations=False)
    assert estimate(plain).ranks[0].activations["checkpoints"] == \
        2 * estimate(w).ranks[0].activations["checkpoints"]


def test_recompute_modules_are_ignored_under_full_granularity():
    a = estimate(_full("block", 2, recompute_modules=["mlp"]))
    b = estimate(_full("block", 2))
    assert a.ranks[0].activation_bytes == b.ranks[0].activation_bytes


def test_deallocate_pipeline_outputs_off_keeps_stage_outputs():
    """MCore's default deallocate_pipeline_outputs=False keeps [Tr, h] per in-flight
    micro-batch per chunk (Korthikanti et al. appendix B)."""
    on = dense(pipeline_model_parallel_size=4)
    off = on.replace(extra_model={"bias_activation_fusion": True})
    sh = shape_of(on, DEFAULT_KNOBS)
    est = estimate(off)
    assert est.ranks[0].activations["pipeline"] == 4 * 2 * sh.h * sh.Tr
    assert est.ranks[0].activation_bytes - estimate(on).ranks[0].activation_bytes == \
        4 * 2 * sh.h * sh.Tr
