"""The one `Workload` type every tool reasons about.

Field names are Megatron-Core `TransformerConfig` / Megatron Bridge names, so a
Bridge config dump loads as-is and findings speak the user's vocabulary.
Defaults are megatron-core 0.16.1's `TransformerConfig` defaults (attention and
hidden dropout 0.1, `cuda_graph_impl="none"`, `fp8_recipe="delayed"`, ...):
the live validator must see exactly what megatron-core would see.

`loading.py` builds a Workload from files and overrides and validates it once;
everything after that trusts it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

# Sections of a workload file that hold Workload fields, and ours for what a
# Bridge config does not hold. The value maps section key -> Workload field.
TRAIN_KEYS = {"micro_batch_size": "micro_batch_size", "global_batch_size": "global_batch_size"}
DDP_KEYS = {"use_distributed_optimizer": "use_distributed_optimizer",
            "grad_reduce_in_fp32": "grad_reduce_in_fp32"}
# Bridge/MCore OptimizerConfig fields that change optimizer-state bytes
# (optimizer/optimizer_config.py:187-206 @ core_v0.16.1); dtypes are normalised names
# (fp32, bf16, fp16, fp8) by loading.py.
OPTIMIZER_KEYS = {"use_precision_aware_optimizer": "use_precision_aware_optimizer",
                  "main_params_dtype": "main_params_dtype", "main_grads_dtype": "main_grads_dtype",
                  "exp_avg_dtype": "exp_avg_dtype", "exp_avg_sq_dtype": "exp_avg_sq_dtype",
                  "store_param_remainders": "store_param_remainders"}
COMM_OVERLAP_KEYS = {"overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
                     "delay_wgrad_compute": "delay_wgrad_compute"}
CLUSTER_KEYS = {"num_gpus": "num_gpus", "gpu_memory_gb": "gpu_memory_gb",
                "te_version": "te_version"}


@dataclass
class Workload:
    # --- architecture ---------------------------------------------------
    num_layers: int = 2
    hidden_size: int = 1024
    num_attention_heads: int = 16
    num_query_groups: Optional[int] = None          # None -> num_attention_heads (MHA)
    kv_channels: Optional[int] = None               # None -> hidden_size // num_attention_heads
    ffn_hidden_size: Optional[int] = None           # None -> 4 * hidden_size
    gated_linear_unit: bool = False
    activation_func: str = "gelu"                   # last dotted name: gelu, silu, squared_relu, ...
    normalization: str = "LayerNorm"
    qk_layernorm: bool = False
    add_bias_linear: bool = True
    seq_length: int = 4096
    vocab_size: Optional[int] = None
    share_embeddings_and_output_weights: bool = True
    position_embedding_type: str = "rope"
    mtp_num_layers: Optional[int] = None
    # MoE
    num_moe_experts: Optional[int] = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: Optional[int] = None
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_shared_expert_overlap: bool = False
    moe_grouped_gemm: bool = False
    moe_token_dispatcher_type: str = "allgather"
    moe_layer_freq: Union[int, list] = 1            # int k: every k-th layer is MoE; list: 1 = MoE
    moe_expert_capacity_factor: Optional[float] = None
    moe_input_jitter_eps: Optional[float] = None
    moe_router_dtype: Optional[str] = None
    moe_layer_recompute: bool = False
    # MLA
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # hybrid models: Bridge's pattern string (M = Mamba, * = attention, - = MLP, E = MoE)
    hybrid_override_pattern: Optional[str] = None
    experimental_attention_variant: Optional[str] = None
    # --- implementation / backends -------------------------------------
    transformer_impl: str = "transformer_engine"
    attention_backend: str = "auto"
    attention_dropout: float = 0.1
    hidden_dropout: float = 0.1
    masked_softmax_fusion: bool = False
    attention_softmax_in_fp32: bool = True
    fused_single_qkv_rope: bool = False
    # --- parallelism -----------------------------------------------------
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None   # None -> TP (MCore's default)
    sequence_parallel: bool = False
    num_layers_in_first_pipeline_stage: Optional[int] = None
    num_layers_in_last_pipeline_stage: Optional[int] = None
    # --- precision -----------------------------------------------------
    bf16: bool = False
    fp16: bool = False
    fp8: Optional[str] = None                       # e4m3 / hybrid
    fp8_recipe: str = "delayed"                     # delayed / tensorwise / mxfp8 / blockwise / custom
    fp8_param: bool = False
    fp4: Optional[str] = None
    activation_func_fp8_input_store: bool = False
    # --- CUDA graphs ---------------------------------------------------
    cuda_graph_impl: str = "none"                   # none / local / transformer_engine
    cuda_graph_scope: Union[str, list] = "full"     # "full" == whole layer; list of scopes
    # --- offloading ----------------------------------------------------
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    fine_grained_activation_offloading: bool = False
    offload_modules: Optional[list] = None
    # --- MoE communication overlap (Bridge: comm_overlap section) -------
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    # --- recompute -----------------------------------------------------
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: Optional[int] = None
    recompute_modules: Optional[list] = None        # None -> ["core_attn"] (MCore default)
    distribute_saved_activations: bool = False
    # --- batch, optimizer, cluster (train / ddp / cluster sections) ----
    micro_batch_size: int = 1
    global_batch_size: Optional[int] = None
    use_distributed_optimizer: bool = True
    grad_reduce_in_fp32: bool = True
    # optimizer section (MCore OptimizerConfig defaults: fp32 Adam state, remainders on)
    use_precision_aware_optimizer: bool = False
    main_params_dtype: str = "fp32"
    main_grads_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    store_param_remainders: bool = True
    num_gpus: Optional[int] = None                  # None -> one data-parallel replica
    gpu_memory_gb: float = 80.0                     # per GPU, decimal GB as nvidia-smi and Bridge print
    te_version: Optional[str] = None                # Transformer Engine on the training nodes, if known
    # model-section keys that are real MCore/Bridge fields but not modelled here;
    # passed to the live validator unchanged.
    extra_model: dict = field(default_factory=dict)

    # --- derived quantities (never stored, so they cannot disagree) ----
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
        """One entry per decoder layer: 'attn+mlp', 'attn+moe', 'mamba', 'mlp', 'moe', 'attn'.

        Hybrid models follow `hybrid_override_pattern`; GPT models follow
        `moe_layer_freq` (int k: layer i is MoE when i % k == 0; list: 1 = MoE),
        as MCore's `get_gpt_decoder_block_spec` reads it.
        """
        if self.hybrid_override_pattern:
            names = {"M": "mamba", "*": "attn", "-": "mlp", "E": "moe", "G": "gdn"}
            return [names.get(c, "mamba") for c in self.hybrid_override_pattern if c in names]
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
        non_model = set(TRAIN_KEYS.values()) | set(DDP_KEYS.values()) | set(CLUSTER_KEYS.values())
        non_model |= set(OPTIMIZER_KEYS.values())
        non_model |= {"extra_model", "seq_length", "vocab_size", "share_embeddings_and_output_weights",
                      "position_embedding_type", "hybrid_override_pattern", "attention_backend"}
        out = {}
        for f in dataclasses.fields(self):
            if f.name in non_model:
                continue
            out[f.name] = getattr(self, f.name)
        out.update(self.extra_model)
        return out

    def replace(self, **changes) -> "Workload":
        return dataclasses.replace(self, **changes)


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Workload)) - {"extra_model"}
