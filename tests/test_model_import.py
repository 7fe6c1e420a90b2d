"""Models from a Hugging Face config.json: fields read right (head_dim, GQA, MoE, MLA, FP8, tied embeddings), the
same entries as the hand-written catalog, the CLI and scenario paths, and one-line errors."""
import json

import pytest

from costmodels import get_model
from costmodels.catalog import load_model_config, model_from_hf_config, spec_as_python
from costmodels.errors import UserError
from sim.cli import main
from sim.cluster.runner import run_scenario
from sim.scenario.config import scenario_from_dict

# Public config.json facts (numbers only) of the models the validation data names.
NEMO = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120, "num_hidden_layers": 40,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
        "vocab_size": 131072, "max_position_embeddings": 1024000, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 32768, "hidden_act": "silu", "torch_dtype": "bfloat16"}
SCOUT_FP8 = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
    "max_position_embeddings": 10485760, "hidden_act": "silu", "torch_dtype": "bfloat16"},
    "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                            "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}},
    "tie_word_embeddings": False}
DEEPSEEK_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
                 "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                 "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                 "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                 "vocab_size": 102400, "max_position_embeddings": 163840, "torch_dtype": "bfloat16"}


def test_head_dim_is_read_not_derived():
    m = model_from_hf_config(NEMO, "nemo")
    assert m.head_dim == 128 != m.hidden // m.heads
    assert m.q_width == 32 * 128
    assert m.kv_bytes_per_token() == 2 * 40 * 8 * 128 * 2
    assert m.dtype == "bf16" and not m.is_moe


def test_imported_entries_match_the_hand_written_catalog():
    for cfg, name in ((NEMO, "mistral-nemo-12b"), (MIXTRAL, "mixtral-8x7b")):
        got, want = model_from_hf_config(cfg, name), get_model(name)
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "experts",
                  "experts_per_token", "expert_ffn"):
            assert getattr(got, f) == getattr(want, f), (name, f)
        assert got.params() == pytest.approx(want.params(), rel=1e-9)


def test_mixtral_moe_counts_all_experts_in_weights_and_two_per_token():
    m = model_from_hf_config(MIXTRAL, "mixtral")
    assert (m.experts, m.experts_per_token, m.expert_ffn) == (8, 2, 14336)
    assert 46e9 < m.params() < 47.5e9                       # Mixtral 8x7B: 46.7B parameters


def test_llama4_scout_fp8_reads_the_text_config_and_the_quantization():
    m = model_from_hf_config(SCOUT_FP8, "scout-fp8")
    assert (m.experts, m.experts_per_token, m.ffn, m.expert_ffn, m.shared_expert_ffn) == (16, 1, 16384, 8192, 8192)
    assert m.dtype == "fp8"
    assert 107e9 < m.params() < 110e9                      # 109B total parameters (text)
    # FP8 halves the expert and attention weights; embeddings and lm_head stay 16-bit
    emb = m.embedding_params()
    assert m.weight_bytes() == pytest.approx((m.params() - emb) * 1 + emb * 2)


def test_deepseek_mla_caches_the_latent_and_counts_shared_experts():
    m = model_from_hf_config(DEEPSEEK_LITE, "dsv2-lite")
    assert m.is_mla and m.kv_bytes_per_token() == 27 * (512 + 64) * 2
    assert m.shared_expert_ffn == 2 * 1408 and m.dense_layers == 1 and m.moe_layer_count() == 26


def test_cli_import_prints_a_catalog_entry_and_scenarios_can_name_the_file(tmp_path, capsys):
    folder = tmp_path / "Mistral-Nemo"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(NEMO))
    assert main(["model", "import", str(folder / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "ModelSpec('mistral-nemo', 40, 5120, 32, 8, 14336, 131072" in out and "head_dim=128" in out
    assert spec_as_python(load_model_config(folder)).startswith("ModelSpec('mistral-nemo'")
    scn = scenario_from_dict({"model": {"config": str(folder / "config.json")}, "hardware": {"gpu": "h100-sxm"},
                              "memory": {"M": 20000}, "workload": {"kind": "synthetic", "num_requests": 5}})
    res = run_scenario(scn)
    assert res.summary["completed"] == 5 and "mistral-nemo" in res.meta["costmodel"]


@pytest.mark.parametrize("cfg,message", [
    ({"hidden_size": 4096}, "missing field 'num_hidden_layers'"),
    ({**NEMO, "num_attention_heads": "32"}, "field 'num_attention_heads' must be a non-negative integer"),
    ({**MIXTRAL, "intermediate_size": None}, "mixture-of-experts config needs intermediate_size"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_configs_are_one_line(cfg, message):
    with pytest.raises(UserError, match=message):
        model_from_hf_config(cfg, "x")


def test_unreadable_config_files_are_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a JSON file"):
        load_model_config(bad)
    assert main(["model", "import", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such config.json" in err[0]
