"""diagnose on real megatron-core 0.16.1 failures, captured on a GPU.

The logs in tests/fixtures/logs/real_mcore_*.log are the uncaught tracebacks printed by
tests/fixtures/logs/gpu_mcore_probe.py on one NVIDIA H200 (torch 2.11.0+cu130, megatron-core
0.16.1, local spec, no Transformer Engine), with PyTorch's `[rank0]: ` prefix on every line.
"""

from __future__ import annotations

import json

from conftest import ROOT, run_script

FIXTURES = ROOT / "tests" / "fixtures" / "logs"


def diagnose_json(name: str) -> tuple:
    proc = run_script("diagnose", FIXTURES / name, "--json")
    return proc.returncode, json.loads(proc.stdout)


def test_real_uniform_recompute_index_error_is_the_uniform_constraint():
    rc, out = diagnose_json("real_mcore_uniform3_of_4.log")
    assert rc == 0
    f = out["findings"][0]
    assert (f["kind"], f["constraint_id"]) == ("runtime", "uniform-num-layers-not-dividing-chunk")
    assert "IndexError: index 4 is out of range" in f["evidence"]


def test_real_layernorm_without_te_is_the_needs_te_constraint():
    rc, out = diagnose_json("real_mcore_layernorm.log")
    assert rc == 0
    f = out["findings"][0]
    assert (f["kind"], f["constraint_id"], f["severity"]) == ("runtime", "label-needs-te", "error")


def test_real_oom_in_the_recompute_replay_is_a_backward_activation_oom():
    rc, out = diagnose_json("real_mcore_replay_oom.log")
    assert rc == 0
    f = out["findings"][0]
    assert (f["kind"], f["stage"]) == ("activations", "backward")
    # the replay runs inside megatron-core's CheckpointFunction.backward
    assert any("megatron/core/tensor_parallel/random.py" in fr and fr.endswith("in backward")
               for fr in f["oom"]["frames"])
    assert f["oom"]["rank"] == 0 and f["oom"]["allowed_gib"] == 4.39


def test_default_config_warnings_come_after_the_failure():
    # every default 0.16.1 config warns "full scope is deprecated"; it is listed, after the errors
    _, out = diagnose_json("real_mcore_replay_oom.log")
    severities = [f["severity"] for f in out["findings"]]
    assert severities[0] == "error" and "info" in severities
    assert severities == sorted(severities, key=lambda s: s != "error")
