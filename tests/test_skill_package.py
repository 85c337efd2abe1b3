"""The skill as a package: valid frontmatter, size, links, references, evals, hygiene.

Checks run on real files with the real validator (`skills_ref`, the Agent Skills
reference implementation), on a copy of the tracked files in a directory named
after the skill, as an installed skill would be laid out.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, SCRIPT_OF, SCRIPTS

NAME = "mbridge-activation-recompute"
SKILL = ROOT / "SKILL.md"
REFERENCES = sorted((ROOT / "references").glob("*.md"))
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = [SKILL, ROOT / "README.md", CONTRIBUTING, *REFERENCES]
SPEC_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
REQUIRED_REFERENCES = {"labels.md", "constraints.md", "memory-model.md", "harness-and-logs.md",
                       "evidence.md", "troubleshooting.md", "cli-reference.md"}


def frontmatter(text: str) -> tuple[str, str]:
    assert text.startswith("---\n"), "SKILL.md must start with '---' frontmatter"
    head, body = text[4:].split("\n---\n", 1)
    return head, body


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


# ---------------------------------------------------------------- frontmatter

def test_skills_ref_accepts_a_copy_of_the_tracked_files_named_after_the_skill(tmp_path):
    from skills_ref import read_properties, validate

    dest = tmp_path / NAME
    for rel in tracked_files():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shutil.copy2(SKILL, dest / "SKILL.md")   # the working copy, committed or not
    assert validate(dest) == []
    props = read_properties(dest)
    assert props.name == NAME
    assert props.license == "Apache-2.0"


def test_skills_ref_rejects_the_same_skill_in_a_wrongly_named_directory(tmp_path):
    from skills_ref import validate

    dest = tmp_path / "recompute"
    dest.mkdir()
    shutil.copy2(SKILL, dest / "SKILL.md")
    assert any("must match skill name" in e for e in validate(dest))


def test_frontmatter_uses_only_spec_keys_with_string_metadata():
    head, _ = frontmatter(SKILL.read_text())
    data = yaml.safe_load(head)
    assert set(data) <= SPEC_KEYS, set(data) - SPEC_KEYS
    assert data["name"] == NAME
    assert data["license"] == "Apache-2.0"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in data["metadata"].items())
    assert 1 <= len(data["compatibility"]) <= 500
    # strictyaml (skills-ref) rejects flow collections; '<' '>' break some validators
    assert not re.search(r":\s*[\[{]", head)
    assert "<" not in data["description"] and ">" not in data["description"]


def test_description_fits_and_names_the_triggers():
    data = yaml.safe_load(frontmatter(SKILL.read_text())[0])
    desc = data["description"]
    assert 1 <= len(desc) <= 1024
    for word in ("out of memory", "throughput", "assertion", "recompute_granularity",
                 "recompute_modules", "recompute_method", "recompute_num_layers",
                 "distribute_saved_activations", "selective", "full", "activation checkpointing",
                 "Use when"):
        assert word in desc, word


def test_skill_md_is_at_most_500_lines():
    assert len(SKILL.read_text().splitlines()) <= 500


# No tokenizer installs offline (tiktoken and Hugging Face tokenizers download their
# vocabularies), so the budget is a stated, conservative bound: English prose with code spans
# runs at about 4 characters per BPE token; counting 3.5 overestimates the tokens.
CHARS_PER_TOKEN = 3.5
TOKEN_BUDGET = 5000


def estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def test_skill_md_is_at_most_5000_tokens_at_3_5_characters_per_token():
    """The whole file, frontmatter included (what an agent loads on activation)."""
    text = SKILL.read_text()
    assert estimated_tokens(text) <= TOKEN_BUDGET, (
        f"SKILL.md is about {estimated_tokens(text)} tokens ({len(text)} characters / "
        f"{CHARS_PER_TOKEN}); move depth to references/")


def test_token_bound_counts_a_file_over_budget():
    assert estimated_tokens("x" * int(TOKEN_BUDGET * CHARS_PER_TOKEN)) == TOKEN_BUDGET
    assert estimated_tokens("x" * (int(TOKEN_BUDGET * CHARS_PER_TOKEN) + 1)) > TOKEN_BUDGET


def test_skill_md_lines_are_at_most_100_characters():
    wide = [(i, len(ln)) for i, ln in enumerate(SKILL.read_text().splitlines(), 1) if len(ln) > 100]
    assert wide == []


def test_skill_md_has_instructions_and_examples_sections():
    headings = re.findall(r"^## (.+)$", SKILL.read_text(), flags=re.M)
    assert "Instructions" in headings and "Examples" in headings


# ---------------------------------------------------------------- links and paths

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# paths of this repository named in prose, code spans or code blocks
OWN_PATH = re.compile(r"(?<![\w/.~-])((?:scripts|references|examples|evals|benchmarks|tests)/[\w./-]*\w)")
# upstream (Bridge / Megatron-LM) paths quoted as sources, not files of this repository
UPSTREAM = ("scripts/performance/", "scripts/training/", "tests/unit_tests/", "tests/functional_tests/")


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset:
    return frozenset(slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M))


def broken_paths(doc: Path) -> list[str]:
    text = doc.read_text()
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            problems.append(f"{doc.name}: link {target} -> missing {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{doc.name}: link {target} -> no heading #{anchor}")
        elif ROOT not in dest.parents and dest != ROOT:
            problems.append(f"{doc.name}: link {target} leaves the skill")
    for rel in OWN_PATH.findall(text):
        if rel.startswith(UPSTREAM) or rel + "/" in UPSTREAM:
            continue
        if not (ROOT / rel).exists():
            problems.append(f"{doc.name}: path {rel} does not exist")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_the_docs_name_exists(doc):
    assert broken_paths(doc) == []


def test_path_check_catches_a_missing_script_and_a_dead_anchor(tmp_path):
    doc = tmp_path / "references" / "x.md"
    doc.parent.mkdir()
    doc.write_text("Run `python3 scripts/plan_v2.py` and see [labels](../SKILL.md#no-such-heading).\n")
    # the check resolves own paths against the repository root
    problems = broken_paths(doc)
    assert any("scripts/plan_v2.py" in p for p in problems)


# a test file of this repository (not an upstream tests/unit_tests/ path), with an optional
# ::test_name
TEST_CITATION = re.compile(r"(?<![\w/.-])(tests/test_\w+\.py)(?:::(\w+))?")
CITING = [*DOCS, *(p for ext in ("py", "yaml", "json") for p in sorted((ROOT / "scripts").rglob(f"*.{ext}"))),
          *sorted((ROOT / "benchmarks").glob("*.py"))]


def missing_test_citations(paths) -> tuple[int, list[str]]:
    """(how many citations, the ones naming a test file, or a test in it, that does not exist)."""
    seen, missing = 0, []
    for path in paths:
        for rel, name in TEST_CITATION.findall(path.read_text(encoding="utf-8")):
            seen += 1
            target = ROOT / rel
            where = path.relative_to(ROOT) if ROOT in path.parents else path
            if not target.is_file():
                missing.append(f"{where}: {rel}")
            elif name and not re.search(rf"^def {name}\b", target.read_text(), flags=re.M):
                missing.append(f"{where}: {rel}::{name}")
    return seen, missing


def test_every_test_file_the_code_and_docs_cite_exists():
    """Docstrings and pages that say which test holds a claim name a test that exists."""
    seen, missing = missing_test_citations(CITING)
    assert missing == [] and seen > 20


def test_test_citation_check_catches_a_missing_file_and_a_missing_test(tmp_path):
    doc = tmp_path / "x.py"
    doc.write_text('"""tests/test_nope.py and tests/test_card.py::test_nope hold it; '
                   'tests/unit_tests/test_random.py is upstream."""\n')
    seen, missing = missing_test_citations([doc])
    assert seen == 2 and [m.split(": ")[1] for m in missing] == [
        "tests/test_nope.py", "tests/test_card.py::test_nope"]


def test_skill_md_links_every_reference_and_says_when_to_read_it():
    names = {p.name for p in REFERENCES}
    assert REQUIRED_REFERENCES <= names
    # a bullet or paragraph (lines joined) that links the reference also says when to read it
    items = re.split(r"\n(?=- )|\n\n", SKILL.read_text())
    for name in names:
        linking = [it for it in items if f"](references/{name})" in it]
        assert linking, f"SKILL.md does not link references/{name}"
        assert any("Read" in it for it in linking), f"SKILL.md does not say when to read {name}"


def test_long_references_have_a_table_of_contents():
    for ref in REFERENCES:
        text = ref.read_text()
        if len(text.splitlines()) > 300:
            assert re.search(r"^## Contents$", text, flags=re.M), ref.name


# ---------------------------------------------------------------- commands in the docs

def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(tool script, its --flags) for every `python3 scripts/X.py ...` in the text."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for m in re.finditer(r"python3 scripts/(\w+\.py)([^`\n|]*)", joined):
        args = m.group(2).split(" -- ")[0]          # after '--' come the harness's own flags
        out.append((m.group(1), re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args)))
    return out


@lru_cache(maxsize=None)
def help_text(script: str) -> str:
    r = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60)
    return r.stdout if r.returncode == 0 else ""


def _landed(script: str) -> bool:
    tool = {v: k for k, v in SCRIPT_OF.items()}[script]
    module = {"plan": "plan", "config": "config", "check": "check", "harness": "harness",
              "compare": "compare", "diagnose": "diagnose", "tests": "tests", "tune": "tune"}[tool]
    return (SCRIPTS / "mbridge_recompute" / "commands" / f"{module}.py").exists()


def test_commands_in_the_docs_use_only_flags_the_tools_accept():
    seen = 0
    for doc in DOCS:
        for script, flags in _commands(doc.read_text()):
            assert script in SCRIPT_OF.values(), f"{doc.name}: unknown tool scripts/{script}"
            if not _landed(script):
                continue
            usage = help_text(script)
            assert usage, f"scripts/{script} --help failed"
            for flag in flags:
                seen += 1
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage), \
                    f"{doc.name}: scripts/{script} has no {flag}"
    assert seen > 0


# ---------------------------------------------------------------- evals

def test_evals_follow_the_skill_evaluator_format():
    data = json.loads((ROOT / "evals" / "evals.json").read_text())
    assert isinstance(data, list) and len(data) >= 10
    keys = {"id", "question", "expected_skill", "expected_script", "ground_truth",
            "expected_behavior", "should_trigger"}
    assert len({e["id"] for e in data}) == len(data)
    for e in data:
        assert set(e) == keys, e["id"]
        assert e["question"].strip() and e["ground_truth"].strip()
        assert e["expected_behavior"] and all(isinstance(b, str) and b for b in e["expected_behavior"])
        if e["should_trigger"]:
            assert e["expected_skill"] == NAME, e["id"]
        else:
            assert e["expected_skill"] is None and e["expected_script"] is None, e["id"]
        if e["expected_script"] is not None:
            assert (ROOT / e["expected_script"]).is_file(), e["expected_script"]
    assert sum(not e["should_trigger"] for e in data) >= 3


# ---------------------------------------------------------------- hygiene

def test_no_build_or_tool_junk_is_tracked():
    junk = re.compile(r"(^|/)(\.venv|node_modules|\.pytest_cache|__pycache__|\.tools)(/|$)|"
                      r"\.egg-info(/|$)|(^|/)metadata\.json$|\.pyc$")
    assert [p for p in tracked_files() if junk.search(p)] == []


def test_license_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


# ---------------------------------------------------------------- maintainer guide

RECIPES = ("Add a megatron-core release", "Add a recompute label", "Add a rule", "Add a GPU",
           "Add an input format")


def test_contributing_has_the_data_flow_and_a_recipe_for_each_change():
    text = CONTRIBUTING.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert "How the facts flow" in headings and set(RECIPES) <= set(headings)
    assert "```" in text.split("## How the facts flow", 1)[1].split("\n## ", 1)[0]


def test_every_file_the_maintainer_guide_names_exists():
    """Paths in CONTRIBUTING.md are from the repository root, or from the package
    (scripts/mbridge_recompute/) for its modules (`memory/tensors.py`)."""
    text = CONTRIBUTING.read_text()
    named = set(re.findall(r"`([\w./-]+\.(?:py|json|yaml|yml|sh|txt|md))", text))
    named |= set(re.findall(r"`((?:tests|scripts)/[\w./-]+)`", text))
    package = ROOT / "scripts" / "mbridge_recompute"
    missing = []
    for rel in sorted(named):
        if not ((ROOT / rel).exists() or (package / rel).exists() or (package / "data" / rel).exists()):
            missing.append(rel)
    assert missing == [] and len(named) > 25
