"""Every megatron-core release the card covers, checked against that release's real code.

tests/envs/build.sh (run by tests/run_all.sh) builds one CPU environment per release and names
them in $MBR_ENVS/envs.json. For each release the differential matrix
(rules/differential.py, over 150 settings: labels, graph modules and scopes, FP8 recipes,
offloading, distribute_saved_activations, MoE overlap, gdn/gdp/mhc, pipeline splits) runs in that
release's Python against its real TransformerConfig; the built-in table, told the release, must
give the same verdict (accept, or reject with the same card id and exception) and the same config
warnings on every case. The same run reads the release's allowed recompute and offload labels
from its source and the messages at the lines the card cites.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mbridge_recompute.facts import releases

from conftest import ROOT, SCRIPTS

ENVS = Path(os.environ.get("MBR_ENVS", Path.home() / ".cache" / "mbridge-recompute" / "envs"))
RELEASES = ["0.16.1", "0.17.1", "0.18.2", "0.19.2"]


def release_env(release: str) -> dict:
    manifest = ENVS / "envs.json"
    if not manifest.exists():
        pytest.fail(f"no per-release environments at {ENVS}: run `bash tests/envs/build.sh` "
                    "(tests/run_all.sh does)")
    envs = json.loads(manifest.read_text())
    if release not in envs:
        pytest.fail(f"{manifest} has no environment for megatron-core {release}")
    spec = dict(envs[release])
    # a relative python is this checkout's own (.venv for 0.16.1); an absolute one is shared
    spec["python"] = str(ROOT / spec["python"])
    return spec


def run_in(release: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env_spec = release_env(release)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SCRIPTS), env_spec["pythonpath"]) if p)
    return subprocess.run([env_spec["python"], *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, stdin=subprocess.DEVNULL, timeout=timeout)


_RESULTS: dict = {}


def differential(release: str) -> dict:
    if release not in _RESULTS:
        proc = run_in(release, "-W", "ignore", "-m", "mbridge_recompute.rules.differential")
        assert proc.returncode == 0, proc.stderr[-3000:]
        _RESULTS[release] = json.loads(proc.stdout)
    return _RESULTS[release]


@pytest.mark.parametrize("release", RELEASES)
def test_the_environment_runs_that_release(release):
    d = differential(release)
    assert d["installed"] == release and d["facts"] == releases.resolve_version(release)


@pytest.mark.parametrize("release", RELEASES)
def test_builtin_verdicts_agree_with_that_releases_transformer_config(release):
    d = differential(release)
    wrong = [f"{r['name']}: live={r['live']} builtin={r['builtin']} ({(r['live_message'] or '')[:120]})"
             for r in d["results"] if r["live"] != r["builtin"]]
    assert not wrong, d["summary"] + "\n" + "\n".join(wrong)
    assert len(d["results"]) >= 80


@pytest.mark.parametrize("release", RELEASES)
def test_builtin_config_warnings_agree_with_that_release(release):
    d = differential(release)
    wrong = [f"{r['name']}: live={r['live_warnings']} builtin={r['builtin_warnings']}"
             for r in d["results"] if r["live_warnings"] != r["builtin_warnings"]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("release", RELEASES)
def test_every_rejection_maps_to_a_card_constraint(release):
    d = differential(release)
    unmapped = [f"{r['name']}: {r['live_message']}" for r in d["results"]
                if r["live"][0] == "reject" and r["live"][1] is None]
    assert not unmapped, unmapped


@pytest.mark.parametrize("release", RELEASES)
def test_card_label_sets_are_the_ones_in_that_releases_source(release):
    d = differential(release)
    key = releases.resolve_version(release)
    assert d["label_sets"]["recompute_modules"] == sorted(releases.labels_for(key))
    assert d["label_sets"]["offload_modules"] == sorted(releases.enum("offload_modules", key))


@pytest.mark.parametrize("release", RELEASES)
def test_card_messages_are_at_the_lines_it_cites_in_that_release(release):
    assert differential(release)["cited_message_problems"] == []


@pytest.mark.parametrize("release", RELEASES)
def test_matrix_exercises_every_config_rule_of_that_release(release):
    """Each config rule the card holds for the release is decided by its TransformerConfig in at
    least one case (the default's full-scope warning is filtered as noise)."""
    from mbridge_recompute.facts import card

    d = differential(release)
    key = releases.resolve_version(release)
    config_ids = {c["id"] for c in card.constraints() if c["kind"] == "config" and card.holds(c["id"], key)}
    seen = {r["live"][1] for r in d["results"]} | {w for r in d["results"] for w in r["live_warnings"]}
    seen.add("cuda-graph-full-scope-deprecated")
    assert config_ids - seen == set()


@pytest.mark.parametrize("release", RELEASES)
def test_the_live_validator_names_the_installed_release(release):
    proc = run_in(release, "-W", "ignore", "-m", "mbridge_recompute", "check", "--validator", "live",
                  "--json", "--set", "model.recompute_granularity=selective",
                  "--set", "model.recompute_modules=[core_attn]")
    report = json.loads(proc.stdout)
    assert report["version"] == release and report["facts"] == releases.resolve_version(release)
    assert report["release"]["how"].startswith(f"the installed megatron-core {release}")
    assert report["validator"] == "live" and report["version"] != "main"


def test_0_19_2_rejects_what_its_transformer_config_rejects_without_it_installed(run_tool):
    """--mcore-version 0.19.2 on the builtin table: gdp_qkv is not a 0.19 label."""
    p = run_tool("check", "--validator", "builtin", "--mcore-version", "0.19.2", "--json",
                 "--set", "model.recompute_granularity=selective",
                 "--set", "model.recompute_modules=[gdp_qkv]")
    assert p.returncode != 0 and "gdp_qkv" in (p.stdout + p.stderr)
    live = differential("0.19.2")
    gdp = next(r for r in live["results"] if r["name"] == "30 sel gdp_qkv")
    assert gdp["live"][:2] == ["reject", "modules-invalid-label"]


@pytest.mark.parametrize("release", RELEASES)
def test_a_fused_quick_gelu_passes_that_releases_transformer_config(release):
    """The live validator hands TransformerConfig the quick_gelu it compares against (its own
    module's, from fusions/fused_bias_geglu), so GPT-OSS's gated quick_gelu with
    bias_activation_fusion is accepted, as Bridge's provider builds it; the one from
    megatron/core/activations.py was refused with a false bias_activation_fusion error."""
    proc = run_in(release, "-W", "ignore", "-m", "mbridge_recompute", "check", "--validator", "live",
                  "--set", "model.activation_func=quick_gelu", "--set", "model.gated_linear_unit=true",
                  "--set", "model.bias_activation_fusion=true", "--json")
    report = json.loads(proc.stdout)
    assert report["validator"] == "live", proc.stderr[-2000:]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
