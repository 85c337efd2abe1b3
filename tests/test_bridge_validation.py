"""Megatron Bridge's own validation: what Bridge 0.5 / 0.6 refuses or requires that megatron-core
accepts, checked by the built-in table and by Bridge itself.

The built-in rules (card constraints of kind `bridge`) are tested here directly. In the Bridge
0.6.2 environment (tests/bridge_env.py; Transformer Engine is its import-only stand-in) the real
ConfigContainer goes through Bridge's runtime_config_update and the model provider's checks for
every case of rules/bridge_differential.py, and the built-in verdict must be Bridge's; the same
run reads each message at the line the card cites in the installed Bridge.
"""

from __future__ import annotations

import json

import pytest
from bridge_env import hf_cache, run_in_bridge

from mbridge_recompute.facts import card
from mbridge_recompute.rules import builtin
from mbridge_recompute.workload import Workload

from conftest import ROOT, SCRIPTS

BASE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "bf16": True,
        "attention_dropout": 0.0, "hidden_dropout": 0.0}
BRIDGE_IDS = {c["id"] for c in card.constraints() if c["kind"] == "bridge"}


def found(version="0.19", **kw) -> dict:
    w = Workload(**{**BASE, **kw})
    return {f["id"]: f for f in builtin.check(w, version=version)["findings"] if f["kind"] == "bridge"}


# ------------------------------------------------------------------ the built-in table
def test_local_per_layer_cuda_graphs_are_a_bridge_0_6_error_though_megatron_core_accepts_them():
    f = found(cuda_graph_impl="local", cuda_graph_modules=["attn"], te_rng_tracker=True)
    hit = f["bridge-local-cuda-graph-needs-full-iteration"]
    assert hit["severity"] == "error" and hit["kind"] == "bridge"
    assert hit["upstream_message"].startswith(
        "Megatron Bridge supports model.cuda_graph_impl=\"local\" only for full-iteration CUDA graphs "
        "with scopes ['attn']")
    assert hit["citation"] == "bridge/utils/cuda_graph.py:134-153 @ megatron-bridge 0.6.2"
    # Bridge 0.5 (megatron-core 0.18) has no such check
    assert "bridge-local-cuda-graph-needs-full-iteration" not in found(
        "0.18", cuda_graph_impl="local", cuda_graph_scope=["attn"], te_rng_tracker=True)
    # full-iteration capture through local graphs is what Bridge takes
    assert "bridge-local-cuda-graph-needs-full-iteration" not in found(
        cuda_graph_impl="local", cuda_graph_scope=["full_iteration"], check_for_nan_in_loss=False,
        te_rng_tracker=True)


@pytest.mark.parametrize("version, bridge", [("0.18", "v0.5.1"), ("0.19", "0.6.2")])
def test_full_iteration_graphs_with_the_nan_check_are_refused_by_bridge_0_5_and_0_6(version, bridge):
    hit = found(version, cuda_graph_impl="full_iteration", check_for_nan_in_loss=True,
                te_rng_tracker=True)["bridge-full-iteration-graph-with-nan-check"]
    assert hit["severity"] == "error" and hit["citation"].endswith(f"@ megatron-bridge {bridge}")
    unstated = found(version, cuda_graph_impl="full_iteration", te_rng_tracker=True)
    assert unstated["bridge-full-iteration-graph-with-nan-check"]["severity"] == "warning"
    assert "bridge-full-iteration-graph-with-nan-check" not in found(
        version, cuda_graph_impl="full_iteration", check_for_nan_in_loss=False, te_rng_tracker=True)


def test_fine_grained_offloading_with_newer_transformer_engine_needs_nvte_cpu_offload_v1():
    fg = {"fine_grained_activation_offloading": True, "offload_modules": ["core_attn"]}
    hit = found(**fg, te_version="2.17.1")["bridge-fine-grained-offloading-needs-nvte-cpu-offload-v1"]
    assert hit["severity"] == "warning" and "NVTE_CPU_OFFLOAD_V1" in hit["upstream_message"]
    assert "bridge-fine-grained-offloading-needs-nvte-cpu-offload-v1" in found(**fg)      # TE unknown
    assert not found(**fg, te_version="2.9.0")
    assert not found(**fg, te_version="2.17.1", env_vars={"NVTE_CPU_OFFLOAD_V1": "1"})


def test_fine_grained_offloading_needs_the_transformer_engine_layers_in_bridge():
    hit = found("0.18", fine_grained_activation_offloading=True, offload_modules=["core_attn"],
                transformer_impl="local")["bridge-fine-grained-offloading-needs-te-impl"]
    assert hit["severity"] == "error"


def test_cuda_graphs_of_a_gpt_model_need_the_te_rng_tracker_in_bridge_but_not_of_a_hybrid_stack():
    graphs = {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]}
    hit = found(**graphs, te_rng_tracker=False)["bridge-cuda-graphs-need-te-rng-tracker"]
    assert hit["severity"] == "error"
    assert not found(**graphs, te_rng_tracker=True)
    assert not found(**graphs, te_rng_tracker=False, extra_model={"use_te_rng_tracker": True})
    assert "bridge-cuda-graphs-need-te-rng-tracker" not in found(
        **graphs, te_rng_tracker=False, hybrid_override_pattern="M*M*")


def test_bridge_rules_do_not_apply_to_a_megatron_lm_training_run():
    assert not found(cuda_graph_impl="local", cuda_graph_modules=["attn"], defaults_source="megatron-lm")


def test_every_bridge_rule_holds_only_for_the_releases_bridge_pins():
    pinned = {pin["facts"] for pin in card.load()["bridge_pins"]}
    for cid in BRIDGE_IDS:
        c = card.constraint(cid)
        assert set(c["at"]) <= pinned and set(c["bridge"]) == set(c["at"]), cid


def test_a_bridge_dump_carries_what_the_bridge_rules_read():
    from mbridge_recompute.inputs.loading import load_workload

    w = load_workload(str(ROOT / "examples" / "bridge_dump_llama3_8b.yaml"), mcore_version="0.19.2")
    assert w.check_for_nan_in_loss is True and w.te_rng_tracker is False
    assert w.env_vars["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    w = load_workload(str(ROOT / "examples" / "bridge_dump_llama3_8b.yaml"),
                      ["env_vars.NVTE_CPU_OFFLOAD_V1=1"], mcore_version="0.19.2")
    assert w.env_vars["NVTE_CPU_OFFLOAD_V1"] == "1"


# ------------------------------------------------------------------ the real Bridge 0.6.2
@pytest.fixture(scope="module")
def bridge_run(tmp_path_factory) -> dict:
    home = hf_cache(tmp_path_factory.mktemp("hf"))
    proc = run_in_bridge(["-W", "ignore", "-m", "mbridge_recompute.rules.bridge_differential"], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_bridge_environment_runs_bridge_0_6_2_on_megatron_core_0_19(bridge_run):
    assert bridge_run["bridge"] == "0.6.2" and bridge_run["facts"] == "0.19"


def test_builtin_bridge_verdicts_agree_with_bridges_own_validation(bridge_run):
    wrong = [f"{r['name']}: bridge={r['live']} builtin={r['builtin']} ({(r['message'] or '')[:120]})"
             for r in bridge_run["results"] if r["live"] != r["builtin"]]
    assert not wrong, "\n".join(wrong)
    assert len(bridge_run["results"]) >= 25


def test_every_bridge_rule_of_bridge_0_6_is_raised_by_bridge_itself_in_some_case(bridge_run):
    raised = {r["live"][1] for r in bridge_run["results"] if r["live"][0] == "reject"}
    held = {cid for cid in BRIDGE_IDS if card.holds(cid, "0.19")}
    assert held <= raised, held - raised
    assert any(r["live"][0] == "accept" for r in bridge_run["results"])


def test_bridge_messages_are_at_the_lines_the_card_cites_in_bridge_0_6_2(bridge_run):
    assert bridge_run["cited_message_problems"] == []


def test_check_live_where_bridge_imports_reports_a_local_scoped_graph_as_bridges_error(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("model:\n  num_layers: 4\n  hidden_size: 64\n  num_attention_heads: 4\n  bf16: true\n"
                  "  attention_dropout: 0.0\n  hidden_dropout: 0.0\n  cuda_graph_impl: local\n"
                  "  cuda_graph_modules: [attn]\nrng:\n  te_rng_tracker: true\n")
    proc = run_in_bridge([SCRIPTS / "check_config.py", wl, "--validator", "live", "--json"],
                         hf_cache(tmp_path / "hf"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    (hit,) = [f for f in report["findings"] if f["id"] == "bridge-local-cuda-graph-needs-full-iteration"]
    assert hit["source"] == "live" and hit["raises"] == "ValueError" and hit["severity"] == "error"
    assert "bridge-validation-unavailable" not in {f["id"] for f in report["findings"]}
