"""The harness argument list is read once, the way the rank reads it (inputs/harness_argv.py): with
argparse's rules for the release's flags and Hydra's override grammar for the rest. Both readings
are checked against the real thing -- CPython's argparse built from the same flag table, and
hydra-core 1.3.2's OverridesParser in the Megatron Bridge 0.6.2 environment -- and every tool
that reads a harness command line (check --run, compare, diagnose, logs/effective) asks it.
"""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest
from bridge_env import bridge_env
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mbridge_recompute.facts import bridge_flags
from mbridge_recompute.inputs.harness_argv import HarnessArgv, parse_value
from mbridge_recompute.runs import bridge

from conftest import ROOT, run_script

RELEASES = list(bridge.keys())


# ------------------------------------------------------------------ argparse, the real one
class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def real_parser(release: str) -> argparse.ArgumentParser:
    """The release's harness parser as argparse builds it from the flag table (allow_abbrev on,
    parse_known_args, as argument_parser.py does); absent flags stay out of the namespace."""
    p = _Parser(allow_abbrev=True, add_help=False)
    for e in bridge_flags.flags(release):
        kw = {"dest": e["flags"][-1], "default": argparse.SUPPRESS}
        if e["value"] == "none":
            kw.update(action="append_const" if e.get("append") else "store_const", const=True)
        else:
            kw.update(nargs={"one": None, "optional": "?", "many": "*"}[e["value"]],
                      action="append" if e.get("append") else "store")
        p.add_argument(*e["flags"], **kw)
    return p


def ours_as_namespace(h: HarnessArgv) -> dict:
    entries = {e["flags"][-1]: e for e in bridge_flags.flags(h.release)}
    out = {}
    for name in dict.fromkeys(f.name for f in h.flags):
        e, given_ = entries[name], h.given(name)
        values = [_as_argparse(e["value"], f) for f in given_]
        out[name] = values if e.get("append") else values[-1]
    return out


def _as_argparse(kind: str, f):
    if kind == "none":
        return True
    if kind == "one":
        return f.values[0]
    if kind == "optional":
        return f.values[0] if f.values else None
    return list(f.values)


ARGPARSE_PROBLEMS = ("ambiguous option", "needs a value", "takes no value")


def _vocabulary(release: str) -> list:
    spellings = [sp for e in bridge_flags.flags(release) for sp in e["flags"]]
    abbreviations = ["--recompute_mod", "--recompute", "--global_b", "--num_g", "--use_rec", "--dr", "-r",
                     "-w", "-wd", "--re", "--model_f", "--seq"]
    values = ["moe_act", "2", "-1", "-", "a b", "x,y", "8", "llama", "bf16", ""]
    attached = ["-rl=2", "--recompute_modules=mlp", "-gb=32", "-mllama", "-dm", "-d=x", "--dryrun=1",
                "-ng8", "--num_gpus=8", "-rl2", "-vb"]
    hydra = ["model.recompute_modules=[]", "model.recompute_granularity=selective", "+model.x=1", "~model.y",
             "++train.z=[a,b]", "stray"]
    return spellings[:40] + ["-rl", "--recompute_modules", "-ng", "-d", "-cb", "-E", "--dataset_paths",
                             "-et", "--use_recipes", "--"] + abbreviations + values + attached + hydra


@pytest.mark.parametrize("release", RELEASES)
def test_the_harness_argv_reads_flags_and_leftovers_as_argparse_does(release):
    real = real_parser(release)
    vocab = _vocabulary(release)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.sampled_from(vocab), max_size=10))
    @example(["-dm", "x"])                       # single-dash switches combine
    @example(["-d=m", "x"])
    @example(["-d=x"])                           # ignored explicit argument
    @example(["--recompute", "a"])               # ambiguous prefix
    @example(["--recompute_mod", "moe_act"])     # a unique prefix is the flag
    @example(["-r", "2"])                        # a unique prefix of a short option
    @example(["-mllama"])                        # a short option with its value attached
    @example(["--lr", "-1"])                     # a negative number is a value
    @example(["-gb", "--", "x"])                 # '--' is no value
    @example(["--dataset_paths", "a", "b=1"])    # nargs='*' takes every value that follows
    def check(tokens):
        ours = HarnessArgv.parse(tokens, release)
        argparse_side = [p for p in ours.problems if any(k in p for k in ARGPARSE_PROBLEMS)]
        try:
            namespace, extras = real.parse_known_args(list(tokens))
        except _Refused as exc:
            assert argparse_side, (tokens, str(exc))
            return
        assert not argparse_side, (tokens, argparse_side)
        assert ours_as_namespace(ours) == vars(namespace), tokens
        assert ours.left == extras, tokens

    check()


def test_an_abbreviated_flag_is_the_flag_it_abbreviates():
    h = HarnessArgv.parse(["--recompute_mod", "moe_act", "--global_b", "32"], "0.6")
    assert [f.name for f in h.flags] == ["--recompute_modules", "--global_batch_size"]
    assert h.flags[0].text == "--recompute_mod moe_act"
    assert h.value("--global_batch_size") == "32"


def test_a_repeated_flag_keeps_its_last_value_and_is_named():
    h = HarnessArgv.parse(["--recompute_modules", "a", "--recompute_mod", "b"], "main")
    assert h.value("--recompute_modules") == "b"
    assert any("--recompute_modules is given twice" in p for p in h.problems)


# ------------------------------------------------------------------ Hydra, the real one
OVERRIDES = [
    "model.recompute_modules=[]", "model.recompute_modules=[moe_act, mlp]",
    "model.recompute_modules=['a','b']",
    "model.recompute_modules=[ a , b ]", "model.recompute_modules=moe_act,mlp", "model.recompute_modules=",
    "model.recompute_modules=\"\"", "model.recompute_modules=[null]", "model.recompute_modules=[a,[b]]",
    "model.recompute_granularity=null", "model.recompute_granularity=NULL",
    "model.recompute_granularity=Null",
    "model.recompute_granularity=selective", "model.recompute_granularity='full'",
    "model.recompute_granularity= full ", "model.recompute_method=null", "model.recompute_num_layers=4",
    "model.recompute_num_layers=-4", "model.recompute_num_layers=+4", "model.recompute_num_layers=4_000",
    "model.recompute_num_layers=1e3", "model.recompute_num_layers=4.0", "model.recompute_num_layers=.5",
    "model.recompute_num_layers=0x10", "model.recompute_num_layers=inf", "model.recompute_num_layers=nan",
    "model.recompute_num_layers=true", "model.recompute_num_layers=True", "model.recompute_num_layers=yes",
    "+model.recompute_modules=[mlp]", "++model.recompute_modules=[mlp]", "~model.recompute_modules",
    "~model.recompute_num_layers=3", "model.x=a b", "model.x=${y}", "model.x={a: 1}", "model.x={a: [1, 2]}",
    "model.x=a\\,b", "model.x=[a,b", "model", "stray", "model.x=a=b", "a.b-c=1", "x=1",
    "model.x='it''s'", "model.x=\"a,b\"", "model.x=[\"a b\", c]", "model.x=-", "model.x=1.5e-3",
]


def _hydra_in_bridge_env(tokens: list) -> list:
    env = bridge_env()
    script = (
        "import json, sys\n"
        "from hydra.core.override_parser.overrides_parser import OverridesParser\n"
        "from hydra.core.override_parser.types import ChoiceSweep\n"
        "p = OverridesParser.create()\n"
        "out = []\n"
        "for t in json.load(sys.stdin):\n"
        "    try:\n"
        "        o = p.parse_overrides([t])[0]\n"
        "        v = o.value()\n"
        "        v = 'sweep' if isinstance(v, ChoiceSweep) else repr(v)\n"
        "        out.append({'type': o.type.name, 'key': o.key_or_group, 'value': v})\n"
        "    except Exception as e:\n"
        "        out.append({'error': type(e).__name__})\n"
        "print(json.dumps(out))\n")
    import os

    proc = subprocess.run([env["python"], "-c", script], input=json.dumps(tokens), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": env["pythonpath"]})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _ours(token: str) -> dict:
    from mbridge_recompute.inputs.harness_argv import Sweep, parse_override

    o, why = parse_override(token)
    if o is None or (why and not isinstance(o.value, Sweep)):
        return {"error": True}
    kind = {"": "CHANGE", "+": "ADD", "++": "FORCE_ADD", "~": "DEL"}[o.op]
    return {"type": kind, "key": o.key, "value": "sweep" if isinstance(o.value, Sweep) else repr(o.value)}


def _read_as_hydra_reads(tokens: list) -> None:
    """Each override token means to us what Hydra in the Bridge environment makes of it: the same
    (type, key, value), or an error on both sides."""
    for token, theirs in zip(tokens, _hydra_in_bridge_env(tokens)):
        ours = _ours(token)
        if "error" in theirs:
            assert "error" in ours, (token, ours)
        else:
            assert ours == theirs, token


def test_hydra_overrides_are_read_as_hydra_reads_them():
    _read_as_hydra_reads(OVERRIDES)


def test_hydra_values_of_generated_tokens_are_read_as_hydra_reads_them():
    pieces = st.sampled_from(["a", "b", "mlp", "1", "-2", "null", "true", " ", ",", "[", "]", "'", "\"", "{",
                              "}", ":", "=", "_", ".", "e3", "$", "\\"])
    tokens = []

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(pieces, min_size=1, max_size=8).map("".join))
    def collect(value):
        tokens.append("model.recompute_modules=" + value)

    collect()
    _read_as_hydra_reads(tokens)


def test_a_value_hydra_cannot_parse_is_refused():
    with pytest.raises(ValueError):
        parse_value("[a,b")


# ------------------------------------------------------------------ every tool asks the same reading
LOGS = ROOT / "tests" / "fixtures" / "logs"
HEAD = ["torchrun", "--nproc_per_node", "8", "scripts/performance/run_script.py"]
COMMON = ["-m", "llama", "-mr", "llama3_8b", "-ng", "8", "-gb", "32", "-sl", "4096"]
DUMP = ("model:\n  recompute_granularity: selective\n  recompute_modules: [moe_act]\n"
        "  recompute_method: null\n  recompute_num_layers: null\n")


def _run(tmp_path, name, tail, dump=DUMP, log=None):
    d = tmp_path / name
    d.mkdir()
    (d / "log.txt").write_text(log if log is not None else (LOGS / "pass.log").read_text())
    (d / "manifest.json").write_text(json.dumps({"name": name, "argv": HEAD + COMMON + tail}))
    if dump:
        (d / "ConfigContainer.yaml").write_text(dump)
    return d


def test_an_abbreviated_recompute_flag_reads_the_same_in_check_run_compare_diagnose_and_effective(tmp_path):
    from mbridge_recompute.logs import effective

    tail = ["--recompute_mod", "moe_act", "-wdj", "a"]
    # effective: the abbreviation is the labels flag, applied after the Hydra overrides
    requests, _ = effective.requests_of(HEAD + COMMON + tail)
    assert [(r.field, r.value) for r in requests] == [("recompute_modules", ["moe_act"]),
                                                       ("recompute_granularity", "selective")]
    # check --run: what the command asked is what ran; no difference
    run = _run(tmp_path, "moe_act", tail)
    r = run_script("check", "--run", run, "--json")
    report = json.loads(r.stdout)["run"]
    assert report["asked"] == {"recompute_modules": ["moe_act"], "recompute_granularity": "selective"}
    assert report["differences"] == [] and report["requests"][0]["token"] == "--recompute_mod moe_act"
    # compare: a control spelled with Hydra and the long flag names is matched
    control = _run(tmp_path, "empty", ["model.recompute_granularity=selective", "model.recompute_modules=[]",
                                       "-wdj", "b"])
    manifest = json.loads((control / "manifest.json").read_text())
    long_names = {"-gb": "--global_batch_size", "-sl": "--seq_length"}
    manifest["argv"] = [long_names.get(t, t) for t in manifest["argv"]]
    (control / "manifest.json").write_text(json.dumps(manifest))
    out = json.loads(run_script("compare", control, run, "--json").stdout)
    assert all(row.get("matched", True) for row in out["runs"]), out["runs"]
    # diagnose: the abbreviation given beside the full flag is the list flag given twice
    twice = _run(tmp_path, "twice", ["--recompute_mod", "mlp", "--recompute_modules", "moe_act"], dump=None)
    found = json.loads(run_script("diagnose", twice, "--json").stdout)["findings"]
    assert any(f.get("id") == "list-flag-given-twice" for f in found)


def test_rl_beside_abbreviated_labels_is_named_by_diagnose(tmp_path):
    log = "ValueError: When using recompute_granularity: selective recompute_num_layers must be None.\n"
    d = _run(tmp_path, "rl", ["--recompute_m", "moe_act", "-rl", "2"], dump=None, log=log)
    found = json.loads(run_script("diagnose", d, "--json").stdout)["findings"]
    f = next(f for f in found if f.get("id") == "selective-with-num-layers")
    assert "beside --recompute_modules" in f["evidence"] and f["next_action"].startswith("drop -rl")


def test_harness_refuses_a_passthrough_flag_given_twice_in_two_spellings():
    from mbridge_recompute.inputs.harness_argv import check_passthrough

    problems = check_passthrough(["-gb", "32", "--global_b", "64"], "0.6")
    assert problems and "--global_batch_size is given twice" in problems[0]
