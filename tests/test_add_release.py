"""Adding a megatron-core release is one command (tests/tools/add_release.py), and adding 0.19.2
again from scratch, from its installed wheel, gives the card's 0.19 entries.

The tool reads upstream files only (no import of megatron): here the installed wheels of
tests/envs/build.sh's environments, 0.18.2 as the release before and 0.19.2 as the one added.
The card cites core_v0.19.0 for the whole 0.19 line; where 0.19.2's package differs from that
tag (the card lists the files as `patch_files`), its lines are 0.19.2's own, and the test holds
the tool to finding the same code there instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_releases import release_env

from mbridge_recompute.facts import card, releases

from conftest import ROOT, need_mirror

sys.path.insert(0, str(ROOT / "tests" / "tools"))
import add_release  # noqa: E402


def _site_dir(release: str) -> Path:
    """The directory holding megatron/core of a release's environment."""
    spec = release_env(release)
    for entry in spec["pythonpath"].split(":"):
        if entry and (Path(entry) / "megatron" / "core").is_dir():
            return Path(entry)
    pytest.fail(f"no megatron/core on the path of the {release} environment")


@pytest.fixture(scope="module")
def readded():
    old = add_release.Tree(root=_site_dir("0.18.2"))
    new = add_release.Tree(root=_site_dir("0.19.2"))
    return add_release.add("0.19", new, previous="0.18", old=old, tag="core_v0.19.0"), old, new


def _text(tree, site: str) -> list:
    s = card.site(site)
    lines = tree.lines(s.path())
    return [ln.strip() for a, b in s.ranges for ln in lines[a - 1:b]]


def test_adding_0_19_2_again_reproduces_the_cards_0_19_sites(readded):
    change, old, new = readded
    patched = set(releases.meta("0.19")["patch_files"])
    by_id = {r.cid: r for r in change.refound}
    mcore = add_release.sited(card.load())     # Bridge's own rules cite Bridge, not megatron-core
    assert len(by_id) == sum("0.18" in c["at"] for c in mcore) > 100
    same, shifted, changed, ended = [], [], [], []
    for c in mcore:
        if "0.18" not in c["at"]:
            continue
        r, want = by_id[c["id"]], c["at"].get("0.19")
        if want is None:
            # the card ends it at 0.18: a later rule took its place, which no text search can know
            assert r.new is None or "from 0.19 by" in c["condition"], c["id"]
            ended.append(c["id"])
        elif r.new == want:
            same.append(c["id"])
        elif r.new is not None:
            # found elsewhere only in a file 0.19.2 changed against core_v0.19.0 (the card's tag)
            assert card.site(want).path() in patched, (c["id"], want, r.new)
            assert _text(new, r.new) == _text(old, c["at"]["0.18"]), c["id"]
            shifted.append(c["id"])
        else:
            # vanished: the cited code really changed between 0.18.2 and 0.19 (a person re-cites it)
            if card.site(want).path() not in patched:
                assert _text(new, want) != _text(old, c["at"]["0.18"]), c["id"]
            changed.append(c["id"])
    assert len(same) >= 0.9 * len(by_id), (len(same), shifted, changed, ended)
    assert change.lost == [by_id[cid] for cid in by_id if by_id[cid].new is None]


def test_the_readded_release_has_the_cards_labels_and_offload_modules(readded):
    change, _, _ = readded
    assert sorted(change.labels) == sorted(releases.labels_for("0.19"))
    assert sorted(change.offload_modules) == sorted(releases.enum("offload_modules", "0.19"))


@pytest.mark.parametrize("release", ["0.17.1", "0.18.2", "0.19.2"])
def test_field_lists_read_from_source_are_the_packages_own(release):
    """data/upstream_fields.json was written by importing each package; the tool reads the class
    bodies instead and gets the same names and plain defaults."""
    fields = json.loads((ROOT / "scripts/mbridge_recompute/data/upstream_fields.json").read_text())
    key = releases.resolve_version(release)
    read = add_release.field_lists(add_release.Tree(root=_site_dir(release)))
    want = fields["mcore"][key]
    assert {k: read[k] for k in read} == {k: want[k] for k in read}


def test_the_release_entry_is_read_from_the_wheel(readded):
    change, _, _ = readded
    entry, card_entry = change.release_entry, releases.meta("0.19")
    assert entry["newest"] == card_entry["newest"] == "0.19.2"
    assert entry["python"] == card_entry["python"] and entry["tag"] == card_entry["tag"]
    assert "te_version_without_te" in " ".join(entry["carried_over"])


def test_writing_the_readded_release_into_a_card_without_it_gives_back_the_card(readded):
    """The card with every 0.19 site taken out of its `at` lines, written by the tool, is the card
    again: byte for byte on every line but the `at` of a constraint the tool did not re-find at
    the card's site."""
    import re

    change, _, _ = readded
    text = (ROOT / "card.yaml").read_text()
    without = re.sub(r', "0\.19": "[^"]*"', "", text)
    assert without != text
    out = add_release.write_card(without, change, list(card.load()["releases"]))
    sited = {c["id"]: c for c in add_release.sited(card.load())}     # constraints and memory bugs
    differ = {r.cid for r in change.refound if r.new != sited[r.cid]["at"].get("0.19")}
    expected_changes = {cid for cid, c in sited.items() if "0.19" in c["at"]} & differ | {
        cid for cid, c in sited.items() if "0.19" not in c["at"] and cid in change.at}
    ids = re.findall(r"^  - id: (\S+)", text, flags=re.M)
    bridge = {c["id"] for c in card.constraints() if c.get("bridge")}   # not the tool's to re-find
    wrong = []
    cid = None
    for a, b in zip(text.splitlines(), out.splitlines()):
        m = re.match(r"  - id: (\S+)", a)
        cid = m.group(1) if m else cid
        if a != b and cid not in expected_changes and cid not in bridge:
            wrong.append((cid, a.strip()[:80], b.strip()[:80]))
    assert len(text.splitlines()) == len(out.splitlines()) and len(ids) > 100
    assert wrong == []


BRIDGE_READ_AT = [(key, entry["read_at"]) for key, entry in card.load()["bridge_releases"].items()]


@pytest.mark.parametrize("key,tag", BRIDGE_READ_AT, ids=[k for k, _ in BRIDGE_READ_AT])
def test_the_bridge_harness_flags_read_at_each_tag_are_the_recorded_ones(key, tag):
    """--bridge TAG reads scripts/performance/argument_parser.py at the tag: every add_argument's
    spellings, arity, choices, required, append and line are data/bridge_harness_flags.json's, and
    the recompute tests the card lists for the release exist there. Needs the Bridge git mirror
    ($BRIDGE_MIRROR); no package carries the harness (the 0.6.2 wheel ships no scripts/)."""
    need_mirror("Megatron Bridge", tag)
    b = add_release.bridge_release(tag)
    recorded = json.loads((ROOT / "scripts/mbridge_recompute/data/bridge_harness_flags.json").read_text())
    assert b["flags"] == recorded["releases"][key]["flags"]
    assert b["package_info"] == card.load()["bridge_releases"][key]["package_info"]
    core = card.load()["bridge_releases"][key]["core_tests"]
    assert all(b["tests_present"][t] for t in core)


def test_write_applies_the_change_to_copies_of_the_data_files(readded, tmp_path):
    """--write on copies: the card stays valid for its schema and the field lists of 0.19 read
    from the wheel replace the imported ones unchanged."""
    import shutil

    from mbridge_recompute.facts.card_schema import check_file

    change, _, _ = readded
    data = tmp_path / "data"
    data.mkdir()
    for name in ("card.yaml", "upstream_fields.json"):
        shutil.copy2(ROOT / "scripts/mbridge_recompute/data" / name, data / name)
    before = json.loads((data / "upstream_fields.json").read_text())
    written = add_release.write(change, data_dir=data, top_card=tmp_path / "card.yaml")
    assert len(written) == 3 and check_file(data / "card.yaml") == []
    after = json.loads((data / "upstream_fields.json").read_text())
    assert after["mcore"]["0.19"] == before["mcore"]["0.19"]
    assert list(after["mcore"]) == list(before["mcore"])


def test_rules_only_main_had_are_found_in_the_release_they_arrived_in():
    """With Megatron-LM main's tree (the git mirror), the rules the card holds only from 0.19 on
    are re-found in the 0.19.2 wheel by main's text, at the card's 0.19 lines (in files 0.19.2
    did not change) or with main's code (in the ones it did)."""
    need_mirror("Megatron-LM", card.load()["releases"]["main"]["commit"])
    main = add_release.Tree(add_release.MLM_MIRROR, card.load()["releases"]["main"]["commit"])
    new = add_release.Tree(root=_site_dir("0.19.2"))
    change = add_release.add("0.19", new, previous="0.18", old=add_release.Tree(root=_site_dir("0.18.2")),
                             tag="core_v0.19.0", main=main)
    arrived = {r.cid: r.new for r in change.refound if r.status == "arrived"}
    new_in_019 = [c for c in card.constraints() if "0.19" in c["at"] and "0.18" not in c["at"]
                  and "main" in c["at"]]
    patched = set(releases.meta("0.19")["patch_files"])
    assert len(arrived) >= len(new_in_019) - 1
    for cid, site in arrived.items():
        want = card.constraint(cid)["at"]["0.19"]
        assert site == want or card.site(want).path() in patched, (cid, site, want)
