"""`--hf-config config.json`: Hugging Face keys become Megatron-Core fields."""

from __future__ import annotations

import json

import pytest

from mbridge_recompute.errors import InputError
from mbridge_recompute.inputs import hf_config
from mbridge_recompute.inputs.loading import load_workload

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
         "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
         "hidden_act": "silu", "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False,
         "rope_theta": 500000.0, "max_position_embeddings": 8192, "bos_token_id": 128000,
         "torch_dtype": "bfloat16"}
MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "router_aux_loss_coef": 0.02}
DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
            "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "moe_layer_freq": 1, "num_nextn_predict_layers": 1, "vocab_size": 129280,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def _write(tmp_path, data, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_llama_config_maps_to_gqa_swiglu_rmsnorm_fields(tmp_path):
    f = hf_config.model_fields(_write(tmp_path, LLAMA))
    assert f == {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
                 "ffn_hidden_size": 14336, "vocab_size": 128256,
                 "share_embeddings_and_output_weights": False, "gated_linear_unit": True,
                 "activation_func": "silu", "normalization": "RMSNorm", "add_bias_linear": False}
    w = load_workload(hf_config=str(_write(tmp_path, LLAMA)))
    assert w.swiglu and w.heads_kv == 8 and w.head_dim == 128 and not w.is_moe


def test_mixtral_experts_use_intermediate_size_and_every_layer_is_moe(tmp_path):
    f = hf_config.model_fields(_write(tmp_path, MIXTRAL))
    assert (f["num_moe_experts"], f["moe_router_topk"], f["moe_ffn_hidden_size"]) == (8, 2, 14336)
    assert f["moe_layer_freq"] == [1] * 32
    assert "moe_shared_expert_intermediate_size" not in f
    w = load_workload(hf_config=str(_write(tmp_path, MIXTRAL)))
    assert w.layer_kinds() == ["attn+moe"] * 32 and w.moe_grouped_gemm


def test_deepseek_config_maps_mla_dims_shared_experts_dense_prefix_and_mtp(tmp_path):
    f = hf_config.model_fields(_write(tmp_path, DEEPSEEK))
    assert f["multi_latent_attention"] is True
    assert (f["q_lora_rank"], f["kv_lora_rank"], f["qk_head_dim"], f["qk_pos_emb_head_dim"],
            f["v_head_dim"]) == (1536, 512, 128, 64, 128)
    assert "num_query_groups" not in f          # MLA has no query groups
    assert f["moe_shared_expert_intermediate_size"] == 2048
    assert f["moe_layer_freq"] == [0, 0, 0] + [1] * 58
    assert f["mtp_num_layers"] == 1 and f["qk_layernorm"] is True
    w = load_workload(hf_config=str(_write(tmp_path, DEEPSEEK)))
    assert w.layer_kinds()[2:4] == ["attn+mlp", "attn+moe"]


def test_qwen3_moe_sparse_step_and_dense_layers(tmp_path):
    cfg = dict(MIXTRAL, model_type="qwen3_moe", num_experts=128, num_local_experts=None,
               moe_intermediate_size=768, num_hidden_layers=6, decoder_sparse_step=1,
               mlp_only_layers=[0, 5], head_dim=128)
    f = hf_config.model_fields(_write(tmp_path, cfg))
    assert f["num_moe_experts"] == 128 and f["moe_ffn_hidden_size"] == 768
    assert f["moe_layer_freq"] == [0, 1, 1, 1, 1, 0]
    assert f["qk_layernorm"] is True and f["kv_channels"] == 128


def test_unknown_keys_are_ignored_with_a_note(tmp_path, capsys):
    f = hf_config.model_fields(_write(tmp_path, dict(LLAMA, fancy_new_gate=3)))
    assert "fancy_new_gate" not in f
    err = " ".join(capsys.readouterr().err.split())     # the note is wrapped to the text width
    assert "ignored keys not used by the memory model: fancy_new_gate" in err


@pytest.mark.parametrize("content, why", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    (json.dumps({"hidden_size": 8}), "missing 'num_hidden_layers'"),
    (json.dumps(dict(LLAMA, num_hidden_layers=-3)), "num_hidden_layers must be a non-negative integer"),
])
def test_bad_config_json_is_an_input_error_naming_the_file(tmp_path, content, why):
    p = _write(tmp_path, content)
    with pytest.raises(InputError) as exc:
        hf_config.model_fields(p)
    assert exc.value.field == "--hf-config"
    assert why in exc.value.reason
    assert str(p) in exc.value.reason or "num_hidden_layers" in why


def test_missing_config_json_exits_2_naming_the_file(run_tool, tmp_path):
    p = run_tool("plan", "--hf-config", str(tmp_path / "nope.json"))
    assert p.returncode == 2
    assert p.stderr.strip() == f"error: --hf-config: {tmp_path / 'nope.json'}: no such file"
