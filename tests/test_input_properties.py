"""Property: whatever the input, the workload tools end in exit 0, 1 or 2 -- never a traceback.

Arbitrary bytes as a workload file, arbitrary YAML trees built from the real section and field
names (so the generator reaches the coercion of every field, not only the YAML reader), and
arbitrary `--set` values go through `check` and `plan` in-process, exactly as the scripts run
them (mbridge_recompute.cli.main).
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbridge_recompute.cli import main
from mbridge_recompute.workload import FIELDS

SECTIONS = ["model", "train", "ddp", "optimizer", "comm_overlap", "cluster", "mixed_precision", "dataset",
            "source", "_target_"]
NAMES = sorted(FIELDS) + ["first_k_dense_replace", "hybrid_layer_pattern", "mamba_head_dim", "_target_",
                          "bias_activation_fusion", "not_a_field"]


def run(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _assert_contract(code, out, err):
    assert code in (0, 1, 2), (code, err[-2000:])
    assert "Traceback" not in err
    if code == 2:
        # with --json the one error object (the exit/JSON contract), else nothing on stdout
        assert out == "" or set(json.loads(out)) == {"error"}, out
        assert len(err.splitlines()) == 1, err


scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=64),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["selective", "full", "uniform", "block", "silu", "RMSNorm", "core_attn", "moe_act",
                     "M*-E", "hybrid", "2.8.0", "bf16_mixed", "torch.bfloat16", "", "nan"]),
    st.text(max_size=12),
)
small = st.one_of(st.none(), st.booleans(), st.integers(min_value=0, max_value=16),
                  st.sampled_from(["selective", "full", "uniform", "block", "core_attn", "mlp", "silu"]))


def trees(leaf):
    def branch(kids):
        return st.one_of(st.lists(kids, max_size=4),
                         st.dictionaries(st.sampled_from(NAMES), kids, max_size=4))

    values = st.recursive(leaf, branch, max_leaves=12)
    return st.dictionaries(st.sampled_from(SECTIONS), st.one_of(
        st.dictionaries(st.sampled_from(NAMES), values, max_size=8), values), max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_as_a_workload_file(tmp_path, data):
    path = tmp_path / "w.yaml"
    path.write_bytes(data)
    _assert_contract(*run(["check", str(path), "--validator", "builtin", "--json"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees(scalars))
def test_arbitrary_yaml_trees_through_check(tmp_path, tree):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(tree))
    _assert_contract(*run(["check", str(path), "--validator", "builtin", "--json"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees(small))
def test_arbitrary_small_yaml_trees_through_plan(tmp_path, tree):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(tree))
    _assert_contract(*run(["plan", str(path), "--json"]))


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from([f"{FIELDS[n].metadata['section'] or 'model'}.{n}" for n in sorted(FIELDS)]),
       value=st.one_of(scalars.map(lambda v: yaml.safe_dump(v).split("\n...")[0].strip()
                                   if not (isinstance(v, float) and math.isnan(v)) else ".nan"),
                       st.text(max_size=20)))
def test_arbitrary_set_values(key, value):
    _assert_contract(*run(["check", "--validator", "builtin", "--json", "--set", f"{key}={value}"]))
