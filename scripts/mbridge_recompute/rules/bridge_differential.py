"""Differential check of Megatron Bridge's own rules: the built-in table against the installed
Bridge.

Each case is a small workload run through both:

- live: `bridge_live.run` -- a real `ConfigContainer` through Bridge's `runtime_config_update` and
  the checks of `provide()`; its exception is mapped to a card id by message;
- builtin: the card's Bridge constraints for the release (`builtin.evaluate`), the first one in
  the order Bridge checks them (`BRIDGE_ORDER`); a warning counts, because it stands for a value
  the input does not state and Bridge's default fails (check_for_nan_in_loss, the RNG tracker,
  NVTE_CPU_OFFLOAD_V1).

A case agrees when both accept or both reject with the same card id. Every case is one
megatron-core accepts, so only Bridge decides. The run also reads the message at each line the
card cites in the installed Bridge. Used by tests/test_bridge_validation.py in the Bridge 0.6.2
environment; needs megatron-bridge (imports it).
"""

from __future__ import annotations

from typing import Optional

from mbridge_recompute.workload import Workload

BASE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "bf16": True, "seq_length": 128,
        "attention_dropout": 0.0, "hidden_dropout": 0.0, "check_for_nan_in_loss": False,
        "te_rng_tracker": True}
FG = {"fine_grained_activation_offloading": True, "offload_modules": ["core_attn"]}
TE_GRAPH = {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn"]}
LOCAL = {"cuda_graph_impl": "local"}
FULL_ITERATION = {"cuda_graph_impl": "full_iteration"}
MLA = {"multi_latent_attention": True, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_head_dim": 16,
       "qk_pos_emb_head_dim": 16, "v_head_dim": 16}
TE_212 = {"te_version": "2.12.0"}        # the version the environment's TE reports

# (name, overrides)
CASES: list = [
    ("plain", {}),
    ("local graph of attn", {**LOCAL, "cuda_graph_modules": ["attn"]}),
    ("local graph of attn and mlp", {**LOCAL, "cuda_graph_modules": ["attn", "mlp"]}),
    ("local whole-layer graph", {**LOCAL}),
    ("local graph, deprecated full_iteration scope", {**LOCAL, "cuda_graph_scope": ["full_iteration"]}),
    ("full-iteration graph", FULL_ITERATION),
    ("full-iteration graph with the NaN check", {**FULL_ITERATION, "check_for_nan_in_loss": True}),
    ("full-iteration graph, NaN check not stated (Bridge's default)",
     {**FULL_ITERATION, "check_for_nan_in_loss": None}),
    ("full-iteration graph, NaN check, no RNG tracker",
     {**FULL_ITERATION, "check_for_nan_in_loss": True, "te_rng_tracker": False}),
    ("TE graph of attn", TE_GRAPH),
    ("TE graph of attn without the RNG tracker", {**TE_GRAPH, "te_rng_tracker": False}),
    ("TE graph of attn, RNG tracker on the model", {**TE_GRAPH, "te_rng_tracker": False,
                                                    "extra_model": {"use_te_rng_tracker": True}}),
    ("TE whole-layer graph without the RNG tracker", {"cuda_graph_impl": "transformer_engine",
                                                      "te_rng_tracker": False}),
    ("full-iteration graph without the RNG tracker", {**FULL_ITERATION, "te_rng_tracker": False}),
    ("TE graph, RNG tracker not stated", {**TE_GRAPH, "te_rng_tracker": None}),
    ("MLA, local graph of attn", {**MLA, **LOCAL, "cuda_graph_modules": ["attn"]}),
    ("MLA, TE graph without the RNG tracker", {**MLA, **TE_GRAPH, "te_rng_tracker": False}),
    ("fine-grained offloading, local spec", {**FG, "transformer_impl": "local", **TE_212}),
    ("fine-grained offloading, TE 2.12, no NVTE_CPU_OFFLOAD_V1", {**FG, **TE_212}),
    ("fine-grained offloading, TE 2.12, env_vars sets it", {**FG, **TE_212,
                                                           "env_vars": {"NVTE_CPU_OFFLOAD_V1": "1"}}),
    ("fine-grained offloading, TE 2.12, env_vars sets 0", {**FG, **TE_212,
                                                          "env_vars": {"NVTE_CPU_OFFLOAD_V1": "0"}}),
    ("fine-grained offloading, TE 2.9", {**FG, "te_version": "2.9.0"}),
    ("fine-grained offloading, local spec, TE 2.9", {**FG, "transformer_impl": "local",
                                                     "te_version": "2.9.0"}),
    ("fine-grained offloading of attn_proj, TE 2.12", {**FG, "offload_modules": ["core_attn", "attn_proj"],
                                                       **TE_212}),
    ("local graph and fine-grained offloading (Bridge's graph check comes first)",
     {**LOCAL, "cuda_graph_modules": ["attn"], **FG, **TE_212}),
    ("full-iteration graph, NaN check and fine-grained offloading on the local spec",
     {**FULL_ITERATION, "check_for_nan_in_loss": True, **FG, "transformer_impl": "local", **TE_212,
      "extra_model": {"fine_grained_offloading_max_inflight_offloads": 1}}),
    ("no graphs, NaN check on, no RNG tracker", {"check_for_nan_in_loss": True, "te_rng_tracker": False}),
]


def workload(overrides: dict) -> Workload:
    return Workload(**{**BASE, **overrides})


def builtin_verdict(w, key: str) -> tuple:
    """("accept", None) or ("reject", id): the first Bridge finding, in the order Bridge checks."""
    from mbridge_recompute.rules import builtin

    ev = builtin.evaluate(w, key, w.te_version)
    found = {f["id"] for f in ev.findings if f["kind"] == "bridge"}
    first = next((cid for cid in builtin.BRIDGE_ORDER if cid in found), None)
    return ("accept", None) if first is None else ("reject", first)


def run_case(name: str, overrides: dict, key: str) -> dict:
    from mbridge_recompute.rules import bridge_live

    w = workload(overrides)
    out = bridge_live.run(w)
    state, cid, exc_type = bridge_live.verdict(out, key)
    live = (state, cid)
    return {"name": name, "live": list(live), "builtin": list(builtin_verdict(w, key)),
            "exception": exc_type, "message": out.exc_message, "where": out.where, "stage": out.stage}


def cited_message_problems(key: str) -> list:
    """Bridge constraints of release `key` whose message is not the string literal at the lines
    the card cites in the installed Bridge."""
    import importlib.util
    import re
    from pathlib import Path

    from mbridge_recompute.facts import card
    from mbridge_recompute.rules.differential import _literals

    root = Path(list(importlib.util.find_spec("megatron.bridge").submodule_search_locations)[0])
    problems = []
    for c in card.constraints():
        if c["kind"] != "bridge" or key not in c["at"]:
            continue
        site = card.site(c["at"][key])
        path = root / site.file.removeprefix("bridge/")
        lines = path.read_text(encoding="utf-8").splitlines()[site.start - 1:site.end]
        want = re.sub(r"\{[^}]*\}", "{}", card.constraint_at(c["id"], key)["message"]).replace('\\"', '"')
        text = _literals(lines).replace('\\"', '"')
        if want not in text:
            problems.append(f"{c['id']}: {want!r} is not at {c['at'][key]} (installed megatron-bridge)")
    return problems


def main(argv: Optional[list] = None) -> int:
    """`python -m mbridge_recompute.rules.bridge_differential`: every case against the installed
    Bridge, as one JSON object (what tests/test_bridge_validation.py reads)."""
    import json
    import logging
    import sys
    import warnings
    from importlib import metadata

    from mbridge_recompute.facts import releases

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    key = releases.target_version()
    results = [run_case(name, overrides, key) for name, overrides in CASES]
    out = {"bridge": metadata.version("megatron-bridge"), "mcore": releases.installed_mcore_version(),
           "facts": key, "results": results, "cited_message_problems": cited_message_problems(key)}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
