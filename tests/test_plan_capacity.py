"""The budget is cut from what PyTorch reports for the GPU (the card's `gpus:` section), and the
plan says which figure it used."""

from __future__ import annotations

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.plan.capacity import capacity, table
from mbridge_recompute.plan.planner import plan
from mbridge_recompute.units import GIB
from mbridge_recompute.workload import Workload


def test_the_capacity_table_cites_a_source_for_every_gpu():
    for name, e in table().items():
        # PyTorch reports fewer GiB than the marketed size (which is GB or, for B200, GiB)
        assert e["source"] and 0 < e["total_gib"] < e["marketed_gb"], name


def test_an_80gb_gpu_is_what_pytorch_reports_for_an_h100_not_80_decimal_gb():
    cap = capacity(Workload(gpu_memory_gb=80))
    assert cap.bytes == int(79.11 * GIB)
    assert "79.11 GiB" in cap.how and "84.94 GB" in cap.how


def test_gpu_name_and_gib_take_precedence_in_that_order():
    assert capacity(Workload(gpu="H200")).bytes == int(139.80 * GIB)
    assert capacity(Workload(gpu="nvidia_h100_sxm")).bytes == int(79.11 * GIB)
    assert capacity(Workload(gpu="h200", gpu_memory_gib=139.5)).bytes == int(139.5 * GIB)


def test_a_size_no_gpu_has_stays_decimal_gb():
    cap = capacity(Workload(gpu_memory_gb=76))
    assert cap.bytes == int(76e9) and "decimal GB" in cap.how


def test_an_unknown_gpu_is_bad_input_naming_the_field():
    with pytest.raises(InputError) as e:
        capacity(Workload(gpu="h900"))
    assert e.value.field == "cluster.gpu"


def test_the_plan_states_the_capacity_it_used():
    r = plan(Workload(num_layers=2, bf16=True, gpu="b200")).to_dict()
    assert r["workload"]["gpu_capacity_bytes"] == int(178.35 * GIB)
    assert any("178.35 GiB" in a for a in r["assumptions"])
