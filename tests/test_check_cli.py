"""`check_config.py` as an agent runs it: JSON shape, exit codes, text output, light start."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import EXAMPLES, SCRIPTS, run_script

MINIMAL_FINDING_KEYS = {"id", "severity", "message", "fix", "source"}


def _json(proc) -> dict:
    assert proc.stdout.count("\n") >= 1
    return json.loads(proc.stdout)


def test_json_has_the_minimal_keys_and_exits_1_on_an_error_finding():
    proc = run_script("check", EXAMPLES / "check_moe_ep_overlap_full.yaml", "--json",
                      "--validator", "builtin")
    assert proc.returncode == 1, proc.stderr
    report = _json(proc)
    assert {"ok", "validator", "findings"} <= set(report)
    assert report["ok"] is False and report["validator"] == "builtin"
    for f in report["findings"]:
        assert MINIMAL_FINDING_KEYS <= set(f)
        assert f["severity"] in ("error", "warning", "info") and f["source"] in ("live", "builtin")
    assert "ep-overlap-with-full" in {f["id"] for f in report["findings"] if f["severity"] == "error"}


def test_a_clean_workload_exits_0():
    proc = run_script("check", EXAMPLES / "check_moe_selective_ok.yaml", "--json", "--validator", "builtin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _json(proc)["ok"] is True


def test_live_validator_answers_by_default_and_says_so():
    proc = run_script("check", EXAMPLES / "check_recipe_leftover_full.yaml", "--json")
    assert proc.returncode == 1, proc.stderr
    report = _json(proc)
    assert report["validator"] == "live"
    by_id = {f["id"]: f for f in report["findings"]}
    assert by_id["selective-with-num-layers"]["source"] == "live"
    assert by_id["selective-with-method"]["source"] == "builtin"   # training arguments: table only


def test_no_workload_checks_the_embedded_default():
    proc = run_script("check", "--json", "--validator", "builtin")
    assert proc.returncode == 0, proc.stderr
    report = _json(proc)
    # the default workload is Llama3 70B with selective [core_attn] under TE
    assert "core-attn-fused-attention" in {f["id"] for f in report["findings"]}


def test_set_overrides_reach_the_checker():
    proc = run_script("check", "--json", "--validator", "builtin",
                      "--set", "model.recompute_granularity=full", "--set", "model.recompute_method=uniform",
                      "--set", "model.recompute_num_layers=3")
    assert proc.returncode == 1
    ids = {f["id"] for f in _json(proc)["findings"]}
    assert "uniform-num-layers-not-dividing-chunk" in ids   # chunks of 4 layers (PP4 x VPP5, 80 layers)


def test_text_output_groups_findings_by_severity():
    proc = run_script("check", EXAMPLES / "check_recipe_leftover_full.yaml", "--validator", "builtin",
                      "--set", "model.recompute_modules=[mlp,layernorm]")
    assert proc.returncode == 1
    out = proc.stdout
    assert out.startswith("validator: builtin")
    assert out.index("ERRORS (2)") < out.index("WARNINGS (2)")
    assert "[selective-with-num-layers]" in out and "fix:" in out
    assert out.rstrip().endswith("error finding(s)")
    assert proc.stderr == ""


def test_mcore_version_main_uses_the_main_rules():
    w = ["--json", "--validator", "builtin", "--set", "model.num_moe_experts=8", "--set", "model.bf16=true",
         "--set", "model.expert_model_parallel_size=2", "--set", "model.moe_token_dispatcher_type=alltoall",
         "--set", "comm_overlap.overlap_moe_expert_parallel_comm=true",
         "--set", "model.recompute_modules=[moe]", "--set", "model.pipeline_model_parallel_size=1",
         "--set", "model.virtual_pipeline_model_parallel_size=null",
         "--set", "cluster.num_gpus=8"]
    old = run_script("check", *w, "--mcore-version", "0.16.1")
    new = run_script("check", *w, "--mcore-version", "main")
    assert old.returncode == 0 and new.returncode == 1, old.stderr + new.stderr
    assert _json(new)["version"] == "main"
    assert "ep-overlap-with-moe-recompute" in {f["id"] for f in _json(new)["findings"]}


def test_builtin_validator_imports_no_torch_or_megatron():
    code = (
        "import sys, json\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from mbridge_recompute.cli import main\n"
        "try:\n"
        "    main(['check', '--validator', 'builtin', '--json'])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('torch', 'megatron', 'transformer_engine'))\n"
        "sys.stderr.write(json.dumps({'code': code, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}
    assert json.loads(proc.stdout)["validator"] == "builtin"


def test_help_lists_the_validator_choices():
    proc = run_script("check", "--help")
    assert proc.returncode == 0 and "--validator" in proc.stdout and "builtin" in proc.stdout
