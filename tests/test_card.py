"""The card is well-formed, the top-level copy is the package's, and the guide agrees with it.

Facts live once, in scripts/mbridge_recompute/data/card.yaml. SKILL.md and references/
carry blocks generated from it (labels, rules, limitations) and references/evidence.md the
evidence tables; these tests fail as soon as either drifts from the card. After editing the card,
refresh the top-level copy with:

    cp scripts/mbridge_recompute/data/card.yaml card.yaml
"""

from __future__ import annotations

import copy
import re
import shutil

import pytest
import yaml

from mbridge_recompute.facts import card, docs, releases
from mbridge_recompute.facts.card_schema import check_file, validate

from conftest import ROOT

PACKAGE_CARD = card.CARD_PATH
TOP_CARD = ROOT / "card.yaml"
SKILL = ROOT / "SKILL.md"
EVIDENCE_DOC = ROOT / "references" / "evidence.md"


# ---------------------------------------------------------------- markdown parsing

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_table(lines: list[str], start: int) -> list[dict]:
    """The markdown table whose header is at or after line `start`, as a list of row dicts."""
    i = start
    while i < len(lines) and not lines[i].lstrip().startswith("|"):
        i += 1
    header = _cells(lines[i])
    rows = []
    for line in lines[i + 2:]:
        if not line.lstrip().startswith("|"):
            break
        rows.append(dict(zip(header, _cells(line))))
    return rows


def modules_of(cell: str) -> list[str]:
    names = re.findall(r"`([^`]*)`", cell)
    return [] if names == ["[]"] else names


# ---------------------------------------------------------------- evidence tables

OUTCOME_TEXT = {
    "completed": "completed",
    "oom_after_iteration_1": "OOM after iteration 1",
    "oom_in_iteration_1": "OOM in iteration 1",
    "oom_rank0": "OOM on rank 0",
}
# table header (lower-cased, by substring, first match wins) -> card row key
HEADER_KEYS = [
    ("selective modules", "modules"),
    ("outcome", "outcome"),
    ("peak allocated", "peak_allocated_gb"),
    ("peak (gb)", "peak_memory_gb"),
    ("after it", "peak_after_iteration"),
    ("step time", "step_time_ms"),
    ("tflop/s/gpu", "tflops_per_gpu"),
    ("δ peak", "delta_peak_pct"),
    ("δ time", "delta_time_pct"),
]
NUMERIC_KEYS = ("peak_allocated_gb", "peak_memory_gb", "peak_after_iteration", "step_time_ms",
                "tflops_per_gpu", "delta_peak_pct", "delta_time_pct")


def _key_of(header: str) -> str | None:
    h = header.lower()
    for needle, key in HEADER_KEYS:
        if needle in h:
            return key
    return None


def _number(cell: str) -> tuple[float, bool]:
    approx = "≈" in cell
    text = cell.replace("≈", "").replace("−", "-").replace("%", "").replace("+", "").strip()
    return float(text), approx


def evidence_tables(text: str) -> dict[str, list[dict]]:
    lines = text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s*<!-- card:evidence (\S+) -->", line)
        if m:
            out[m.group(1)] = parse_table(lines, i + 1)
    return out


def evidence_mismatches(doc_text: str, card_data: dict) -> list[str]:
    """Every way the doc's evidence tables differ from the card's evidence rows."""
    problems = []
    tables = evidence_tables(doc_text)
    for entry in card_data["evidence"]:
        eid = entry["id"]
        if eid not in tables:
            problems.append(f"{eid}: no table marked <!-- card:evidence {eid} -->")
            continue
        doc_rows = {tuple(modules_of(r[next(iter(r))])): r for r in tables[eid]}
        card_rows = {tuple(r["modules"]): r for r in entry["rows"]}
        for missing in card_rows.keys() - doc_rows.keys():
            problems.append(f"{eid}: card row {list(missing)} is not in the table")
        for extra in doc_rows.keys() - card_rows.keys():
            problems.append(f"{eid}: table row {list(extra)} is not in the card")
        for mods in card_rows.keys() & doc_rows.keys():
            crow, drow = card_rows[mods], doc_rows[mods]
            where = f"{eid} {list(mods)}"
            shown = set()
            for header, cell in drow.items():
                key = _key_of(header)
                if key in (None, "modules"):
                    continue
                shown.add(key)
                if key == "outcome":
                    want = OUTCOME_TEXT.get(crow["outcome"], f"<no text for {crow['outcome']}>")
                    if cell != want:
                        problems.append(f"{where}: outcome {cell!r}, card says {want!r}")
                    continue
                if cell == "control":
                    if mods != () or crow.get(key) not in (0, 0.0, None):
                        problems.append(f"{where}: {key} shown as control")
                    continue
                if cell in ("–", "-", ""):
                    if crow.get(key) is not None:
                        problems.append(f"{where}: {key} missing in the table, card has {crow[key]}")
                    continue
                try:
                    value, approx = _number(cell)
                except ValueError:
                    problems.append(f"{where}: {key} cell {cell!r} is not a number")
                    continue
                if crow.get(key) is None or abs(value - crow[key]) > 1e-9:
                    problems.append(f"{where}: {key} {value} in the table, card has {crow.get(key)}")
                if approx != (key in crow.get("approximate", [])):
                    problems.append(f"{where}: {key} approximate={approx} in the table, card "
                                    f"approximate={crow.get('approximate', [])}")
            for key in NUMERIC_KEYS:
                if crow.get(key) is not None and key not in shown and not (
                        key.startswith("delta") and mods == ()):
                    problems.append(f"{where}: card value {key}={crow[key]} has no column")
    return problems


# ---------------------------------------------------------------- the tests

def test_card_matches_its_schema():
    assert check_file(PACKAGE_CARD) == []


def test_top_level_card_is_a_byte_identical_copy_of_the_package_card():
    assert TOP_CARD.read_bytes() == PACKAGE_CARD.read_bytes(), (
        "card.yaml differs from scripts/mbridge_recompute/data/card.yaml; "
        "run: cp scripts/mbridge_recompute/data/card.yaml card.yaml")


def test_top_level_card_copy_check_fails_when_the_copy_drifts(tmp_path):
    drifted = tmp_path / "card.yaml"
    shutil.copyfile(TOP_CARD, drifted)
    drifted.write_text(drifted.read_text().replace("36.618", "36.619", 1))
    assert drifted.read_bytes() != PACKAGE_CARD.read_bytes()


def test_guide_tables_are_the_ones_the_card_renders():
    """The labels-by-release matrix, the rules that differ between releases and the full
    constraint tables in SKILL.md and references/ are generated from the card
    (`python3 -m mbridge_recompute.facts.docs --write`)."""
    assert docs.stale_blocks() == []


def _copy_docs(tmp_path):
    for f in {f for files in docs.BLOCKS.values() for f in files}:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text((ROOT / f).read_text())


def test_guide_table_check_fails_when_a_table_drifts(tmp_path):
    _copy_docs(tmp_path)
    labels = tmp_path / "references" / "labels.md"
    text = labels.read_text()
    drifted = re.sub(r"(\| `mhc` \| )– \|", r"\1yes |", text, count=1)   # mhc present in 0.16
    assert drifted != text
    labels.write_text(drifted)
    assert docs.stale_blocks(tmp_path) == ["references/labels.md: block labels differs from the card"]
    docs.write(tmp_path)
    assert docs.stale_blocks(tmp_path) == [] and labels.read_text() == text


def test_skill_label_releases_check_fails_when_a_label_moves(tmp_path):
    _copy_docs(tmp_path)
    skill = tmp_path / "SKILL.md"
    text = skill.read_text()
    drifted = text.replace("`gdp_qkv`, `mhc`.", "`gdp_qkv`.", 1)
    assert drifted != text
    skill.write_text(drifted)
    assert docs.stale_blocks(tmp_path) == ["SKILL.md: block label-releases differs from the card"]


def test_skill_names_main_only_labels_as_in_no_release():
    """The labels SKILL.md calls main-only are exactly the card's labels that no numbered
    release accepts (so 'upgrade megatron-core' cannot fix their Invalid choices error)."""
    line = next(ln for ln in docs.label_releases().split("\n- ") if "in no release" in ln)
    named = set(re.findall(r"`(\w+)`", line))
    numbered = [k for k in card.load()["releases"] if k != "main"]
    from mbridge_recompute.facts import releases

    want = {e["label"] for e in card.load()["labels"]
            if not any(releases.in_range(k, e["releases"]) for k in numbered)}
    assert named == want == {"gdp_in_proj", "gdp_qkv", "mhc"}


def test_table_cells_escape_a_pipe_instead_of_rewriting_it():
    """A hybrid pattern's `|` (pipeline stage) and `/` mean different things: a constraint
    cell keeps the `|`, escaped for markdown."""
    tables = docs.constraint_tables()
    row = next(ln for ln in tables.splitlines() if ln.startswith("| `hybrid-vpp-needs-pipes` |"))
    assert "without '\\|' separators" in row and "'/'" not in row
    cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    assert len(cells) == 5


def test_label_matrix_lists_each_label_in_the_releases_the_card_names():
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:7]]
            for line in docs.label_matrix().splitlines()[2:]}
    assert rows["core_attn"] == ["yes"] * 5
    assert rows["gdn_norm_out"] == ["–", "–", "–", "yes", "yes"]
    assert rows["mhc"] == ["–", "–", "–", "–", "yes"]
    assert set(rows) == {e["label"] for e in card.load()["labels"]}


def test_reference_evidence_tables_agree_with_card_evidence():
    assert evidence_mismatches(EVIDENCE_DOC.read_text(), card.load()) == []


def test_evidence_check_fails_when_a_number_drifts():
    text = EVIDENCE_DOC.read_text()
    drifted = text.replace("| 466.26 |", "| 466.62 |", 1)
    assert drifted != text
    problems = evidence_mismatches(drifted, card.load())
    assert problems == ["moonlight_16b_selective_h100 ['moe_act']: step_time_ms 466.62 in the "
                        "table, card has 466.26"]


def test_evidence_check_fails_when_the_card_drifts(tmp_path):
    data = copy.deepcopy(card.load())
    data["evidence"][2]["rows"][1]["peak_memory_gb"] = 55.7
    data["evidence"][1]["rows"][4]["outcome"] = "oom_in_iteration_1"
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    drifted = yaml.safe_load((tmp_path / "card.yaml").read_text())
    problems = evidence_mismatches(EVIDENCE_DOC.read_text(), drifted)
    assert any("llama3_70b_fp8_sft_h100 ['mlp']: peak_memory_gb" in p for p in problems)
    assert any("nemotron3_nano_capacity_h100 ['moe']: outcome" in p for p in problems)


def test_evidence_check_fails_when_a_row_or_approximation_drifts():
    text = EVIDENCE_DOC.read_text()
    assert any("['mlp', 'core_attn']" in p for p in
               evidence_mismatches(text.replace("| `mlp`, `core_attn` |", "| `core_attn`, `mlp` |"),
                                   card.load()))
    assert any("approximate" in p for p in
               evidence_mismatches(text.replace("| ≈ 704 |", "| 704 |"), card.load()))


def test_evidence_deltas_follow_from_the_raw_numbers():
    """Each stated delta is (value / control − 1) · 100, rounded to two decimals."""
    for entry in card.load()["evidence"]:
        rows = {tuple(r["modules"]): r for r in entry["rows"]}
        control = rows.get(())
        for row in entry["rows"]:
            for delta, raw in (("delta_peak_pct", "peak_allocated_gb"), ("delta_time_pct", "step_time_ms")):
                if row.get(delta) is None:
                    continue
                assert control is not None, f"{entry['id']}: a delta needs a [] control row"
                want = round((row[raw] / control[raw] - 1) * 100, 2)
                assert row[delta] == pytest.approx(want, abs=0.006), (entry["id"], row["modules"], delta)


def test_every_evidence_entry_states_its_workload():
    for entry in card.load()["evidence"]:
        cond = entry["conditions"]
        for key in ("model", "hardware", "precision", "parallelism", "seq_length",
                    "micro_batch_size", "global_batch_size", "revisions", "memory_point"):
            assert cond.get(key) not in (None, ""), (entry["id"], key)
        assert entry["limits"], entry["id"]


# ---------------------------------------------------------------- the schema itself

def _card() -> dict:
    return copy.deepcopy(card.load())


def test_schema_names_the_path_of_a_non_numeric_evidence_value():
    data = _card()
    data["evidence"][0]["rows"][1]["peak_allocated_gb"] = "n/a"
    assert validate(data) == ["evidence[0].rows[1].peak_allocated_gb: expected a number, got 'n/a'"]


def test_schema_rejects_unknown_top_level_keys_and_missing_sections():
    data = _card()
    data["evidense"] = []
    del data["limitations"]
    problems = validate(data)
    assert any(p.startswith("evidense: unknown top-level key") for p in problems)
    assert "card.limitations: missing" in problems


def test_schema_rejects_a_release_the_card_does_not_declare():
    data = _card()
    data["labels"][0]["releases"] = "0.15-main"
    data["constraints"][0]["at"]["0.20"] = "tc:1"
    assert validate(data) == ["labels[0].releases: '0.15' is not one of the card's releases "
                              "(0.16, 0.17, 0.18, 0.19, main)",
                              "constraints[0].at: '0.20' is not one of the card's releases"]


def test_schema_rejects_duplicate_ids_and_bad_constraint_fields():
    data = _card()
    data["constraints"].append(dict(data["constraints"][0]))
    data["constraints"][1]["severity"] = "fatal"
    data["constraints"][2]["kind"] = "folklore"
    problems = validate(data)
    assert any("duplicate" in p and p.startswith(f"constraints[{len(data['constraints']) - 1}]")
               for p in problems)
    assert any(p.startswith("constraints[1].severity: 'fatal'") for p in problems)
    assert any(p.startswith("constraints[2].kind: 'folklore'") for p in problems)


def test_schema_requires_evidence_conditions_and_known_row_fields():
    data = _card()
    del data["evidence"][1]["conditions"]["hardware"]
    data["evidence"][1]["rows"][0]["peak_gb"] = 1.0
    problems = validate(data)
    assert "evidence[1].conditions.hardware: missing" in problems
    assert "evidence[1].rows[0].peak_gb: unknown row field" in problems


def test_schema_requires_limitation_text():
    data = _card()
    data["limitations"][0] = {"id": "x"}
    assert validate(data) == ["limitations[0].text: missing"]


def test_schema_command_line_exit_codes(tmp_path):
    import subprocess
    import sys

    from conftest import SCRIPTS

    good = subprocess.run([sys.executable, "-m", "mbridge_recompute.facts.card_schema", str(PACKAGE_CARD)],
                          cwd=SCRIPTS, capture_output=True, text=True)
    assert (good.returncode, good.stderr) == (0, "")
    data = _card()
    data["limitations"].append({"id": "y", "text": 3})
    bad_path = tmp_path / "card.yaml"
    bad_path.write_text(yaml.safe_dump(data))
    bad = subprocess.run([sys.executable, "-m", "mbridge_recompute.facts.card_schema", str(bad_path)],
                         cwd=SCRIPTS, capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        f"limitations[{len(data['limitations']) - 1}].text: expected a non-empty string, got 3"]


# ---------------------------------------------------------------- constraints reference

def test_constraints_reference_quotes_every_card_message_of_every_release():
    text = (ROOT / "references" / "constraints.md").read_text()
    for c in card.constraints():
        for message, _keys in card.message_variants(c["id"]):
            if message and message not in ("runtime only", "silent no-op"):
                assert message.replace("|", "\\|").replace("`", "'") in text, c["id"]


# ---------------------------------------------------------------- evidence conditions in prose

def evidence_condition_mismatches(doc_text: str, card_data: dict) -> list[str]:
    """The prose above each evidence table must state the card's hardware, parallelism,
    sequence length and batch sizes (no number travels without its workload)."""
    lines = doc_text.replace("×", "x").splitlines()
    problems = []
    for entry in card_data["evidence"]:
        marker = f"<!-- card:evidence {entry['id']} -->"
        idx = next((i for i, line in enumerate(lines) if line.strip() == marker), None)
        if idx is None:
            problems.append(f"{entry['id']}: no marker")
            continue
        start = max(i for i in range(idx) if lines[i].startswith("#"))
        prose = " ".join(lines[start:idx])
        cond = entry["conditions"]
        wanted = [cond["hardware"], f"seq {cond['seq_length']}", f"MBS {cond['micro_batch_size']}",
                  f"GBS {cond['global_batch_size']}"]
        wanted += [f"{k} {v}" for k, v in re.findall(r"\b(TP|PP|VPP|CP|EP|DP) (\d+)", cond["parallelism"])]
        problems += [f"{entry['id']}: prose lacks {w!r}" for w in wanted if w not in prose]
    return problems


def test_evidence_prose_states_each_workload():
    assert evidence_condition_mismatches(EVIDENCE_DOC.read_text(), card.load()) == []


def test_evidence_prose_check_fails_when_a_condition_drifts():
    drifted = EVIDENCE_DOC.read_text().replace("GBS 32 |", "GBS 64 |", 1)
    assert evidence_condition_mismatches(drifted, card.load()) == [
        "llama3_70b_fp8_sft_h100: prose lacks 'GBS 32'"]


# ---------------------------------------------------------------- limitations

def test_known_limitations_are_the_card_limitations_in_card_order():
    """references/memory-model.md's Known limitations block is rendered from the card, one
    bullet per limitation (stale_blocks holds it to the card)."""
    block = docs.limitations()
    bullets = [" ".join(b.split()) for b in re.split(r"^- ", block, flags=re.M)[1:]]
    assert bullets == [" ".join(e["text"].split()) for e in card.load()["limitations"]]
    assert "<!-- card:limitations -->\n" + block in (ROOT / "references" / "memory-model.md").read_text()


def test_every_citation_abbreviation_is_defined_in_the_card_legend():
    """`tc:1208 @ core_v0.16.1`-style citations in code, card, SKILL.md and references use a file
    name or path, or an abbreviation the card's `abbreviations:` defines."""
    legend = set(card.load()["abbreviations"])
    cite = re.compile(r"(?<![\w./-])([\w./-]+?):\d+(?:-\d+)?(?:,\s?\d+(?:-\d+)?)*\s*@")
    files = [*ROOT.glob("scripts/**/*.py"), *ROOT.glob("references/*.md"), ROOT / "SKILL.md",
             ROOT / "card.yaml", ROOT / "README.md"]
    undefined = {}
    for f in files:
        for m in cite.finditer(f.read_text()):
            name = m.group(1)
            if name in legend or "/" in name or "." in name:
                continue
            undefined.setdefault(name, f.relative_to(ROOT).as_posix())
    assert undefined == {}
    # a site of the card (a constraint's or a memory bug's `at`) names a path or an abbreviation:
    # a bare `token_dispatcher.py` says nothing of its directory, so no tool can open it
    sited = [*card.constraints(), *card.load()["memory_bugs"]]
    for loc in (v for c in sited for v in c.get("at", {}).values()):
        name = re.match(r"[\w./-]+?(?=:)", loc).group(0)
        assert name in legend or "/" in name, loc


def test_the_schema_refuses_a_bare_file_name_that_is_no_abbreviation():
    data = copy.deepcopy(card.load())
    data["memory_bugs"][0]["at"]["0.16"] = "dispatcher_of_nowhere.py:1-2"
    problems = validate(data)
    assert any("memory_bugs" in p and "neither a path nor a card abbreviation" in p for p in problems)


# ---------------------------------------------------------------- release-dependent prose

PROSE = [ROOT / "SKILL.md", ROOT / "README.md", *sorted((ROOT / "references").glob("*.md"))]


def _numbered() -> list[str]:
    return [k for k in card.load()["releases"] if k != "main"]


def test_release_spans_in_prose_are_the_cards_first_and_last_release():
    """'megatron-core 0.16 to 0.19' (and the like) in the guide and the card's limitations name
    the card's oldest and newest numbered release."""
    want = f"{_numbered()[0]} to {_numbered()[-1]}"
    texts = {p.name: p.read_text() for p in PROSE}
    texts["card limitations"] = " ".join(e["text"] for e in card.load()["limitations"])
    spans = {(name, m) for name, t in texts.items() for m in re.findall(r"\b0\.\d+ to 0\.\d+\b", t)}
    assert spans and {m for _, m in spans} == {want}, spans


def test_main_commit_in_prose_is_the_cards():
    commit = card.load()["releases"]["main"]["commit"]
    texts = [p.read_text() for p in PROSE] + [e["text"] for e in card.load()["limitations"]]
    named = {h for t in texts for h in re.findall(r"Megatron-LM main (?:at )?([0-9a-f]{7,40})\b", t)}
    assert named == {commit}


def test_skill_metadata_names_each_releases_newest_patch_and_main():
    head = yaml.safe_load(SKILL.read_text()[4:].split("\n---\n", 1)[0])
    rel = card.load()["releases"]
    want = ", ".join(rel[k]["newest"] for k in _numbered()) + f" and Megatron-LM main {rel['main']['commit']}"
    assert head["metadata"]["mcore-versions"] == want


def _since(cid: str) -> list[str]:
    return [ch["since"] for ch in next(c for c in card.constraints() if c["id"] == cid).get("changes", [])]


@pytest.mark.parametrize("cid", ["shared-expert-overlap-needs-alltoall", "ep-overlap-cuda-graph-scope"])
def test_a_rule_change_is_attributed_to_the_release_it_arrived_in(cid):
    """flex with shared-expert overlap and local graphs with EP overlap arrived in 0.18
    (transformer_config.py @ core_v0.18.2), not on main; the condition text says so."""
    c = next(c for c in card.constraints() if c["id"] == cid)
    assert re.findall(r"\bfrom (\d+\.\d+|main)\b", c["condition"]) == _since(cid) == ["0.18"]


def test_full_iteration_graph_impl_is_attributed_to_the_release_that_added_it():
    c = next(c for c in card.constraints() if c["id"] == "cuda-graph-impl-invalid")
    first = next(r["releases"].split("-")[0] for r in card.load()["enums"]["cuda_graph_impl"]
                 if "full_iteration" in r["values"])
    assert re.findall(r"from (\S+) full_iteration", c["condition"]) == [first] == ["0.18"]


def test_no_condition_calls_a_change_main_only_when_a_release_has_it():
    """A rule text that says what main does must be about a change that arrived on main, or a
    rule that holds only there, or name a label only main has."""
    main_only = {e["label"] for e in card.load()["labels"] if e["releases"] == "main"}
    wrong = []
    for c in card.constraints():
        text = c["condition"]
        if not re.search(r"\bmain\b", text):
            continue
        if "main" in _since(c["id"]) or set(c["at"]) == {"main"} or main_only & set(re.findall(r"\w+", text)):
            continue
        wrong.append(c["id"])
    assert wrong == []


def test_label_caveats_name_the_release_a_rejection_arrived_in():
    moe = next(e for e in card.load()["labels"] if e["label"] == "moe")
    caveat = next(x for x in moe["caveats"] if "EP A2A overlap" in x)
    rejected_from = next(iter(next(c for c in card.constraints()
                                   if c["id"] == "ep-overlap-with-moe-recompute")["at"]))
    assert caveat.endswith(f"rejected by the config from {rejected_from}") and rejected_from == "0.17"


def test_labels_reference_dates_gdn_norm_out_and_the_graph_capture_skip_by_the_card():
    """references/labels.md: gdn_norm_out is a 0.19 label and the CUDA-graph checkpoint skip holds
    from 0.18 (random.py:642-648 @ core_v0.18.2), as the card says; neither is 'main only'."""
    text = (ROOT / "references" / "labels.md").read_text()
    gdn = next(e for e in card.load()["labels"] if e["label"] == "gdn_norm_out")["releases"].split("-")[0]
    assert f"### From {gdn}: `gdn_norm_out`" in text
    skip = next(iter(next(c for c in card.constraints()
                          if c["id"] == "recompute-inside-cuda-graph-capture")["at"]))
    row = next(ln for ln in text.splitlines() if "per-layer CUDA-graph capture" in ln)
    assert f"from {skip}" in row and "main only" not in row
    main_only = next(ln for ln in text.splitlines() if ln.startswith("### Main only"))
    assert set(re.findall(r"`(\w+)`", main_only)) == {
        e["label"] for e in card.load()["labels"] if e["releases"] == "main"}


MECHANISMS = {"tensor_parallel.checkpoint": lambda m: m.startswith("tensor_parallel.checkpoint"),
              "te_checkpoint": lambda m: "te_checkpoint" in m,
              "CheckpointWithoutOutput": lambda m: m.startswith("CheckpointWithoutOutput")}


def used_by(cell: str) -> dict:
    """label -> the release qualifier it is listed under in a `used by` cell ('' for none):
    "`a`, `b`; from 0.19: `c`; main only: `d`"."""
    out = {}
    for part in cell.split(";"):
        head, sep, _rest = part.partition(":")
        qualifier = head.strip() if sep and "`" not in head else ""
        for label in re.findall(r"`(\w+)`", part):
            out[label] = qualifier
    return out


def test_labels_reference_mechanism_table_follows_the_card():
    """references/labels.md's checkpoint-mechanism table lists under each mechanism the labels
    whose card `mechanism` uses it, each under the releases the card gives it: unqualified for
    every release, `from X` for X and later, `main only` for main (a 0.19 label listed as
    `main:` was wrong)."""
    text = (ROOT / "references" / "labels.md").read_text()
    section = text.split("## The three checkpoint mechanisms", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        m = re.match(r"`(\w+(?:\.\w+)?)`", cells[0]) if len(cells) == 4 else None
        if m:
            rows[m.group(1)] = used_by(cells[3])
    assert set(rows) == set(MECHANISMS)
    labels = card.load()["labels"]
    numbered = [k for k in releases.keys() if k != "main"]
    for mechanism, uses in MECHANISMS.items():
        want = {e["label"] for e in labels if uses(e["mechanism"])}
        assert set(rows[mechanism]) == want, mechanism
        for e in labels:
            if e["label"] not in rows[mechanism]:
                continue
            q = rows[mechanism][e["label"]]
            spec = ({"": f"{numbered[0]}-main", "main only": "main"}.get(q)
                    or (q.removeprefix("from ") + "-main" if q.startswith("from ") else None))
            assert spec == e["releases"], (mechanism, e["label"], q, e["releases"])


def test_every_citation_abbreviation_names_a_file_of_megatron_lm():
    """The card's abbreviations are paths in Megatron-LM; `recompute.py` is
    megatron/core/recompute.py (tb imports checkpointed_forward from it, transformer_block.py:23
    @ core_v0.18.2), not megatron/core/transformer/recompute.py, which no tag has."""
    legend = card.load()["abbreviations"]
    assert legend["recompute.py"] == "megatron/core/recompute.py"
    for abbr, path in legend.items():
        assert path.startswith("megatron/") and path.endswith(".py"), abbr
        if abbr.endswith(".py"):
            assert path.endswith("/" + abbr), (abbr, path)


def test_the_site_parser_reads_every_site_form_the_card_writes():
    """card.site is the one parser of `abbr:start-end` sites (schema, rule order, the live
    validator's line match and the differential's cited-message check all use it)."""
    s = card.site("tc:1208-1211")
    assert (s.file, s.start, s.end, s.caller) == ("tc", 1208, 1211, None)
    assert s.path() == "megatron/core/transformer/transformer_config.py"
    multi = card.site("moe_utils.py:24-39,1192")
    assert multi.ranges == ((24, 39), (1192, 1192)) and multi.path().endswith("moe/moe_utils.py")
    called = card.site("cgc:108-111 (from tc:2187)")
    assert (called.file, called.start, called.caller.file, called.caller.start) == ("cgc", 108, "tc", 2187)
    for bad in ("tc", "tc:", "tc:12-", "line 12", "", None):
        with pytest.raises(ValueError):
            card.site(bad)
    sites = [v for c in card.constraints() for v in c["at"].values()]
    assert all(card.site(v).text() == v.replace(", ", ",") for v in sites) and len(sites) > 500
