"""The built-in rule table: every recompute constraint as a pure function of a Workload.

No torch, no megatron: this is what `check --validator builtin` runs, and what
the live validator adds for everything `TransformerConfig` cannot see
(training arguments, runtime-only failures, silent no-ops).

Each rule is registered under a card id; the card holds its message, severity,
exception, fix, the releases it holds for and, per release, where it sits
(`at`). A rule runs only for a release the card says it holds for, and reads
what differs between releases from the card (`params`, `enums`), never from a
version comparison here. `__post_init__` stops at the first failing check, so
when several config rules fail, the one earliest in that release's
`__post_init__` (`card.order_in`) is the one megatron-core raises;
`Evaluation.first_error` names it.

Transformer Engine. Three checks call `is_te_min_version` (tc:1248, 1601, 1607
@ core_v0.16.1). With a known TE version they decide like megatron-core on the
training nodes. With the version unknown they are reported as warnings (the
intended rule). With `assume_te_absent=True` -- used to predict what the
installed megatron-core raises on a machine without TE -- they fail the way
that release does there: 0.16 raises `TypeError` ('>=' between None and
Version); later releases report version 0.0.0 and raise the intended ValueError
(card `releases.<key>.te_version_without_te`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from mbridge_recompute.facts import card, releases
from mbridge_recompute.layer_spec import separate_norms
from mbridge_recompute.memory.graphs import capture as _capture
from mbridge_recompute.memory.graphs import scope_names as _names
from mbridge_recompute.placement import place
from mbridge_recompute.rules.findings import finding, report
from mbridge_recompute.workload import TE_ABSENT  # what te_version says when TE is absent

# Modules fine-grained offloading may move inside a MoE layer (tc:1874-1884 @ core_v0.19.0).
MOE_INTERNALS = ("moe_act", "expert_fc1", "fused_group_mlp")


@dataclass
class Hit:
    detail: str
    severity: Optional[str] = None     # override the card's severity
    raises: Optional[str] = None       # override the card's exception type
    # what a silent no-op switches off, as (label, block) pairs: block "all" is the whole label,
    # "moe" / "attn" / "mlp" one block's use of it; ("full", "all") is full recompute itself.
    # The memory model and the planner price the setting without them (one effective setting).
    disables: tuple = ()
    upstream: Optional[str] = None     # megatron-core's message with its f-string parts filled in
    fix: Optional[str] = None          # a fix for this very case, in place of the card's general one


def _python_set(items) -> str:
    """A set as megatron-core's f-strings print it, sorted (upstream's set order varies by run)."""
    return "{" + ", ".join(map(repr, sorted(items))) + "}"


@dataclass(frozen=True)
class Rule:
    id: str
    fn: Callable[["State"], Optional[Hit]]


RULES: list[Rule] = []


def rule(cid: str):
    def register(fn):
        RULES.append(Rule(cid, fn))
        return fn
    return register


def rule_ids() -> set[str]:
    return {r.id for r in RULES}


# ------------------------------------------------------------------ state
class State:
    """The workload as `__post_init__` of release `version` sees it, plus derived facts the rules share."""

    def __init__(self, w, release: releases.Release, te_version: Optional[str], assume_te_absent: bool):
        self.w = w
        self.version = release.key          # the card key the rules look facts up by
        self.assume_te_absent = assume_te_absent
        te = te_version if te_version is not None else w.te_version
        self.te_raw = te
        self.te_absent = assume_te_absent or (te is not None and str(te).strip().lower() in TE_ABSENT)
        self.te = None if self.te_absent or te is None else _parse_version(str(te))
        self.after_override = False
        self.extra = dict(w.extra_model or {})
        self.has_modules_field = bool(releases.enum("cuda_graph_modules", release))
        self.impl, self.scopes, self.migrated_full_iteration = _capture(w, self.has_modules_field)
        self.placement = place(w, release)
        # a layout with several virtual stages per rank sets virtual_pipeline_model_parallel_size
        # before the later checks read it (tc:1339-1352 @ core_v0.16.1)
        self.vpp = w.virtual_pipeline_model_parallel_size
        if self.vpp is None and w.pipeline_model_parallel_layout is not None and self.placement.ok \
                and len(self.placement.chunks[0]) > 1:
            self.vpp = len(self.placement.chunks[0])

    def params(self, cid: str) -> dict:
        return card.constraint_at(cid, self.version)["params"]

    def chunk_sizes(self) -> list[int]:
        """Distinct layer counts of the model chunks (empty when the split is rejected)."""
        return self.placement.distinct_chunk_sizes

    # recompute fields, before / after the moe_layer_recompute override
    @property
    def g(self) -> Optional[str]:
        if self.after_override and self.w.moe_layer_recompute and self.w.recompute_granularity != "full":
            return "selective"
        return self.w.recompute_granularity

    @property
    def mods(self) -> list:
        mods = self.w.recompute_modules
        mods = ["core_attn"] if mods is None else (list(mods) if not isinstance(mods, str) else mods)
        if self.after_override and self.w.moe_layer_recompute and self.w.recompute_granularity != "full":
            if "moe" not in mods:
                mods = list(mods) + ["moe"]
        return mods

    def selective(self, *labels: str) -> list[str]:
        """The given labels that are active (selective granularity and listed)."""
        if self.g != "selective":
            return []
        return [lb for lb in labels if lb in self.mods]

    @property
    def graphs(self) -> bool:
        return self.impl not in (None, "none")

    @property
    def per_layer_graphs(self) -> bool:
        """Per-layer capture (local or TE), where scopes name what is captured."""
        return self.impl in ("local", "transformer_engine")

    @property
    def full_iteration(self) -> bool:
        """Full-iteration capture: impl full_iteration (0.18+) or a [full_iteration] scope (0.16/0.17)."""
        return self.impl == "full_iteration" or "full_iteration" in self.scopes

    @property
    def full_cudagraph(self) -> bool:
        # whole-layer (empty scope) or full-iteration capture (tc:1798-1804 @ core_v0.16.1,
        # tc:2317-2320 @ core_v0.18.2)
        return not self.scopes or self.full_iteration

    @property
    def moe_layers(self) -> int:
        return sum("moe" in k for k in self.w.layer_kinds())

    @property
    def dense_layers(self) -> int:
        return sum(k in ("attn+mlp", "mlp") for k in self.w.layer_kinds())

    @property
    def has_shared_experts(self) -> bool:
        return self.w.moe_shared_expert_intermediate_size is not None

    def te_min(self, minimum: str) -> Optional[bool]:
        """True/False when the TE version is known (or assumed absent), None when unknown."""
        if self.te_absent:
            return False
        if self.te is None:
            return None
        return self.te >= _parse_version(minimum)

    def te_shown(self) -> str:
        """What megatron-core prints as 'your version' (0.17+: 0.0.0 without TE)."""
        if self.te_absent:
            return str(releases.meta(self.version)["te_version_without_te"])
        return str(self.te_raw)


def _parse_version(text: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def _fmt(labels) -> str:
    return ", ".join(labels)


# ================================================================== config rules
# In the order of megatron-core 0.16.1 __post_init__ (ModelParallelConfig first).

@rule("sp-needs-tp")
def _sp_needs_tp(s: State):
    if s.w.sequence_parallel and s.w.tensor_model_parallel_size <= 1:
        return Hit("sequence_parallel=true with tensor_model_parallel_size=1")


@rule("ep-tp-without-sp")
def _ep_tp_without_sp(s: State):
    w = s.w
    if w.expert_model_parallel_size > 1 and w.tensor_model_parallel_size > 1 and not w.sequence_parallel:
        return Hit(f"EP={w.expert_model_parallel_size} and TP={w.tensor_model_parallel_size} "
                   "without sequence_parallel")


@rule("shared-expert-overlap-needs-alltoall")
def _shared_overlap_dispatcher(s: State):
    w = s.w
    ok = s.params("shared-expert-overlap-needs-alltoall")["dispatchers"]
    if s.has_shared_experts and w.moe_shared_expert_overlap and w.moe_token_dispatcher_type not in ok:
        return Hit(f"moe_shared_expert_overlap with the {w.moe_token_dispatcher_type} dispatcher")


@rule("cpu-offloading-layer-count")
def _cpu_off_layers(s: State):
    w = s.w
    if w.cpu_offloading and not 0 <= w.cpu_offloading_num_layers < w.num_layers:
        return Hit(f"cpu_offloading_num_layers={w.cpu_offloading_num_layers} is not below "
                   f"num_layers={w.num_layers}")


@rule("cpu-offloading-with-pp")
def _cpu_off_pp(s: State):
    if s.w.cpu_offloading and s.w.pipeline_model_parallel_size > 1:
        return Hit(f"cpu_offloading with pipeline_model_parallel_size={s.w.pipeline_model_parallel_size}")


@rule("cpu-offloading-with-recompute")
def _cpu_off_recompute(s: State):
    if s.w.cpu_offloading and s.w.recompute_granularity is not None:
        return Hit(f"cpu_offloading with recompute_granularity={s.w.recompute_granularity}")


@rule("granularity-invalid")
def _granularity_invalid(s: State):
    g = s.w.recompute_granularity
    if g is not None and g not in ("full", "selective"):
        return Hit(f"recompute_granularity={g!r}")


@rule("method-invalid")
def _method_invalid(s: State):
    w = s.w
    if w.recompute_granularity is not None and w.recompute_method is not None \
            and w.recompute_method not in ("block", "uniform"):
        return Hit(f"recompute_method={w.recompute_method!r}")


@rule("full-needs-method")
def _full_needs_method(s: State):
    w = s.w
    if w.recompute_granularity not in (None, "selective") and w.recompute_method is None:
        return Hit(f"recompute_granularity={w.recompute_granularity} without recompute_method")


@rule("full-needs-num-layers")
def _full_needs_num_layers(s: State):
    w = s.w
    if w.recompute_granularity not in (None, "selective") and w.recompute_num_layers is None:
        return Hit(f"recompute_granularity={w.recompute_granularity} without recompute_num_layers")


@rule("selective-with-num-layers")
def _selective_num_layers(s: State):
    w = s.w
    if w.recompute_granularity == "selective" and w.recompute_num_layers is not None:
        return Hit(f"selective recompute with recompute_num_layers={w.recompute_num_layers}")


@rule("distribute-saved-activations-with-sp")
def _distribute_sp(s: State):
    w = s.w
    if w.recompute_granularity is not None and w.distribute_saved_activations and w.sequence_parallel:
        return Hit("distribute_saved_activations with sequence_parallel")


@rule("modules-invalid-label")
def _invalid_label(s: State):
    if s.g != "selective" or len(s.mods) == 0:
        return None
    allowed = releases.labels_for(s.version)
    bad = sorted(set(s.mods) - set(allowed))
    if bad:
        extra = " (a string is iterated character by character)" if isinstance(s.mods, str) else ""
        # tc:1208-1211 @ core_v0.16.1 formats the invalid, then the allowed labels as sets
        upstream = card.constraint_at("modules-invalid-label", s.version)["message"].format(
            invalid_modules=_python_set(bad), allowed_modules=_python_set(allowed))
        return Hit(f"unknown label(s) {_fmt(bad)} for megatron-core {s.version}{extra}; "
                   f"valid: {_fmt(allowed)}", upstream=upstream)


@rule("moe-act-needs-grouped-gemm")
def _moe_act_grouped(s: State):
    if s.selective("moe_act") and not s.w.moe_grouped_gemm:
        return Hit("moe_act with moe_grouped_gemm=false")


@rule("mla-up-proj-needs-mla")
def _mla_up_proj(s: State):
    if s.selective("mla_up_proj") and not s.w.multi_latent_attention:
        return Hit("mla_up_proj on a model without multi_latent_attention")


@rule("gdn-norm-out-needs-gdn")
def _gdn_norm_out(s: State):
    variants = s.params("gdn-norm-out-needs-gdn")["variants"]
    if s.selective("gdn_norm_out") and s.w.experimental_attention_variant not in variants:
        return Hit(f"gdn_norm_out with experimental_attention_variant="
                   f"{s.w.experimental_attention_variant!r} (this release needs {' or '.join(variants)})")


@rule("core-attn-fused-attention")
def _core_attn_warning(s: State):
    if not s.selective("core_attn"):
        return None
    default = " (the default when recompute_modules is null)" if s.w.recompute_modules is None else ""
    if s.w.transformer_impl == "local":
        return Hit(f"core_attn{default} with transformer_impl=local: unfused attention, so it drops the "
                   "a*s^2 softmax probabilities - a real saving here", severity="info")
    return Hit(f"core_attn{default} under Transformer Engine fused attention saves nothing and may add "
               "memory: its checkpoint keeps v as a view that pins the fused QKV GEMM output "
               "(code reading)")


@rule("shared-experts-with-shared-expert-overlap")
def _shared_experts_overlap(s: State):
    if s.selective("shared_experts") and s.has_shared_experts and s.w.moe_shared_expert_overlap:
        return Hit("shared_experts with moe_shared_expert_overlap")


@rule("fp8-delayed-moe-act-layernorm")
def _fp8_delayed(s: State):
    hit = s.selective("moe_act", "layernorm")
    if s.w.fp8 and hit and s.w.fp8_recipe == "delayed":
        return Hit(f"{_fmt(hit)} with fp8 and fp8_recipe=delayed")


@rule("fp8-moe-act-layernorm-needs-te-2-6")
def _fp8_te26(s: State):
    hit = s.selective("moe_act", "layernorm")
    if not (s.w.fp8 and hit and s.w.fp8_recipe != "delayed"):
        return None
    return _te_gate(s, "2.6.0dev0", f"{_fmt(hit)} with fp8 recipe {s.w.fp8_recipe}")


def _te_gate(s: State, minimum: str, what: str) -> Optional[Hit]:
    ok = s.te_min(minimum)
    if ok:
        return None
    if ok is None:
        return Hit(f"{what} needs Transformer Engine >= {minimum}; the TE version on the training "
                   "nodes is unknown (set cluster.te_version)", severity="warning")
    if s.te_absent and releases.meta(s.version)["te_version_without_te"] is None:
        return Hit(f"{what}: Transformer Engine is not installed, and megatron-core {s.version} then raises "
                   "TypeError ('>=' not supported between 'NoneType' and 'Version') instead of the "
                   f"intended check (needs TE >= {minimum})", raises="TypeError")
    return Hit(f"{what} needs Transformer Engine >= {minimum}, have {s.te_shown()}")


@rule("mhc-needs-mhc-connections")
def _mhc_needs(s: State):
    # the field exists on main only, so it arrives via extra_model
    if s.selective("mhc") and not s.extra.get("enable_mhc_connections", False):
        return Hit("mhc without enable_mhc_connections")


@rule("mhc-with-mlp")
def _mhc_mlp(s: State):
    if s.selective("mhc") and s.selective("mlp") and s.extra.get("enable_mhc_connections", False):
        return Hit("mhc together with mlp")


@rule("mhc-recompute-layer-num-positive")
def _mhc_layer_num(s: State):
    n = s.extra.get("mhc_recompute_layer_num")
    if s.selective("mhc") and n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        return Hit(f"mhc recompute with mhc_recompute_layer_num={n!r}")


@rule("mhc-with-fine-grained-offloading")
def _mhc_offload(s: State):
    if s.selective("mhc") and s.w.fine_grained_activation_offloading:
        return Hit("mhc recompute with fine-grained activation offloading")


@rule("mhc-with-full-recompute")
def _mhc_full(s: State):
    if s.extra.get("enable_mhc_connections") and s.g == "full":
        return Hit("hyper-connections with full recompute")


@rule("moe-layer-recompute-deprecated")
def _moe_layer_recompute_deprecated(s: State):
    if not s.w.moe_layer_recompute:
        return None
    if s.w.recompute_granularity == "full":
        return Hit("moe_layer_recompute=true (deprecated)")
    before = s.w.recompute_modules
    mods = ["core_attn"] if before is None else list(before)
    after = mods + ([] if "moe" in mods else ["moe"])
    return Hit(f"moe_layer_recompute=true silently becomes selective recompute of [{_fmt(after)}]"
               + (" - core_attn included, from the default" if before is None else ""))


@rule("moe-layer-recompute-with-full")
def _moe_layer_recompute_full(s: State):
    if s.w.moe_layer_recompute and s.w.recompute_granularity == "full":
        return Hit("moe_layer_recompute with full recompute")


# The pipeline split: placement.py decides it (the one home of layer placement); these rules
# report what it rejects, each where the card puts it in its release.
PLACEMENT_RULES = (
    "uneven-pp-with-pipeline-split-accounting", "uneven-first-stage-not-positive",
    "uneven-first-stage-not-divisible-by-vpp", "uneven-last-stage-not-positive",
    "uneven-last-stage-not-divisible-by-vpp", "uneven-middle-mismatch", "uneven-middle-not-divisible",
    "uneven-middle-not-divisible-by-vpp", "pipeline-split-accounting-not-divisible",
    "pipeline-split-accounting-not-divisible-with-vpp", "pipeline-split-accounting-not-divisible-by-vpp",
    "pp-does-not-divide-layers", "vpp-does-not-divide-stage-layers",
    "pipeline-split-accounting-leaves-no-first-layers", "pipeline-split-accounting-leaves-no-last-layers",
    "hybrid-no-interleaving", "hybrid-pp-drops-layers",
    "hybrid-pipes-with-uneven-stages", "hybrid-vpp-needs-pipes", "hybrid-uneven-middle-not-divisible",
    "hybrid-pp-does-not-divide-layers", "hybrid-segments-not-divisible-by-pp",
    "hybrid-segment-out-of-range", "hybrid-segments-beyond-vpp",
    "layout-with-other-pipeline-arguments", "layout-invalid-layer-character",
    "layout-stages-not-divisible-by-pp", "layout-invalid-layer-name", "layout-vpp-conflict",
    "layout-first-not-embedding", "layout-last-not-loss", "layout-embedding-not-once",
    "layout-loss-not-once", "layout-decoder-count", "layout-mtp-count", "layout-decoder-after-mtp",
    "layout-mtp-not-in-last-virtual-stage", "layout-mtp-split", "layout-encoder-not-supported")


def _placement_rule(cid: str):
    def check(s: State) -> Optional[Hit]:
        for problem in s.placement.problems:
            if problem.cid == cid:
                return Hit(problem.detail)
        return None
    RULES.append(Rule(cid, check))


for _cid in PLACEMENT_RULES:
    _placement_rule(_cid)


@rule("fine-grained-offloading-with-cpu-offloading")
def _fg_cpu(s: State):
    if s.w.fine_grained_activation_offloading and s.w.cpu_offloading:
        return Hit("fine_grained_activation_offloading with cpu_offloading")


@rule("fine-grained-offloading-needs-modules")
def _fg_empty(s: State):
    if s.w.fine_grained_activation_offloading and not s.w.offload_modules:
        return Hit("fine_grained_activation_offloading with an empty offload_modules")


@rule("offload-modules-invalid")
def _fg_invalid(s: State):
    if s.w.fine_grained_activation_offloading and s.w.offload_modules:
        allowed = releases.enum("offload_modules", s.version)
        bad = sorted(set(s.w.offload_modules) - set(allowed))
        if bad:
            upstream = card.constraint_at("offload-modules-invalid", s.version)["message"].format(
                invalid_modules=_python_set(bad), allowed_modules=_python_set(allowed))
            return Hit(f"unknown offload_modules {_fmt(bad)}; valid: {_fmt(allowed)}", upstream=upstream)


@rule("offload-attn-proj-without-core-attn")
def _fg_attn_proj(s: State):
    mods = s.w.offload_modules or []
    if s.w.fine_grained_activation_offloading and "attn_proj" in mods and "core_attn" not in mods:
        return Hit("offload_modules has attn_proj without core_attn")


@rule("gdp-qkv-offload-with-gdp-in-proj")
def _gdp_offload(s: State):
    if s.w.fine_grained_activation_offloading and "gdp_qkv" in (s.w.offload_modules or []) \
            and s.selective("gdp_in_proj"):
        return Hit("gdp_qkv offloaded while gdp_in_proj is recomputed")


@rule("moe-recompute-with-offloaded-moe-internals")
def _moe_offload_main(s: State):
    mods = set(s.w.offload_modules or [])
    hit = sorted(mods & {"moe_act", "expert_fc1", "fused_group_mlp"})
    if s.w.fine_grained_activation_offloading and s.selective("moe") and hit:
        return Hit(f"moe recompute while offloading {_fmt(hit)}")


@rule("fused-group-mlp-offload-needs-op-fuser")
def _fused_group_mlp_fuser(s: State):
    if s.w.fine_grained_activation_offloading and "fused_group_mlp" in (s.w.offload_modules or []) \
            and not s.extra.get("use_transformer_engine_op_fuser"):
        return Hit("fused_group_mlp offloaded without use_transformer_engine_op_fuser")


@rule("fused-group-mlp-offload-with-partial-moe-offload")
def _fused_group_mlp_partial(s: State):
    mods = set(s.w.offload_modules or [])
    partial = mods & {"expert_fc1", "moe_act"}
    if s.w.fine_grained_activation_offloading and "fused_group_mlp" in mods and partial:
        return Hit(f"fused_group_mlp offloaded with {_fmt(sorted(mods & {'expert_fc1', 'moe_act'}))}")


@rule("fp8-input-store-needs-swiglu")
def _fp8_input_store(s: State):
    if s.w.activation_func_fp8_input_store and not s.w.swiglu:
        return Hit("activation_func_fp8_input_store without SwiGLU")


@rule("moe-fp8-needs-te-1-7")
def _moe_fp8_te17(s: State):
    if s.w.is_moe and s.w.fp8:
        return _te_gate(s, "1.7.0.dev0", "MoE FP8 training")


@rule("moe-fp8-grouped-gemm-needs-te-1-11")
def _moe_fp8_te111(s: State):
    if s.w.is_moe and s.w.fp8 and s.w.moe_grouped_gemm:
        # only reached when the TE >= 1.7 check passed, which implies a known version
        if s.te_min("1.7.0.dev0"):
            return _te_gate(s, "1.11.0", "FP8 grouped GEMM")


@rule("cuda-graph-full-scope-deprecated")
def _full_scope(s: State):
    given = s.w.cuda_graph_scope
    if s.has_modules_field and given is None:
        given = s.w.cuda_graph_modules
    named_full = "full" in _names(given if given is not None else "full")
    if s.graphs and named_full:
        return Hit(f"cuda_graph_impl={s.w.cuda_graph_impl} with the capture scope 'full' (whole layer)")


@rule("cuda-graph-impl-invalid")
def _graph_impl(s: State):
    if s.graphs and s.impl not in releases.enum("cuda_graph_impl", s.version):
        return Hit(f"cuda_graph_impl={s.impl!r} is not known to megatron-core {s.version}")


@rule("cuda-graph-with-cpu-offloading")
def _graph_cpu_off(s: State):
    exempt = s.params("cuda-graph-with-cpu-offloading").get("exempt", [])
    if s.graphs and s.w.cpu_offloading and s.impl not in exempt:
        return Hit(f"cuda_graph_impl={s.impl} with cpu_offloading")


@rule("te-graph-full-iteration-scope")
def _te_full_iteration(s: State):
    given = s.w.cuda_graph_scope if s.w.cuda_graph_scope is not None else s.w.cuda_graph_modules
    if s.w.cuda_graph_impl == "transformer_engine" and "full_iteration" in _names(given):
        return Hit("cuda_graph_impl=transformer_engine with a full_iteration capture scope")


@rule("cuda-graph-scope-moe-needs-moe")
def _scope_moe_dense(s: State):
    hit = [x for x in ("moe", "moe_router") if x in s.scopes]
    if s.per_layer_graphs and hit and (not s.w.num_moe_experts or s.w.num_moe_experts <= 1):
        return Hit(f"cuda_graph_scope {_fmt(hit)} on a model without MoE")


@rule("cuda-graph-scope-mlp-needs-dense")
def _scope_mlp_moe(s: State):
    w = s.w
    if not (s.per_layer_graphs and w.num_moe_experts and w.num_moe_experts > 1 and "mlp" in s.scopes):
        return None
    all_moe = w.moe_layer_freq == 1 or (isinstance(w.moe_layer_freq, list) and 0 not in w.moe_layer_freq)
    if all_moe:
        return Hit("cuda_graph_scope mlp on a model whose layers are all MoE")


@rule("cuda-graph-scope-moe-needs-drop-padding")
def _scope_moe_padding(s: State):
    w = s.w
    if not (s.per_layer_graphs and w.num_moe_experts and w.num_moe_experts > 1 and "moe" in s.scopes):
        return None
    cf = w.moe_expert_capacity_factor
    cf = None if cf is not None and cf < 0 else cf
    if cf is None or not s.extra.get("moe_pad_expert_input_to_capacity", False):
        return Hit("cuda_graph_scope moe without drop-and-pad MoE")


@rule("cuda-graph-scope-and-modules")
def _scope_and_modules(s: State):
    if s.w.cuda_graph_scope is not None and _names(s.w.cuda_graph_modules) not in ([], ["full"]):
        return Hit("cuda_graph_scope and cuda_graph_modules both set")


@rule("cuda-graph-scope-deprecated")
def _scope_deprecated(s: State):
    if s.w.cuda_graph_scope is None:
        return None
    extra = ""
    if s.migrated_full_iteration and s.w.cuda_graph_impl in ("none", None):
        extra = "; its full_iteration entry turns full-iteration CUDA graphs ON although cuda_graph_impl=none"
    elif s.migrated_full_iteration:
        extra = "; its full_iteration entry becomes cuda_graph_impl=full_iteration"
    return Hit(f"cuda_graph_scope={s.w.cuda_graph_scope!r} is copied to cuda_graph_modules{extra}")


@rule("cuda-graph-modules-not-in-release")
def _modules_not_here(s: State):
    if s.w.cuda_graph_modules is not None:
        return Hit(f"cuda_graph_modules={s.w.cuda_graph_modules!r} on megatron-core {s.version}, which "
                   "names the capture scope cuda_graph_scope")


@rule("full-iteration-graph-with-modules")
def _full_iteration_modules(s: State):
    if s.impl == "full_iteration" and s.scopes:
        return Hit(f"cuda_graph_impl=full_iteration with capture modules {_fmt(s.scopes)}")


@rule("cuda-graph-scope-moe-and-moe-router")
def _scope_moe_router(s: State):
    if s.per_layer_graphs and "moe" in s.scopes and "moe_router" in s.scopes:
        return Hit("the capture scope names both moe and moe_router")


@rule("cuda-graph-moe-preprocess-needs-moe-router")
def _scope_preprocess(s: State):
    if s.per_layer_graphs and "moe_preprocess" in s.scopes and "moe_router" not in s.scopes:
        return Hit("the capture scope names moe_preprocess without moe_router")


@rule("full-recompute-needs-full-iteration-graph")
def _full_graph(s: State):
    only_full_iteration = s.scopes == ["full_iteration"] or s.impl == "full_iteration"
    if s.graphs and s.g is not None and s.g != "selective" and not only_full_iteration:
        where = f"scope {_fmt(s.scopes)}" if s.scopes else "whole-layer graphs"
        return Hit(f"full recompute with cuda_graph_impl={s.impl} and {where}")


@rule("moe-recompute-with-te-moe-router-graph")
def _moe_te_router(s: State):
    if s.graphs and s.impl == "transformer_engine" and s.selective("moe") \
            and "moe_router" in s.scopes:
        return Hit("moe recompute would straddle the moe_router graph (transformer_engine graphs)")


@rule("attention-dropout-with-graphed-core-attn")
def _attn_dropout(s: State):
    if s.graphs and s.w.attention_dropout != 0.0 and s.selective("core_attn") and \
            (s.full_cudagraph or "attn" in s.scopes):
        return Hit(f"core_attn with attention_dropout={s.w.attention_dropout} inside a CUDA graph")


@rule("hidden-dropout-with-graphed-mlp-moe")
def _hidden_dropout(s: State):
    if not (s.graphs and s.w.hidden_dropout != 0.0 and s.g == "selective"):
        return None
    hit = [lb for lb, sc in (("mlp", "mlp"), ("moe", "moe"))
           if lb in s.mods and (s.full_cudagraph or sc in s.scopes)]
    if hit:
        return Hit(f"{_fmt(hit)} with hidden_dropout={s.w.hidden_dropout} inside a CUDA graph")


@rule("jitter-with-graphed-moe")
def _jitter(s: State):
    if s.graphs and s.w.moe_input_jitter_eps is not None and s.selective("moe") and \
            (s.full_cudagraph or "moe" in s.scopes):
        return Hit("moe recompute with moe_input_jitter_eps inside a CUDA graph")


@rule("fine-grained-offloading-local-graph-modules")
def _fg_local_modules(s: State):
    if s.graphs and s.w.fine_grained_activation_offloading and s.impl == "local":
        bad = sorted(set(s.w.offload_modules or []) - set(MOE_INTERNALS))
        if bad:
            return Hit(f"fine-grained offloading of {_fmt(bad)} under local CUDA graphs")


@rule("fine-grained-offloading-local-whole-layer-graph")
def _fg_local_whole(s: State):
    if s.graphs and s.w.fine_grained_activation_offloading and s.impl == "local" and not s.scopes:
        return Hit("fine-grained offloading under local CUDA graphs of the whole layer")


@rule("fine-grained-offloading-graph-impl")
def _fg_graph_impl(s: State):
    if not (s.graphs and s.w.fine_grained_activation_offloading):
        return None
    if s.impl in ("transformer_engine", "full_iteration"):
        return None
    offloaded = set(s.w.offload_modules or [])
    partial_moe = (s.impl == "local" and bool(offloaded) and offloaded <= set(MOE_INTERNALS)
                   and "moe" not in s.scopes)
    if partial_moe and s.params("fine-grained-offloading-graph-impl")["local_partial_moe"]:
        return None
    return Hit(f"fine-grained offloading with cuda_graph_impl={s.impl}"
               + (f" capturing {_fmt(s.scopes)}" if s.scopes else ""))


@rule("ep-overlap-needs-vpp")
def _ep_vpp(s: State):
    w = s.w
    if w.overlap_moe_expert_parallel_comm and w.pipeline_model_parallel_size > 1 \
            and s.vpp is None:
        return Hit("EP overlap with pipeline parallelism but no virtual pipeline")


@rule("ep-overlap-needs-ep")
def _ep_ep(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.w.expert_model_parallel_size <= 1:
        return Hit("EP overlap with expert_model_parallel_size=1")


@rule("ep-overlap-needs-alltoall-or-flex")
def _ep_dispatcher(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.w.moe_token_dispatcher_type not in ("alltoall", "flex"):
        return Hit(f"EP overlap with the {s.w.moe_token_dispatcher_type} dispatcher")


@rule("ep-overlap-with-full")
def _ep_full(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.g == "full":
        return Hit("EP overlap with full recompute")


@rule("ep-overlap-with-method")
def _ep_method(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.w.recompute_method is not None:
        return Hit(f"EP overlap with recompute_method={s.w.recompute_method}")


@rule("ep-overlap-with-num-layers")
def _ep_num_layers(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.w.recompute_num_layers is not None:
        return Hit(f"EP overlap with recompute_num_layers={s.w.recompute_num_layers}")


@rule("ep-overlap-with-moe-recompute")
def _ep_moe_main(s: State):
    # main tc:3030-3032 tests the list at any granularity
    if s.w.overlap_moe_expert_parallel_comm and "moe" in s.mods:
        return Hit("EP overlap with moe in recompute_modules")


@rule("ep-overlap-needs-bf16")
def _ep_bf16(s: State):
    if s.w.overlap_moe_expert_parallel_comm and not (s.w.bf16 or s.w.fp16):
        return Hit("EP overlap without bf16/fp16")


@rule("ep-overlap-with-shared-expert-overlap")
def _ep_shared(s: State):
    if s.w.overlap_moe_expert_parallel_comm and s.w.moe_shared_expert_overlap:
        return Hit("EP overlap with moe_shared_expert_overlap")


@rule("ep-overlap-cuda-graph-scope")
def _ep_graph(s: State):
    if not (s.w.overlap_moe_expert_parallel_comm and s.graphs):
        return None
    bad_scope = [x for x in ("moe", "mlp") if x in s.scopes]
    if s.params("ep-overlap-cuda-graph-scope").get("only_transformer_engine"):
        if s.impl != "transformer_engine" or bad_scope:
            return Hit(f"EP overlap with cuda_graph_impl={s.impl}"
                       + (f" and scope {_fmt(bad_scope)}" if bad_scope else ""))
    elif s.impl == "transformer_engine" and bad_scope:
        return Hit(f"EP overlap with transformer_engine graphs on {_fmt(bad_scope)}")


@rule("delay-wgrad-needs-ep-overlap")
def _delay_wgrad(s: State):
    if s.w.delay_wgrad_compute and not s.w.overlap_moe_expert_parallel_comm:
        return Hit("delay_wgrad_compute without EP overlap")


# ================================================================== training arguments
# megatron/training/arguments.py: TransformerConfig accepts these, the training loop does not.

@rule("selective-with-method")
def _selective_method(s: State):
    if s.w.recompute_granularity == "selective" and s.w.recompute_method is not None:
        return Hit(f"selective recompute with recompute_method={s.w.recompute_method}")


@rule("distribute-needs-tp")
def _distribute_tp(s: State):
    if s.w.distribute_saved_activations and s.w.tensor_model_parallel_size <= 1:
        return Hit("distribute_saved_activations with tensor_model_parallel_size=1")


@rule("distribute-needs-full")
def _distribute_full(s: State):
    if s.w.distribute_saved_activations and s.w.recompute_granularity != "full":
        return Hit(f"distribute_saved_activations with recompute_granularity={s.w.recompute_granularity}")


@rule("distribute-needs-method")
def _distribute_method(s: State):
    if s.w.distribute_saved_activations and s.w.recompute_method is None:
        return Hit("distribute_saved_activations without recompute_method")


# ================================================================== runtime-only
def _full(s: State, method: str) -> Optional[int]:
    """recompute_num_layers when full recompute with `method` is configured, else None."""
    w = s.w
    if w.recompute_granularity == "full" and w.recompute_method == method \
            and w.recompute_num_layers is not None:
        return w.recompute_num_layers
    return None


@rule("uniform-num-layers-not-dividing-chunk")
def _uniform_not_dividing(s: State):
    n = _full(s, "uniform")
    if n is None or n < 1:
        return None
    chunks = s.chunk_sizes()
    bad = [c for c in chunks if c % n]
    if bad:
        return Hit(f"uniform recompute_num_layers={n} does not divide the {_fmt(map(str, bad))} layers "
                   "of a model chunk: the last group indexes past the chunk (IndexError in the first "
                   "forward)")


@rule("uniform-num-layers-below-one")
def _uniform_below_one(s: State):
    n = _full(s, "uniform")
    if n is not None and n < 1:
        return Hit(f"uniform recompute_num_layers={n}: the group loop never advances (training hangs)")


@rule("block-num-layers-below-one")
def _block_below_one(s: State):
    n = _full(s, "block")
    if n is not None and n < 1:
        return Hit(f"block recompute_num_layers={n} recomputes no layer")


@rule("block-num-layers-covers-chunk")
def _block_covers(s: State):
    n = _full(s, "block")
    if n is None or n < 1:
        return None
    chunks = s.chunk_sizes()
    covered = [c for c in chunks if n >= c]
    if covered:
        more = " (larger values change nothing)" if any(n > c for c in covered) else ""
        return Hit(f"block recompute_num_layers={n} >= the {_fmt(map(str, covered))} layers of a model "
                   f"chunk: every layer of those chunks is recomputed{more}")


@rule("num-layers-per-model-chunk")
def _per_chunk(s: State):
    w = s.w
    if w.recompute_granularity != "full" or w.recompute_num_layers is None or w.recompute_num_layers < 1:
        return None
    pl = s.placement
    interleaved = any(len(rank) > 1 for rank in pl.chunks)
    if interleaved or len(set(pl.stage_layers)) > 1:
        stages = sorted(set(pl.stage_layers))
        return Hit(f"recompute_num_layers={w.recompute_num_layers} applies to each model chunk of "
                   f"{_fmt(map(str, pl.distinct_chunk_sizes))} layers (PP={w.pipeline_model_parallel_size}, "
                   f"VPP={w.vpp}), not to the {_fmt(map(str, stages))} layers of a pipeline rank")


@rule("mtp-uniform-needs-one")
def _mtp_uniform(s: State):
    n = _full(s, "uniform")
    if s.w.mtp_num_layers and n is not None and n != 1:
        return Hit(f"MTP with uniform recompute_num_layers={n}")


@rule("mtp-block-skips-recompute")
def _mtp_block(s: State):
    if s.w.mtp_num_layers and _full(s, "block") is not None:
        return Hit("MTP with block recompute: the MTP layers keep all activations")


@rule("moe-tp-without-sp")
def _moe_tp_sp(s: State):
    w = s.w
    if w.is_moe and w.tensor_model_parallel_size > 1 and not w.sequence_parallel:
        return Hit(f"MoE with TP={w.tensor_model_parallel_size} and no sequence_parallel: "
                   "MoELayer.forward raises in training")


@rule("label-needs-te")
def _label_needs_te(s: State):
    if s.assume_te_absent or not s.te_absent:
        return None   # only when the user states TE is absent on the training nodes
    # the labels whose checkpoint is CheckpointWithoutOutput: the label table's needs_te
    hit = s.selective(*(label for label in releases.labels_for(s.version) if card.label(label)["needs_te"]))
    if hit:
        return Hit(f"{_fmt(hit)} needs Transformer Engine at runtime (CheckpointWithoutOutput calls "
                   "FP8GlobalStateManager even in bf16); te_version says it is absent")


@rule("fp8-moe-act-legacy-grouped-gemm")
def _legacy_grouped(s: State):
    if s.selective("moe_act") and s.w.is_moe and (s.w.fp8 or s.w.fp4) and \
            s.extra.get("moe_use_legacy_grouped_gemm", False):
        return Hit("moe_act with fp8/fp4 and the legacy GroupedMLP")


@rule("moe-router-needs-te")
def _moe_router_te(s: State):
    # moe_utils.py:24-39 leaves te_general_gemm undefined without TE and :1192 reads it before
    # looking at the router dtype (seen on a GPU with the local spec); fixed in 0.17 (the card).
    if s.w.is_moe and s.te_absent and not s.assume_te_absent:
        return Hit("MoE router without Transformer Engine: the gating GEMM raises NameError "
                   "in the first forward")


@rule("cpu-offloading-needs-te")
def _cpu_off_te(s: State):
    if s.w.cpu_offloading and s.te_absent and not s.assume_te_absent:
        return Hit("cpu_offloading while te_version says Transformer Engine is absent")


# ================================================================== the GPU
# Transformer Engine asserts FP8 support for every recipe, then the recipe's own check, when the
# first autocast region is entered (quantization.py:720-759 @ v2.17.1); the thresholds are the
# card's constraint params, the GPU's compute capability its `gpus:` entry.
_ARCH_RECIPES = ("blockwise", "mxfp8", "nvfp4")


def _precision_recipe(s: State) -> Optional[str]:
    """The recipe Transformer Engine is asked to run: fp8_recipe under FP8, fp4_recipe under FP4."""
    if s.w.fp8:
        return str(s.w.fp8_recipe)
    if s.w.fp4:
        return str(s.extra.get("fp4_recipe") or "nvfp4")
    return None


def _gpu(s: State):
    from mbridge_recompute.facts import gpus

    return gpus.of_workload(s.w)


def _cc_text(cc: tuple) -> str:
    return f"{cc[0]}.{cc[1]}"


def _below(cc: tuple, text: str) -> bool:
    from mbridge_recompute.facts.gpus import cc_tuple

    return cc < cc_tuple(text)


@rule("fp8-needs-sm89")
def _fp8_sm89(s: State):
    recipe = _precision_recipe(s)
    gpu = _gpu(s)
    if recipe is None or gpu.cc is None:
        return None
    if _below(gpu.cc, s.params("fp8-needs-sm89")["min_cc"]):
        return Hit(f"{'fp8' if s.w.fp8 else 'fp4'} recipe {recipe} on {gpu.how}, compute capability "
                   f"{_cc_text(gpu.cc)}: Transformer Engine runs no FP8 / FP4 recipe below 8.9")


@rule("fp8-blockwise-needs-sm90")
def _fp8_blockwise(s: State):
    gpu = _gpu(s)
    if _precision_recipe(s) != "blockwise" or not s.w.fp8 or gpu.cc is None \
            or _below(gpu.cc, s.params("fp8-needs-sm89")["min_cc"]):
        return None            # below 8.9 the FP8 check fails first (fp8-needs-sm89)
    p = s.params("fp8-blockwise-needs-sm90")
    where = f"{gpu.how}, compute capability {_cc_text(gpu.cc)}"
    if _below(gpu.cc, p["min_cc"]):
        return Hit(f"fp8_recipe blockwise on {where}: block-scaled FP8 GEMMs need Hopper or newer")
    if not _below(gpu.cc, "10.0"):
        ok = s.te_min(p["hopper_only_before_te"])
        if ok is None:
            return Hit(f"fp8_recipe blockwise on {where}: Transformer Engine before "
                       f"{p['hopper_only_before_te']} runs it on Hopper only; the TE version on the "
                       "training nodes is unknown (set cluster.te_version)", severity="warning",
                       upstream=p["message_before_te"])
        if not ok:
            return Hit(f"fp8_recipe blockwise on {where} with Transformer Engine {s.te_shown()}: "
                       f"before {p['hopper_only_before_te']} it runs on Hopper only",
                       upstream=p["message_before_te"])
    return None


@rule("mxfp8-needs-sm100")
def _mxfp8(s: State):
    gpu = _gpu(s)
    if not s.w.fp8 or _precision_recipe(s) != "mxfp8" or gpu.cc is None \
            or _below(gpu.cc, s.params("fp8-needs-sm89")["min_cc"]):
        return None
    p = s.params("mxfp8-needs-sm100")
    where = f"{gpu.how}, compute capability {_cc_text(gpu.cc)}"
    if _below(gpu.cc, p["min_cc"]):
        return Hit(f"fp8_recipe mxfp8 on {where}: MXFP8 needs Blackwell (B200, GB200, B300, GB300)")
    if not _below(gpu.cc, p["below_cc"]):
        return Hit(f"fp8_recipe mxfp8 on {where}: not supported from compute capability "
                   f"{p['below_cc']} on", upstream=p["message_from_below_cc"])
    return None


@rule("nvfp4-needs-sm100")
def _nvfp4(s: State):
    gpu = _gpu(s)
    if not s.w.fp4 or _precision_recipe(s) != "nvfp4" or gpu.cc is None \
            or _below(gpu.cc, s.params("fp8-needs-sm89")["min_cc"]):
        return None
    if _below(gpu.cc, s.params("nvfp4-needs-sm100")["min_cc"]):
        return Hit(f"fp4 recipe nvfp4 on {gpu.how}, compute capability {_cc_text(gpu.cc)}: NVFP4 "
                   "needs Blackwell (B200, GB200, B300, GB300)")
    return None


@rule("precision-recipe-gpu-not-named")
def _recipe_gpu_unknown(s: State):
    recipe = _precision_recipe(s)
    if recipe not in _ARCH_RECIPES:
        return None
    gpu = _gpu(s)
    if gpu.cc is not None:
        return None
    if gpu.name is not None:
        return Hit(f"{recipe} on {gpu.how}: Transformer Engine's compute-capability checks do not "
                   "apply to this GPU, so whether it runs the recipe is not decided here")
    return Hit(f"{recipe} runs only on some GPUs (card precision_recipes) and {gpu.how}: "
               "not checked against the hardware")


# ================================================================== silent no-ops
@rule("mlp-on-moe-layers")
def _mlp_on_moe(s: State):
    if not (s.selective("mlp") and s.w.is_moe):
        return None
    moe, dense = s.moe_layers, s.dense_layers
    if dense == 0:
        return Hit(f"mlp recomputes dense MLP layers only, and this model's {moe} layers are all MoE: "
                   "nothing is recomputed")
    return Hit(f"mlp applies only to the {dense} dense layers; the {moe} MoE layers ignore it",
               severity="info")


@rule("layernorm-on-te-dense-spec")
def _layernorm_te_dense(s: State):
    w = s.w
    if s.selective("layernorm") and not separate_norms(
            w.layer_kinds(), w.transformer_impl == "transformer_engine", bool(w.multi_latent_attention)):
        stack = "hybrid" if w.hybrid_override_pattern else "dense"
        return Hit(f"layernorm on the Transformer Engine {stack} spec without MoE layers: every norm is "
                   "fused into TELayerNormColumnParallelLinear (IdentityOp), nothing is recomputed")


@rule("moe-labels-on-dense-model")
def _moe_labels_dense(s: State):
    hit = s.selective("moe", "moe_act", "shared_experts")
    if hit and not s.w.is_moe:
        return Hit(f"{_fmt(hit)} on a model without MoE layers: nothing is recomputed")


@rule("shared-experts-without-shared-experts")
def _shared_without(s: State):
    if s.selective("shared_experts") and s.w.is_moe and not s.has_shared_experts:
        return Hit("shared_experts on a MoE model without shared experts")


@rule("moe-with-local-cuda-graph")
def _moe_local_graph(s: State):
    if s.selective("moe") and s.w.is_moe and s.w.cuda_graph_impl == "local":
        return Hit("moe with cuda_graph_impl=local: MoELayer skips its checkpoint",
                   disables=(("moe", "all"),))


@rule("moe-under-ep-overlap")
def _moe_ep_overlap(s: State):
    if s.selective("moe") and s.w.is_moe and s.w.overlap_moe_expert_parallel_comm:
        return Hit("moe under EP A2A overlap: the fine-grained callables bypass MoELayer.forward, "
                   "nothing is recomputed", disables=(("moe", "all"),))


@rule("modules-ignored-without-selective")
def _modules_ignored(s: State):
    mods = s.w.recompute_modules
    if mods is None or len(mods) == 0 or s.g == "selective":
        return None
    if s.g is None:
        return Hit(f"recompute_modules [{_fmt(mods)}] without recompute_granularity: nothing is "
                   "recomputed", severity="warning")
    return Hit(f"recompute_modules [{_fmt(mods)}] is ignored under recompute_granularity={s.g}")


@rule("pre-mlp-layernorm-with-moe-router-graph")
def _pre_mlp_ln_graph(s: State):
    w = s.w
    if not (s.selective("layernorm") and w.is_moe and w.cuda_graph_impl == "transformer_engine"
            and "moe_router" in s.scopes):
        return None
    # the capture list is cuda_graph_modules from 0.18 (cuda_graph_scope is its deprecated alias)
    key = "cuda_graph_modules" if s.has_modules_field else "cuda_graph_scope"
    drop = "or drop layernorm from recompute_modules (it saves nothing here)"
    if s.has_shared_experts and w.moe_shared_expert_overlap:
        # checked before the capture list: no scope brings the norm back (tl:467-479 @ 0.19.2)
        return Hit("layernorm with a moe_router graph and shared-expert overlap: the pre-MLP norm "
                   "recompute is switched off", disables=(("layernorm", "moe"),),
                   upstream="pre_mlp_layernorm recompute is not supported with moe router cudagraph + "
                            "shared expert overlap. Disabling pre_mlp_layernorm recompute.",
                   fix="the shared-expert overlap is the blocker: the shared expert reads the norm's "
                       "output outside the graph, whatever it captures; set moe_shared_expert_overlap="
                       f"false to keep the saving, {drop}")
    if "moe_preprocess" in s.scopes and (w.moe_token_dispatcher_type == "alltoall"
                                         or s.extra.get("moe_latent_size")):
        return None
    if "moe_preprocess" in s.scopes:
        return Hit(f"layernorm with moe_router and moe_preprocess graphs and the "
                   f"{w.moe_token_dispatcher_type} dispatcher: the pre-MLP norm recompute is switched off",
                   disables=(("layernorm", "moe"),),
                   fix=f"moe_preprocess is captured already; the norm also needs the alltoall dispatcher "
                       f"(moe_token_dispatcher_type=alltoall) or latent MoE, {drop}")
    return Hit("layernorm with a moe_router graph (without moe_preprocess + alltoall): the pre-MLP "
               "norm recompute is switched off", disables=(("layernorm", "moe"),),
               fix=f"add moe_preprocess to {key} with the alltoall dispatcher, {drop}")


@rule("modules-none-promoted")
def _none_promoted(s: State):
    if s.w.recompute_granularity == "selective" and s.w.recompute_modules is None:
        return Hit("recompute_modules is None: megatron-core turns it into [core_attn] in "
                   "__post_init__ (Bridge does not), so this run recomputes core attention")


@rule("full-recompute-on-hybrid-stack")
def _full_hybrid(s: State):
    if s.w.hybrid_override_pattern and s.g == "full":
        return Hit("full recompute on a hybrid (Mamba) stack: MambaStack runs its layers without a "
                   "checkpoint, nothing is recomputed", disables=(("full", "all"),))


# What a per-layer capture scope contains (transformer/cuda_graphs.py @ core_v0.18.2): a
# recompute region inside it runs without its checkpoint while the graph is captured.
_CAPTURED_BY = {"core_attn": "attn", "mlp": "mlp", "moe": "moe", "shared_experts": "moe"}


@rule("recompute-inside-cuda-graph-capture")
def _inside_capture(s: State):
    if not s.per_layer_graphs:
        return None
    hit = [lb for lb in s.selective(*_CAPTURED_BY) if not s.scopes or _CAPTURED_BY[lb] in s.scopes]
    if hit:
        where = f"the captured {_fmt(sorted({_CAPTURED_BY[lb] for lb in hit}))} scope" if s.scopes \
            else "the whole-layer capture"
        return Hit(f"{_fmt(hit)} inside {where} ({s.impl} graphs): the checkpoint is skipped while "
                   "the graph is captured, so the graph keeps every activation of the region",
                   disables=tuple((lb, "all") for lb in hit))


# ================================================================== Megatron Bridge's own checks
# What Bridge refuses that megatron-core accepts: ConfigContainer.validate() (run by
# runtime_config_update before training) and GPTModelProvider.provide(). They hold for a Bridge
# run, not for Megatron-LM's own training script; Bridge stops at the first that fails, in this
# order (training/config.py:1261-1374 @ megatron-bridge 0.6.2, then gpt_provider.py:233).
BRIDGE_ORDER = ("bridge-local-cuda-graph-needs-full-iteration",
                "bridge-fine-grained-offloading-needs-te-impl",
                "bridge-fine-grained-offloading-needs-nvte-cpu-offload-v1",
                "bridge-full-iteration-graph-with-nan-check", "bridge-cuda-graphs-need-te-rng-tracker")


def _bridge_run(s: State) -> bool:
    return s.w.defaults_source != "megatron-lm"


@rule("fine-grained-offloading-needs-te-impl")
def _mlm_fg_impl(s: State):
    if not _bridge_run(s) and s.w.fine_grained_activation_offloading \
            and s.w.transformer_impl != "transformer_engine":
        return Hit(f"fine-grained offloading with transformer_impl={s.w.transformer_impl}")


@rule("fine-grained-offloading-needs-nvte-cpu-offload-v1")
def _mlm_fg_env(s: State):
    if _bridge_run(s) or not s.w.fine_grained_activation_offloading:
        return None
    if s.te_min(s.params("fine-grained-offloading-needs-nvte-cpu-offload-v1")["from_te"]) is False:
        return None
    return Hit("fine-grained offloading with Transformer Engine >= 2.10 (or unknown): Megatron-LM "
               "asserts NVTE_CPU_OFFLOAD_V1=1 in the launch environment")


@rule("bridge-local-cuda-graph-needs-full-iteration")
def _bridge_local_graph(s: State):
    if not _bridge_run(s) or s.w.cuda_graph_impl != "local" or s.full_iteration:
        return None
    inference = set(_names(s.extra.get("inference_cuda_graph_scope")))
    if not s.scopes and inference & {"layer", "block"}:
        return None            # a local inference graph (utils/cuda_graph.py:141-144)
    shown = f" with scopes {s.scopes}" if s.scopes else ""
    upstream = card.constraint_at("bridge-local-cuda-graph-needs-full-iteration", s.version)["message"] \
        .format(config_name="model", modules_msg=shown)
    return Hit("cuda_graph_impl=local " + (f"capturing {_fmt(s.scopes)}" if s.scopes else "whole layers")
               + ": megatron-core accepts it, Megatron Bridge takes local graphs for full-iteration "
               "capture only", upstream=upstream)


@rule("bridge-fine-grained-offloading-needs-te-impl")
def _bridge_fg_impl(s: State):
    if _bridge_run(s) and s.w.fine_grained_activation_offloading \
            and s.w.transformer_impl != "transformer_engine":
        return Hit(f"fine-grained offloading with transformer_impl={s.w.transformer_impl}: Megatron "
                   "Bridge offloads with the Transformer Engine layers only")


@rule("bridge-fine-grained-offloading-needs-nvte-cpu-offload-v1")
def _bridge_fg_env(s: State):
    if not (_bridge_run(s) and s.w.fine_grained_activation_offloading
            and s.w.transformer_impl == "transformer_engine"):
        return None
    since = s.params("bridge-fine-grained-offloading-needs-nvte-cpu-offload-v1")["from_te"]
    if s.te_min(since) is False:
        return None
    if str(s.w.env_vars.get("NVTE_CPU_OFFLOAD_V1", "")) == "1":
        return None
    te = f"Transformer Engine {s.te_shown()}" if s.te is not None else \
        f"Transformer Engine >= {since} (the version on the training nodes is unknown)"
    return Hit(f"fine-grained offloading with {te}: Megatron Bridge refuses it unless "
               "NVTE_CPU_OFFLOAD_V1=1 is set, and the config's env_vars do not set it")


@rule("bridge-full-iteration-graph-with-nan-check")
def _bridge_nan(s: State):
    if not (_bridge_run(s) and s.graphs and s.full_iteration):
        return None
    if s.w.check_for_nan_in_loss is False:
        return None
    if s.w.check_for_nan_in_loss is None:
        return Hit("full-iteration CUDA graphs and rerun_state_machine.check_for_nan_in_loss not given: "
                   "Bridge's default (true) is refused with them", severity="warning")
    return Hit("full-iteration CUDA graphs with rerun_state_machine.check_for_nan_in_loss=true")


@rule("bridge-cuda-graphs-need-te-rng-tracker")
def _bridge_rng(s: State):
    if not (_bridge_run(s) and s.graphs) or s.w.hybrid_override_pattern:
        return None          # HybridModelProvider.provide() has no such check
    model = s.extra.get("use_te_rng_tracker")
    if s.w.te_rng_tracker or model:
        return None
    if s.w.te_rng_tracker is None and model is None:
        return Hit(f"cuda_graph_impl={s.impl} and neither rng.te_rng_tracker nor "
                   "model.use_te_rng_tracker given: Bridge refuses to build the model without it",
                   severity="warning")
    return Hit(f"cuda_graph_impl={s.impl} with rng.te_rng_tracker and model.use_te_rng_tracker off")


# ------------------------------------------------------------------ offloads upstream skips
# Each switches the offload off in the memory model: ("offload:MODULE", "all"), memory/offload.py.
def _offloaded(s: State) -> set:
    return set(s.w.offload_modules or []) if s.w.fine_grained_activation_offloading else set()


def _skip(*modules: str) -> tuple:
    from mbridge_recompute.memory.offload import skipped

    return tuple(skipped(m) for m in modules)


@rule("offload-core-attn-skipped-under-recompute")
def _offload_core_attn(s: State):
    if "core_attn" in _offloaded(s) and s.selective("core_attn"):
        return Hit("core_attn is recomputed and offloaded: the checkpointed attention never enters "
                   "the core_attn offload context, so core attention's tensors stay on the GPU",
                   disables=_skip("core_attn"))


@rule("offload-fused-norm-moves-nothing")
def _offload_fused_norm(s: State):
    from mbridge_recompute.layer_spec import norm_fused

    te, mla = s.w.transformer_impl == "transformer_engine", bool(s.w.multi_latent_attention)
    kinds = [k.split("+") for k in s.w.layer_kinds()]
    mods = _offloaded(s)
    fused = []
    if "attn_norm" in mods and norm_fused("attention", te, mla):
        fused.append("attn_norm")
    mlp_kinds = [b for b in kinds if "mlp" in b or "moe" in b]
    if "mlp_norm" in mods and mlp_kinds and all(norm_fused("mlp", te, moe="moe" in b) for b in mlp_kinds):
        fused.append("mlp_norm")
    if fused:
        return Hit(f"{_fmt(fused)} offloaded on the Transformer Engine spec, where that norm is fused "
                   "into the next GEMM (IdentityOp): nothing is offloaded for it",
                   disables=_skip(*fused))


@rule("offload-inside-moe-recompute")
def _offload_in_moe(s: State):
    inside = sorted(_offloaded(s) & {"moe_act", "expert_fc1"})
    if inside and s.selective("moe") and s.w.is_moe:
        return Hit(f"{_fmt(inside)} offloaded inside the recomputed MoE layer: its forward runs under "
                   "no_grad, so nothing is saved for the offload to move", disables=_skip(*inside))


@rule("offload-under-full-recompute")
def _offload_full(s: State):
    if not _offloaded(s) or s.g != "full" or s.w.recompute_num_layers is None \
            or s.w.recompute_num_layers < 1:
        return None
    n = s.w.recompute_num_layers
    every = s.w.recompute_method != "block" or all(n >= c for c in s.chunk_sizes())
    if every:
        return Hit("fine-grained offloading under full recompute of every layer: the checkpointed "
                   "forwards save nothing for the offload to move, so nothing is offloaded",
                   disables=_skip(*sorted(_offloaded(s))))
    return Hit(f"fine-grained offloading under full block recompute of {n} layers per chunk: those "
               "layers offload nothing; only the layers after them offload", severity="info")


@rule("fine-grained-offloading-on-hybrid-stack")
def _offload_hybrid(s: State):
    if _offloaded(s) and s.w.hybrid_override_pattern:
        return Hit("fine-grained offloading on a hybrid (Mamba) model: MambaModel never sets up the "
                   "offload handler on this release, so nothing is offloaded",
                   disables=_skip(*sorted(_offloaded(s))))


@rule("attn-norm-offload-with-attn-graph")
def _attn_norm_graph(s: State):
    if "attn_norm" in _offloaded(s) and "attn" in s.scopes:
        return Hit("attn_norm offloaded with attention in the CUDA-graph capture modules: its "
                   "offloading is switched off", disables=_skip("attn_norm"))


@rule("mlp-norm-offload-with-graph-boundary")
def _mlp_norm_graph(s: State):
    if "mlp_norm" not in _offloaded(s):
        return None
    kinds = [k.split("+") for k in s.w.layer_kinds()]
    attn, mlp = "attn" in s.scopes, "mlp" in s.scopes
    off_moe = attn or "moe_router" in s.scopes
    off_dense = attn != mlp
    hit = [b for b in kinds if ("moe" in b and off_moe) or ("mlp" in b and "moe" not in b and off_dense)]
    carriers = [b for b in kinds if "moe" in b or "mlp" in b]
    if not hit:
        return None
    whole = len(hit) == len(carriers)
    return Hit("mlp_norm offloaded with the pre-MLP norm on a CUDA-graph boundary "
               f"({'every' if whole else 'some'} MLP / MoE layer): its offloading is switched off",
               disables=_skip("mlp_norm") if whole else ())


@rule("offload-captured-in-cuda-graph-needs-te-2-14")
def _offload_in_graph_te(s: State):
    from mbridge_recompute.layer_spec import norm_fused

    mods = _offloaded(s)
    if not mods or not s.per_layer_graphs:
        return None
    captured = sorted(mods & {"core_attn", "attn_proj", "qkv_linear"}) if "attn" in s.scopes else []
    dense = any("mlp" in k.split("+") and "moe" not in k.split("+") for k in s.w.layer_kinds())
    if "mlp_norm" in mods and dense and "attn" in s.scopes and "mlp" in s.scopes \
            and not norm_fused("mlp", s.w.transformer_impl == "transformer_engine"):
        captured.append("mlp_norm")
    if not captured:
        return None
    need = s.params("offload-captured-in-cuda-graph-needs-te-2-14")["min_te"]
    ok = s.te_min(need)
    if ok:
        return None
    what = f"{_fmt(captured)} offloaded inside the captured CUDA graph"
    if ok is None:
        return Hit(f"{what} needs Transformer Engine >= {need} and torch >= 2.9; the TE version on "
                   "the training nodes is unknown (set cluster.te_version)", severity="warning")
    return Hit(f"{what} with Transformer Engine {s.te_shown()} (needs >= {need})")


@rule("cpu-offloading-weights-ignored")
def _cpu_weights(s: State):
    if not (s.w.cpu_offloading and s.extra.get("cpu_offloading_weights")):
        return None
    since = s.params("cpu-offloading-weights-ignored")["ignored_from_te"]
    if s.te_min(since) is False and not s.te_absent:
        return None
    nothing = s.extra.get("cpu_offloading_activations") is False
    return Hit("cpu_offloading_weights=true: Transformer Engine "
               + (f"{s.te_shown()} " if s.te is not None else f"{since} and later ")
               + "offloads no weights" + (", and with cpu_offloading_activations=false nothing is "
                                          "offloaded at all" if nothing else ""))


# ================================================================== evaluation
@dataclass
class Evaluation:
    version: str
    findings: list = field(default_factory=list)
    first_error: Optional[dict] = None            # the config error megatron-core raises
    warnings_before_error: list = field(default_factory=list)   # config warning ids it emits first

    def verdict(self) -> tuple:
        """("accept", None, None) or ("reject", id, exception type) for TransformerConfig."""
        if self.first_error is None:
            return ("accept", None, None)
        return ("reject", self.first_error["id"], self.first_error.get("raises"))


# The moe_layer_recompute override (tc:1264-1266 @ core_v0.16.1) sits right after the check
# that rejects it with full recompute: checks after that one see granularity "selective" and
# "moe" appended.
OVERRIDE_AFTER = "moe-layer-recompute-with-full"


def evaluate(w, version: Optional[releases.ReleaseLike] = None, te_version: Optional[str] = None,
             assume_te_absent: bool = False) -> Evaluation:
    """Every rule the card holds for release `version`, config rules in that release's order."""
    release = releases.resolve(version)
    version = release.key
    s = State(w, release, te_version, assume_te_absent)
    ev = Evaluation(version)
    applicable = [r for r in RULES if card.holds(r.id, version)]
    config_rules = sorted((r for r in applicable if card.constraint(r.id)["kind"] == "config"),
                          key=lambda r: card.order_in(r.id, version))
    other_rules = [r for r in applicable if card.constraint(r.id)["kind"] != "config"]
    override = card.order_in(OVERRIDE_AFTER, version)
    for r in config_rules:
        s.after_override = card.order_in(r.id, version) > override
        hit = r.fn(s)
        if hit is None:
            continue
        f = _finding_of(r.id, version, hit)
        if f["severity"] == "error":
            f["raises"] = hit.raises or card.constraint_at(r.id, version).get("raises")
            if ev.first_error is None:
                f["first"] = True
                ev.first_error = f
        elif ev.first_error is None and f["id"] != "cuda-graph-full-scope-deprecated":
            ev.warnings_before_error.append(f["id"])
        ev.findings.append(f)
    for r in other_rules:
        s.after_override = True   # what the model is built with
        hit = r.fn(s)
        if hit is not None:
            ev.findings.append(_finding_of(r.id, version, hit))
    return ev


def _finding_of(cid: str, version: str, hit: Hit) -> dict:
    f = finding(cid, "builtin", version, hit.detail, severity=hit.severity, upstream=hit.upstream)
    if hit.fix:
        f["fix"] = hit.fix
    if hit.disables:
        f["disables"] = [list(d) for d in hit.disables]
    return f


def check(w, version: Optional[releases.ReleaseLike] = None, te_version: Optional[str] = None,
          assume_te_absent: bool = False) -> dict:
    ev = evaluate(w, version, te_version, assume_te_absent)
    return report(ev.findings, "builtin", ev.version)
