"""The per-rank dimensions the memory model reads, frozen so results can be cached.

`shape_of(w, knobs)` is the only place that looks at the Workload's field names;
every other module of the memory model works on a `Shape`. Fields that MCore has
but the Workload does not model (bias_activation_fusion, mamba_*, linear_*) are
read from `w.extra_model` with MCore 0.16.1's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mbridge_recompute.memory.lora import from_workload as lora_of
from mbridge_recompute.workload import TE_ABSENT

# Positional encodings that produce fresh q/k tensors (a RoPE kernel writes new storage).
ROTARY = ("rope", "yarn", "mrope")


def attention_core(w) -> str:
    """Which core-attention kernel runs, and so what it keeps for backward.

    - "mcore": megatron-core's own DotProductAttention, the local spec's core attention and,
      with the TE spec, what `attention_backend: local` swaps in (Bridge gpt_provider.py:277-279
      @ v0.6.0; Megatron-LM training/models/gpt.py:301-304);
    - "te_unfused": TEDotProductAttention with `attention_backend: unfused`, which makes TE run
      its UnfusedDotProductAttention (NVTE_UNFUSED_ATTN=1 alone, language_module.py:108-152);
    - "te_fused": TE's flash or cuDNN fused kernels (`auto`, `flash`, `fused`): q, k, v, the
      output and fp32 softmax statistics, never the probabilities.
    """
    if w.transformer_impl != "transformer_engine" or w.attention_backend == "local":
        return "mcore"
    return "te_unfused" if w.attention_backend == "unfused" else "te_fused"


def padded_vocab(w) -> int:
    """The vocabulary the embedding and output layer hold: padded to a multiple of
    make_vocab_size_divisible_by x TP (megatron/training/tokenizer/tokenizer.py:117-130 @
    core_v0.16.1; build_tokenizer.py:133-146 @ d98e8a6) unless should_pad_vocab is off."""
    vocab = w.vocab_size or 0
    if not vocab or not w.should_pad_vocab:
        return vocab
    div = w.make_vocab_size_divisible_by * w.tensor_model_parallel_size
    return -(-vocab // div) * div


@dataclass(frozen=True)
class Shape:
    # tokens
    s: int                 # sequence length
    b: int                 # micro-batch size
    c: int                 # context parallel
    t: int                 # tensor parallel
    sp: bool               # sequence parallel (only meaningful with t > 1)
    # attention
    h: int
    a: int
    g: int
    d: int
    rope: bool
    qk_norm: bool
    mla: bool
    q_lora: Optional[int]
    kv_lora: int
    dqk: int
    dr: int
    dv: int
    # mlp
    f: int
    gated: bool
    act: str
    bias_act_fusion: bool
    te_act_func: bool
    fused_sq_relu: bool    # use_fused_weighted_squared_relu (MoE experts)
    act_fp8_store: bool
    add_bias: bool
    # moe
    E: int
    k: int
    f_e: int
    f_s: int
    shared_gate: bool
    grouped: bool
    ep: int
    etp: int
    capacity: Optional[float]
    imbalance: float
    # hybrid mixers
    mamba_heads: int
    mamba_head_dim: int
    mamba_groups: int
    mamba_state: int
    gdn_qk: int            # linear_num_key_heads * linear_key_head_dim
    gdn_v: int             # linear_num_value_heads * linear_value_head_dim
    gdn_nv: int            # linear_num_value_heads
    # backend and precision
    te: bool               # Transformer Engine linears (norms fused into the next GEMM)
    attn_core: str         # attention_core(): "te_fused", "te_unfused" or "mcore"
    elt: int               # bytes of one activation element (2 in bf16/fp16, 4 in fp32)
    fp8: bool
    fp8_recipe: str
    fp4: bool
    save_original_ok: bool  # TE new enough for set_save_original_input (>= 2.6 fp8 / 2.7 fp4)
    layernorm: bool        # LayerNorm (mu + rsigma) vs RMSNorm (rsigma)
    norm_stats: bool
    tiny: bool             # count constant-size tensors
    attn_dropout: bool
    hidden_dropout: bool
    softmax_fusion: bool
    softmax_fp32: bool
    fused_single_qkv_rope: bool
    # model ends
    vocab: int             # padded vocabulary
    learned_pos: bool
    deallocate_outputs: bool
    te_cross_entropy: bool      # cross_entropy_loss_fusion with cross_entropy_fusion_impl="te"
    rope_fusion: bool           # apply_rope_fusion (MCore default False)
    mamba_mem_eff: bool         # use_mamba_mem_eff_path (MCore default True)
    dispatcher: str             # moe_token_dispatcher_type
    offload: frozenset          # offload_modules in force (fine-grained activation offloading)
    router_fp32: bool           # moe_router_dtype fp32/fp64: probs, and combine temporaries, in fp32
    lora: Optional[tuple] = None  # memory/lora.Lora: LoRA adapters on a frozen base (Bridge peft:)
    # gradient_accumulation_fusion with TE >= 2.2.1: each weight shape's cached dummy wgrad
    # (memory/static.dummy_wgrad_bytes); grouped_dummies: TE GroupedLinear too (TE >= 2.10)
    wgrad_dummies: bool = False
    grouped_dummies: bool = False

    # --- derived per-rank quantities -------------------------------------------
    @property
    def T(self) -> float:
        """Tokens per CP rank in one micro-batch (attention / GEMM-output side)."""
        return self.s * self.b / self.c

    @property
    def Tr(self) -> float:
        """Tokens in residual-stream tensors: sharded over TP under sequence parallelism."""
        return self.T / self.t if (self.sp and self.t > 1) else self.T

    @property
    def a_(self) -> float:
        return self.a / self.t

    @property
    def g_(self) -> float:
        # KV heads are replicated when there are fewer groups than TP ranks.
        return max(self.g / self.t, 1)

    @property
    def q_bytes(self) -> float:
        """Bytes per element of a GEMM input that a low-precision linear keeps (its quantized copy)."""
        if self.fp4:
            return 0.5 + 1 / 16          # nvfp4: 4-bit values, one fp8 scale per 16
        if self.fp8:
            if self.fp8_recipe in ("mxfp8", "blockwise"):
                return 1 + 1 / 32        # one scale per 32 (mxfp8) / ~1x128 blocks (blockwise)
            return 1.0                   # per-tensor scaling: scales are negligible
        return float(self.elt)

    @property
    def stats(self) -> int:
        if not self.norm_stats:
            return 0
        return 8 if self.layernorm else 4

    @property
    def low_precision(self) -> bool:
        return self.fp8 or self.fp4

    @property
    def vocab_(self) -> float:
        return self.vocab / self.t

    def n_routed(self) -> float:
        """Token copies reaching the hottest EP rank's local experts in one micro-batch.

        Balanced dropless routing gives k * Tr * etp; the imbalance factor scales the
        hottest rank, and a capacity factor caps it.
        """
        factor = self.imbalance
        if self.capacity is not None:
            factor = min(factor, self.capacity)
        return self.k * self.Tr * self.etp * factor


def extra_value(w, name, default=None):
    """A TransformerConfig field the Workload keeps outside its own fields (`extra_model`), or
    `default` when it is unset."""
    value = w.extra_model.get(name) if isinstance(w.extra_model, dict) else None
    return default if value is None else value


def _te_at_least(w, version: str) -> bool:
    if not w.te_version:
        return True        # stated assumption: a Transformer Engine release >= 2.7
    try:
        from packaging.version import Version
        return Version(str(w.te_version)) >= Version(version)
    except Exception:  # unparsable version string: keep the assumption
        return True


def shape_of(w, knobs) -> Shape:
    t = w.tensor_model_parallel_size
    elt = 2 if (w.bf16 or w.fp16) else 4
    fp8 = bool(w.fp8)
    fp4 = bool(w.fp4)
    if fp4:
        save_ok = _te_at_least(w, "2.7.0.dev0")
    else:
        save_ok = fp8 and w.fp8_recipe != "delayed" and _te_at_least(w, "2.6.0.dev0")
    h = w.hidden_size
    mamba_hd = int(extra_value(w, "mamba_head_dim", 64))
    mamba_heads = extra_value(w, "mamba_num_heads", None) or (2 * h) // mamba_hd
    nk = int(extra_value(w, "linear_num_key_heads", 16))
    nv = int(extra_value(w, "linear_num_value_heads", 32))
    dk = int(extra_value(w, "linear_key_head_dim", 128))
    dvv = int(extra_value(w, "linear_value_head_dim", 128))
    lora = lora_of(w)
    return Shape(
        s=w.seq_length, b=w.micro_batch_size, c=w.context_parallel_size, t=t,
        sp=bool(w.sequence_parallel),
        h=h, a=w.num_attention_heads, g=w.heads_kv, d=w.head_dim,
        rope=w.position_embedding_type in ROTARY, qk_norm=bool(w.qk_layernorm),
        mla=bool(w.multi_latent_attention), q_lora=w.q_lora_rank, kv_lora=w.kv_lora_rank,
        dqk=w.qk_head_dim, dr=w.qk_pos_emb_head_dim, dv=w.v_head_dim,
        f=w.ffn, gated=bool(w.gated_linear_unit), act=w.activation_func,
        bias_act_fusion=bool(extra_value(w, "bias_activation_fusion", False)),
        te_act_func=bool(extra_value(w, "use_te_activation_func", False)),
        fused_sq_relu=bool(extra_value(w, "use_fused_weighted_squared_relu", False)),
        act_fp8_store=bool(w.activation_func_fp8_input_store), add_bias=bool(w.add_bias_linear),
        E=w.num_moe_experts or 0, k=w.moe_router_topk,
        f_e=w.moe_ffn_hidden_size or w.ffn,
        f_s=w.moe_shared_expert_intermediate_size or 0,
        shared_gate=bool(extra_value(w, "moe_shared_expert_gate", False)),
        grouped=bool(w.moe_grouped_gemm),
        ep=w.expert_model_parallel_size, etp=w.etp,
        capacity=w.moe_expert_capacity_factor, imbalance=float(knobs.moe_load_imbalance),
        mamba_heads=int(mamba_heads), mamba_head_dim=mamba_hd,
        mamba_groups=int(extra_value(w, "mamba_num_groups", 8)),
        mamba_state=int(extra_value(w, "mamba_state_dim", 128)),
        gdn_qk=nk * dk, gdn_v=nv * dvv, gdn_nv=nv,
        te=w.transformer_impl == "transformer_engine", attn_core=attention_core(w), elt=elt, fp8=fp8,
        fp8_recipe=str(w.fp8_recipe), fp4=fp4, save_original_ok=bool(save_ok),
        layernorm=w.normalization == "LayerNorm", norm_stats=bool(knobs.norm_stats),
        tiny=bool(knobs.tiny_tensors),
        attn_dropout=w.attention_dropout > 0, hidden_dropout=w.hidden_dropout > 0,
        softmax_fusion=bool(w.masked_softmax_fusion), softmax_fp32=bool(w.attention_softmax_in_fp32),
        fused_single_qkv_rope=bool(w.fused_single_qkv_rope),
        vocab=padded_vocab(w), learned_pos=w.position_embedding_type == "learned_absolute",
        deallocate_outputs=bool(extra_value(w, "deallocate_pipeline_outputs", False)),
        te_cross_entropy=bool(extra_value(w, "cross_entropy_loss_fusion", False))
        and extra_value(w, "cross_entropy_fusion_impl", "native") == "te",
        mamba_mem_eff=bool(extra_value(w, "use_mamba_mem_eff_path", True)),
        rope_fusion=bool(extra_value(w, "apply_rope_fusion", False)),
        dispatcher=w.moe_token_dispatcher_type,
        offload=frozenset(w.offload_modules or ()) if w.fine_grained_activation_offloading
        else frozenset(),
        router_fp32=w.moe_router_dtype in ("fp32", "fp64"),
        lora=lora,
        # unset: the fused path (Bridge's GPT / hybrid providers and Megatron-LM turn it on where
        # the fused kernel exists; data/coverage.yaml names `false` as not modelled)
        wgrad_dummies=bool(extra_value(w, "gradient_accumulation_fusion", True))
        and _te_at_least(w, "2.2.1") and lora is None
        and (not w.te_version or str(w.te_version).strip().lower() not in TE_ABSENT),
        grouped_dummies=_te_at_least(w, "2.10.0.dev0"),
    )
