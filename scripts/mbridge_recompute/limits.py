"""The one limits table: how much of each kind of file a tool reads, and how large a YAML or
JSON document may grow once parsed. files.py holds every file to LIMITS; yamlio.py every
document to the rest."""

from __future__ import annotations

from mbridge_recompute.units import MIB

# What one tool reads at most, per kind of file: the one limits table. A document is kilobytes
# (a Bridge ConfigContainer dump ~30 KB, a config.json ~10 KB, a manifest ~2 KB, a plan with
# --alternatives ~130 KB), so a few MiB already means "not what it claims to be"; a compare report
# carries one record per rank and run. A long training log is hundreds of MB; it is streamed.
LIMITS = {
    "workload": 4 * MIB,          # a workload YAML or a Bridge ConfigContainer dump
    "config dump": 4 * MIB,       # a run's ConfigContainer.yaml
    "manifest": 4 * MIB,          # a run's manifest.json
    "hf config": 4 * MIB,         # a Hugging Face config.json
    "arguments": 4 * MIB,         # a Megatron-LM argument file (a command line or model_config.yaml)
    "plan": 16 * MIB,             # `plan --json` (run_harness --from-plan)
    "report": 16 * MIB,           # `compare --json` / `diagnose --json` (plan --measured)
    "tune record": 16 * MIB,      # a tune's tune.json (64 runs at most, each a few KB)
    "checkout source": 4 * MIB,   # a file of a Megatron-Bridge checkout read as text, never run
    "log": 1024 * MIB,            # a training log (streamed: memory does not grow with it)
}
LOG_LIMIT = LIMITS["log"]
# A YAML/JSON document: nesting, values once aliases are expanded, digits of one integer
# (a dump nests 5 levels and holds ~3,000 values; int() refuses more than 4300 digits)
MAX_DEPTH = 64
MAX_NODES = 200_000
MAX_INT_DIGITS = 4300
# text handed over without a file (a --set value, a recipe's dump) is bounded like the largest file
MAX_DOCUMENT_BYTES = max(v for k, v in LIMITS.items() if k != "log")
