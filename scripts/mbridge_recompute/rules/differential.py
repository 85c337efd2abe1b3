"""Differential check: the built-in table against the installed megatron-core.

A matrix of small workloads (the 84 empirical cases of the reference matrix,
plus variations across TP/SP/PP/VPP/MoE/MLA/fp8/CUDA graphs/offloading/EP
overlap and known Transformer Engine versions) is run through both:

- live: the installed `TransformerConfig` is constructed; its exception is
  mapped to a card id by message and raising line (`live.map_message`);
- builtin: `builtin.evaluate(..., assume_te_absent=<no te_version>)`, i.e. the
  table's prediction of what megatron-core does *on this machine*.

A case agrees when both accept, or both reject with the same card id and the
same exception type, and the config warnings emitted before the decision are
the same set. Used by tests/test_check_differential.py and
benchmarks/check_agreement.py. Needs megatron-core (imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mbridge_recompute.workload import Workload

BASE = {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4}
MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32}
SEL = {"recompute_granularity": "selective"}
FULL1 = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
PP2 = {"pipeline_model_parallel_size": 2}
TP2 = {"tensor_model_parallel_size": 2}
OFF = {"cpu_offloading": True, "cpu_offloading_num_layers": 1}
GG = {"moe_grouped_gemm": True}
SHARED = {"moe_shared_expert_intermediate_size": 32}
EPO = {"bf16": True, "expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall",
       "overlap_moe_expert_parallel_comm": True}
FG = {"fine_grained_activation_offloading": True}


def sel(*mods: str) -> dict:
    return {**SEL, "recompute_modules": list(mods)}


def fp8(recipe: Optional[str] = None, mode: str = "e4m3") -> dict:
    return {"fp8": mode, **({"fp8_recipe": recipe} if recipe else {})}


def cg(impl: str, scope=None) -> dict:
    return {"cuda_graph_impl": impl, **({"cuda_graph_scope": scope} if scope is not None else {})}


# (name, overrides, te_version). Numbers are the reference matrix's case numbers.
REFERENCE_CASES: list = [
    ("01 default", {}, None),
    ("02 selective default modules", {**SEL}, None),
    ("03 selective []", sel(), None),
    ("04 granularity bogus", {"recompute_granularity": "bogus"}, None),
    ("05 full no method", {"recompute_granularity": "full"}, None),
    ("06 full uniform no num_layers", {"recompute_granularity": "full", "recompute_method": "uniform"}, None),
    ("07 full method bogus", {**FULL1, "recompute_method": "bogus"}, None),
    ("08 full uniform 1", FULL1, None),
    ("09 full uniform 3", {**FULL1, "recompute_num_layers": 3}, None),
    ("10 full uniform 0", {**FULL1, "recompute_num_layers": 0}, None),
    ("11 full block -1", {**FULL1, "recompute_method": "block", "recompute_num_layers": -1}, None),
    ("12 full block 100", {**FULL1, "recompute_method": "block", "recompute_num_layers": 100}, None),
    ("13 full block 5 pp2", {**FULL1, **PP2, "recompute_method": "block", "recompute_num_layers": 5}, None),
    ("14 selective + method uniform", {**SEL, "recompute_method": "uniform"}, None),
    ("15 selective + num_layers 1", {**SEL, "recompute_num_layers": 1}, None),
    ("16 no granularity + block 2", {"recompute_method": "block", "recompute_num_layers": 2}, None),
    ("17 full + modules [mlp]", {**FULL1, "recompute_modules": ["mlp"]}, None),
    ("18 sel core_attn", sel("core_attn"), None),
    ("19 sel mlp", sel("mlp"), None),
    ("20 sel layernorm", sel("layernorm"), None),
    ("21 sel moe dense", sel("moe"), None),
    ("22 sel moe MoE", {**sel("moe"), **MOE}, None),
    ("23 sel moe_act no grouped gemm", {**sel("moe_act"), **MOE}, None),
    ("24 sel moe_act grouped gemm", {**sel("moe_act"), **MOE, **GG}, None),
    ("25 sel shared_experts no shared", {**sel("shared_experts"), **MOE}, None),
    ("26 sel mla_up_proj no MLA", sel("mla_up_proj"), None),
    ("27 sel mla_up_proj MLA", {**sel("mla_up_proj"), "multi_latent_attention": True}, None),
    ("28 sel gdn_norm_out", sel("gdn_norm_out"), None),
    ("29 sel gdp_in_proj", sel("gdp_in_proj"), None),
    ("30 sel gdp_qkv", sel("gdp_qkv"), None),
    ("31 sel mhc", sel("mhc"), None),
    ("32 sel moe_layer", sel("moe_layer"), None),
    ("33 sel attn", sel("attn"), None),
    ("34 sel modules str 'mlp'", {**SEL, "recompute_modules": "mlp"}, None),
    ("35 no granularity modules [bogus]", {"recompute_modules": ["bogus"]}, None),
    ("36 sel core_attn mlp layernorm", sel("core_attn", "mlp", "layernorm"), None),
    ("37 moe_layer_recompute", {"moe_layer_recompute": True, **MOE}, None),
    ("38 moe_layer_recompute + full", {"moe_layer_recompute": True, **FULL1, **MOE}, None),
    ("39 moe_layer_recompute + sel [mlp]", {"moe_layer_recompute": True, **sel("mlp"), **MOE}, None),
    ("40 sel shared_experts + overlap", {**sel("shared_experts"), **MOE, **SHARED,
                                         "moe_shared_expert_overlap": True,
                                         "moe_token_dispatcher_type": "alltoall"}, None),
    ("41 sel shared_experts + shared", {**sel("shared_experts"), **MOE, **SHARED}, None),
    ("42 full + distribute + SP", {**FULL1, **TP2, "sequence_parallel": True,
                                   "distribute_saved_activations": True}, None),
    ("43 sel + distribute + SP", {**SEL, **TP2, "sequence_parallel": True,
                                  "distribute_saved_activations": True}, None),
    ("44 none + distribute + SP", {**TP2, "sequence_parallel": True, "distribute_saved_activations": True},
     None),
    ("45 full + distribute TP1", {**FULL1, "distribute_saved_activations": True}, None),
    ("46 sel + distribute TP2", {**SEL, **TP2, "distribute_saved_activations": True}, None),
    ("47 SP with TP1", {"sequence_parallel": True}, None),
    ("48 cpu offloading + sel", {**OFF, **SEL}, None),
    ("49 cpu offloading + full", {**OFF, **FULL1}, None),
    ("50 cpu offloading num_layers=8", {**OFF, "cpu_offloading_num_layers": 8}, None),
    ("51 cpu offloading + PP2", {**OFF, **PP2}, None),
    ("52 fine-grained []", {**FG, "offload_modules": []}, None),
    ("53 fine-grained + cpu offloading", {**FG, **OFF, "offload_modules": ["core_attn"]}, None),
    ("54 fine-grained attn_proj alone", {**FG, "offload_modules": ["attn_proj"]}, None),
    ("55 fine-grained core_attn + sel core_attn", {**FG, "offload_modules": ["core_attn"],
                                                   **sel("core_attn")}, None),
    ("56 fine-grained moe_act + sel moe", {**FG, "offload_modules": ["moe_act"], **sel("moe"), **MOE, **GG},
     None),
    ("57 fine-grained expert_fc1 + sel moe_act", {**FG, "offload_modules": ["expert_fc1"],
                                                  **sel("moe_act"), **MOE, **GG}, None),
    ("58 fine-grained + full", {**FG, "offload_modules": ["core_attn"], **FULL1}, None),
    ("59 fp8 delayed + layernorm", {**fp8("delayed"), **sel("layernorm")}, None),
    ("60 fp8 delayed + moe_act", {**fp8("delayed"), **sel("moe_act"), **MOE, **GG}, None),
    ("61 fp8 tensorwise + layernorm", {**fp8("tensorwise", "hybrid"), **sel("layernorm")}, None),
    ("62 fp8 mxfp8 + layernorm", {**fp8("mxfp8"), **sel("layernorm")}, None),
    ("63 fp8 blockwise + core_attn,mlp", {**fp8("blockwise"), **sel("core_attn", "mlp")}, None),
    ("64 fp8 delayed + full", {**fp8("delayed", "hybrid"), **FULL1}, None),
    ("65 fp8 + MoE", {**fp8(), **MOE}, None),
    ("66 cg local + full", {**cg("local"), **FULL1}, None),
    ("67 cg TE + full", {**cg("transformer_engine"), **FULL1}, None),
    ("68 cg local full_iteration + full", {**cg("local", ["full_iteration"]), **FULL1}, None),
    ("69 cg impl full_iteration + full", {**cg("full_iteration"), **FULL1}, None),
    ("70 cg local + core_attn dropout", {**cg("local"), **sel("core_attn")}, None),
    ("71 cg local + core_attn no dropout", {**cg("local"), **sel("core_attn"), "attention_dropout": 0.0},
     None),
    ("72 cg TE attn + core_attn", {**cg("transformer_engine", ["attn"]), **sel("core_attn")}, None),
    ("73 cg TE mlp + core_attn", {**cg("transformer_engine", ["mlp"]), **sel("core_attn")}, None),
    ("74 cg TE attn + mlp", {**cg("transformer_engine", ["attn"]), **sel("mlp")}, None),
    ("75 cg TE mlp + mlp", {**cg("transformer_engine", ["mlp"]), **sel("mlp")}, None),
    ("76 cg TE mlp + mlp no dropout", {**cg("transformer_engine", ["mlp"]), **sel("mlp"),
                                       "hidden_dropout": 0.0}, None),
    ("77 cg TE moe_router + moe", {**cg("transformer_engine", ["moe_router"]), **sel("moe"), **MOE}, None),
    ("78 cg local attn + moe", {**cg("local", ["attn"]), **sel("moe"), **MOE, "hidden_dropout": 0.0}, None),
    ("79 cg local + cpu offloading", {**cg("local"), **OFF}, None),
    ("80 EP overlap + full", {**EPO, **MOE, **FULL1}, None),
    ("81 EP overlap + sel moe", {**EPO, **MOE, **sel("moe")}, None),
    ("82 EP overlap + sel method uniform", {**EPO, **MOE, **SEL, "recompute_method": "uniform"}, None),
    ("83 EP overlap + core_attn,moe_act,shared_experts", {**EPO, **MOE, **GG, **SHARED,
                                                          **sel("core_attn", "moe_act", "shared_experts")},
     None),
    ("84 delay_wgrad without EP overlap", {**MOE, "delay_wgrad_compute": True}, None),
]

VARIATION_CASES: list = [
    # parallel layouts
    ("v tp2 sp full uniform 2", {**TP2, "sequence_parallel": True, **FULL1, "recompute_num_layers": 2}, None),
    ("v pp2 vpp2 full uniform 2", {**PP2, "virtual_pipeline_model_parallel_size": 2, **FULL1,
                                   "recompute_num_layers": 2}, None),
    ("v pp2 vpp2 full block 3", {**PP2, "virtual_pipeline_model_parallel_size": 2, **FULL1,
                                 "recompute_method": "block", "recompute_num_layers": 3}, None),
    ("v pp4 full uniform 4 (bound unchecked)", {"pipeline_model_parallel_size": 4, **FULL1,
                                                "recompute_num_layers": 4}, None),
    ("v tp2 no sp MoE sel moe", {**TP2, **MOE, "add_bias_linear": False, **sel("moe")}, None),
    ("v ep2 tp2 no sp (warning)", {**TP2, **MOE, "add_bias_linear": False,
                                   "expert_model_parallel_size": 2}, None),
    ("v ep2 tp2 sp", {**TP2, **MOE, "add_bias_linear": False, "expert_model_parallel_size": 2,
                      "sequence_parallel": True}, None),
    ("v tp4 gqa sp layernorm", {"tensor_model_parallel_size": 4, "num_query_groups": 2,
                                "sequence_parallel": True, **sel("layernorm")}, None),
    ("v cp2 sel core_attn", {"context_parallel_size": 2, **sel("core_attn")}, None),
    # labels and models
    ("v local impl core_attn", {"transformer_impl": "local", **sel("core_attn")}, None),
    ("v MoE layernorm moe_act mlp", {**MOE, **GG, **sel("layernorm", "moe_act", "mlp")}, None),
    ("v MoE freq 2 mlp", {**MOE, "moe_layer_freq": 2, **sel("mlp")}, None),
    ("v MLA layernorm mla_up_proj", {"multi_latent_attention": True, **sel("layernorm", "mla_up_proj")},
     None),
    ("v MLA + full", {"multi_latent_attention": True, **FULL1}, None),
    ("v selective empty + PP2", {**sel(), **PP2}, None),
    ("v moe_layer_recompute + sel []", {"moe_layer_recompute": True, **sel(), **MOE}, None),
    ("v moe_layer_recompute + EP overlap", {"moe_layer_recompute": True, **EPO, **MOE}, None),
    ("v mtp full uniform 2", {"mtp_num_layers": 1, **FULL1, "recompute_num_layers": 2}, None),
    ("v sel + bad method + num layers", {**SEL, "recompute_method": "bogus"}, None),
    ("v full + distribute TP2 no SP", {**FULL1, **TP2, "distribute_saved_activations": True}, None),
    # fp8 / TE versions (te_version known: live is told it)
    ("v fp8 tensorwise layernorm TE 2.8", {**fp8("tensorwise"), **sel("layernorm")}, "2.8.0"),
    ("v fp8 tensorwise layernorm TE 2.5", {**fp8("tensorwise"), **sel("layernorm")}, "2.5.0"),
    ("v fp8 mxfp8 moe_act TE 2.8", {**fp8("mxfp8"), **sel("moe_act"), **MOE, **GG}, "2.8.0"),
    ("v fp8 MoE grouped TE 1.9", {**fp8("tensorwise"), **MOE, **GG}, "1.9.0"),
    ("v fp8 MoE TE 1.6", {**fp8("tensorwise"), **MOE}, "1.6.0"),
    ("v fp8 delayed layernorm TE 2.8", {**fp8("delayed"), **sel("layernorm")}, "2.8.0"),
    ("v fp8 input store no swiglu", {**fp8("tensorwise"), "activation_func_fp8_input_store": True}, None),
    ("v fp8 input store swiglu", {**fp8("tensorwise"), "activation_func_fp8_input_store": True,
                                  "gated_linear_unit": True, "activation_func": "silu"}, None),
    ("v fp8 delayed + cpu offload + sel (order)", {**fp8("delayed"), **sel("layernorm"), **OFF}, None),
    # CUDA graphs
    ("v cg TE full_iteration scope", {**cg("transformer_engine", ["full_iteration"]), **FULL1}, None),
    ("v cg TE moe on dense", {**cg("transformer_engine", ["moe"]), **sel()}, None),
    ("v cg TE mlp on all-MoE", {**cg("transformer_engine", ["mlp"]), **MOE, **sel()}, None),
    ("v cg TE moe scope no padding", {**cg("transformer_engine", ["moe"]), **MOE, **sel("moe")}, None),
    ("v cg local moe_router + jitter moe", {**cg("local", ["moe_router"]), **MOE, **sel("moe"),
                                            "moe_input_jitter_eps": 0.01, "hidden_dropout": 0.0}, None),
    ("v cg local whole layer + jitter moe", {**cg("local"), **MOE, **sel("moe"),
                                             "moe_input_jitter_eps": 0.01, "hidden_dropout": 0.0,
                                             "attention_dropout": 0.0}, None),
    ("v cg TE attn + sel [] + full scope none", {**cg("transformer_engine", "full"), **sel(),
                                                 "attention_dropout": 0.0}, None),
    ("v cg TE moe_router layernorm", {**cg("transformer_engine", ["moe_router"]), **MOE, **sel("layernorm")},
     None),
    ("v cg local full_iteration + sel core_attn", {**cg("local", ["full_iteration"]), **sel("core_attn")},
     None),
    # EP overlap
    ("v EP overlap pp2 no vpp", {**EPO, **MOE, **PP2}, None),
    ("v EP overlap ep1", {**EPO, **MOE, "expert_model_parallel_size": 1}, None),
    ("v EP overlap allgather", {**EPO, **MOE, "moe_token_dispatcher_type": "allgather"}, None),
    ("v EP overlap no bf16", {**EPO, **MOE, "bf16": False}, None),
    ("v EP overlap + shared overlap", {**EPO, **MOE, **SHARED, "moe_shared_expert_overlap": True}, None),
    ("v EP overlap + cg local", {**EPO, **MOE, **cg("local", ["attn"]), **sel()}, None),
    ("v EP overlap + cg TE attn", {**EPO, **MOE, **cg("transformer_engine", ["attn"]), **sel()}, None),
    ("v EP overlap + num_layers only", {**EPO, **MOE, "recompute_num_layers": 2}, None),
    ("v delay_wgrad + EP overlap", {**EPO, **MOE, "delay_wgrad_compute": True}, None),
    # offloading
    ("v fine-grained bogus label", {**FG, "offload_modules": ["core_attn", "bogus"]}, None),
    ("v fine-grained qkv_linear + sel layernorm", {**FG, "offload_modules": ["qkv_linear"],
                                                   **sel("layernorm")}, None),
    ("v shared overlap allgather", {**MOE, **SHARED, "moe_shared_expert_overlap": True}, None),
    # pipeline split (placement.py)
    ("v uneven first stage 0, PP 1", {"num_layers_in_first_pipeline_stage": 0}, None),
    ("v uneven last stage -1", {**PP2, "num_layers_in_last_pipeline_stage": -1}, None),
    ("v uneven first 3 over VPP 2", {**PP2, "virtual_pipeline_model_parallel_size": 2,
                                      "num_layers_in_first_pipeline_stage": 3}, None),
    ("v uneven last 3 over VPP 2", {**PP2, "virtual_pipeline_model_parallel_size": 2,
                                     "num_layers_in_first_pipeline_stage": 2,
                                     "num_layers_in_last_pipeline_stage": 3}, None),
    ("v uneven first 8 of 8, PP 2", {**PP2, "num_layers_in_first_pipeline_stage": 8}, None),
    ("v uneven 26 middle layers over 3", {"num_layers": 32, "pipeline_model_parallel_size": 4,
                                          "num_layers_in_last_pipeline_stage": 6}, None),
    ("v uneven middle 3 over VPP 2", {"num_layers": 7, "pipeline_model_parallel_size": 3,
                                      "virtual_pipeline_model_parallel_size": 2,
                                      "num_layers_in_first_pipeline_stage": 2,
                                      "num_layers_in_last_pipeline_stage": 2}, None),
    ("v uneven 6|9|9|6 accepted", {"num_layers": 30, "pipeline_model_parallel_size": 4,
                                   "num_layers_in_first_pipeline_stage": 6,
                                   "num_layers_in_last_pipeline_stage": 6}, None),
    ("v uneven + embedding accounting", {**PP2, "num_layers_in_first_pipeline_stage": 2,
                                         "extra_model": {"account_for_embedding_in_pipeline_split": True}},
     None),
    ("v accounting 9 over PP 2", {**PP2, "extra_model": {"account_for_embedding_in_pipeline_split": True}},
     None),
    ("v accounting 9 over PP 2, VPP 2", {**PP2, "virtual_pipeline_model_parallel_size": 2,
                                         "extra_model": {"account_for_loss_in_pipeline_split": True}}, None),
    ("v accounting 10 over PP 2, VPP 2", {**PP2, "virtual_pipeline_model_parallel_size": 2,
                                          "extra_model": {"account_for_embedding_in_pipeline_split": True,
                                                          "account_for_loss_in_pipeline_split": True}}, None),
    # explicit layouts (placement.py; pipeline_parallel_layer_layout.py)
    ("v layout Et*4|t*4L accepted", {**PP2, "pipeline_model_parallel_layout": "Et*4|t*4L"}, None),
    ("v layout 14 layers uneven over PP 4", {"num_layers": 14, "pipeline_model_parallel_size": 4,
                                             "pipeline_model_parallel_layout": "Et*2|t*4|t*4|t*4L"}, None),
    ("v layout VPP 2 from the string", {**PP2, "pipeline_model_parallel_layout": "Et*2|t*2|t*2|t*2L"}, None),
    ("v layout list form + MTP", {**PP2, "mtp_num_layers": 1, "pipeline_model_parallel_layout":
                                  [["embedding"] + ["decoder"] * 4,
                                   ["decoder"] * 4 + ["mtp", "loss"]]}, None),
    ("v layout + first stage", {**PP2, "num_layers_in_first_pipeline_stage": 4,
                                "pipeline_model_parallel_layout": "Et*4|t*4L"}, None),
    ("v layout bad character", {**PP2, "pipeline_model_parallel_layout": "Et*4|x*4L"}, None),
    ("v layout 3 stages over PP 2", {**PP2, "pipeline_model_parallel_layout": "Et*4|t*2|t*2L"}, None),
    ("v layout bad name", {**PP2, "pipeline_model_parallel_layout": [["embedding", "decoders"], ["loss"]]},
     None),
    ("v layout VPP conflict", {**PP2, "virtual_pipeline_model_parallel_size": 2,
                               "pipeline_model_parallel_layout": "Et*4|t*4L"}, None),
    ("v layout no embedding first", {**PP2, "pipeline_model_parallel_layout": "t*4|Et*4L"}, None),
    ("v layout no loss last", {**PP2, "pipeline_model_parallel_layout": "Et*4|Lt*4"}, None),
    ("v layout two embeddings", {**PP2, "pipeline_model_parallel_layout": "Et*4|Et*4L"}, None),
    ("v layout two losses", {**PP2, "pipeline_model_parallel_layout": "Et*4L|t*4L"}, None),
    ("v layout 7 decoder layers", {**PP2, "pipeline_model_parallel_layout": "Et*4|t*3L"}, None),
    ("v layout MTP without mtp_num_layers", {**PP2, "pipeline_model_parallel_layout": "Et*4|t*4mL"}, None),
    ("v layout decoder after MTP", {**PP2, "mtp_num_layers": 1,
                                    "pipeline_model_parallel_layout": "Et*4|t*3mtL"}, None),
    ("v layout MTP in a first virtual stage", {**PP2, "mtp_num_layers": 1,
                                               "pipeline_model_parallel_layout": "Et*4|t*4m||L"}, None),
    ("v layout MTP split", {**PP2, "mtp_num_layers": 2,
                            "pipeline_model_parallel_layout": "Et*8m|mL"}, None),
    ("v layout sets VPP for EP overlap", {**EPO, **MOE, "pipeline_model_parallel_size": 2,
                                          "pipeline_model_parallel_layout": "Et*2|t*2|t*2|t*2L"}, None),
    ("v layout of one stage per rank, EP overlap", {**EPO, **MOE, "pipeline_model_parallel_size": 2,
                                                    "pipeline_model_parallel_layout": "Et*4|t*4L"},
     None),
    ("v layout encoder", {**PP2, "pipeline_model_parallel_layout":
                          [["embedding", "encoder"] + ["decoder"] * 4, ["decoder"] * 4 + ["loss"]]}, None),
    # release differences (cuda_graph_modules is a 0.18+ field; the scope migrates there)
    ("r cuda_graph_modules attn + sel []", {**cg("transformer_engine"), "cuda_graph_modules": ["attn"],
                                            **sel(), "attention_dropout": 0.0}, None),
    ("r scope and modules together", {**cg("local", ["attn"]), "cuda_graph_modules": ["mlp"]}, None),
    ("r scope full_iteration, impl none", {"cuda_graph_scope": ["full_iteration"], **sel()}, None),
    ("r scope full_iteration, impl none + full", {"cuda_graph_scope": ["full_iteration"], **FULL1}, None),
    ("r impl full_iteration + modules attn", {**cg("full_iteration"), "cuda_graph_modules": ["attn"]}, None),
    ("r cg TE moe + moe_router", {**cg("transformer_engine", ["moe", "moe_router"]), **MOE,
                                   "moe_expert_capacity_factor": 1.0,
                                   "extra_model": {"moe_pad_expert_input_to_capacity": True}}, None),
    ("r cg TE moe_preprocess alone", {**cg("transformer_engine", ["moe_preprocess"]), **MOE}, None),
    ("r cg impl full_iteration + cpu offloading", {**cg("full_iteration"), **OFF}, None),
    ("r fine-grained + cg local attn", {**FG, "offload_modules": ["core_attn"], **cg("local", ["attn"]),
                                        "attention_dropout": 0.0}, None),
    ("r fine-grained moe_act + cg local attn", {**FG, "offload_modules": ["moe_act"], **MOE, **GG,
                                               **cg("local", ["attn"]), "attention_dropout": 0.0}, None),
    ("r fine-grained moe_act + cg local whole layer", {**FG, "offload_modules": ["moe_act"], **MOE, **GG,
                                                      **cg("local"), "attention_dropout": 0.0}, None),
    ("r fine-grained moe_act + cg local moe (drop-pad)",
     {**FG, "offload_modules": ["moe_act"], **MOE, **GG, **cg("local", ["moe"]),
      "moe_expert_capacity_factor": 1.0, "extra_model": {"moe_pad_expert_input_to_capacity": True}}, None),
    ("r cg impl bogus", {"cuda_graph_impl": "bogus"}, None),
    ("r EP overlap + cg TE mlp on dense layers",
     {**EPO, **MOE, "moe_layer_freq": 2, **cg("transformer_engine", ["mlp"]), **sel(), "hidden_dropout": 0.0},
     None),
    ("r fine-grained core_attn + cg TE attn", {**FG, "offload_modules": ["core_attn"],
                                               **cg("transformer_engine", ["attn"])}, None),
    ("r fine-grained fused_group_mlp", {**FG, "offload_modules": ["fused_group_mlp"], **MOE, **GG}, None),
    ("r fine-grained fused_group_mlp + op fuser", {**FG, "offload_modules": ["fused_group_mlp"], **MOE, **GG,
                                                   "extra_model": {"use_transformer_engine_op_fuser": True}},
     None),
    ("r fine-grained fused_group_mlp + moe_act", {**FG, "offload_modules": ["fused_group_mlp", "moe_act"],
                                                  **MOE, **GG,
                                                  "extra_model": {"use_transformer_engine_op_fuser": True}},
     None),
    ("r fine-grained expert_fc1 + sel moe", {**FG, "offload_modules": ["expert_fc1"], **sel("moe"), **MOE},
     None),
    ("r fine-grained moe_act + sel moe_act", {**FG, "offload_modules": ["moe_act"], **sel("moe_act"),
                                              **MOE, **GG}, None),
    ("r EP overlap + cg local attn + sel []", {**EPO, **MOE, **cg("local", ["attn"]), **sel(),
                                              "attention_dropout": 0.0}, None),
    ("r EP overlap + cg TE moe_router", {**EPO, **MOE, **cg("transformer_engine", ["moe_router"]), **sel()},
     None),
    ("r shared overlap flex", {**MOE, **SHARED, "moe_shared_expert_overlap": True,
                               "moe_token_dispatcher_type": "flex"}, None),
    ("r gdn_norm_out with gated_delta_net", {**sel("gdn_norm_out"),
                                             "experimental_attention_variant": "gated_delta_net",
                                             "extra_model": {"linear_attention_freq": 1}}, None),
    ("r gdn_norm_out with gdn", {**sel("gdn_norm_out"), "experimental_attention_variant": "gdn"}, None),
    ("r fp8 MoE no TE (0.17+: 0.0.0)", {**fp8("tensorwise"), **MOE, **GG, **sel("moe_act")}, None),
    ("r EP overlap + moe_layer_recompute full", {**EPO, **MOE, "moe_layer_recompute": True}, None),
]

CASES = REFERENCE_CASES + VARIATION_CASES


def workload(overrides: dict) -> Workload:
    return Workload(**{**BASE, **overrides})


@dataclass
class Result:
    name: str
    live: tuple          # ("accept"|"reject", id, exception type)
    builtin: tuple
    live_warnings: frozenset
    builtin_warnings: frozenset
    live_message: Optional[str]

    @property
    def verdict_agrees(self) -> bool:
        return self.live == self.builtin

    @property
    def agrees(self) -> bool:
        return self.verdict_agrees and self.live_warnings == self.builtin_warnings


def run_case(name: str, overrides: dict, te_version: Optional[str]) -> Result:
    from mbridge_recompute.facts import releases
    from mbridge_recompute.rules import builtin, live

    version = releases.target_version()
    w = workload(overrides)
    out = live.build(w, te_version)
    if out.exc_type is None:
        live_v = ("accept", None, None)
    else:
        cid = live.map_message(out.exc_message, version, out.exc_file, out.exc_line)
        live_v = ("reject", cid, out.exc_type)
    live_w = set()
    for message, file, line in out.warnings:
        cid = live.map_message(message, version, file, line, warning=True)
        if cid and cid != "cuda-graph-full-scope-deprecated":
            live_w.add(cid)
    ev = builtin.evaluate(w, version, te_version, assume_te_absent=te_version is None)
    return Result(name, live_v, ev.verdict(), frozenset(live_w), frozenset(ev.warnings_before_error),
                  out.exc_message)


def run_matrix(cases: list = CASES) -> list:
    return [run_case(*c) for c in cases]


def summary(results: list) -> str:
    n = len(results)
    verdict = sum(r.verdict_agrees for r in results)
    full = sum(r.agrees for r in results)
    rejected = sum(r.live[0] == "reject" for r in results)
    return (f"agreement: {verdict}/{n} verdicts (accept/reject + constraint id + exception type); "
            f"{full}/{n} including config warnings; {rejected} cases rejected by TransformerConfig")


# ------------------------------------------------------------------ run in a release's environment
def installed_label_sets() -> dict:
    """The recompute_modules and offload_modules sets the installed TransformerConfig allows,
    read from its source (the `allowed_modules` set literals of __post_init__)."""
    import ast

    import megatron.core.transformer.transformer_config as tc

    tree = ast.parse(Path(tc.__file__).read_text())
    sets = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "allowed_modules"
                                                for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:        # set([...])
                value = value.args[0]
            if isinstance(value, (ast.Set, ast.List, ast.Tuple)):
                sets.append({e.value for e in value.elts if isinstance(e, ast.Constant)})
    out = {}
    for found in sets:
        key = "recompute_modules" if "mla_up_proj" in found else "offload_modules" if "attn_norm" in found \
            else None
        if key:
            out[key] = sorted(found)
    return out


def _literals(lines: list) -> str:
    """The string literals of a source range, concatenated; f-string fields become {}."""
    import re

    parts = []
    for line in lines:
        for m in re.finditer(r"""[fr]?(['"])(.*?)(?<!\\)\1""", line):
            parts.append(m.group(2))
    return re.sub(r"\{[^}]*\}", "{}", "".join(parts))


def cited_message_problems() -> list:
    """Config constraints of the installed release whose message is not the string literal at
    the lines the card cites for it."""
    import re

    import megatron.core as mc

    from mbridge_recompute.facts import card, releases

    key = releases.target_version()
    # the card's abbreviations are paths from the checkout root (megatron/core/...)
    checkout = Path(mc.__file__).parents[2]
    files = {a: checkout / card.load()["abbreviations"][a] for a in ("tc", "mpc", "cgc", "ppl")}
    problems = []
    for c in card.constraints():
        entry = card.constraint_at(c["id"], key)
        if c["kind"] != "config" or entry is None or not entry["message"] or "(from" in entry["at"] \
                and not files["cgc"].exists():
            continue
        where = card.site(entry["at"])
        if where.file not in files:
            continue
        lines = files[where.file].read_text().splitlines()[where.start - 1:where.end]
        want = re.sub(r"\{[^}]*\}", "{}", entry["message"])
        if want.startswith("TransformerConfig.__init__()"):
            continue      # Python's own message for an unknown keyword, not a literal
        if want not in _literals(lines):
            problems.append(f"{c['id']}: {want!r} is not at {entry['at']} @ {releases.meta(key)['tag']}")
    return problems


def main(argv: list | None = None) -> int:
    """`python -m mbridge_recompute.rules.differential`: the matrix against the installed
    megatron-core, as one JSON object (what tests/test_releases.py reads per release)."""
    import json
    import sys

    from mbridge_recompute.facts import releases

    results = run_matrix()
    out = {"installed": releases.installed_mcore_version(), "facts": releases.target_version(),
           "summary": summary(results), "label_sets": installed_label_sets(),
           "cited_message_problems": cited_message_problems(),
           "results": [{"name": r.name, "live": list(r.live), "builtin": list(r.builtin),
                        "live_warnings": sorted(r.live_warnings),
                        "builtin_warnings": sorted(r.builtin_warnings),
                        "live_message": r.live_message} for r in results]}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
