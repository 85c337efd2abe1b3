"""data/upstream_fields.json is what the packages hold; the per-source default tables agree with it.

The loader reads the field lists without importing anything; here each release's environment
(tests/envs/build.sh) runs tests/tools/gen_upstream_fields.py again and must print the same part,
so a package upgrade that adds a field shows up as a failing test, not as an unknown field.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from bridge_env import bridge_env
from test_releases import RELEASES, release_env

from mbridge_recompute.inputs import defaults
from mbridge_recompute.inputs import fields as upstream_fields

from conftest import ROOT, need_mirror

TOOL = ROOT / "tests" / "tools" / "gen_upstream_fields.py"


def _part(python: str, pythonpath: str, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([python, "-W", "ignore", str(TOOL), "--part", *extra], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("release", RELEASES)
def test_the_field_lists_are_that_releases(release):
    spec = release_env(release)
    part = _part(spec["python"], spec["pythonpath"])["mcore"]
    key = ".".join(release.split(".")[:2])
    assert part[key] == upstream_fields.upstream()["mcore"][key]


def test_the_bridge_lists_are_megatron_bridge_0_6_2s():
    spec = bridge_env()
    part = _part(spec["python"], spec["pythonpath"], "--bridge")["bridge"]
    assert part[upstream_fields.bridge_release()] == upstream_fields.bridge()


def test_main_is_read_from_the_source_of_the_cards_main_commit():
    import sys

    sys.path.insert(0, str(TOOL.parent))
    import gen_upstream_fields

    from mbridge_recompute.facts import releases

    need_mirror("Megatron-LM", releases.meta("main")["commit"])
    part = gen_upstream_fields.main_part(releases.meta("main")["commit"])["mcore"]["main"]
    assert part == upstream_fields.upstream()["mcore"]["main"]


def test_the_bridge_default_tables_are_the_provider_dataclass_defaults():
    b = upstream_fields.bridge()
    for table, cls in ((defaults.BRIDGE_GPT, "GPTModelProvider_defaults"),
                       (defaults.BRIDGE_HYBRID, "HybridModelProvider_defaults")):
        for name, (value, _why) in table.items():
            got = b[cls][name]
            assert got.get("value", got.get("enum")) == value, (cls, name)


def test_every_field_the_default_tables_set_is_one_the_memory_model_reads():
    from mbridge_recompute.workload import FIELD_NAMES

    for table in (defaults.BRIDGE_GPT, defaults.BRIDGE_HYBRID, defaults.MEGATRON_LM):
        assert set(table) <= FIELD_NAMES | upstream_fields.READ_BY_MODEL


def test_no_field_is_both_read_and_classified_or_in_two_groups():
    from mbridge_recompute.workload import FIELD_NAMES, section_fields

    rel = upstream_fields.relevance()
    for section in set(rel["not_memory_relevant"]) | set(rel["not_modelled"]):
        seen: dict = {}
        for reason, names in rel["not_memory_relevant"].get(section, {}).items():
            for n in names:
                assert n not in seen, (section, n, reason, seen.get(n))
                seen[n] = reason
        for n in rel["not_modelled"].get(section, {}):
            assert n not in seen, (section, n)
        ours = FIELD_NAMES if section == "model" else section_fields(section)
        read = ours | (upstream_fields.READ_BY_MODEL if section == "model" else set())
        overlap = (set(seen) | set(rel["not_modelled"].get(section, {}))) & (read - {"_target_"})
        assert not overlap, (section, sorted(overlap))


def test_no_shipped_code_depends_on_the_transformer_engine_stand_in():
    """The stand-in (tests/standins/transformer_engine) exists for the Bridge environment of the
    tests only; nothing under scripts/ names it."""
    doc = (ROOT / "tests" / "standins" / "transformer_engine" / "__init__.py").read_text()
    assert "CUDA-only library" in doc
    shipped = [p for p in (ROOT / "scripts").rglob("*")
               if p.is_file() and p.suffix in (".py", ".yaml", ".json")]
    assert shipped and not [p for p in shipped if "standins" in p.read_text(errors="replace")]
