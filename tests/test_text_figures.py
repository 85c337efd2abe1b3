"""Every figure the plan prints as text is the figure its --json holds.

The text tables are parsed back (their rule line gives the column spans; stacked headers, wrapped
cells, cells moved under the row and column blocks are joined again) and each cell compared with
the JSON field it shows, over every example workload, plain, per rank, calibrated and with
alternatives. The sentences that carry figures (budget, calibration, current setting,
recommendation, a label dropped from the search) are read the same way.
"""

from __future__ import annotations

import json
import re

import pytest

from mbridge_recompute.units import GB, gb

from conftest import EXAMPLES

# free-text columns a table may write under the row
MOVED = ("why", "peak term", "how", "what it changes")


def _invoke(*argv) -> tuple:
    import contextlib
    import io

    from mbridge_recompute.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            return exc.code, out.getvalue()
    return None, out.getvalue()


# ------------------------------------------------------------------------------ the parser
def _spans(rule: str) -> list:
    return [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]


def _is_rule(line: str) -> bool:
    return bool(line) and line.startswith("-") and set(line) <= {"-", " "}


def _within(line: str, spans: list) -> bool:
    """Whether every run of words of `line` (cut at two spaces) lies inside one column and is
    aligned to it (left or right): a header line, not a wrapped title."""
    return all(any(a <= m.start() and m.end() <= b and (m.start() == a or m.end() == b)
                   for a, b in spans)
               for m in re.finditer(r"\S+(?: \S+)*", line))


def tables(text: str) -> list:
    """[(title, rows)] with rows as {header: cell}, every table of `text`; column blocks of one
    table (a block with no title of its own) are merged into its rows."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not _is_rule(line):
            continue
        spans = _spans(line)
        top = i
        while top > 0 and lines[top - 1].strip() and _within(lines[top - 1], spans):
            top -= 1
        heads = [" ".join(h for h in (ln[a:b].strip() for ln in lines[top:i]) if h) for a, b in spans]
        t = top
        while t > 0 and lines[t - 1].strip():
            t -= 1
        title = " ".join(ln.strip() for ln in lines[t:top])
        rows, note, k = [], None, i + 1
        while k < len(lines) and lines[k].strip():
            ln = lines[k]
            m = re.match(r"^    (" + "|".join(map(re.escape, MOVED)) + r"): (.*)$", ln)
            if m and rows:
                note = m.group(1)
                rows[-1][note] = m.group(2)
            elif note and ln.startswith("      ") and len(re.findall(r"\S+(?: \S+)*", ln)) == 1:
                # a moved cell's continuation: one run of words (a row has a run per cell)
                rows[-1][note] += " " + ln.strip()
            elif rows and ln.startswith("@"):      # a candidate name continues before its `@`
                rows[-1][heads[0]] += ln.strip()
            elif re.fullmatch(r"\S+", ln) and len(ln) > spans[0][1]:
                # a long candidate name on a line of its own above its row's figures
                rows.append(dict.fromkeys(heads, ""))
                rows[-1][heads[0]] = ln
            elif rows and not ln[spans[0][0]:spans[0][1]].strip():
                note = None
                for (a, b), h in zip(spans, heads):
                    part = ln[a:b + (len(ln) if (a, b) == spans[-1] else 0)].strip()
                    if part:                       # a wrapped cell, or the figures under a long name
                        rows[-1][h] = (rows[-1][h] + " " + part).strip()
            else:
                note = None
                rows.append({h: ln[a:b + (len(ln) if (a, b) == spans[-1] else 0)].strip()
                             for (a, b), h in zip(spans, heads)})
            k += 1
        if not title and out:
            for row, more in zip(out[-1][1], rows):
                row.update(more)
        else:
            out.append((title, rows))
    return out


def _table(parsed: list, prefix: str) -> list:
    found = [rows for title, rows in parsed if prefix in title]    # (a title may follow prose)
    assert len(found) == 1, (prefix, [t for t, _ in parsed])
    return found[0]


def _words(text: str) -> str:
    return " ".join(text.split())


def _signed(nbytes: float) -> str:
    return f"{nbytes / GB:+.2f}"


# ------------------------------------------------------------------------------ the checks
def check_plan(text: str, j: dict) -> int:
    """Compare every table cell and figure sentence of a plan's text with its JSON; returns how
    many figures were compared."""
    parsed, n = tables(text), 0
    cal = j["calibration"]
    ranks = _table(parsed, "memory per pipeline rank")
    assert len(ranks) == len(j["ranks"])
    for row, rank in zip(ranks, j["ranks"]):
        k = rank["pp_rank"]
        assert row["pp rank"] == str(k)
        assert row["static"] == gb(rank["static_bytes"])
        assert row["saved total"] == gb(rank["activation_bytes"])
        assert row["transient"] == gb(rank["transient_bytes"])
        assert row["model allocated" if cal else "allocated peak"] == gb(rank["allocated_peak_bytes"])
        assert row["model device" if cal else "device peak"] == gb(rank["peak_bytes"])
        comps = [c for c in rank["activations"] if c in row]
        for c in comps:
            assert row[c] == gb(rank["activations"][c]), c
        if "other" in row:
            assert row["other"] == gb(sum(v for c, v in rank["activations"].items() if c not in comps))
        if cal:
            calibrated = j["current"]["rank_peak_bytes"][k]
            assert row["peak"] == gb(calibrated)
            assert row["offset"] == _signed(calibrated - rank["peak_bytes"])
            assert row["offset"] == _signed(cal["rank_offset_bytes"][k])
        assert _words(row["peak term"]) == rank["peak_term"]
        n += 7 + len(comps) + (3 if cal else 0)

    labels = _table(parsed, "recompute labels")
    assert [row["label"] for row in labels] == [e["label"] for e in j["labels"]]
    for row, e in zip(labels, j["labels"]):
        on = e["applicable"]
        assert row["applies"] == ("yes" if on else "no")
        assert row["saving GB"] == (gb(e["saving_bytes"]) if on else "-")
        assert row["replay %"] == (f"{e['cost_pct']:.2f}" if on else "-")
        for k, b in enumerate(e["rank_saving_bytes"]):
            if f"rank {k}" in row:
                assert row[f"rank {k}"] == (gb(b) if on else "-")
                n += 1
        assert _words(row["why"]).startswith(_words(e["reason"]))
        n += 3

    front = _table(parsed, "frontier")
    assert 0 < len(front) <= len(j["frontier"])
    for row, c in zip(front, j["frontier"]):
        assert row["candidate"] == c["name"]
        assert row["peak GB"] == gb(c["peak_bytes"])
        assert row["replay %"] == f"{c['replay_pct']:.2f}"
        assert row["fits"] == c["verdict"] and (c["verdict"] == "fits") == c["fits"]
        assert row["band top GB"] == gb(c["band_upper_bytes"])
        if cal:
            assert row["offset GB"] == _signed(c["offset_bytes"])
            assert row["model GB"] == gb(c["peak_bytes"] - c["offset_bytes"])
            n += 2
        if "step %" in row:
            assert row["step %"] == f"{c['cost_pct']:+.2f}"
            n += 1
        for k, b in enumerate(c["rank_peak_bytes"]):
            if f"rank {k}" in row:
                assert row[f"rank {k}"] == gb(b)
                n += 1
        assert _words(row["peak term"]) == c["peak_term"]
        n += 5

    if j["alternatives"]:
        alts = _table(parsed, "alternatives beside recompute")
        assert len(alts) == len(j["alternatives"])
        for row, a in zip(alts, j["alternatives"]):
            assert row["option"] == a["name"] and row["kind"] == a["kind"]
            assert row["frees GB"] == gb(a["frees_bytes"]) and row["peak GB"] == gb(a["peak_bytes"])
            assert row["replay %"] == f"{a['replay_pct']:.2f}"
            assert row["step %"] == f"{a['cost_pct']:+.2f}"
            assert row["fits"] == ("yes" if a["fits"] else "no")
            n += 5

    flat = _words(text)
    wl = j["workload"]
    assert f"precision: {wl['precision']}; {wl['precision_from']}" in flat
    assert f"DP{wl['dp']} on {wl['num_gpus']} GPU" in flat and wl["parallelism_from"] in flat
    assert f"budget: {gb(j['budget_bytes'])} GB per GPU" in flat
    cur = j["current"]
    assert (f"current setting {cur['describe']}: predicted peak {gb(cur['peak_bytes'])} GB (band "
            f"{gb(cur['band_lower_bytes'])}-{gb(cur['band_upper_bytes'])} GB)") in flat
    rec = j["recommendation"]
    if j["workload_findings"]:      # refused under every setting: said first, and the answer waits
        assert flat.startswith("REJECTED under every recompute setting")
        assert all(f["id"] in flat.split("workload:")[0] for f in j["workload_findings"])
    said = "recommendation once the workload is fixed: " if j["workload_findings"] else "recommendation: "
    if rec:
        assert (f"{said}{rec['describe']} ({rec['name']}): predicted peak "
                f"{gb(rec['peak_bytes'])} GB (band {gb(rec['band_lower_bytes'])}-"
                f"{gb(rec['band_upper_bytes'])} GB) on pp_rank {rec['hottest_pp_rank']}") in flat
        assert {"fits": "fits the", "tight": "TIGHT: the band crosses",
                "no": "does NOT fit"}[rec["verdict"]] in flat
    if cal:
        assert f"measured {gb(cal['measured_allocated_bytes'])} GB" in flat
        assert f"model: {gb(cal['predicted_allocated_bytes'])} GB allocated" in flat
        assert f"unexplained offset: {_signed(cal['offset_bytes'])} GB" in flat
        n += 3
    for e in j["labels"]:                  # a label dropped from the search: the table's figure
        note = next((a for a in j["assumptions"] if a.startswith(f"label {e['label']}: dropped")), None)
        if note:
            assert f"saves {_signed(e['saving_bytes'])} GB on the hottest rank" in note
            best = max(e["rank_saving_bytes"])
            assert f"at best {_signed(best)} GB on any rank" in note
            assert _words(note) in flat
            n += 2
    return n + 5


WORKLOADS = sorted(EXAMPLES.glob("*.yaml"))
MODES = {"plain": (), "per-rank": ("--per-rank",), "calibrated": ("--measured-peak-gb",),
         "alternatives": ("--alternatives",)}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda p: p.stem)
def test_every_figure_in_the_plan_text_is_its_json_figure(workload, mode):
    args = ("plan", workload, *MODES[mode])
    if mode == "calibrated":               # measured: 1 GB over the model's allocated peak
        j = json.loads(_invoke("plan", workload, "--json")[1])
        args += (f"{j['current']['peak_bytes'] / GB - 0.5:.2f}",)
    code, text = _invoke(*args)
    code_json, out = _invoke(*args, "--json")
    j = json.loads(out)
    assert "error" not in j, j
    assert code == code_json and check_plan(text, j) > 20
    assert (j["calibration"] is not None) == (mode == "calibrated")


def test_the_default_plan_text_matches_its_json_and_says_which_core_attn_figure_is_which():
    code, text = _invoke("plan")
    _, out = _invoke("plan", "--json")
    j = json.loads(out)
    check_plan(text, j)
    core = next(e for e in j["labels"] if e["label"] == "core_attn")
    note = next(a for a in j["assumptions"] if a.startswith("label core_attn: dropped"))
    # the table's -1.73 GB is the hottest rank's; the search judged the best rank's -1.27 GB
    assert gb(core["saving_bytes"]) == "-1.73" and "saves -1.73 GB on the hottest rank" in note
    assert "at best -1.27 GB on any rank (pp_rank 3)" in note


def test_a_calibrated_plan_shows_the_offset_as_its_own_column():
    args = ("plan", EXAMPLES / "moonlight_16b.yaml", "--measured-peak-gb", "36.618")
    _, text = _invoke(*args)
    j = json.loads(_invoke(*args, "--json")[1])
    check_plan(text, j)
    rank = _table(tables(text), "memory per pipeline rank")[0]
    top = _table(tables(text), "frontier")[0]
    off = _signed(j["calibration"]["offset_bytes"])
    assert rank["offset"] == off == top["offset GB"]
    # the per-rank table's peak is the frontier's: the model's peak plus the offset
    assert rank["peak"] == gb(j["current"]["peak_bytes"]) and float(rank["model device"]) + float(off) \
        == pytest.approx(float(rank["peak"]), abs=0.011)


def test_a_table_printed_in_column_blocks_still_shows_the_json_figures():
    """16 pipeline ranks do not fit 100 columns: the per-rank columns come in blocks."""
    args = ("plan", "--model", "deepseek-v3", "--per-rank", "--top", "3")
    _, text = _invoke(*args)
    j = json.loads(_invoke(*args, "--json")[1])
    assert text.count("\nlabel ") >= 2            # the label table in at least two blocks
    assert check_plan(text, j) > 16 * 7
    labels = _table(tables(text), "recompute labels")
    assert all(f"rank {k}" in labels[0] for k in range(16))


def _hf_config(tmp_path):
    src = json.loads((EXAMPLES.parent / "tests" / "fixtures" / "hf_configs"
                      / "meta-llama--Meta-Llama-3-8B.json").read_text())["config"]
    assert src["torch_dtype"] == "bfloat16"          # a bf16 checkpoint
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    return path


def test_the_first_lines_say_where_precision_and_parallelism_came_from(tmp_path):
    """--hf-config reads the architecture only: a bf16 checkpoint plans in fp32 on one GPU
    unless --set says otherwise, and the first lines say so."""
    cfg = _hf_config(tmp_path)
    _, text = _invoke("plan", "--hf-config", cfg)
    head = _words(text[text.index("workload:"):].split("\nGPU:")[0])
    assert "precision: fp32 (neither bf16 nor fp16 set); no input sets it: megatron-core's default" in head
    assert "--set model.bf16=true" in head
    assert "on 1 GPU (assumed: see the first line); no input sets them: defaults" in head
    assert "GPUs assumed: the smallest world size megatron-core accepts" in head
    args = ("plan", "--hf-config", cfg, "--set", "model.bf16=true", "--set",
            "model.tensor_model_parallel_size=2", "--set", "cluster.num_gpus=8")
    _, text = _invoke(*args)
    wl = json.loads(_invoke(*args, "--json")[1])["workload"]
    assert wl["precision_from"] == "from --set"
    assert wl["parallelism_from"] == "TP, GPUs from --set; PP, VPP, CP, EP: defaults"
    head = _words(text[text.index("workload:"):].split("\nGPU:")[0])
    assert f"precision: bf16; {wl['precision_from']}" in head
    assert f"on 8 GPUs; {wl['parallelism_from']}" in head


def test_a_set_value_is_credited_to_set_and_the_rest_to_the_file():
    from mbridge_recompute.inputs.loading import load_workload

    w = load_workload(str(EXAMPLES / "moonlight_16b.yaml"), ["model.context_parallel_size=2"])
    assert w.origins["context_parallel_size"] == "--set"
    assert w.origins["tensor_model_parallel_size"] == str(EXAMPLES / "moonlight_16b.yaml")
    assert "virtual_pipeline_model_parallel_size" not in w.origins      # its default
    dump = load_workload(str(EXAMPLES / "bridge_dump_llama3_8b.yaml"))
    assert dump.bf16 and dump.origins["bf16"] == str(EXAMPLES / "bridge_dump_llama3_8b.yaml")
