"""The one `Workload` type every tool reasons about.

Field names are Megatron-Core `TransformerConfig` / Megatron Bridge names, so a Bridge config
dump loads as-is and findings speak the user's vocabulary. Defaults are megatron-core 0.16.1's
`TransformerConfig` defaults (attention and hidden dropout 0.1, `cuda_graph_impl="none"`,
`fp8_recipe="delayed"`, ...): the live validator must see exactly what megatron-core would see.

Each field declares what the loader needs to read it, in its annotation and metadata:
- the type: `bool`, `int`, `float`, `str`, `Literal[...]` (a fixed set of names, the same in
  every release), `Optional[...]` (null allowed), `list[str]` / `list[int]`;
- `origin`: the upstream config that owns it (the live validator passes TransformerConfig's);
- `section`: where a workload file holds it (`model` unless said: `train`, `ddp`, `optimizer`,
  `comm_overlap`, or `cluster`, ours, for what a Bridge config does not hold);
- `bound`: `"positive"` (> 0) or `"count"` (>= 0), and `limit` for counts the model walks one
  by one (layers);
- `kind`: `"dtype"` (an optimizer-state dtype, normalised to fp32/bf16/fp16/fp8), `"function"`
  (an activation function, its last dotted name), `"labels"` (a list of module names, never
  a string), `"version"` (text, never a YAML number), `"enum"` (a Python enum's member name,
  'AttnBackend.flash' read as flash), `"layer-mask"` (a list holds 0/1 per layer),
  `"release-name"` (names whose valid set the card keeps per release).
Names whose valid set depends on the megatron-core release (labels, offload modules, CUDA-graph
implementations and scopes) are checked against the card, not here.

`inputs/loading.py` builds a Workload from files and overrides and validates it once; everything
after that trusts it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

# Which upstream config owns a field (`origin`).
TRANSFORMER_CONFIG = "TransformerConfig"
PROVIDER = "Bridge model provider"
TRAINING = "Bridge TrainingConfig"
DDP = "DistributedDataParallelConfig"
OPTIMIZER = "OptimizerConfig"
COMM_OVERLAP = "Bridge CommOverlapConfig -> TransformerConfig"
BRIDGE = "Bridge ConfigContainer"
OURS = "ours"


def _f(default, section: str = "model", origin: str | None = None, **meta):
    """A Workload field: its default and what the loader checks (see the module docstring)."""
    meta["section"] = section
    meta["origin"] = origin or (COMM_OVERLAP if section == "comm_overlap" else TRANSFORMER_CONFIG)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


POSITIVE = "positive"
COUNT = "count"
# Layers the memory model walks one by one (decoder layers, MTP depths): the bound on each count.
MAX_LAYERS = 10_000
# What `cluster.te_version` says when Transformer Engine is known to be absent on the training nodes
TE_ABSENT = frozenset({"none", "absent", "no", "missing", "0", "0.0.0"})


@dataclass
class Workload:
    """A training job as megatron-core sees it: architecture, parallelism, precision, recompute,
    batch, optimizer state and the machine. One docstring per field; `origin` says which
    upstream config owns it (TransformerConfig / ModelParallelConfig, a Bridge model provider,
    OptimizerConfig, DistributedDataParallelConfig, Bridge's CommOverlapConfig and
    TrainingConfig) or that it is ours."""

    # --- architecture ---------------------------------------------------------------------
    num_layers: int = _f(2, bound=POSITIVE, limit=MAX_LAYERS)
    """Decoder layers (a hybrid stack: the length of hybrid_override_pattern)."""
    hidden_size: int = _f(1024, bound=POSITIVE)
    """Width of the residual stream."""
    num_attention_heads: int = _f(16, bound=POSITIVE)
    """Query heads."""
    num_query_groups: Optional[int] = _f(None, bound=POSITIVE)
    """KV heads for GQA; None means MHA (one group per head)."""
    kv_channels: Optional[int] = _f(None, bound=POSITIVE)
    """Head dimension; None means hidden_size // num_attention_heads."""
    ffn_hidden_size: Optional[int] = _f(None, bound=POSITIVE)
    """Dense MLP width; None means 4 * hidden_size."""
    gated_linear_unit: bool = _f(False)
    """A GLU MLP (fc1 is 2 x ffn wide); with silu this is SwiGLU."""
    activation_func: str = _f("gelu", kind="function")
    """Last dotted name of the function: gelu, silu, squared_relu, ... (a Bridge dump's _target_ too)."""
    normalization: Literal["LayerNorm", "RMSNorm"] = _f("LayerNorm")
    """LayerNorm keeps mean and rstd, RMSNorm only rstd."""
    qk_layernorm: bool = _f(False)
    """Norms on query and key heads (Qwen3, OLMo 2)."""
    add_bias_linear: bool = _f(True)
    """Biases on every linear layer."""
    seq_length: int = _f(4096, bound=POSITIVE, origin=PROVIDER)
    """Tokens per sample (the dataset's sequence length must match)."""
    vocab_size: Optional[int] = _f(None, bound=POSITIVE, origin=PROVIDER)
    """Unpadded vocabulary; None leaves out the embedding, output layer and logits."""
    share_embeddings_and_output_weights: bool = _f(True, origin=PROVIDER)
    """The output layer reuses the input embedding (one copy when PP = 1)."""
    position_embedding_type: str = _f("rope", origin=PROVIDER)
    """rope, yarn, mrope (fresh q/k from a RoPE kernel), learned_absolute or none."""
    mtp_num_layers: Optional[int] = _f(None, bound=POSITIVE, limit=MAX_LAYERS)
    """Multi-token-prediction depth: each depth is one more decoder layer (the spec of the last
    one) with its own norms, eh_proj and a second pass through the output layer and loss."""
    make_vocab_size_divisible_by: int = _f(128, bound=POSITIVE, origin=PROVIDER)
    """The vocabulary is padded to a multiple of this x TP (Megatron-LM's
    --make-vocab-size-divisible-by, Bridge's provider field)."""
    should_pad_vocab: bool = _f(True, origin=PROVIDER)
    """Pad the vocabulary at all. Megatron-LM always pads; Bridge pads when the vocabulary
    comes from the tokenizer (training/setup.py:740-781 @ v0.6.0) and not when the provider
    states a vocab_size at least the tokenizer's."""
    # MoE
    num_moe_experts: Optional[int] = _f(None, bound=POSITIVE)
    """Routed experts per MoE layer; None is a dense model."""
    moe_router_topk: int = _f(2, bound=POSITIVE)
    """Experts each token is routed to."""
    moe_ffn_hidden_size: Optional[int] = _f(None, bound=POSITIVE)
    """Routed-expert width; None means ffn_hidden_size."""
    moe_shared_expert_intermediate_size: Optional[int] = _f(None, bound=POSITIVE)
    """Shared-expert width; None means no shared experts."""
    moe_shared_expert_overlap: bool = _f(False)
    """Overlap the shared experts with the token dispatch."""
    moe_grouped_gemm: bool = _f(False)
    """Grouped-GEMM experts (TEGroupedMLP); moe_act recompute needs them."""
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = _f("allgather")
    """How tokens reach their experts."""
    moe_layer_freq: Union[int, list[int]] = _f(1, bound=POSITIVE, kind="layer-mask")
    """int k: every k-th layer is MoE; a list: 1 = MoE, one entry per layer."""
    moe_expert_capacity_factor: Optional[float] = _f(None)
    """Token-drop capacity per expert; None is dropless."""
    moe_input_jitter_eps: Optional[float] = _f(None)
    """Router input jitter (not allowed inside a CUDA graph)."""
    moe_router_dtype: Optional[str] = _f(None)
    """Router GEMM dtype (fp32 / fp64); None is the activation dtype."""
    moe_layer_recompute: bool = _f(False)
    """Deprecated: becomes selective recompute with 'moe' appended (tc:1264-1266 @ core_v0.16.1)."""
    # MLA
    multi_latent_attention: bool = _f(False)
    """Multi-latent attention (DeepSeek-V2/V3, Moonlight); builds MLATransformerConfig."""
    q_lora_rank: Optional[int] = _f(None, bound=POSITIVE)
    """MLA query down-projection rank; None projects queries directly."""
    kv_lora_rank: int = _f(512, bound=POSITIVE)
    """MLA key/value latent rank."""
    qk_head_dim: int = _f(128, bound=POSITIVE)
    """MLA query/key head dimension without the RoPE part."""
    qk_pos_emb_head_dim: int = _f(64, bound=POSITIVE)
    """MLA RoPE head dimension."""
    v_head_dim: int = _f(128, bound=POSITIVE)
    """MLA value head dimension."""
    # hybrid models
    hybrid_override_pattern: Optional[str] = _f(None, origin=PROVIDER)
    """Bridge's layer pattern: M = Mamba, * = attention, - = MLP, E = MoE, G = GatedDeltaNet."""
    # megatron-core's Literal at every release, joined (transformer_config.py:250 @ core_v0.16.1,
    # :294 @ megatron-core 0.19.2: gated_delta_net, dsa; :301 @ main adds gdn, gdn2); which one a
    # release takes is the rules' call
    experimental_attention_variant: Optional[Literal["gated_delta_net", "dsa", "gdn", "gdn2"]] = _f(None)
    """Linear-attention variants (gdn, gdn2 on main; gated_delta_net on 0.19)."""
    # --- implementation / backends ----------------------------------------------------------
    transformer_impl: Literal["transformer_engine", "local", "inference_optimized"] = _f("transformer_engine")
    """Layer spec family: Transformer Engine modules or megatron-core's local ones."""
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = _f(
        "auto", kind="enum", origin=PROVIDER)
    """megatron-core's AttnBackend; a dump's 'AttnBackend.flash' reads as flash."""
    attention_dropout: float = _f(0.1, bound="fraction")
    """Dropout on attention probabilities (keeps a mask per score when > 0)."""
    hidden_dropout: float = _f(0.1, bound="fraction")
    """Dropout after attention and MLP (keeps a mask per hidden element when > 0)."""
    masked_softmax_fusion: bool = _f(False)
    """Local spec: the fused scale-mask-softmax kernel, where it is eligible."""
    attention_softmax_in_fp32: bool = _f(True)
    """Local spec: the softmax runs (and is kept) in fp32."""
    fused_single_qkv_rope: bool = _f(False)
    """TE: one kernel applies RoPE to the fused QKV buffer."""
    # --- parallelism ------------------------------------------------------------------------
    tensor_model_parallel_size: int = _f(1, bound=POSITIVE)
    """TP."""
    pipeline_model_parallel_size: int = _f(1, bound=POSITIVE)
    """PP."""
    virtual_pipeline_model_parallel_size: Optional[int] = _f(None, bound=POSITIVE)
    """Model chunks per pipeline rank (the interleaved schedule); None is one."""
    context_parallel_size: int = _f(1, bound=POSITIVE)
    """CP: the sequence is split over this many ranks."""
    expert_model_parallel_size: int = _f(1, bound=POSITIVE)
    """EP."""
    expert_tensor_parallel_size: Optional[int] = _f(None, bound=POSITIVE)
    """ETP; None means tensor_model_parallel_size (megatron-core's default)."""
    sequence_parallel: bool = _f(False)
    """SP: residual-stream activations are split over the TP ranks."""
    num_layers_in_first_pipeline_stage: Optional[int] = _f(None)
    """Uneven pipelines: megatron-core itself rejects values <= 0 (a checker finding)."""
    num_layers_in_last_pipeline_stage: Optional[int] = _f(None)
    """Uneven pipelines: layers of the last stage."""
    pipeline_model_parallel_layout: Optional[Union[str, list[list[str]]]] = _f(None)
    """Megatron's layout: a string such as 'Et*3|(tt|)*6mL' (E embedding, t decoder layer,
    m MTP layer, L loss, | between virtual stages) or a list of stages of LayerType names.
    Stage i is rank i % PP's chunk i // PP; the stage count over PP is the VPP size."""
    # --- precision --------------------------------------------------------------------------
    bf16: bool = _f(False)
    """bf16 weights and activations (with neither bf16 nor fp16, TransformerConfig trains in fp32)."""
    fp16: bool = _f(False)
    """fp16 weights and activations."""
    fp8: Optional[Literal["e4m3", "hybrid"]] = _f(None)
    """FP8 format of the linear layers; None is no FP8."""
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise", "custom"] = _f("delayed")
    """FP8 scaling recipe."""
    fp8_param: bool = _f(False)
    """Keep the parameters themselves in FP8."""
    fp4: Optional[Literal["e2m1"]] = _f(None)
    """FP4 format of the linear layers (megatron-core knows e2m1; the recipe is fp4_recipe); None is
    no FP4."""
    activation_func_fp8_input_store: bool = _f(False)
    """SwiGLU keeps its input in FP8."""
    # --- CUDA graphs ------------------------------------------------------------------------
    cuda_graph_impl: str = _f("none", kind="release-name")
    """none, local, transformer_engine (main also full_iteration): checked per release."""
    cuda_graph_scope: Optional[Union[str, list[str]]] = _f(None, kind="release-name")
    """0.16/0.17: what per-layer graphs capture ('full' or a list of CudaGraphScope names); None
    leaves the release's default ('full', the whole layer). 0.18+ deprecate it for
    cuda_graph_modules and migrate it there."""
    cuda_graph_modules: Optional[Union[str, list[str]]] = _f(None, kind="release-name")
    """0.18+: the modules per-layer graphs capture (CudaGraphModule names); None leaves the
    default ('full'). Not a field of 0.16/0.17 (a checker finding there)."""
    # --- offloading -------------------------------------------------------------------------
    cpu_offloading: bool = _f(False)
    """Legacy CPU offloading of whole layers (no recompute, no PP)."""
    cpu_offloading_num_layers: int = _f(0)
    """Layers offloaded by cpu_offloading."""
    fine_grained_activation_offloading: bool = _f(False)
    """Offload the activations of the modules in offload_modules."""
    offload_modules: Optional[list[str]] = _f(None, kind="labels")
    """Modules whose activations fine-grained offloading moves to the host."""
    # --- MoE communication overlap (Bridge: comm_overlap section) ----------------------------
    overlap_moe_expert_parallel_comm: bool = _f(False, section="comm_overlap")
    """EP all-to-all overlapped with compute (the fine-grained 1F1B schedule)."""
    delay_wgrad_compute: bool = _f(False, section="comm_overlap")
    """Delay the weight-gradient GEMMs (needs EP overlap)."""
    # --- recompute --------------------------------------------------------------------------
    recompute_granularity: Optional[str] = _f(None)
    """selective, full or None (checked by the loader: megatron-core's own message has a typo)."""
    recompute_method: Optional[str] = _f(None)
    """uniform, block or None (full recompute)."""
    recompute_num_layers: Optional[int] = _f(None)
    """Full recompute: layers per model chunk (checked by the checker: values < 1 are findings)."""
    recompute_modules: Optional[list[str]] = _f(None, kind="labels")
    """Selective labels; None becomes ["core_attn"] (tc:1193-1194 @ core_v0.16.1)."""
    distribute_saved_activations: bool = _f(False)
    """Full recompute: split each checkpointed input over the TP ranks (no SP)."""
    # --- batch (train section) --------------------------------------------------------------
    micro_batch_size: int = _f(1, section="train", bound=POSITIVE, origin=TRAINING)
    """Samples per micro-batch."""
    global_batch_size: Optional[int] = _f(None, section="train", bound=POSITIVE, origin=TRAINING)
    """None means one micro-batch per data-parallel rank and step."""
    # --- gradients and optimizer state (ddp, optimizer sections) ------------------------------
    use_distributed_optimizer: bool = _f(True, section="ddp", origin=DDP)
    """Shard the optimizer state over the data-parallel ranks."""
    grad_reduce_in_fp32: bool = _f(True, section="ddp", origin=DDP)
    """fp32 main-gradient buffers."""
    use_precision_aware_optimizer: bool = _f(False, section="optimizer", origin=OPTIMIZER)
    """TE FusedAdam holds the state (optimizer/optimizer_config.py:187-206 @ core_v0.16.1)."""
    main_params_dtype: str = _f("fp32", section="optimizer", kind="dtype", origin=OPTIMIZER)
    """Master-weight dtype (precision-aware optimizer)."""
    main_grads_dtype: str = _f("fp32", section="optimizer", kind="dtype", origin=OPTIMIZER)
    """Main-gradient dtype (precision-aware optimizer)."""
    exp_avg_dtype: str = _f("fp32", section="optimizer", kind="dtype", origin=OPTIMIZER)
    """Adam first-moment dtype (precision-aware optimizer)."""
    exp_avg_sq_dtype: str = _f("fp32", section="optimizer", kind="dtype", origin=OPTIMIZER)
    """Adam second-moment dtype (precision-aware optimizer)."""
    store_param_remainders: bool = _f(True, section="optimizer", origin=OPTIMIZER)
    """Keep fp32 master weights as the 16-bit remainders of bf16 parameters."""
    # --- the machine (cluster section, ours) ------------------------------------------------
    num_gpus: Optional[int] = _f(None, section="cluster", bound=POSITIVE, origin=OURS)
    """World size. The loader always sets it (inputs/world.py: from the input, else the smallest
    megatron-core accepts); None, in a Workload built in code, means one data-parallel replica."""
    gpu_memory_gb: float = _f(80.0, section="cluster", bound=POSITIVE, origin=OURS)
    """Per GPU: the marketed size (80 for an 80 GB GPU), read as what PyTorch reports for the one
    GPU of the capacity table with that size (card `gpus:`; 80 -> H100 80GB, 79.11 GiB), else
    as decimal GB. cluster.gpu and cluster.gpu_memory_gib take precedence."""
    gpu: Optional[str] = _f(None, section="cluster", origin=OURS)
    """The GPU model, a name of the card's GPU table (h100-80gb, h200, h20, b200, gb200, b300, gb300,
    a100-80gb, l40s, ...); decides the FP8 / FP4 recipes the checker accepts."""
    gpu_memory_gib: Optional[float] = _f(None, section="cluster", bound=POSITIVE, origin=OURS)
    """Per GPU, GiB as PyTorch reports it (torch.cuda.get_device_properties().total_memory, the
    'total capacity' of an out-of-memory message)."""
    te_version: Optional[str] = _f(None, section="cluster", kind="version", origin=OURS)
    """Transformer Engine on the training nodes, if known (decides the TE-gated rules)."""
    # --- Megatron Bridge's own sections: what ConfigContainer.validate() and the provider check -
    check_for_nan_in_loss: Optional[bool] = _f(None, section="rerun_state_machine", origin=BRIDGE)
    """rerun_state_machine.check_for_nan_in_loss; None when the input does not say (Bridge's
    default is true, which it refuses with full-iteration CUDA graphs)."""
    te_rng_tracker: Optional[bool] = _f(None, section="rng", origin=BRIDGE)
    """rng.te_rng_tracker; Bridge turns model.use_te_rng_tracker on with it (and the reverse)."""
    env_vars: dict = _f({}, section="env_vars", origin=BRIDGE)
    """Bridge 0.6's env_vars: environment defaults the run sets before validating (its recipes put
    NVTE_CPU_OFFLOAD_V1 here); the launch environment itself is not in the config."""
    defaults_source: Literal["mcore", "bridge", "megatron-lm"] = _f("mcore", section="", origin=OURS)
    """Whose defaults the unset fields took: mcore (TransformerConfig's), bridge (a Bridge model
    provider's) or megatron-lm (pretrain_gpt.py's arguments); inputs/defaults.py holds the tables."""
    not_modelled: list[str] = _f([], section="", origin=OURS)
    """`section.field=value` of the input that can change memory and that the memory model does not
    represent (inputs/fields.py); check and plan name them."""
    origins: dict = _f({}, section="", origin=OURS)
    """Field name -> the input that set it (`--set`, the workload file, `--hf-config`, a catalog
    model, ...); a field absent here took `defaults_source`'s default. The plan's first lines
    say where precision and parallelism came from."""
    peft: Optional[dict] = _f(None, section="", origin="Bridge ConfigContainer.peft")
    """A LoRA / DoRA adapter on a frozen base, normalised from a dump's peft: section
    (inputs/peft.py); None is full training of every parameter."""
    num_gpus_from: str = _f("", section="", origin=OURS)
    """Where num_gpus came from: 'cluster.num_gpus', a dump's data-parallel size, a launch line,
    a recipe's name, or 'assumed: ...' (inputs/world.py); '' when the loader did not set it."""
    input_notes: list[str] = _f([], section="", origin=OURS)
    """What the input left open and the loader decided, each of which moves every figure: a world
    size taken as the smallest megatron-core accepts, a vocabulary no input states, a setting
    read but not represented. The plan says them first (inputs/loading.py, inputs/world.py)."""
    extra_model: dict = _f({}, section="", origin=OURS)
    """Model-section keys that are real MCore/Bridge fields but not Workload fields; passed to the
    live validator unchanged, and read by the memory model where noted (memory/shape.py)."""

    # --- derived quantities (never stored, so they cannot disagree) ------------------------
    @property
    def heads_kv(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def etp(self) -> int:
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def model_parallel_size(self) -> int:
        return (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                * self.context_parallel_size)

    @property
    def world_assumed(self) -> bool:
        """The world size is the loader's assumption, not the input's."""
        return self.num_gpus_from.startswith("assumed") or self.num_gpus is None

    @property
    def data_parallel_size(self) -> int:
        if not self.num_gpus:
            return 1
        return max(1, self.num_gpus // self.model_parallel_size)

    @property
    def num_microbatches(self) -> int:
        gbs = self.global_batch_size or self.micro_batch_size * self.data_parallel_size
        return max(1, gbs // (self.micro_batch_size * self.data_parallel_size))

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def is_moe(self) -> bool:
        return bool(self.num_moe_experts)

    @property
    def swiglu(self) -> bool:
        return self.gated_linear_unit and self.activation_func == "silu"

    @property
    def effective_recompute_modules(self) -> list[str]:
        """What MCore ends up with: None becomes ["core_attn"] (tc:1193-1194 @ core_v0.16.1)."""
        return list(self.recompute_modules) if self.recompute_modules is not None else ["core_attn"]

    def layer_kinds(self) -> list[str]:
        """One entry per decoder layer: 'attn+mlp', 'attn+moe', 'mamba', 'mlp', 'moe', 'attn', 'gdn'.

        Hybrid models follow `hybrid_override_pattern`; GPT models follow
        `moe_layer_freq` (int k: layer i is MoE when i % k == 0; list: 1 = MoE),
        as MCore's `get_gpt_decoder_block_spec` reads it.
        """
        if self.hybrid_override_pattern:
            return hybrid_kinds(self.hybrid_override_pattern)
        if not self.is_moe:
            return ["attn+mlp"] * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, list):
            pattern = [bool(x) for x in freq]
        else:
            pattern = [i % int(freq) == 0 for i in range(self.num_layers)]
        return ["attn+moe" if m else "attn+mlp" for m in pattern]

    def model_fields(self) -> dict:
        """The MCore TransformerConfig kwargs this workload stands for (for the live validator)."""
        out = {name: getattr(self, name) for name, f in FIELDS.items()
               if f.metadata["origin"] in (TRANSFORMER_CONFIG, COMM_OVERLAP)}
        out.update(self.extra_model)
        return out

    def replace(self, **changes) -> "Workload":
        return dataclasses.replace(self, **changes)


# The layer symbols of a hybrid pattern the memory model lays out, and the layer kind of each
# (ssm/mamba_hybrid_layer_allocation.py Symbols @ core_v0.17.1); '|' and '/' are separators.
HYBRID_KINDS = {"M": "mamba", "*": "attn", "-": "mlp", "E": "moe", "G": "gdn"}


def hybrid_kinds(pattern: str) -> list:
    """The layer kind of each layer symbol in `pattern`, separators skipped."""
    return [HYBRID_KINDS[c] for c in pattern if c in HYBRID_KINDS]


# the fields an input can set: every one with a section (defaults_source, not_modelled, origins
# and extra_model are bookkeeping the loader fills)
FIELDS = {f.name: f for f in dataclasses.fields(Workload) if f.metadata["section"]}
FIELD_NAMES = frozenset(FIELDS)


def section_fields(section: str) -> frozenset:
    """The Workload fields a workload file holds in `section` (train, ddp, cluster, ...)."""
    return frozenset(n for n, f in FIELDS.items() if f.metadata["section"] == section)
