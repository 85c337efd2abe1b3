"""Plain-data results of the memory model (no logic here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional


@dataclass(frozen=True)
class Knobs:
    """Modelled quantities a Workload does not hold, each with a stated default.

    Every default is also written into `MemoryEstimate.assumptions` as a sentence.
    """
    # CUDA context, NCCL and Transformer Engine workspaces, allocator slack: one constant.
    residual_bytes: int = 3 * 2**29                 # 1.5 GiB
    # tokens reaching the hottest EP rank's experts relative to perfectly balanced routing
    moe_load_imbalance: float = 1.0
    # fp32 norm statistics (rsigma, and mu for LayerNorm); Korthikanti et al. ignore them
    norm_stats: bool = True
    # constant-size tensors (the core_attn checkpoint's int32 attn_mask_type); the paper
    # ignores them too
    tiny_tensors: bool = True
    # attention score FLOPs factor: 0.5 counts only the causal half of QK^T and PV
    attention_flops_factor: float = 0.5
    # one byte of replayed communication costs as much time as this many FLOPs
    comm_flops_per_byte: float = 2000.0
    # one byte moved by a memory-bound (elementwise) replayed kernel costs this many FLOPs
    memory_bound_flops_per_byte: float = 150.0
    # one byte over PCIe (activation offloading, each direction) costs this many FLOPs: about
    # 400 TFLOP/s achieved over 40 GB/s achieved (an estimate, not a measurement)
    pcie_flops_per_byte: float = 1.0e4
    # optimizer bytes per parameter before distributed-optimizer sharding; None = Adam with
    # an fp32 master copy and two fp32 moments (12 with 16-bit weights, 8 with fp32 weights).
    # A precision-aware optimizer with bf16 moments is 8.
    optimizer_bytes_per_param: Optional[float] = None


DEFAULT_KNOBS = Knobs()
# Korthikanti et al. 2022 count only the "main contributors": no fp32 norm statistics.
PAPER_KNOBS = Knobs(norm_stats=False, tiny_tensors=False)


# Static terms the device holds that PyTorch's caching allocator does not count (so they are
# in the device peak, not in the allocated one): the residual knob, the flex dispatcher's
# DeepEP / HybridEP buffers (memory/dispatcher.py).
OUTSIDE_ALLOCATOR = ("residual", "flex_buffers")


@dataclass
class RankMemory:
    pp_rank: int
    static_bytes: int
    activation_bytes: int            # saved activations of the in-flight micro-batches at the worst moment
    transient_bytes: int             # the largest transient at that moment
    peak_term: str                   # which term set the peak
    activations: dict = field(default_factory=dict)   # component -> bytes (sums to activation_bytes)
    static: dict = field(default_factory=dict)        # weights, grads, optimizer, fp8_weight_copies,
    #                                                   global_buffer, dummy_wgrads,
    #                                                   cuda_graph_buffers, flex_buffers, residual
    in_flight_microbatches: float = 0.0               # in units of this rank's whole layer set
    transients: dict = field(default_factory=dict)    # candidate transient -> bytes
    params: int = 0                                   # parameters held by this rank (all chunks)
    layers: int = 0                                   # decoder layers held by this rank (all chunks)
    host_bytes: int = 0               # fine-grained offloading: activations waiting in pinned host
    #                                   memory at the peak moment (not in the GPU peak)
    step_bytes: int = 0                               # optimizer-step temporaries (memory/moments.py)
    lazy_bytes: int = 0                               # optimizer state the first step creates
    graphed_bytes: int = 0                            # part of activation_bytes inside CUDA graphs
    allocated_peak_bytes: int = 0                     # like max_memory_allocated (set by estimate)
    allocated_moment: str = ""                        # the moment that sets it
    first_iteration_allocated_bytes: int = 0          # the same, after iteration 1
    allocated_moments: dict = field(default_factory=dict)   # moment -> allocated bytes
    moe_layers: int = 0                               # MoE layers on this rank (MTP depths included)

    @property
    def peak_bytes(self) -> int:
        """The device peak: what the rank holds at its worst moment, everything included."""
        return self.static_bytes + max(self.activation_bytes + self.transient_bytes, self.step_bytes)

    @property
    def device_peak_bytes(self) -> int:
        return self.peak_bytes

    @property
    def outside_allocator_bytes(self) -> int:
        """Static bytes on the device that PyTorch's allocator does not count."""
        return sum(int(self.static.get(k, 0)) for k in OUTSIDE_ALLOCATOR)

    def as_dict(self) -> dict:
        return {
            "pp_rank": self.pp_rank, "static_bytes": self.static_bytes,
            "activation_bytes": self.activation_bytes, "transient_bytes": self.transient_bytes,
            "step_bytes": self.step_bytes,
            "peak_bytes": self.peak_bytes, "device_peak_bytes": self.device_peak_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "allocated_peak_moment": self.allocated_moment,
            "first_iteration_allocated_bytes": self.first_iteration_allocated_bytes,
            "allocated_moments": dict(self.allocated_moments),
            "outside_allocator_bytes": self.outside_allocator_bytes,
            "graphed_activation_bytes": self.graphed_bytes,
            "peak_term": self.peak_term,
            "activations": dict(self.activations), "static": dict(self.static),
            "transients": dict(self.transients),
            "in_flight_microbatches": self.in_flight_microbatches,
            "params": self.params, "layers": self.layers, "host_bytes": self.host_bytes,
        }


@dataclass
class MemoryEstimate:
    ranks: list                      # list[RankMemory], one per PP rank
    hottest: RankMemory              # the rank with the highest peak
    assumptions: list                # plain sentences
    per_layer: dict                  # layer kind -> {tensor name -> bytes per micro-batch, "total": ...}

    def as_dict(self) -> dict:
        return {"ranks": [r.as_dict() for r in self.ranks], "hottest_pp_rank": self.hottest.pp_rank,
                "assumptions": list(self.assumptions), "per_layer": self.per_layer}


class Saved(NamedTuple):
    """One tensor a layer keeps for backward: what it is, its component, its bytes."""
    name: str
    component: str
    nbytes: float


class RankParams(NamedTuple):
    dense: float       # parameters on this rank sharded by the distributed optimizer over DP x CP
    expert: float      # routed-expert parameters on this rank (expert-DP sharding)
    linear: float      # GEMM weights of decoder layers on this rank (low-precision copies)
    embedding: float   # input embedding (+ learned positions) on this rank
    output: float      # output layer + final norm on this rank

    @property
    def total(self) -> float:
        return self.dense + self.expert
