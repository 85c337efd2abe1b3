"""Fine-grained activation offloading: which saved tensors `offload_modules` move to the host.

Each offloadable module wraps its forward in an offload context and commits the group at its
end; the tensors autograd saves inside it go to pinned host memory once their layer's forward
is done and come back one layer ahead of its backward (fine_grained_activation_offload.py @
core_v0.16.1). What each module covers, in this model's tensor names:
- attn_norm / mlp_norm: the separate norm modules only; a norm fused into the next GEMM (the TE
  dense spec's input norm, its pre-MLP norm) is an IdentityOp and offloads nothing
  (transformer_layer.py:449-458);
- qkv_linear: everything the QKV projection keeps (with a fused input norm, that norm's input
  and statistics too; for MLA the down- and up-projection inputs and norms,
  multi_latent_attention.py:246-257);
- core_attn: what core attention keeps (q, k, v, the output-side statistics or probabilities,
  or the core_attn checkpoint's inputs; attention.py:1148-1190);
- attn_proj: linear_proj's input; expert_fc1: the dispatched tokens; moe_act: the expert
  activation's input (experts.py:578-590, 667-676, 740-750).
Tensors under 1M elements stay (min_offloaded_tensor_size, :609-618); the last layer of a chunk
whose backward follows at once stays (should_bulk_offload, :928-948), and the reload runs one
layer ahead (bulk_reload, :970-990): two layers' offloaded activations are back on the GPU at
the worst moment of the backward.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from mbridge_recompute.layer_spec import norm_fused
from mbridge_recompute.memory.shape import Shape
from mbridge_recompute.memory.tensors import layer_tensors

MIN_ELEMENTS = 1024 * 1024

_CORE = ("A4 q", "A5 k, v", "A7 softmax LSE", "softmax output", "attention-dropout mask",
         "dropped probs", "16-bit copy of the fp32 probs", "q after RoPE", "k after RoPE",
         "k repeated", "v repeated", "q (GQA reshape copy", "fused QKV buffer pinned",
         "query [", "key [", "value [", "core_attn checkpoint")
_QKV = ("A3 QKV GEMM input", "QK-norm", "RoPE cos/sin", "input-norm output", "q_compressed",
        "q-norm", "kv down-projection output", "kv-norm", "mla_up_proj checkpoint")
_ATTN_NORM = ("A1 attention-norm input", "A2 attention-norm statistics")
_MLP_NORM = ("M1 MLP-norm input", "M2 MLP-norm statistics", "pre-MLP norm input",
             "pre-MLP norm statistics")


def _module_of(sh: Shape, name: str, kind: str):
    """The offloadable module a saved tensor of this model belongs to, or None."""
    if name.startswith(_ATTN_NORM):             # a fused norm is held by linear_qkv
        return "qkv_linear" if norm_fused("attention", sh.te, sh.mla) else "attn_norm"
    if name.startswith(_MLP_NORM):              # a fused one by linear_fc1, not offloadable
        return None if norm_fused("mlp", sh.te, moe="moe" in kind) else "mlp_norm"
    if name.startswith(_QKV):
        return "qkv_linear"
    if name.startswith(_CORE):
        return "core_attn"
    if name.startswith(("A6 attention output O", "A8 linear_proj")):
        return "attn_proj"
    if name.startswith("dispatched tokens"):
        return "expert_fc1"
    if name.startswith(("expert fc1 output", "expert unfused")):
        return "moe_act"
    return None


# A checker finding that upstream skips an offload (a module recomputed and offloaded, a hybrid
# stack without an offload handler, ...) switches it off with ("offload:MODULE", "all").
SKIPPED = "offload:"


def skipped(module: str) -> tuple:
    """The `disables` pair of a silent skip that leaves `module` on the GPU."""
    return (SKIPPED + module, "all")


def in_force(sh: Shape, disabled=()) -> Shape:
    """`sh` with the offload modules the checker found skipped (`disabled`) taken out: the
    offloading that really happens."""
    off = {str(label)[len(SKIPPED):] for label, _block in disabled if str(label).startswith(SKIPPED)}
    return replace(sh, offload=sh.offload - off) if off & sh.offload else sh


@lru_cache(maxsize=4096)
def offloaded_components(sh: Shape, kind: str, mods: frozenset, modules: frozenset) -> tuple:
    """(component, bytes) of one layer's saved tensors (one micro-batch) that `modules` move to
    the host, by the activation component they belong to."""
    if not modules:
        return ()
    out: dict = {}
    for x in layer_tensors(sh, kind, mods):
        elements = x.nbytes / (4 if "fp32" in x.name else sh.elt)
        if elements >= MIN_ELEMENTS and _module_of(sh, x.name, kind) in modules:
            out[x.component] = out.get(x.component, 0.0) + x.nbytes
    return tuple(sorted(out.items()))


def offloaded_bytes(sh: Shape, kind: str, mods: frozenset, modules: frozenset) -> float:
    """Bytes of one layer's saved tensors (one micro-batch) that `modules` move to the host."""
    return sum(b for _, b in offloaded_components(sh, kind, mods, modules))
