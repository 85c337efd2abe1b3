"""LoRA adapters as Megatron Bridge 0.6.2 builds them: their parameters and what they keep.

`LoRA.transform` wraps each matched linear layer in a `LoRALinear` whose adapter is a
`ParallelLinearAdapter` (peft/lora.py:120-222, peft/utils.py:896-1080 @ megatron-bridge 0.6.2):

- linear_in (A, in -> r) and linear_out (B, r -> out). For a column-parallel base A is a
  ColumnParallelLinear with gather_output=True and B a ColumnParallelLinear over the output; for a
  row-parallel base A is a RowParallelLinear over the input and B gathers its output (utils.py:
  1002-1048). Both are split over the TP ranks: (in + out) x r / TP parameters per rank, in the
  model's dtype unless lora_dtype says otherwise (lora.py:111).
- Grouped MoE experts (TEGroupedMLP) share one adapter per EP rank across its local experts
  (share_expert_adapters, the default), split over the expert-TP ranks; per-expert linears
  (SequentialMLP) get one each. normalize_moe_lora gives experts rank r // top-k.
- The router (TopKRouter) gets LoRATopKRouter when "router" is a target (lora_layers.py:88-101).

What they keep for backward, per layer and micro-batch on one rank:
- B keeps its input, A's output: r values per token (A gathers over TP for a column-parallel
  base, the row-parallel A all-reduces);
- A keeps its input. For a row-parallel base and for experts that is the tensor the base layer
  holds already. Under sequence parallelism a column-parallel base's A keeps the gathered input
  (a LayerNorm-fused base returns the gathered norm output, utils.py:598-611; otherwise the
  adapter gathers it itself), T x in instead of the T/TP x in shard, unless
  sequence_parallel_input_regather re-gathers it in backward and keeps the shard;
- dropout > 0 keeps a mask and the dropped copy (position pre: of A's input; post: a mask of the
  adapter output).

The base layers are frozen: their inputs are still counted as full fine-tuning keeps them (a
layer whose weight needs no gradient may keep less: an upper bound).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from mbridge_recompute.layer_spec import LAYER_BLOCKS
from mbridge_recompute.memory.types import RankParams, Saved

COLUMN, ROW, EXPERT_COLUMN, EXPERT_ROW, REPLICATED = "col", "row", "ecol", "erow", "rep"


class Lora(NamedTuple):
    """The LoRA settings the memory model reads (inputs/peft.py normalises the dump's)."""
    dim: int
    targets: frozenset
    dropout: float
    dropout_post: bool
    normalize_moe: bool
    share_experts: bool
    regather: bool
    dtype_bytes: Optional[int]


def from_workload(w) -> Optional[Lora]:
    peft = getattr(w, "peft", None)
    if not peft:
        return None
    return Lora(dim=int(peft["dim"]), targets=frozenset(peft["targets"]), dropout=float(peft["dropout"]),
                dropout_post=peft["dropout_position"] == "post",
                normalize_moe=bool(peft["normalize_moe_lora"]),
                share_experts=bool(peft["share_expert_adapters"]),
                regather=bool(peft["sequence_parallel_input_regather"]), dtype_bytes=peft.get("dtype_bytes"))


class Linear(NamedTuple):
    name: str          # the module name LoRA matches
    n_in: float        # input features (whole layer)
    n_out: float       # output features (whole layer)
    split: str         # COLUMN / ROW over TP, EXPERT_* over expert TP, REPLICATED
    block: str         # the recompute block it belongs to: attn, mlp, moe, shared, mamba, gdn


def linears(sh, block: str) -> list:
    """The linear layers of one block of a decoder layer."""
    h = sh.h
    if block == "attn":
        if sh.mla:
            qk, out = sh.dqk + sh.dr, []
            if sh.q_lora:
                out += [Linear("linear_q_down_proj", h, sh.q_lora, COLUMN, "attn"),
                        Linear("linear_q_up_proj", sh.q_lora, sh.a * qk, COLUMN, "attn")]
            else:
                out.append(Linear("linear_q_proj", h, sh.a * qk, COLUMN, "attn"))
            return out + [Linear("linear_kv_down_proj", h, sh.kv_lora + sh.dr, COLUMN, "attn"),
                          Linear("linear_kv_up_proj", sh.kv_lora, sh.a * (sh.dqk + sh.dv), COLUMN, "attn"),
                          Linear("linear_proj", sh.a * sh.dv, h, ROW, "attn")]
        return [Linear("linear_qkv", h, (sh.a + 2 * sh.g) * sh.d, COLUMN, "attn"),
                Linear("linear_proj", sh.a * sh.d, h, ROW, "attn")]
    if block == "mlp":
        return [Linear("linear_fc1", h, (2 if sh.gated else 1) * sh.f, COLUMN, "mlp"),
                Linear("linear_fc2", sh.f, h, ROW, "mlp")]
    if block == "moe":
        out = [Linear("router", h, sh.E, REPLICATED, "moe"),
               Linear("linear_fc1", h, (2 if sh.gated else 1) * sh.f_e, EXPERT_COLUMN, "moe"),
               Linear("linear_fc2", sh.f_e, h, EXPERT_ROW, "moe")]
        if sh.f_s:
            out += [Linear("linear_fc1", h, (2 if sh.gated else 1) * sh.f_s, COLUMN, "shared"),
                    Linear("linear_fc2", sh.f_s, h, ROW, "shared")]
        return out
    if block == "mamba":
        di = sh.mamba_heads * sh.mamba_head_dim
        width = 2 * di + 2 * sh.mamba_groups * sh.mamba_state + sh.mamba_heads
        return [Linear("in_proj", h, width, COLUMN, "mamba"), Linear("out_proj", di, h, ROW, "mamba")]
    if block == "gdn":
        width = 2 * sh.gdn_qk + 2 * sh.gdn_v + 2 * sh.gdn_nv
        return [Linear("in_proj", h, width, COLUMN, "gdn"), Linear("out_proj", sh.gdn_v, h, ROW, "gdn")]
    return []


def _rank(sh, lin: Linear) -> int:
    lora = sh.lora
    if lin.split in (EXPERT_COLUMN, EXPERT_ROW) and lora.normalize_moe and sh.k:
        return max(1, lora.dim // sh.k)            # get_effective_lora_dim (utils.py)
    return lora.dim


def adapted(sh, block: str) -> list:
    """The linears of `block` LoRA wraps."""
    if sh.lora is None:
        return []
    return [lin for lin in linears(sh, block) if lin.name in sh.lora.targets]


def adapter_count(sh, lin: Linear) -> tuple:
    """(parameters of the adapter of `lin` on one rank, whether they are expert parameters)."""
    r = _rank(sh, lin)
    whole = (lin.n_in + lin.n_out) * r
    if lin.split == REPLICATED:
        return whole, False
    if lin.split in (EXPERT_COLUMN, EXPERT_ROW):
        # one adapter per EP rank for grouped experts, else one per local expert
        per_rank = 1 if (sh.grouped and sh.lora.share_experts) else sh.E / sh.ep
        return per_rank * whole / sh.etp, True
    return whole / sh.t, False


def layer_adapter_params(sh, kind: str) -> tuple:
    """(dense, expert) adapter parameters of one layer of `kind` on one rank."""
    dense = expert = 0.0
    for block in LAYER_BLOCKS[kind]:
        for lin in adapted(sh, block):
            n, is_expert = adapter_count(sh, lin)
            if is_expert:
                expert += n
            else:
                dense += n
    return dense, expert


def saved(sh, block: str, mods: frozenset) -> list:
    """(name, bytes) of what the adapters of `block` keep for backward in one micro-batch, under
    the selective labels `mods` (an MLP / MoE recompute replays its adapters too)."""
    if sh.lora is None:
        return []
    e, T, Tr = sh.elt, sh.T, sh.Tr
    dropped = {"mlp": "mlp" in mods, "moe": "moe" in mods,
               "shared": "moe" in mods or "shared_experts" in mods}
    out = []
    for lin in adapted(sh, block):
        if dropped.get(lin.block):
            continue
        r = _rank(sh, lin)
        if lin.split in (EXPERT_COLUMN, EXPERT_ROW):
            tokens = sh.n_routed()
        elif lin.split == REPLICATED:
            tokens = Tr
        else:
            tokens = T
        tag = f"LoRA {lin.name}"
        out.append(Saved(f"{tag}: lora_B input (r = {r})", "lora", e * r * tokens))
        n_in = lin.n_in / (sh.t if lin.split == ROW else sh.etp if lin.split == EXPERT_ROW else 1)
        if lin.split == COLUMN and sh.sp and sh.t > 1:
            kept = Tr if sh.lora.regather else T
            out.append(Saved(f"{tag}: lora_A input, " + ("the sequence shard (regathered in backward)"
                                                        if sh.lora.regather else "gathered over TP"),
                             "lora", e * lin.n_in * kept))
        if sh.lora.dropout > 0:
            if sh.lora.dropout_post:
                n_out = lin.n_out / (sh.t if lin.split == COLUMN else
                                     sh.etp if lin.split == EXPERT_COLUMN else 1)
                out.append(Saved(f"{tag}: dropout mask (post)", "lora", 1 * n_out * tokens))
            else:
                out.append(Saved(f"{tag}: dropout mask and dropped input (pre)", "lora",
                                 (1 + e) * n_in * tokens))
    return out


def rank_params(sh, kinds, mtp_kinds=()):
    """The adapter parameters of one pipeline rank (its decoder layers and MTP depths) as the
    static model's RankParams: dense and expert parts, no low-precision copies, no embedding."""
    dense = expert = 0.0
    for kind in list(kinds) + list(mtp_kinds):
        d, x = layer_adapter_params(sh, kind)
        dense += d
        expert += x
    return RankParams(dense, expert, 0.0, 0.0, 0.0)
