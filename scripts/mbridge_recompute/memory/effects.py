"""What a recompute label drops on this architecture, as the memory model sees it.

Whether the config rejects a label or runs it as a silent no-op is the checker's to say
(rules/builtin.py, card.yaml); this module only says whether the memory model covers the
label here, and what it discards when it runs. The words are the card's (each label's
`memory:`): `not_modelled` for a label the model has no terms for, `needs_layers` for the layer
blocks without which there is nothing to price, and `drops` per attention core where that
decides it (`any` otherwise).
"""

from __future__ import annotations

from mbridge_recompute.facts import card
from mbridge_recompute.memory.shape import attention_core


def _spec(w) -> str:
    """The `drops` key of this workload's attention: which kernel runs (memory/shape.py owns
    that), MLA under TE fused attention apart (it keeps only the softmax statistics)."""
    core = attention_core(w)
    return "te_fused_mla" if core == "te_fused" and w.multi_latent_attention else core


def what_it_drops(w, label: str) -> tuple[bool, str]:
    """(modelled, what the label discards here); modelled=False means the memory model has no
    saving to offer for it on this workload."""
    try:
        memory = card.label(label).get("memory") or {}
    except KeyError:
        return False, "label not modelled"
    if "not_modelled" in memory:
        return False, memory["not_modelled"]
    blocks = {b for k in set(w.layer_kinds()) for b in k.split("+")}
    for block, absent in (memory.get("needs_layers") or {}).items():
        if block not in blocks:
            return False, absent
    drops = memory["drops"]
    return True, drops["any"] if "any" in drops else drops[_spec(w)]
