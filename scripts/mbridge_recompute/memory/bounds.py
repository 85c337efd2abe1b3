"""How far a setting the memory model does not read can move the predicted peak.

Each not-modelled entry of data/coverage.yaml carries a `bound`: a sum of products of numbers
and byte figures of the workload's own estimate (the header of that file names them). The
figures are the largest over the pipeline ranks, so a bound is an upper estimate of the effect
on the hottest rank, not a prediction of it: its job is to order the warnings (the setting that
could move the peak most first) and to drop the settings that cannot move it at all (bound 0).
"""

from __future__ import annotations

import re
from typing import Optional

from mbridge_recompute.units import GB

UNKNOWN = "unknown"
_FACTOR = re.compile(r"^(?:\d+(?:\.\d+)?|[a-z_][a-z0-9_]*)$")


def figures(w, estimate) -> dict:
    """The named figures a bound may use, in bytes (counts as plain numbers)."""
    ranks = list(estimate.ranks) if estimate is not None else []

    def most(fn) -> float:
        return float(max((fn(r) for r in ranks), default=0))

    tp, cp = w.tensor_model_parallel_size, w.context_parallel_size
    tokens = w.seq_length * w.micro_batch_size / cp                  # s*b/c
    rows = tokens / tp if w.sequence_parallel and tp > 1 else tokens  # Tr
    in_flight = most(lambda r: r.in_flight_microbatches) or 1.0
    layers = most(lambda r: r.layers) or 1.0
    vocab = (w.vocab_size or 0) / tp
    out = {"tp": float(tp), "dp": float(w.data_parallel_size), "in_flight": in_flight,
           "static": most(lambda r: r.static_bytes), "activations": most(lambda r: r.activation_bytes),
           "transient": most(lambda r: r.transient_bytes),
           "layer": most(lambda r: r.activation_bytes / max(r.layers, 1)),
           "layer_static": most(lambda r: r.static_bytes / max(r.layers, 1)),
           "layer_weights": most(lambda r: r.static.get("weights", 0) / max(r.layers, 1)),
           "th": 2.0 * tokens * w.hidden_size,
           "hidden": 2.0 * rows * w.hidden_size * layers * in_flight,
           "scores": 2.0 * w.micro_batch_size * (w.num_attention_heads / tp) * (w.seq_length / cp)
           * w.seq_length * layers * in_flight,
           "mask": 1.0 * w.micro_batch_size * w.seq_length * w.seq_length * in_flight,
           "wgrad_deferral": 2.0 * min(w.num_microbatches, _deferral_limit(w) or w.num_microbatches)
           * tokens * (w.hidden_size + vocab)}
    for name in ("weights", "grads", "optimizer", "fp8_weight_copies"):
        out[name] = most(lambda r, n=name: r.static.get(n, 0))
    for name in ("attention", "mlp", "moe", "norms", "logits", "pipeline", "embedding"):
        out[name] = most(lambda r, n=name: r.activations.get(n, 0))
    return out


def _deferral_limit(w) -> int:
    """wgrad_deferral_limit (a model key, or comm_overlap's as the loader noted it); 0: all."""
    extra = w.extra_model if isinstance(w.extra_model, dict) else {}
    value = extra.get("wgrad_deferral_limit")
    for note in getattr(w, "not_modelled", None) or []:
        if note.startswith("comm_overlap.wgrad_deferral_limit="):
            value = note.partition("=")[2]
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def check(expr) -> None:
    """Raise ValueError unless `expr` is a bound this module can evaluate."""
    if expr in (0, UNKNOWN):
        return
    for term in str(expr).split("+"):
        for factor in term.split("*"):
            if not _FACTOR.match(factor.strip()):
                raise ValueError(f"bound {expr!r}: {factor.strip()!r} is not a number or a figure name")


def evaluate(expr, values: dict, own=None) -> Optional[float]:
    """Bytes a bound stands for (None: not sized). `own` is the key's value (`value` in the
    expression, 1 when it is not a number)."""
    if expr is None or expr == UNKNOWN:
        return None
    total = 0.0
    for term in str(expr).split("+"):
        product = 1.0
        for factor in (f.strip() for f in term.split("*")):
            if factor == "value":
                product *= float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else 1.0
            elif factor[0].isdigit():
                product *= float(factor)
            else:
                product *= values[factor]
        total += product
    return total


def up_to(nbytes: Optional[float]) -> str:
    """`up to 12.40 GB`, or `effect not sized` without a bound."""
    return "effect not sized" if nbytes is None else f"up to {nbytes / GB:.2f} GB"


def words(expr, nbytes: Optional[float]) -> str:
    """The bound as a sentence says it: `bound: up to 12.40 GB = optimizer + grads`."""
    if nbytes is None:
        return up_to(None)
    return f"bound: {up_to(nbytes)} = {expr}"
