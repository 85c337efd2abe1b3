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


def test_a_label_the_release_does_not_know_is_an_error_finding_not_unusable_input():
    """The loader no longer refuses labels: the checker reports modules-invalid-label with the
    release's own message and the fix, exit 1 -- live (megatron-core 0.16.1 installed here) and
    built-in alike."""
    argv = ["--mcore-version", "0.16.1", "--set", "model.recompute_granularity=selective",
            "--set", "model.recompute_modules=[gdn_norm_out]", "--json"]
    for validator in ("auto", "builtin"):
        proc = run_script("check", *argv, "--validator", validator)
        assert proc.returncode == 1 and proc.stderr == "", proc.stderr
        f = next(f for f in _json(proc)["findings"] if f["id"] == "modules-invalid-label")
        assert f["severity"] == "error" and f["fix"]
        assert f["upstream_message"].startswith(
            "Invalid choices for recompute_modules: {'gdn_norm_out'}. Allowed modules are: {")
        assert "'core_attn'" in f["upstream_message"] and "{allowed_modules}" not in f["upstream_message"]


def test_under_full_a_label_the_release_does_not_know_is_accepted():
    """megatron-core checks labels only under selective (tc:1196-1211 @ core_v0.16.1)."""
    proc = run_script("check", "--mcore-version", "0.16.1", "--validator", "builtin", "--json",
                      "--set", "model.recompute_granularity=full",
                      "--set", "model.recompute_method=uniform", "--set", "model.recompute_num_layers=1",
                      "--set", "model.recompute_modules=[gdn_norm_out]")
    assert "modules-invalid-label" not in {f["id"] for f in _json(proc)["findings"]}


def test_modules_none_under_selective_warns_about_the_promotion():
    proc = run_script("check", "--validator", "builtin", "--json",
                      "--set", "model.recompute_granularity=selective",
                      "--set", "model.recompute_modules=null")
    f = next(f for f in _json(proc)["findings"] if f["id"] == "modules-none-promoted")
    assert f["severity"] == "warning" and "[core_attn]" in f["message"]
    assert proc.returncode == 0


def test_the_report_says_whose_defaults_the_workload_took(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("source: bridge\nmodel: {num_layers: 2, hidden_size: 256, num_attention_heads: 4}\n")
    proc = run_script("check", path, "--validator", "builtin", "--json")
    assert _json(proc)["input"]["defaults_source"] == "bridge"
    text = run_script("check", path, "--validator", "builtin").stdout
    assert "defaults: bridge" in text


def test_the_light_tools_start_without_torch_or_megatron_on_a_bridge_dump_and_an_mlm_list():
    """Only --recipe (and --mlm-parser installed) may import them; a dump, a plan
    and a config snippet of the default path must not."""
    code = (
        "import sys, json, contextlib, io\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from mbridge_recompute.cli import main\n"
        "codes = []\n"
        f"dump = {str(EXAMPLES / 'bridge_dump_llama3_8b.yaml')!r}\n"
        "for argv in (['check', dump, '--validator', 'builtin', '--json'],\n"
        "             ['plan', dump, '--json'],\n"
        "             ['config', '--granularity', 'selective', '--modules', 'mlp', '--json'],\n"
        "             ['plan', '--json', '--', '--num-layers', '2', '--hidden-size', '64',\n"
        "              '--num-attention-heads', '4', '--seq-length', '128', '--micro-batch-size', '1']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            codes.append(e.code)\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('torch', 'megatron', 'transformer_engine'))\n"
        "sys.stderr.write(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["heavy"] == [] and all(c in (0, 1) for c in result["codes"]), result
