"""The release is resolved once per invocation and handed on as one `releases.Release`.

`cli._run` turns `--mcore-version` (or the default: the installed megatron-core, else the newest
release the card covers) into a Release and runs the tool with it as the invocation's release
(`releases.current()`); everything below takes that object, so no version string is parsed
again, and nothing falls back to the installed release when another was asked for.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from mbridge_recompute.facts import releases

from conftest import EXAMPLES


def _run_counting(monkeypatch, argv: list) -> tuple[dict, int]:
    """(the tool's JSON report, how many version strings were resolved to a card key)."""
    from mbridge_recompute.cli import main

    seen = []
    real = releases._key_of

    def counting(text, field):
        if text not in releases.keys():          # a card key is no resolution, a version is
            seen.append(text)
        return real(text, field)

    monkeypatch.setattr(releases, "_key_of", counting)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(argv)
    return json.loads(out.getvalue()), len(seen)


@pytest.mark.parametrize("argv", [
    ["plan", "--mcore-version", "0.19.2", "--json"],
    ["check", "--mcore-version", "0.18.2", "--validator", "builtin", "--json"],
    ["config", "--mcore-version", "0.17.1", "--modules", "moe_act", "--json"],
], ids=["plan", "check", "config"])
def test_a_tool_resolves_the_requested_release_once(monkeypatch, argv):
    report, resolutions = _run_counting(monkeypatch, argv)
    assert resolutions == 1, resolutions
    assert "error" not in report


def test_the_default_release_is_resolved_once_too(monkeypatch):
    report, resolutions = _run_counting(monkeypatch, ["plan", "--json"])
    assert resolutions == 1 and report["release"]["requested"] == releases.installed_mcore_version()


def test_the_memory_model_places_layers_by_the_requested_release_not_the_installed_one(monkeypatch):
    """From 0.17 a hybrid pattern's '|' separators are its pipeline stages; the installed 0.16.1
    would split the 52 layers evenly. The per-rank figures follow the requested 0.19 split
    (45 and 7 layers), not the installed one (26 and 26)."""
    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EM|EMEMEME"
    report, _ = _run_counting(monkeypatch, [
        "plan", str(EXAMPLES / "nemotron_3_nano.yaml"), "--mcore-version", "0.19.2", "--json",
        "--set", f"model.hybrid_override_pattern={pattern}", "--set", "model.pipeline_model_parallel_size=2"])
    assert [r["layers"] for r in report["ranks"]] == [45, 7]
    assert report["ranks"][0]["activation_bytes"] > 4 * report["ranks"][1]["activation_bytes"]


def test_release_objects_pass_through_every_resolver_unchanged():
    r = releases.target("0.18.2")
    assert releases.resolve(r) is r and releases.resolve_version(r) == "0.18" and r.asked
    assert r.labels() == releases.labels_for("0.18") and r.meta["tag"] == "core_v0.18.2"
    with releases.using(r):
        assert releases.current() is r and releases.target_version() == "0.18"
        assert releases.resolve(None) is r
    assert releases.current() == releases.target()      # outside: the default again
