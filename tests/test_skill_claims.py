"""One test per checkable claim of SKILL.md (and of the reference pages its claims moved to:
the label matrix in references/labels.md, the symptom table in references/troubleshooting.md),
named after the claim.

Claims about megatron-core are tested against the installed megatron-core 0.16.1
(real `TransformerConfig`, real checkpoint utilities); claims about what the tools
say are tested by running the tools as an agent would. Bridge itself cannot be
imported here (it needs Transformer Engine), so claims about Bridge's harness are
tested through what this package emits for it.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from mbridge_recompute.facts import releases

from conftest import EXAMPLES, ROOT, run_script

SKILL_TEXT = (ROOT / "SKILL.md").read_text()
LABELS_TEXT = (ROOT / "references" / "labels.md").read_text()
TROUBLE_TEXT = (ROOT / "references" / "troubleshooting.md").read_text()
BASE = dict(num_layers=8, hidden_size=64, num_attention_heads=4)


@pytest.fixture(scope="module")
def TransformerConfig():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig as TC
    return TC


def make(TC, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TC(**{**BASE, **kw})


def raised(TC, **kw) -> str:
    """The message of the exception TransformerConfig raises for these fields."""
    with pytest.raises((AssertionError, ValueError)) as info:
        make(TC, **kw)
    return str(info.value)


def check(*sets: str, validator: str = "builtin") -> tuple[int, dict]:
    args = ["--validator", validator, "--json"]
    for s in sets:
        args += ["--set", s]
    r = run_script("check", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def ids(report: dict, severity: str | None = None) -> set:
    return {f["id"] for f in report["findings"] if severity in (None, f["severity"])}


def harness_tokens(*config_args: str) -> list:
    r = run_script("config", *config_args, "--format", "harness", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["formats"]["harness"]


# ---------------------------------------------------------------- labels and defaults

def test_claim_empty_list_is_a_valid_selective_control(TransformerConfig):
    cfg = make(TransformerConfig, recompute_granularity="selective", recompute_modules=[])
    assert cfg.recompute_modules == []
    code, report = check("model.recompute_granularity=selective", "model.recompute_modules=[]")
    assert code == 0 and report["ok"] and ids(report, "error") == set()


def test_claim_empty_list_is_valid_for_the_live_validator_too(TransformerConfig, capsys):
    # in-process, so the megatron-core import of the fixture is reused
    from mbridge_recompute.cli import main

    with pytest.raises(SystemExit) as done:
        main(["check", "--validator", "live", "--json", "--set", "model.recompute_granularity=selective",
              "--set", "model.recompute_modules=[]"])
    report = json.loads(capsys.readouterr().out)
    assert done.value.code == 0 and report["ok"] and report["validator"] == "live"


def test_claim_none_becomes_core_attn(TransformerConfig):
    cfg = make(TransformerConfig, recompute_granularity="selective", recompute_modules=None)
    assert cfg.recompute_modules == ["core_attn"]
    # the checker sees the implicit core_attn too, and warns about it under fused attention
    _, report = check("model.recompute_granularity=selective", "model.recompute_modules=null")
    assert "core-attn-fused-attention" in ids(report, "warning")


def test_claim_labels_are_validated_only_under_selective(TransformerConfig):
    cfg = make(TransformerConfig, recompute_granularity="full", recompute_method="uniform",
               recompute_num_layers=1, recompute_modules=["bogus"])
    assert cfg.recompute_modules == ["bogus"]
    assert "Invalid choices for recompute_modules: {'bogus'}" in raised(
        TransformerConfig, recompute_granularity="selective", recompute_modules=["bogus"])


def test_claim_label_table_for_the_installed_release_is_its_megatron_core_set(TransformerConfig):
    """The label matrix of references/labels.md (rendered from the card, as SKILL.md's label
    list is) names, for the installed release, the set its TransformerConfig accepts (read from
    the error it raises for an unknown label)."""
    message = raised(TransformerConfig, recompute_granularity="selective",
                     recompute_modules=["__probe__"])
    allowed = ast.literal_eval(message.split("Allowed modules are: ")[1])
    key = releases.target_version()
    column = releases.keys().index(key)
    rows = [line for line in LABELS_TEXT.split("<!-- card:labels -->", 1)[1].split("<!--", 1)[0].splitlines()
            if line.startswith("| `")]
    shown = {r.split("|")[1].strip(" `") for r in rows if r.split("|")[2 + column].strip() == "yes"}
    assert shown == allowed


def test_claim_empty_string_from_the_harness_flag_is_an_invalid_label(TransformerConfig):
    # `--recompute_modules ""` arrives as [''], which megatron-core rejects
    assert "Invalid choices for recompute_modules: {''}" in raised(
        TransformerConfig, recompute_granularity="selective", recompute_modules=[""])
    assert "`Invalid choices for recompute_modules: {''}`" in SKILL_TEXT


def test_claim_a_space_after_the_comma_makes_an_invalid_label(TransformerConfig):
    assert "{' layernorm'}" in raised(TransformerConfig, recompute_granularity="selective",
                                      recompute_modules=["core_attn", " layernorm"])


# ---------------------------------------------------------------- harness forms

def test_claim_harness_flag_is_one_comma_token():
    tokens = harness_tokens("--modules", "layernorm,moe_act")
    i = tokens.index("--recompute_modules")
    assert tokens[i + 1] == "layernorm,moe_act"
    assert "moe_act" not in tokens[i + 2:i + 3]


def test_claim_empty_list_is_not_expressible_through_the_harness_flag():
    tokens = harness_tokens("--modules", "[]")
    assert "--recompute_modules" not in tokens
    assert "model.recompute_granularity=selective" in tokens
    assert "model.recompute_modules=[]" in tokens


def test_claim_rl_means_full_recompute_with_method_block():
    block = harness_tokens("--granularity", "full", "--method", "block", "--num-layers", "4")
    assert block[block.index("-rl") + 1] == "4"
    uniform = harness_tokens("--granularity", "full", "--method", "uniform", "--num-layers", "1")
    assert "-rl" not in uniform
    assert "model.recompute_method=uniform" in uniform


def test_claim_full_iteration_graphs_are_impl_local_with_scope_full_iteration(TransformerConfig):
    full = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    make(TransformerConfig, **full, cuda_graph_impl="local", cuda_graph_scope=["full_iteration"])
    assert raised(TransformerConfig, **full, cuda_graph_impl="transformer_engine") == \
        "full recompute is only supported with full iteration CUDA graph."
    # on 0.16.1 the impl name full_iteration does not exist
    assert "Invalid cuda graph implementation: full_iteration" in raised(
        TransformerConfig, **full, cuda_graph_impl="full_iteration")
    code, report = check("model.recompute_granularity=full", "model.recompute_method=uniform",
                         "model.recompute_num_layers=1", "model.cuda_graph_impl=transformer_engine")
    assert code == 1 and "full-recompute-needs-full-iteration-graph" in ids(report, "error")
    code, _ = check("model.recompute_granularity=full", "model.recompute_method=uniform",
                    "model.recompute_num_layers=1", "model.cuda_graph_impl=local",
                    "model.cuda_graph_scope=[full_iteration]")
    assert code == 0


# ---------------------------------------------------------------- mechanisms

@pytest.fixture
def cpu_rng(monkeypatch):
    """The CUDA RNG snapshot the checkpoints take, replaced: this machine has no GPU.

    Everything else (the checkpoint functions, save_for_backward, the TE lookups) is
    the installed megatron-core 0.16.1 code. No backward is run.
    """
    from megatron.core.tensor_parallel import random as rnd

    monkeypatch.setattr(rnd, "_get_all_rng_states", lambda: None)
    return rnd


def test_claim_core_attn_checkpoint_pins_the_fused_qkv_buffer(cpu_rng):
    import torch

    s, b, groups, heads_per_group, hn = 16, 2, 2, 4, 8
    x = torch.randn(s, b, 32, requires_grad=True)
    w = torch.randn(32, groups * (heads_per_group + 2) * hn, requires_grad=True)
    qkv = (x @ w).view(s, b, groups, (heads_per_group + 2) * hn)       # fused QKV GEMM output
    q, k, v = torch.split(qkv, [heads_per_group * hn, hn, hn], dim=3)  # views, as in Attention
    q, k = q.reshape(s, b, -1, hn) * 1.0, k * 1.0                      # RoPE returns fresh q, k

    def core_attention(q, k, v):
        return q.mean() + k.mean() + v

    out = cpu_rng.checkpoint(core_attention, False, q, k, v)
    saved_v = out.grad_fn.saved_tensors[2]
    assert saved_v.numel() * saved_v.element_size() == s * b * groups * hn * 4
    assert saved_v.untyped_storage().nbytes() == qkv.untyped_storage().nbytes()
    assert saved_v.untyped_storage().nbytes() == (heads_per_group + 2) * saved_v.numel() * 4


def test_claim_checkpoint_without_output_needs_transformer_engine_even_in_bf16(cpu_rng):
    import torch

    CheckpointWithoutOutput = cpu_rng.CheckpointWithoutOutput

    assert CheckpointWithoutOutput().fp8 is True            # the default fp8=False becomes True
    assert CheckpointWithoutOutput(fp8=None).fp8 is False   # how mla_up_proj builds it in bf16
    with pytest.raises(NameError, match="FP8GlobalStateManager"):
        CheckpointWithoutOutput().checkpoint(lambda t: t * 2, torch.randn(3, requires_grad=True))
    assert "`NameError: name 'FP8GlobalStateManager' is not defined`" in SKILL_TEXT


SILENT = [
    ("layernorm-on-te-dense-spec", None, ["model.recompute_modules=[layernorm]"]),
    ("moe-labels-on-dense-model", None, ["model.recompute_modules=[moe]"]),
    ("moe-with-local-cuda-graph", "moonlight_16b.yaml",
     ["model.recompute_modules=[moe]", "model.cuda_graph_impl=local", "model.cuda_graph_scope=[attn]"]),
    ("mlp-on-moe-layers", "moonlight_16b.yaml", ["model.recompute_modules=[mlp]"]),
]


@pytest.mark.parametrize("rule,workload,sets", SILENT, ids=[r for r, _, _ in SILENT])
def test_claim_labels_that_silently_do_nothing_are_reported(rule, workload, sets):
    args = [str(EXAMPLES / workload)] if workload else []
    for s in sets:
        args += ["--set", s]
    r = run_script("check", *args, "--validator", "builtin", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0, "a silent no-op is not an error"
    assert rule in ids(report)


# ---------------------------------------------------------------- full recompute

def test_claim_uniform_with_a_non_dividing_layer_count_fails_only_at_runtime(TransformerConfig):
    make(TransformerConfig, recompute_granularity="full", recompute_method="uniform",
         recompute_num_layers=3)                             # 8 layers: accepted by the config
    # default workload: 80 layers / (PP 4 * VPP 5) = 4 layers per chunk; 3 does not divide it
    code, report = check("model.recompute_granularity=full", "model.recompute_method=uniform",
                         "model.recompute_num_layers=3", "model.recompute_modules=null")
    assert code == 1 and "uniform-num-layers-not-dividing-chunk" in ids(report, "error")
    code, _ = check("model.recompute_granularity=full", "model.recompute_method=uniform",
                    "model.recompute_num_layers=2", "model.recompute_modules=null")
    assert code == 0


def test_claim_recompute_num_layers_below_one_is_accepted_by_the_config(TransformerConfig):
    make(TransformerConfig, recompute_granularity="full", recompute_method="uniform",
         recompute_num_layers=0)
    code, report = check("model.recompute_granularity=full", "model.recompute_method=uniform",
                         "model.recompute_num_layers=0")
    assert code == 1 and "uniform-num-layers-below-one" in ids(report, "error")


def test_claim_recompute_num_layers_counts_per_model_chunk():
    _, report = check("model.recompute_granularity=full", "model.recompute_method=block",
                      "model.recompute_num_layers=2", "model.recompute_modules=null")
    info = [f for f in report["findings"] if f["id"] == "num-layers-per-model-chunk"]
    assert info and "4 layers" in info[0]["message"]


# ---------------------------------------------------------------- quoted messages

QUOTED = [
    (dict(recompute_granularity="selective", recompute_num_layers=1),
     "When using recompute_granularity: selective recompute_num_layers must be None."),
    (dict(recompute_granularity="full", recompute_num_layers=1),
     'Using recompute_granularity: full so recompute_method must be "block" or "uniform"'),
    (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
          tensor_model_parallel_size=2, sequence_parallel=True, distribute_saved_activations=True),
     "distribute_saved_activations: True must be false when sequence parallel is enabled: True"),
    (dict(recompute_granularity="selective", cpu_offloading=True, cpu_offloading_num_layers=1),
     "CPU offloading does not work when activation recomputation is enabled"),
    (dict(recompute_granularity="selective", recompute_modules=["layernorm"], fp8="hybrid",
          fp8_recipe="delayed"),
     "Delayed scaling does not support moe_act and layernorm recompute for fp8."),
    (dict(recompute_granularity="selective", recompute_modules=["moe_act"], num_moe_experts=4,
          moe_router_topk=2, moe_ffn_hidden_size=32),
     "moe_act in recompute_modules is only supported with moe_grouped_gemm."),
    (dict(recompute_granularity="selective", recompute_modules=["shared_experts"], num_moe_experts=4,
          moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32,
          moe_shared_expert_overlap=True, moe_token_dispatcher_type="alltoall"),
     "shared_experts recompute cannot work with --moe-shared-expert-overlap."),
]


@pytest.mark.parametrize("fields,message", QUOTED, ids=[m[:40] for _, m in QUOTED])
def test_claim_quoted_messages_are_the_installed_megatron_core_messages(TransformerConfig, fields, message):
    assert f"`{message}`" in TROUBLE_TEXT
    assert raised(TransformerConfig, **fields) == message


def test_claim_mhc_is_not_a_0_16_1_label(TransformerConfig):
    assert "{'mhc'}" in raised(TransformerConfig, recompute_granularity="selective",
                               recompute_modules=["mhc"])


def test_claim_mhc_and_gdp_labels_are_fixed_by_dropping_them_not_by_upgrading():
    """No megatron-core release has mhc or a gdp_* label (main only, tc @ core_v0.19.0 lists
    neither), so the symptom table's fix for their Invalid choices error is to drop them."""
    numbered = [k for k in releases.keys() if k != "main"]
    for label in ("mhc", "gdp_in_proj", "gdp_qkv"):
        assert not any(label in releases.labels_for(k) for k in numbered), label
    row = next(ln for ln in TROUBLE_TEXT.splitlines() if "{'mhc'}" in ln and ln.startswith("|"))
    assert "upgrade" not in row.split("|")[3] and "drop it" in row.split("|")[3]


# ---------------------------------------------------------------- tests that run nothing

def _fake_checkout(root: Path) -> Path:
    """A checkout of this package's kind whose conftest maps exit 5 to 0, as Bridge's does."""
    (root / "scripts" / "mbridge_recompute").mkdir(parents=True)
    tests = root / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(textwrap.dedent("""\
        def pytest_sessionfinish(session, exitstatus):
            if exitstatus == 5:          # "no tests collected" reported as success
                session.exitstatus = 0
        """))
    (tests / "test_config.py").write_text(textwrap.dedent("""\
        def test_sync_and_validate_cuda_graph():
            cfg = dict(recompute_granularity="selective")   # the word only in a body
            assert cfg["recompute_granularity"] == "selective"

        def test_all_validations_combined():
            assert True
        """))
    return root


def test_claim_minus_k_recompute_selects_zero_tests_and_still_exits_zero(tmp_path):
    repo = _fake_checkout(tmp_path / "checkout")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        "tests/test_config.py", "-k", "recompute", "-q"],
                       cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0
    assert "2 deselected" in r.stdout and "passed" not in r.stdout


def test_claim_zero_selected_is_failure(tmp_path):
    repo = _fake_checkout(tmp_path / "checkout")
    r = run_script("tests", "--repo", repo, "-k", "recompute", "--runner", "python", "--json")
    report = json.loads(r.stdout)
    assert (r.returncode, report["verdict"], report["selected"]) == (1, "no-tests", 0)
    # the same checkout with a selection that matches: a real pass
    ok = run_script("tests", "--repo", repo, "-k", "cuda_graph", "--runner", "python", "--json")
    assert (ok.returncode, json.loads(ok.stdout)["verdict"]) == (0, "pass")


# ---------------------------------------------------------------- measurement contract

def _copy_runs(src: Path, dst: Path, names: list[str]) -> list[Path]:
    out = []
    for name in names:
        shutil.copytree(src / name, dst / name)
        out.append(dst / name)
    return out


def test_claim_moe_act_is_the_cheapest_real_saving_in_the_moonlight_sweep():
    r = run_script("compare", *sorted((EXAMPLES / "logs" / "moonlight16b").iterdir()), "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["narrowest"] == "moe_act"
    core_attn = next(x for x in report["runs"] if x["name"] == "core_attn")
    assert abs(core_attn["delta_peak_pct"]) < 0.5 and core_attn["delta_time_pct"] > 3


def test_claim_a_later_failure_is_not_a_pass():
    r = run_script("compare", *sorted((EXAMPLES / "logs" / "nemotron3nano").iterdir()), "--json")
    runs = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert runs["moe_act"]["status"] == "oom"
    assert runs["moe_act"]["peak_allocated_gb"] < runs["empty"]["peak_allocated_gb"]
    assert runs["moe"]["status"] == "pass"


def test_claim_missing_lm_loss_is_a_failure(tmp_path):
    control, candidate = _copy_runs(EXAMPLES / "logs" / "moonlight16b", tmp_path, ["empty", "moe_act"])
    log = candidate / "log.txt"
    lines = log.read_text().splitlines(keepends=True)
    dropped = [re.sub(r"lm loss: [^|]*\| ", "", ln) if re.search(r"iteration\s+1[5-9]/", ln) else ln
               for ln in lines]
    assert dropped != lines
    log.write_text("".join(dropped))
    r = run_script("compare", control, candidate, "--json")
    runs = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert runs["moe_act"]["status"] == "nan"
    assert r.returncode == 1


def test_claim_fragmentation_is_ruled_out_first():
    message = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
               "total capacity of 79.11 GiB of which 1.20 GiB is free. Of the allocated memory 70.10 GiB "
               "is allocated by PyTorch, and 5.30 GiB is reserved by PyTorch but unallocated.")
    r = run_script("diagnose", "--message", message, "--json")
    findings = json.loads(r.stdout)["findings"]
    assert r.returncode == 0
    assert findings[0]["kind"] == "fragmentation"
    assert "expandable_segments:True" in findings[0]["next_action"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_claim_moe_router_needs_transformer_engine_in_0_16_1(dtype):
    """The installed 0.16.1 router gating GEMM reads te_general_gemm, undefined without TE,
    before it looks at the router dtype (moe_utils.py:24-39,1192)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.moe import moe_utils

    dt = getattr(torch, dtype)
    with pytest.raises(NameError, match="te_general_gemm"):
        moe_utils.router_gating_linear(torch.randn(4, 8, dtype=dt), torch.randn(3, 8, dtype=dt), None, dt)
    assert "`NameError: name 'te_general_gemm' is not defined`" in SKILL_TEXT


# ---------------------------------------------------------------- releases, budget, layouts

def _plan(*args: str) -> dict:
    r = run_script("plan", *args, "--json", timeout=300)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_claim_the_tools_say_which_release_they_checked_against():
    asked = _plan("--mcore-version", "0.18.2")
    assert asked["release"]["key"] == "0.18" and "0.18.2" in asked["release"]["requested"]
    default = _plan()
    # the test venv has megatron-core 0.16.1 installed: that release, and the reason, are named
    assert default["release"]["key"] == "0.16" and default["release"]["how"]


def test_claim_the_release_is_the_flag_else_the_installed_one_else_the_newest_the_card_covers(monkeypatch):
    """SKILL.md step 1 and cli-reference's --mcore-version default: the flag wins over the
    installed megatron-core, and with none installed the newest numbered release of the card
    applies (not the oldest)."""
    assert "`--mcore-version VER`, else the installed megatron-core, else the newest release" in SKILL_TEXT
    assert releases.target("0.17.1").key == "0.17"          # the flag over the installed 0.16.1
    monkeypatch.setattr(releases, "installed_mcore_version", lambda: None)
    newest = [k for k in releases.keys() if k != "main"][-1]
    chosen = releases.target()
    assert chosen.key == newest and chosen.requested == releases.meta(newest)["newest"]
    cli = (ROOT / "references" / "cli-reference.md").read_text()
    row = next(ln for ln in cli.splitlines() if ln.startswith("| `--mcore-version VER`"))
    assert "else the newest release the card covers" in row


def test_claim_an_h100_80gb_reports_79_11_gib_and_the_budget_keeps_a_margin():
    d = _plan("--set", "cluster.gpu=h100-80gb", "--mcore-version", "0.19.2")
    cap = d["workload"]["gpu_capacity_bytes"]
    assert round(cap / 2**30, 2) == 79.11
    assert abs(d["budget_bytes"] - (cap - max(0.05 * cap, 2e9))) < 1e3


def test_claim_free_gb_asks_for_the_cheapest_setting_that_frees_that_much_on_the_failing_rank():
    d = _plan("--free-gb", "3.2", "--rank", "0", "--mcore-version", "0.19.2")
    free = d["free"]
    assert free["pp_rank"] == 0 and free["free_bytes"] == 3.2e9 and free["freed_bytes"] >= 3.2e9
    assert d["recommendation"]["name"] == free["answer"]
    # cheapest: no other recompute candidate that frees as much on rank 0 costs less
    current = d["current"]["rank_peak_bytes"][0]
    cheaper = [c for c in d["candidates"] if c["allowed"] and c["cost_pct"] < d["recommendation"]["cost_pct"]
               and current - c["rank_peak_bytes"][0] >= 3.2e9]
    assert cheaper == []


def test_claim_gdn_norm_out_exists_from_0_19_and_gdp_labels_and_mhc_only_on_main():
    assert "gdn_norm_out" not in releases.labels_for("0.18") and "gdn_norm_out" in releases.labels_for("0.19")
    for label in ("gdp_in_proj", "gdp_qkv", "mhc"):
        assert label not in releases.labels_for("0.19") and label in releases.labels_for("main")


def test_claim_moe_under_ep_overlap_is_a_no_op_on_0_16_and_rejected_from_0_17():
    sets = ["--set", "model.recompute_modules=[moe]", "--set", "model.overlap_moe_expert_parallel_comm=true",
            "--set", "model.moe_token_dispatcher_type=alltoall", "--validator", "builtin", "--json"]
    old = run_script("check", str(EXAMPLES / "moonlight_16b.yaml"), "--mcore-version", "0.16.1", *sets)
    new = run_script("check", str(EXAMPLES / "moonlight_16b.yaml"), "--mcore-version", "0.17.1", *sets)
    assert "moe-under-ep-overlap" in ids(json.loads(old.stdout))
    assert new.returncode == 1 and "ep-overlap-with-moe-recompute" in ids(json.loads(new.stdout), "error")


def test_claim_hybrid_pipe_segments_need_pp_x_vpp_and_megatron_lm_derives_vpp_from_them():
    from mbridge_recompute.inputs import mlm_args

    pattern = "M*M-|M*M-|MM|**"
    fields = [f"model.hybrid_override_pattern={pattern}", "model.num_layers=12",
              "model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=null",
              "model.num_moe_experts=null"]
    sets = [a for f in fields for a in ("--set", f)]
    sets += ["--mcore-version", "0.19.2", "--validator", "builtin", "--json"]
    r = run_script("check", *sets)
    assert r.returncode == 1 and "hybrid-segments-beyond-vpp" in ids(json.loads(r.stdout), "error")
    spec = ["--num-layers", "12", "--hidden-size", "512", "--num-attention-heads", "8",
            "--pipeline-model-parallel-size", "2", "--hybrid-layer-pattern", pattern]
    assert mlm_args.sections(spec, "0.19")["model"]["virtual_pipeline_model_parallel_size"] == 2


def _full_with_graphs(release: str, *graph: str) -> set:
    sets = ["model.recompute_granularity=full", "model.recompute_method=uniform",
            "model.recompute_num_layers=1", "model.recompute_modules=null", *graph]
    args = [a for s in sets for a in ("--set", s)]
    r = run_script("check", *args, "--mcore-version", release, "--validator", "builtin", "--json")
    return ids(json.loads(r.stdout), "error")


def test_claim_full_recompute_with_graphs_needs_impl_full_iteration_from_0_18():
    rule = "full-recompute-needs-full-iteration-graph"
    assert rule not in _full_with_graphs("0.16.1", "model.cuda_graph_impl=local",
                                         "model.cuda_graph_scope=[full_iteration]")
    assert rule in _full_with_graphs("0.16.1", "model.cuda_graph_impl=local", "model.cuda_graph_scope=[attn]")
    assert rule not in _full_with_graphs("0.18.2", "model.cuda_graph_impl=full_iteration")
    assert rule in _full_with_graphs("0.18.2", "model.cuda_graph_impl=local", "model.cuda_graph_scope=[attn]")


def test_claim_vpp_10_frees_memory_on_rank_0_and_halves_the_bubble_of_the_embedded_workload():
    d = _plan("--alternatives", "--mcore-version", "0.19.2")
    vpp10 = "core_attn@virtual_pipeline_model_parallel_size=10"
    row = next(a for a in d["alternatives"] if a["name"] == vpp10)
    assert 1.0e9 < row["frees_bytes"] < 1.4e9 and "3.75 % -> 1.88 %" in row["detail"]
    mlp = next(label for label in d["labels"] if label["label"] == "mlp")
    assert 25 < mlp["cost_pct"] < 35
    assert "1.19 GB on rank 0" in SKILL_TEXT and "3.75% → 1.88%" in SKILL_TEXT


def test_claim_the_calibrated_moonlight_example_recommends_block_11_and_names_moe_act_to_confirm():
    """SKILL.md's and README's Moonlight example: anchored on the measured [] control with a budget
    0.5 GB below it, the plan recommends the cheapest setting whose band fits (full block 11) and
    names moe_act, whose predicted peak fits but whose calibrated band crosses the budget, as the
    cheaper setting to confirm first with a 2-iteration run of it."""
    d = _plan(str(EXAMPLES / "moonlight_16b.yaml"), "--measured-peak-gb", "36.618", "--budget-gb", "37.7")
    rec, cheaper = d["recommendation"], d["cheaper_if_calibrated"]
    assert (d["verdict"], rec["verdict"], d["fits"]) == ("fits", "fits", True)
    assert cheaper["verdict"] == "tight" and cheaper["point_fits"] and cheaper["cost_pct"] < rec["cost_pct"]
    assert d["calibrate_first"].startswith("confirm first") and f"'{cheaper['name']}'" in d["calibrate_first"]
    assert "-ms 2" in d["calibrate_first"]
    skill = " ".join(SKILL_TEXT.split())
    assert (f"`--measured-peak-gb 36.618 --budget-gb 37.7` recommends `{rec['name']}` "
            f"({rec['replay_pct']:.2f}% replay), whose band fits, and names the cheaper "
            f"`{cheaper['name']}` to confirm first with a 2-iteration run") in skill
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"It recommends `{rec['name']}` ({rec['replay_pct']:.2f} % replay)" in readme
    assert f"`{cheaper['name']}`, the boundary the published sweep" in readme
    assert "the cheaper setting to confirm first with a 2-iteration run" in readme


def test_claim_missing_fields_take_megatron_core_or_bridge_defaults_and_the_first_line_says_whose():
    ours = run_script("plan", "--mcore-version", "0.19.2")
    dump = run_script("plan", str(EXAMPLES / "bridge_dump_llama3_8b.yaml"), "--mcore-version", "0.19.2")
    def workload_line(text: str) -> str:     # after the `note:` lines of what the input left open
        return next(line for line in text.splitlines() if line.startswith("workload:"))

    assert "defaults: megatron-core TransformerConfig's" in workload_line(ours.stdout)
    assert workload_line(ours.stdout) == ours.stdout.splitlines()[0]       # the default states its GPUs
    assert dump.stdout.startswith("note: world size: 2 GPUs assumed")
    assert "defaults: Megatron Bridge providers'" in workload_line(dump.stdout)
    assert _plan(str(EXAMPLES / "bridge_dump_llama3_8b.yaml"), "--mcore-version", "0.19.2")[
        "workload"]["defaults_source"] == "bridge"


@pytest.mark.parametrize("tool", ["plan.py", "check_config.py", "diagnose.py"])
def test_claim_a_tool_that_lacks_a_package_names_it_in_one_line(tool):
    """`python -S` stands in for an agent's interpreter without site-packages (pyyaml, jinja2,
    packaging absent): one line naming what to install, exit 2, no traceback; with --json the
    same as one error object."""
    assert "python3 -m pip install pyyaml jinja2 packaging" in SKILL_TEXT
    text = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / tool)], capture_output=True,
                          text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=60)
    assert text.returncode == 2 and "Traceback" not in text.stderr
    assert text.stderr.count("\n") == 1 and "pip install pyyaml jinja2 packaging" in text.stderr
    as_json = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / tool), "--json"],
                             capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=60)
    err = json.loads(as_json.stdout)["error"]
    assert as_json.returncode == 2 and err["field"] == "python" and err["exit"] == 2


def test_claim_alternative_kinds_are_the_ones_the_frontier_marks():
    """The kinds SKILL.md tells the reader to look for are the ones the planner writes."""
    from mbridge_recompute.setting import CHANGE_KINDS

    named = re.search(r"any kind \(([^)]*)\)", SKILL_TEXT).group(1)
    kinds = set(re.findall(r"`(\w+)`", named))
    assert kinds == set(CHANGE_KINDS.values())
