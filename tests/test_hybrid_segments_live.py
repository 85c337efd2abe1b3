"""Hybrid stacks' pipeline placement, checked against each release's real `select_pipeline_segment`.

From megatron-core 0.17 a hybrid model asks `select_pipeline_segment` (ssm/
mamba_hybrid_layer_allocation.py on 0.17, models/hybrid/hybrid_layer_allocation.py from 0.18)
which layers each (pipeline rank, virtual stage) builds. That function is pure Python over the
pattern and the pipeline group's rank and size, so it runs here on a CPU: the pipeline group is
the only stand-in (torch.distributed's get_rank / get_world_size answer for the rank asked, and
the per-stage log helpers, which need an initialised process group, are silenced).
For each case `placement.place` must build the same layer kinds on every rank and chunk, or name
the card constraint whose message the real function raises (or, for segments past PP x VPP,
which it drops without a word, see that it built fewer layers than the pattern holds).
"""

from __future__ import annotations

import json

import pytest
from test_releases import run_in

from mbridge_recompute.facts import card, releases
from mbridge_recompute.placement import place
from mbridge_recompute.workload import Workload

# pattern, PP, VPP, first, last
CASES = [
    ("M*M-|M*M-", 2, None, None, None),
    ("M*M-|M*M-|MM|**", 2, None, None, None),
    ("M*M-|M*M-|MM|**", 2, 2, None, None),
    ("M*M-M*M-", 2, None, None, None),
    ("M*M-M*M-M*", 3, None, 2, None),
    ("M*M-M*M-M*", 3, None, None, 4),
    ("M*M-M*M-M", 3, None, 2, None),
    ("M*M-M*M-M", 2, None, None, None),
    ("M*M|-M*|M-", 2, None, None, None),
    ("M*M-|M*M-", 2, None, 4, None),
    ("M*M-M*M-", 2, 2, None, None),
    ("M*M-|M*M-", 2, 2, None, None),
    ("M*M-|M*M-", 1, None, None, None),
]

PROBE = r"""
import json, sys
import torch
try:
    from megatron.core.models.hybrid import hybrid_layer_allocation as h
except ImportError:
    from megatron.core.ssm import mamba_hybrid_layer_allocation as h
# logging only: the per-stage log helpers need an initialised process group
h.log_on_each_pipeline_stage = lambda *a, **k: None
h.log_single_rank = lambda *a, **k: None
out = []
for pattern, pp, vpp, first, last in json.loads(sys.argv[1]):
    ranks = []
    try:
        for r in range(pp):
            torch.distributed.get_rank = lambda group=None, r=r: r
            torch.distributed.get_world_size = lambda group=None: pp
            chunks = []
            for v in (range(vpp) if vpp else [None]):
                layers, _ = h.select_pipeline_segment(pattern, object() if pp > 1 else None, v,
                                                      first, last)
                chunks.append("".join(layers))
            ranks.append(chunks)
        out.append({"ranks": ranks})
    except ValueError as e:
        out.append({"error": str(e)})
print(json.dumps(out))
"""

_LIVE: dict = {}


def live(release: str) -> list:
    if release not in _LIVE:
        proc = run_in(release, "-W", "ignore", "-c", PROBE, json.dumps(CASES))
        assert proc.returncode == 0, proc.stderr[-3000:]
        _LIVE[release] = json.loads(proc.stdout)
    return _LIVE[release]


def _ours(case, release):
    pattern, pp, vpp, first, last = case
    w = Workload(num_layers=len(pattern.replace("|", "")), hybrid_override_pattern=pattern,
                 pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                 num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
    return place(w, releases.resolve_version(release))


def _message_head(cid: str) -> str:
    """The card message up to its first placeholder: the part a raised message must start with."""
    return next(c for c in card.constraints() if c["id"] == cid)["message"].split("{")[0]


@pytest.mark.parametrize("release", ["0.17.1", "0.18.2", "0.19.2"])
def test_hybrid_placement_matches_that_releases_select_pipeline_segment(release):
    from mbridge_recompute.workload import HYBRID_KINDS

    wrong = []
    for case, real in zip(CASES, live(release)):
        pl = _ours(case, release)
        if not pl.ok and pl.problems[0].cid == "hybrid-segments-beyond-vpp":
            # runtime only: the real function raises nothing and builds fewer layers than written
            built = sum(len(chunk) for rank in real.get("ranks", []) for chunk in rank)
            if "error" in real or built >= len(case[0].replace("|", "")):
                wrong.append(f"{case}: ours says segments are dropped, real built {real}")
            continue
        if "error" in real:
            if pl.ok or not real["error"].startswith(_message_head(pl.problems[0].cid)):
                wrong.append(f"{case}: real raised {real['error'][:90]!r}, ours {pl.problems}")
            continue
        want = [[tuple(HYBRID_KINDS.get(c, "mamba") for c in chunk) for chunk in rank]
                for rank in real["ranks"]]
        got = [[tuple(chunk) for chunk in rank] for rank in pl.chunks] if pl.ok else pl.problems
        if got != want:
            wrong.append(f"{case}: real {real['ranks']}, ours {got}")
    assert not wrong, "\n".join(wrong)
    assert sum("error" in r for r in live(release)) >= 6     # the rejecting cases really raise
