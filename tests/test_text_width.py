"""Text output fits 100 columns: tables stack their headers, wrap their free-text column or move it
under the row, and split into column blocks; prose wraps with a hanging indent; a pasted command
continues with backslashes. `--wide` keeps one line per sentence and per table row."""

from __future__ import annotations

import shlex
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_recompute.output import WIDTH, shell_lines, table, width, wrap

from conftest import EXAMPLES, ROOT, run_in_process, run_script


def _longest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def test_the_default_plan_prints_no_line_over_100_columns():
    proc = run_script("plan")
    assert proc.returncode == 0, proc.stderr
    assert WIDTH == 100 and _longest(proc.stdout) <= 100
    assert "recompute labels" in proc.stdout and "assumptions:" in proc.stdout


def test_wide_keeps_one_line_per_table_row():
    text = run_script("plan", "--wide").stdout
    rows = [ln for ln in text.splitlines() if ln.startswith(("core_attn ", "mlp "))]
    assert len(rows) == 2 and all("  yes  " in ln for ln in rows)
    assert _longest(text) > 100          # the old form: nothing was wrapped
    narrow = run_script("plan").stdout

    def words(t: str) -> set:            # what the text says, rules and continuations aside
        return {w for w in t.split() if w.strip("-") and w != "\\"}
    # the same words; a free-text cell moved under its row is led by its header ("peak term:")
    assert words(text) <= words(narrow) and all(w.endswith(":") for w in words(narrow) - words(text))


def test_a_free_text_column_wraps_in_place_when_the_numbers_leave_room():
    reason = "a long reason " * 12
    with width(60):
        text = table(["label", "GB", "why"], [["moe_act", "1.00", reason]], "lrl", free=-1)
    lines = text.splitlines()
    assert _longest(text) <= 60 and len(lines) > 3
    start = lines[0].index("why")
    assert all(ln[:start].strip() == "" for ln in lines[3:])   # continuation under its column
    assert " ".join(ln[start:].strip() for ln in lines[2:]).split() == reason.split()


def test_a_free_text_column_moves_under_the_row_when_too_narrow():
    cells = [f"{k}.00" for k in range(12)]
    with width(80):
        text = table(["rank"] + [f"r{k}" for k in range(12)] + ["peak term"],
                     [["0"] + cells + ["forward working set of one layer"]], free=-1)
    assert _longest(text) <= 80
    assert "    peak term: forward working set of one layer" in text.splitlines()


def test_a_table_too_wide_for_any_wrap_splits_into_column_blocks_led_by_its_key():
    headers = ["label"] + [f"rank {k}" for k in range(20)]
    with width(100):
        text = table(headers, [["moe"] + [f"{k}.25" for k in range(20)]])
    blocks = text.split("\n\n")
    assert len(blocks) >= 2 and _longest(text) <= 100
    assert all(b.startswith("label") and "\nmoe " in b for b in blocks)
    assert "rank 0" in blocks[0] and "rank 19" in blocks[-1]


def test_a_candidate_name_breaks_only_before_its_at_changes():
    name = ("moe_act,layernorm@pipeline_model_parallel_layout=Et*5|(t*6|)*2t*7L"
            "@virtual_pipeline_model_parallel_size=null")
    with width(70):
        text = table(["candidate", "peak GB", "how"], [[name, "23.84", "dominated by moe_act"]], "lrl",
                     free=-1, breaks="@")
    lines = text.splitlines()
    rule = next(k for k, ln in enumerate(lines) if ln.startswith("---"))
    first = [ln.split()[0] for ln in lines[rule + 1:] if not ln.startswith(" ")]
    assert "".join(first) == name and all(p.startswith("@") for p in first[1:])


def test_wide_gives_the_old_one_line_form():
    with width(None):
        text = table(["a", "why"], [["x", "w " * 200]], free=-1)
        assert wrap("w " * 200) == ["w " * 200]
    assert len(text.splitlines()) == 3


def test_a_wrapped_command_pastes_back_to_the_same_tokens():
    argv = ["torchrun", "--nproc_per_node", "8", "scripts/performance/bootstrap.py"] + \
        [f"model.key_{k}=[a, b]" for k in range(12)] + ["model.y=$HOME"]
    lines = shell_lines(argv, "", "  ")
    assert len(lines) > 1 and max(map(len, lines)) <= WIDTH
    assert all(ln.endswith(" \\") for ln in lines[:-1])
    assert shlex.split(" ".join(ln.removesuffix(" \\") for ln in lines)) == argv


def test_a_wrapped_note_on_stderr_is_held_whole_by_the_note_gate():
    import io

    from mbridge_recompute.cli import _NoteGate

    inner = io.StringIO()
    gate = _NoteGate(inner)
    gate.write("note: " + "long words " * 20 + "\n")
    gate.write("\n".join(wrap("note: " + "long words " * 20)[1:]) + "\n")
    gate.close_gate(drop_notes=True)
    assert inner.getvalue() == ""


words = st.text(alphabet="abcdefgh@,.-", min_size=1, max_size=30)
short = st.text(alphabet="abcdefgh@,.-", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(words, min_size=1, max_size=60), st.integers(min_value=30, max_value=120))
def test_wrapping_keeps_every_word_and_stays_inside_the_width(ws, cols):
    with width(cols):
        lines = wrap(" ".join(ws), "  - ", "    ")
    assert "".join("".join(ln.split()) for ln in lines) == "-" + "".join(ws)
    for ln in lines:                     # over the width only for one word that cannot be cut
        assert len(ln) <= cols or " " not in ln.strip().removeprefix("- "), ln


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(short, min_size=4, max_size=12), min_size=1, max_size=6),
       st.integers(min_value=40, max_value=120), st.integers(min_value=1, max_value=14))
def test_a_table_of_short_words_always_fits_the_width(rows, cols, extra):
    headers = ["key"] + [f"column {k}" for k in range(extra)] + ["free text"]
    body = [[r[0]] + [r[k % len(r)] for k in range(extra)] + [" ".join(r)] for r in rows]
    with width(cols):
        text = table(headers, body, free=-1)
    assert _longest(text) <= cols
    for r in body:                       # every word of every cell is still there
        for word in " ".join(r).split():
            assert word in text


# ----------------------------------------------------------------- every tool, every example

WORKLOADS = sorted(EXAMPLES.glob("*.yaml"))
RUN_SETS = sorted(p for p in (EXAMPLES / "logs").iterdir() if p.is_dir() and (p / "empty").is_dir())
RUN_DIRS = sorted(d for s in RUN_SETS for d in s.iterdir() if (d / "log.txt").is_file())
LOGS = sorted((EXAMPLES / "logs" / "oom").glob("*.log")) + [d / "log.txt" for d in RUN_DIRS]
PINNED = ["-m", "deepseek", "-mr", "moonlight_16b", "-ng", "8", "-g", "h100", "-c", "bf16", "-gb", "64",
          "-sl", "4096", "-ms", "20"]


def _cases(tmp: Path) -> list:
    """Every tool on every example workload, run directory and log (text, not --json)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
    import standin

    checkout = standin.make_checkout(tmp / "bridge", "main", tests=True)
    plan_json = tmp / "plan.json"
    code, out, _ = run_in_process("plan", EXAMPLES / "moonlight_16b.yaml", "--top", "3", "--json")
    plan_json.write_text(out)
    cases = [("plan",), ("check",), ("config", "--modules", "moe_act,layernorm")]
    for w in WORKLOADS:
        cases += [("plan", w), ("plan", w, "--per-rank"), ("plan", w, "--alternatives"),
                  ("plan", w, "--measured-peak-gb", "60"), ("check", w),
                  ("config", w, "--modules", "core_attn,mlp"),
                  ("config", w, "--granularity", "full", "--method", "uniform", "--num-layers", "1")]
    for fmt in ("python", "yaml", "overrides", "harness", "mlm"):
        cases.append(("config", "--modules", "moe_act,layernorm", "--format", fmt))
    for run_set in RUN_SETS:
        cases.append(("compare", *sorted(run_set.iterdir())))
    cases += [("check", "--run", d) for d in RUN_DIRS]
    cases += [("diagnose", log) for log in LOGS]
    cases += [("harness", "--bridge-release", "0.6", "--candidates", "core_attn", "moe_act", "--", *PINNED),
              ("harness", "--repo", checkout, "--out", tmp / "runs", "--from-plan", plan_json, "--", *PINNED),
              ("tests", "--repo", checkout)]
    return cases


def test_every_tool_fits_100_columns_on_every_example(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")     # `tests` runs a real pytest
    wide = []
    for case in _cases(tmp_path):
        code, out, err = run_in_process(*case)
        assert code in (0, 1), (case, err[-2000:])
        lines = out.splitlines() + [ln for ln in err.splitlines() if not ln.startswith("error:")]
        if case[0] == "tests":           # pytest's own output on stderr is not ours
            lines = out.splitlines()
        # over the width only a single token no shell may split (a pytest node id, a path)
        over = [ln for ln in lines if len(ln) > WIDTH and " " in ln.strip().removesuffix(" \\")]
        if over:
            wide.append((case, over[:3]))
    assert not wide, wide
