"""Layer placement: one function (placement.place) places layers on pipeline stages and model
chunks for the checker, the memory model and the planner, and rejects the splits
Megatron-Core rejects, with its message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_recompute.facts import card
from mbridge_recompute.memory import estimate
from mbridge_recompute.placement import place
from mbridge_recompute.plan import planner, search
from mbridge_recompute.rules import check_workload
from mbridge_recompute.workload import Workload


def shape(**kw) -> Workload:
    base = dict(num_layers=8, hidden_size=256, num_attention_heads=4, seq_length=256,
                vocab_size=1024, bf16=True, attention_dropout=0.0, hidden_dropout=0.0)
    base.update(kw)
    return Workload(**base)


def errors(w, version="0.16.1") -> dict:
    report = check_workload(w, validator="builtin", version=version)
    return {f["id"]: f for f in report["findings"] if f["severity"] == "error"}


def test_layers_are_laid_out_by_virtual_stage():
    """Virtual stage j*p + r is rank r's chunk j: with 8 layers, p 2, v 2, rank 0 holds
    layers 0-1 and 4-5 (transformer_layer.py get_transformer_layer_offset @ core_v0.16.1)."""
    w = shape(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    kinds = [f"L{i}" for i in range(8)]
    w.layer_kinds = lambda: kinds          # label the layers to follow them
    pl = place(w)
    assert [list(c) for c in pl.chunks[0]] == [["L0", "L1"], ["L4", "L5"]]
    assert [list(c) for c in pl.chunks[1]] == [["L2", "L3"], ["L6", "L7"]]


def test_uneven_first_and_last_stage_layer_counts():
    pl = place(shape(num_layers=30, pipeline_model_parallel_size=4,
                     num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=6))
    assert pl.ok and pl.stage_layers == [6, 9, 9, 6]


def test_uneven_stages_with_vpp_split_each_stage_over_its_chunks():
    pl = place(shape(num_layers=20, pipeline_model_parallel_size=3, virtual_pipeline_model_parallel_size=2,
                     num_layers_in_first_pipeline_stage=4, num_layers_in_last_pipeline_stage=4))
    assert pl.ok and pl.stage_layers == [4, 12, 4] and pl.chunk_sizes == [2, 2, 6, 6, 2, 2]


def test_without_pipeline_parallelism_there_is_one_chunk():
    pl = place(shape(virtual_pipeline_model_parallel_size=2))
    assert pl.chunks and len(pl.chunks) == 1 and pl.chunk_sizes == [8]


def test_last_stage_whose_middle_remainder_does_not_divide_is_rejected_with_mcores_message():
    """32 layers, PP 4, last stage 6: 26 layers for 3 middle stages (tc:1412-1418 @ core_v0.16.1).
    One answer everywhere: rejected, nothing placed, nothing lost."""
    w = shape(num_layers=32, pipeline_model_parallel_size=4, num_layers_in_last_pipeline_stage=6)
    pl = place(w)
    assert not pl.ok and pl.chunks == () and [p.cid for p in pl.problems] == ["uneven-middle-not-divisible"]
    f = errors(w)["uneven-middle-not-divisible"]
    assert f["upstream_message"] == card.constraint("uneven-middle-not-divisible")["message"]
    assert "must be divisible by" in f["upstream_message"] and "26 middle layers" in f["message"]
    assert planner.plan(w, version="0.16.1").to_dict()["fits"] is False


def test_first_stage_not_divisible_by_vpp_is_rejected():
    """80 layers, PP 4, VPP 5, first = last = 17: 17 is not a multiple of 5 (tc:1371-1381)."""
    w = shape(num_layers=80, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=5,
              num_layers_in_first_pipeline_stage=17, num_layers_in_last_pipeline_stage=17)
    assert [p.cid for p in place(w).problems] == ["uneven-first-stage-not-divisible-by-vpp"]
    assert set(errors(w)) >= {"uneven-first-stage-not-divisible-by-vpp"}


def test_first_stage_of_zero_or_fewer_layers_is_rejected_even_without_pipeline_parallelism():
    for n in (0, -3):
        w = shape(num_layers_in_first_pipeline_stage=n)
        assert "uneven-first-stage-not-positive" in errors(w)


def test_even_split_that_pp_does_not_divide_is_rejected():
    w = shape(num_layers=14, pipeline_model_parallel_size=4)
    assert "pp-does-not-divide-layers" in errors(w)
    assert "pp-does-not-divide-layers" in errors(w, version="main")


def test_hybrid_stacks_drop_the_remainder_and_reject_interleaving_on_0_16_1():
    hybrid = dict(hybrid_override_pattern="M*M-M*M-M", num_layers=9)
    assert "hybrid-pp-drops-layers" in errors(shape(**hybrid, pipeline_model_parallel_size=2))
    assert "hybrid-no-interleaving" in errors(shape(**hybrid, num_layers_in_first_pipeline_stage=None,
                                                    pipeline_model_parallel_size=3,
                                                    virtual_pipeline_model_parallel_size=3))


@st.composite
def splits(draw):
    p = draw(st.integers(1, 6))
    v = draw(st.sampled_from([None, 1, 2, 3]))
    n = draw(st.integers(1, 48))
    first = draw(st.one_of(st.none(), st.integers(-2, 12)))
    last = draw(st.one_of(st.none(), st.integers(-2, 12)))
    emb, loss = draw(st.booleans()), draw(st.booleans())
    return shape(num_layers=n, pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v,
                 num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                 extra_model={"account_for_embedding_in_pipeline_split": emb,
                              "account_for_loss_in_pipeline_split": loss})


@settings(max_examples=300, deadline=None)
@given(splits())
def test_every_accepted_split_places_exactly_num_layers_and_all_consumers_agree(w):
    pl = place(w)
    errs = errors(w)
    rejected = {p.cid for p in pl.problems}
    assert rejected <= set(errs)                       # the checker reports every rejection
    if not pl.ok:
        return
    assert sum(pl.chunk_sizes) == w.num_layers and min(pl.chunk_sizes) >= 0
    assert len(pl.chunks) == w.pipeline_model_parallel_size
    # the planner's candidates are sized against the same chunks
    blocks = [s.num_layers for s in search.full_settings(w, "0.16.1") if s.method == "block"]
    assert max(blocks) == max(pl.chunk_sizes, default=0) or not blocks
    # the memory model holds the same layers on every rank
    est = estimate(w)
    assert [r.layers for r in est.ranks] == pl.stage_layers


def test_a_split_megatron_core_rejects_is_exit_1_with_the_finding_not_unusable_input(run_tool):
    p = run_tool("check", "--validator", "builtin", "--mcore-version", "0.16.1",
                 "--set", "model.num_layers=81")
    assert p.returncode == 1 and "pp-does-not-divide-layers" in p.stdout
    p = run_tool("plan", "--mcore-version", "0.16.1", "--set", "model.num_layers=81", "--json")
    import json
    r = json.loads(p.stdout)
    assert p.returncode == 1 and r["recommendation"] is None and "pipeline split" in r["diagnosis"]
    assert any(f["id"] == "pp-does-not-divide-layers" for f in r["workload_findings"])


# --- hybrid stacks from 0.17: '|' separators are the stages ----------------------------------
def _hybrid(pattern, **kw):
    from mbridge_recompute.workload import Workload

    return Workload(num_layers=len(pattern.replace("|", "")), hybrid_override_pattern=pattern, **kw)


def test_hybrid_pipes_are_the_stages_from_0_17():
    from mbridge_recompute.placement import place

    pl = place(_hybrid("M*M-|M*M-|MM|**", pipeline_model_parallel_size=2,
                       virtual_pipeline_model_parallel_size=2), "0.19")
    assert pl.ok and [[len(c) for c in r] for r in pl.chunks] == [[4, 2], [4, 2]]
    assert pl.chunks[1][1] == ("attn", "attn")            # segment 3 = rank 1, chunk 1


@pytest.mark.parametrize("pattern, kw, cid", [
    ("M*M-|M*M-", {"num_layers_in_first_pipeline_stage": 4}, "hybrid-pipes-with-uneven-stages"),
    ("M*M-M*M-", {"virtual_pipeline_model_parallel_size": 2}, "hybrid-vpp-needs-pipes"),
    ("M*M-M*M-M", {}, "hybrid-pp-does-not-divide-layers"),
    ("M*M|-M*|M-", {}, "hybrid-segments-not-divisible-by-pp"),
    ("M*M-|M*M-", {"virtual_pipeline_model_parallel_size": 2}, "hybrid-segment-out-of-range"),
    ("M*M-|M*M-|MM|**", {}, "hybrid-segments-beyond-vpp"),
])
def test_hybrid_splits_megatron_core_rejects_from_0_17(pattern, kw, cid):
    from mbridge_recompute.placement import place

    w = _hybrid(pattern, pipeline_model_parallel_size=2, **kw)
    assert [p.cid for p in place(w, "0.17").problems] == [cid]


def test_hybrid_uneven_counts_without_pipes_from_0_17():
    from mbridge_recompute.placement import place

    w = _hybrid("M*M-M*M-M*", pipeline_model_parallel_size=3, num_layers_in_first_pipeline_stage=2)
    pl = place(w, "0.18")
    assert pl.ok and pl.stage_layers == [2, 4, 4]
    bad = _hybrid("M*M-M*M-M", pipeline_model_parallel_size=3, num_layers_in_first_pipeline_stage=2)
    assert [p.cid for p in place(bad, "0.18").problems] == ["hybrid-uneven-middle-not-divisible"]


def test_an_odd_hybrid_split_drops_layers_on_0_16_and_raises_from_0_17():
    from mbridge_recompute.placement import place

    w = _hybrid("M*M-M*M", pipeline_model_parallel_size=2)
    assert [p.cid for p in place(w, "0.16").problems] == ["hybrid-pp-drops-layers"]
    assert [p.cid for p in place(w, "0.17").problems] == ["hybrid-pp-does-not-divide-layers"]


def test_a_megatron_lm_argument_list_derives_vpp_from_the_hybrid_segments():
    from mbridge_recompute.inputs import mlm_args

    spec = ["--num-layers", "12", "--hidden-size", "512", "--num-attention-heads", "8",
            "--pipeline-model-parallel-size", "2", "--hybrid-layer-pattern", "M*M-|M*M-|MM|**"]
    assert mlm_args.sections(spec, "0.19")["model"]["virtual_pipeline_model_parallel_size"] == 2


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.one_of(st.none(), st.integers(1, 16)),
       st.one_of(st.none(), st.integers(1, 16)))
def test_uneven_split_fixes_the_ends_and_spreads_the_rest_over_the_middle(n, p, first, last):
    """Invariant of the one uneven first/last split (placement.uneven_split): the fixed counts
    sit on the first and last rank, the middle stages share what is left, and a split whose
    middle divides places every layer exactly once."""
    from mbridge_recompute.placement import uneven_split

    split = uneven_split(n, p, first, last)
    given_counts = [x for x in (first, last) if x is not None]
    assert split.middle_layers == n - sum(given_counts)
    assert split.middle_stages == p - len(given_counts)
    if p > 1 and split.middle_stages >= 0 and split.middle_layers >= 0 and (
            split.middle_stages == 0 and split.middle_layers == 0
            or split.middle_stages and split.middle_layers % split.middle_stages == 0):
        stages = split.stages(p)
        assert sum(stages) == n and len(stages) == p
        assert first is None or stages[0] == first
        assert last is None or stages[-1] == last
        w = shape(num_layers=n, pipeline_model_parallel_size=p, num_layers_in_first_pipeline_stage=first,
                  num_layers_in_last_pipeline_stage=last)
        pl = place(w, "0.16.1")
        if pl.ok:
            assert pl.stage_layers == stages
