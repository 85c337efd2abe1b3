"""`write_config.py` as a user or an agent runs it: real subprocesses, real files."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest
import yaml

from mbridge_recompute.facts import card
from mbridge_recompute.setting import RecomputeSetting as R
from mbridge_recompute.write import snippets

from conftest import ROOT, SCRIPTS

MOE_NO_GROUPED_GEMM = """\
model:
  num_layers: 8
  hidden_size: 1024
  num_attention_heads: 16
  num_moe_experts: 8
  moe_router_topk: 2
  moe_grouped_gemm: false
  bf16: true
"""


def constraint_id(upstream_fragment: str) -> str:
    """The card id of the constraint whose upstream message contains the fragment,
    so the test names the constraint by what megatron-core says, not by a literal id."""
    ids = [c["id"] for c in card.constraints() if upstream_fragment in c["message"]]
    assert len(ids) == 1, ids
    return ids[0]


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


# ---------------------------------------------------------------- formats
def test_default_format_is_bridge_python(run_tool):
    res = run_tool("config", "--modules", "moe_act,layernorm")
    assert res.returncode == 0, res.stderr
    assert res.stdout == snippets.render(R.selective("moe_act", "layernorm"), "python")


@pytest.mark.parametrize("fmt", ["yaml", "overrides", "harness", "mlm"])
def test_each_format_prints_what_the_renderer_writes(run_tool, fmt):
    res = run_tool("config", "--granularity", "full", "--method", "block", "--num-layers", "2",
                   "--format", fmt)
    assert res.returncode == 0, res.stderr
    want = snippets.render(R.full("block", 2), fmt)
    if isinstance(want, str):
        assert res.stdout == snippets.as_text(want)
    else:                                # tokens: one shell command, continued at 100 columns
        assert shlex.split(res.stdout.replace(" \\\n", " ")) == want
        assert max(map(len, res.stdout.splitlines())) <= 100
        wide = run_tool("config", "--granularity", "full", "--method", "block", "--num-layers", "2",
                        "--format", fmt, "--wide")
        assert wide.stdout == snippets.as_text(want)


def test_token_formats_print_one_shell_line_that_splits_back(run_tool):
    res = run_tool("config", "--modules", "[]", "--format", "harness")
    assert res.returncode == 0, res.stderr
    tokens = shlex.split(res.stdout)
    assert "model.recompute_modules=[]" in tokens and "--recompute_modules" not in tokens
    assert "'model.recompute_modules=[]'" in res.stdout


def test_json_has_the_setting_and_every_format(run_tool):
    res = run_tool("config", "--granularity", "full", "--method", "uniform", "--num-layers", "1",
                   "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["setting"] == {"recompute_granularity": "full", "recompute_modules": [],
                              "recompute_method": "uniform", "recompute_num_layers": 1,
                              "distribute_saved_activations": False}
    assert set(out["formats"]) == set(snippets.FORMATS)
    assert isinstance(out["formats"]["python"], str) and isinstance(out["formats"]["yaml"], str)
    for fmt in ("overrides", "harness", "mlm"):
        assert isinstance(out["formats"][fmt], list) and out["formats"][fmt]
    assert out["check"]["validator"] == "builtin" and out["check"]["checked_against"] == "baseline"


def test_json_says_megatron_lm_cannot_express_the_empty_list(run_tool):
    res = run_tool("config", "--modules", "[]", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["formats"]["mlm"] == [] and "nargs" in out["unexpressible"]["mlm"]
    assert out["setting"]["recompute_modules"] == []


def test_mlm_format_refuses_the_empty_list_naming_the_option(run_tool):
    res = run_tool("config", "--modules", "[]", "--format", "mlm")
    assert res.returncode == 2 and res.stdout == ""
    assert one_error_line(res).startswith("error: --format: mlm cannot express")


# ---------------------------------------------------------------- legality
def test_moe_act_without_grouped_gemm_is_refused_with_the_constraint(run_tool, tmp_path):
    wl = tmp_path / "moe.yaml"
    wl.write_text(MOE_NO_GROUPED_GEMM)
    res = run_tool("config", str(wl), "--modules", "moe_act")
    assert res.returncode == 1 and res.stdout == ""
    cid = constraint_id("moe_act in recompute_modules is only supported with moe_grouped_gemm")
    assert cid in res.stderr and "fix:" in res.stderr
    # the same workload with grouped GEMM on is accepted
    ok = run_tool("config", str(wl), "--modules", "moe_act", "--set", "model.moe_grouped_gemm=true")
    assert ok.returncode == 0, ok.stderr


def test_full_recompute_with_te_cuda_graphs_is_refused_in_json(run_tool):
    res = run_tool("config", "--set", "model.cuda_graph_impl=transformer_engine",
                   "--granularity", "full", "--method", "uniform", "--num-layers", "1", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    cid = constraint_id("full recompute is only supported with full iteration CUDA graph")
    assert out["ok"] is False and "formats" not in out
    refused = {f["id"]: f for f in out["refused"]}
    assert cid in refused and refused[cid]["fix"] and refused[cid]["message"]


def test_distribute_saved_activations_needs_full_recompute(run_tool):
    res = run_tool("config", "--modules", "core_attn", "--distribute-saved-activations")
    assert res.returncode == 1
    assert constraint_id("only application to full recompute granularity") in res.stderr


def test_distribute_saved_activations_is_refused_with_sequence_parallel(run_tool):
    res = run_tool("config", "--set", "model.tensor_model_parallel_size=2",
                   "--set", "model.sequence_parallel=true", "--granularity", "full",
                   "--method", "block", "--num-layers", "1", "--distribute-saved-activations")
    assert res.returncode == 1
    assert constraint_id("must be false when sequence parallel is enabled") in res.stderr


def test_the_checked_setting_is_the_written_one_not_the_workloads(run_tool, tmp_path):
    """A workload whose own setting is full/block/5 still accepts a selective snippet,
    because the snippet (and the check) reset method and num_layers."""
    wl = tmp_path / "full_recipe.yaml"
    wl.write_text(MOE_NO_GROUPED_GEMM + "  recompute_granularity: full\n"
                  "  recompute_method: block\n  recompute_num_layers: 5\n")
    res = run_tool("config", str(wl), "--modules", "moe", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["check"]["checked_against"] == "workload"
    assert out["setting"]["recompute_method"] is None


# ---------------------------------------------------------------- bad options
@pytest.mark.parametrize("argv,option", [
    (["--granularity", "selective", "--modules", "core_attn", "--num-layers", "2"], "--num-layers"),
    (["--granularity", "selective", "--modules", "core_attn", "--method", "block"], "--method"),
    (["--method", "uniform"], "--method"),
    (["--granularity", "none", "--modules", "core_attn"], "--modules"),
    (["--granularity", "none", "--distribute-saved-activations"], "--distribute-saved-activations"),
    (["--granularity", "full", "--modules", "core_attn", "--method", "block", "--num-layers", "1"],
     "--modules"),
    (["--granularity", "full", "--num-layers", "2"], "--method"),
    (["--granularity", "full", "--method", "uniform"], "--num-layers"),
    (["--granularity", "full", "--method", "uniform", "--num-layers", "0"], "--num-layers"),
    (["--granularity", "selective"], "--modules"),
    (["--modules", "core_atn"], "--modules"),
    (["--modules", "core_attn,,mlp"], "--modules"),
    (["--modules", "mlp,mlp"], "--modules"),
    (["--modules", ""], "--modules"),
    (["--modules", "mlp", "--force"], "--force"),
    ([], "--granularity"),
])
def test_incoherent_options_exit_2_naming_the_option(run_tool, argv, option):
    res = run_tool("config", *argv)
    assert res.returncode == 2 and res.stdout == ""
    assert one_error_line(res).startswith(f"error: {option}:")


def test_unknown_label_names_the_valid_ones_for_the_version(run_tool):
    res = run_tool("config", "--modules", "mhc")
    assert res.returncode == 2 and "0.16.1" in res.stderr and "moe_act" in res.stderr
    ok = run_tool("config", "--modules", "mhc", "--mcore-version", "main", "--format", "overrides")
    # `mhc` is a main label: accepted as a label, then judged by main's rules
    assert ok.returncode in (0, 1) and "unknown label" not in ok.stderr


def test_argparse_choice_errors_are_one_line(run_tool):
    res = run_tool("config", "--granularity", "partial")
    assert res.returncode == 2
    assert "partial" in one_error_line(res)


# ---------------------------------------------------------------- --output
def test_output_writes_the_format_and_never_overwrites_without_force(run_tool, tmp_path):
    target = tmp_path / "recompute.yaml"
    args = ("config", "--modules", "moe_act", "--format", "yaml", "--output", str(target))
    first = run_tool(*args)
    assert first.returncode == 0, first.stderr
    assert target.read_text() == snippets.render(R.selective("moe_act"), "yaml")
    assert yaml.safe_load(target.read_text())["model"]["recompute_modules"] == ["moe_act"]

    target.write_text("user content\n")
    again = run_tool("config", "--modules", "mlp", "--format", "yaml", "--output", str(target))
    assert again.returncode == 2 and str(target) in one_error_line(again)
    assert target.read_text() == "user content\n"

    forced = run_tool("config", "--modules", "mlp", "--format", "yaml", "--output", str(target),
                      "--force")
    assert forced.returncode == 0, forced.stderr
    assert target.read_text() == snippets.render(R.selective("mlp"), "yaml")


def test_output_of_a_token_format_is_the_printed_line(run_tool, tmp_path):
    """The file holds the one-line form (what --wide prints; the terminal gets it continued)."""
    target = tmp_path / "overrides.txt"
    printed = run_tool("config", "--modules", "[]", "--format", "overrides", "--wide")
    written = run_tool("config", "--modules", "[]", "--format", "overrides", "--output", str(target))
    assert written.returncode == 0 and written.stdout == ""
    assert target.read_text() == printed.stdout


def test_json_with_output_reports_the_path_and_writes_the_format(run_tool, tmp_path):
    target = tmp_path / "snippet.py"
    res = run_tool("config", "--modules", "moe", "--json", "--output", str(target))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["output"] == str(target) and out["format"] == "python"
    assert target.read_text() == out["formats"]["python"]


def test_refused_setting_writes_no_file(run_tool, tmp_path):
    target = tmp_path / "x.py"
    res = run_tool("config", "--modules", "core_attn", "--distribute-saved-activations",
                   "--output", str(target))
    assert res.returncode == 1 and not target.exists()


def test_output_into_a_missing_directory_is_bad_input(run_tool, tmp_path):
    res = run_tool("config", "--modules", "mlp", "--output", str(tmp_path / "no" / "x.py"))
    assert res.returncode == 2 and "--output" in one_error_line(res)


# ---------------------------------------------------------------- help, start-up
def test_help_shows_examples_and_the_workload_rule(run_tool):
    res = run_tool("config", "--help")
    assert res.returncode == 0
    assert "examples:" in res.stdout and "--modules '[]' --format harness" in res.stdout
    assert "permissive baseline" in res.stdout


def test_config_never_imports_torch_or_megatron():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SCRIPTS)!r})
        from mbridge_recompute.cli import main
        try:
            main(["config", "--modules", "moe_act", "--json"])
        except SystemExit as e:
            assert e.code == 0, e.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron"))
        sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "HEAVY=\n" in res.stderr
