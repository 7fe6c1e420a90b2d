"""Model configs that cannot exist are refused in one line (config.json import, catalog entries, tensor parallelism,
weights against the GPU when M is given), and real configs still load."""
import json

import pytest

from costmodels import get_model
from costmodels.catalog import MODELS, ModelSpec, model_from_hf_config
from costmodels.errors import UserError
from sim.cli import main
from sim.scenario.config import scenario_from_dict
from sim.cluster.runner import run_scenario

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
         "hidden_act": "silu", "torch_dtype": "bfloat16"}
MOE = {**LLAMA, "num_local_experts": 8, "num_experts_per_tok": 2}


@pytest.mark.parametrize("change,message", [
    ({"num_key_value_heads": 40}, "num_attention_heads 32 must be a multiple of num_key_value_heads 40"),
    ({"num_key_value_heads": 5}, "num_attention_heads 32 must be a multiple of num_key_value_heads 5"),
    ({"hidden_size": 4100}, "hidden_size 4100 is not divisible by num_attention_heads 32"),
    ({"torch_dtype": "float64"}, "torch_dtype 'float64' is not a serving precision"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
    ({"num_hidden_layers": 10 ** 12}, "num_hidden_layers 1000000000000 is more than any model has"),
    ({"intermediate_size": -3}, "'intermediate_size' must be a non-negative integer"),
    ({"max_position_embeddings": -1}, "'max_position_embeddings' must be a non-negative integer"),
])
def test_impossible_dense_configs_are_refused_naming_the_key(change, message):
    with pytest.raises(UserError, match=message) as e:
        model_from_hf_config({**LLAMA, **change}, "x", "m/config.json")
    assert str(e.value).startswith("m/config.json: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("change,message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 must be between 1 and the 8 experts"),
    ({"first_k_dense_replace": 32}, "first_k_dense_replace 32 leaves no MoE layer of 32"),
])
def test_impossible_moe_configs_are_refused_naming_the_key(change, message):
    with pytest.raises(UserError, match=message):
        model_from_hf_config({**MOE, **change}, "x", "m/config.json")


def test_real_configs_still_load():
    assert model_from_hf_config(LLAMA, "l").kv_heads == 8
    assert model_from_hf_config(MOE, "m").experts_per_token == 2
    assert model_from_hf_config({**LLAMA, "torch_dtype": "float32"}, "f").dtype == "fp16"   # served in 16 bits
    assert model_from_hf_config({**LLAMA, "hidden_size": 5120, "head_dim": 128}, "n").head_dim == 128


@pytest.mark.parametrize("kwargs,message", [
    (dict(kv_heads=3), "heads 4 must be a multiple of kv_heads 3"),
    (dict(kv_heads=8), "heads 4 must be a multiple of kv_heads 8"),
    (dict(layers=0), "layers must be a positive integer"),
    (dict(vocab=-5), "vocab must be a positive integer"),
    (dict(experts=4, experts_per_token=5, expert_ffn=64), "experts_per_token 5 must be between 1 and experts 4"),
    (dict(experts=4, experts_per_token=0, expert_ffn=64), "experts_per_token 0 must be between 1 and experts 4"),
    (dict(experts=4, experts_per_token=2), "needs expert_ffn > 0"),
    (dict(experts_per_token=2), "experts_per_token or expert_ffn is set but experts is 0"),
    (dict(dtype="float64"), "dtype 'float64' is not allowed"),
])
def test_catalog_entries_that_cannot_exist_are_refused(kwargs, message):
    base = dict(name="bad", layers=2, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=1024, max_context=2048)
    with pytest.raises(UserError, match=message):
        ModelSpec(**{**base, **kwargs})


def test_every_catalog_model_passes_the_checks():
    for m in MODELS.values():
        m.check()


def test_tensor_parallelism_must_split_or_replicate_kv_heads():
    """vLLM shards KV heads when tp divides them and copies them when tp is a multiple of them; 6 KV heads over 4
    GPUs is neither."""
    m = ModelSpec("g", 2, 768, 12, 6, 1024, 1000, 2048)
    with pytest.raises(UserError, match="6 KV heads: tp=4 must divide them or be a multiple of them"):
        m.check_tp(4)
    m.check_tp(2)
    get_model("llama-3.1-70b").check_tp(8)            # 8 KV heads over 8 GPUs
    get_model("qwen2.5-7b").check_tp(4)               # 4 KV heads over 4
    with pytest.raises(UserError, match="heads 28, not divisible by tp=8"):
        get_model("qwen2.5-7b").check_tp(8)


def test_cli_import_of_an_impossible_config_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_key_value_heads": 40}))
    assert main(["model", "import", str(tmp_path / "config.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_key_value_heads 40" in err[0] and "config.json" in err[0]


def test_given_m_does_not_skip_the_weights_check():
    """A 70B model in 16 bits (~128 GiB) cannot sit on one 80 GB A100 whatever M says; at tp=2 it fits."""
    def scn(tp):
        return scenario_from_dict({"name": "w", "model": {"name": "llama-2-70b"},
                                   "hardware": {"gpu": "a100-80gb", "tp": tp}, "memory": {"M": 10000},
                                   "workload": {"kind": "synthetic", "num_requests": 3}})
    with pytest.raises(UserError, match="memory.M: llama-2-70b's weights .* do not fit in a100-80gb"):
        run_scenario(scn(1))
    assert run_scenario(scn(2)).summary["completed"] == 3
