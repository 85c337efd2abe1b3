"""Property-based: `harness --from-plan` reads any file as a plan -- arbitrary bytes, arbitrary JSON
trees, plan-shaped objects with fields of any type -- and ends in exit 0, 1 or 2, never a
traceback. Driven in-process through `cli.main` against a stand-in checkout (a dry run: nothing
is imported from it)."""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "harness"))
import standin  # noqa: E402
from test_logs_reader_properties import invoke, judged, trees  # noqa: E402

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PINNED = ["-m", "llama", "-mr", "llama3_8b", "-ng", "8", "-g", "h100", "-gb", "128", "-sl", "8192"]
_TMP = tempfile.mkdtemp(prefix="plan-props-")
atexit.register(shutil.rmtree, _TMP, True)
_REPO = standin.make_checkout(Path(_TMP) / "bridge", "main", parser=False)

entry_fields = st.fixed_dictionaries({}, optional={
    "recompute_granularity": st.one_of(st.sampled_from(["selective", "full", "none", None, "bogus"]), trees),
    "recompute_modules": st.one_of(
        st.lists(st.sampled_from(["core_attn", "mlp", "moe_act", "x"]), max_size=4), trees),
    "recompute_method": st.one_of(st.sampled_from(["uniform", "block", None]), trees),
    "recompute_num_layers": st.one_of(st.integers(min_value=-2, max_value=40), trees),
    "allowed": st.one_of(st.booleans(), trees), "rejected_by": trees, "name": trees})
plans = st.fixed_dictionaries({}, optional={
    "harness_candidates": st.one_of(st.lists(st.sampled_from(["[]", "core_attn", "block:2", "uniform:0", "x",
                                                               "mlp,mlp", "none"]), max_size=5), trees),
    "frontier": st.one_of(st.lists(entry_fields, max_size=4), trees),
    "recommendation": st.one_of(entry_fields, trees)})


def _text(obj) -> str:
    return json.dumps(obj, default=str)


@FAST
@given(st.one_of(plans.map(_text), trees.map(_text),
                 st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
                 st.sampled_from(["[" * 30000, '{"frontier": [' + "9" * 6000 + "]}", "", "   "])))
def test_any_plan_file_is_judged_without_a_traceback(text):
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(text, encoding="utf-8", errors="surrogateescape")
        judged(*invoke(["harness", "--repo", str(_REPO), "--out", str(Path(tmp) / "runs"), "--json",
                        "--from-plan", str(plan), "--", *PINNED]))


@FAST
@given(st.lists(st.text(max_size=30), min_size=1, max_size=6), st.lists(st.text(max_size=20), max_size=8))
def test_any_candidates_and_harness_arguments_are_judged_without_a_traceback(candidates, passthrough):
    with tempfile.TemporaryDirectory() as tmp:
        judged(*invoke(["harness", "--repo", str(_REPO), "--out", str(Path(tmp) / "runs"), "--json",
                        "--candidates", *candidates, "--", *PINNED, *passthrough]))
