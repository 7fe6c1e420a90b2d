"""Catalog arithmetic against hand computations: KV/hidden bytes, parameters, capacity M, TP, all-reduce."""
import numpy as np
import pytest

from costmodels import GPUS, MODELS, get_gpu, get_model, kv_capacity_tokens
from costmodels.catalog import GiB
from costmodels.errors import UserError

MiB, KiB = 1024 ** 2, 1024


def test_kv_bytes_per_token_by_hand():
    assert get_model("llama-2-7b").kv_bytes_per_token() == 0.5 * MiB          # 2·32·32·128·2
    assert get_model("llama-3-8b").kv_bytes_per_token() == 128 * KiB          # 8 KV heads: 2·32·8·128·2
    assert get_model("llama-2-7b").kv_bytes_per_token("int8") == 0.25 * MiB
    assert get_model("opt-13b").kv_bytes_per_token() == 800 * KiB             # Apt-Serve spec table
    assert get_model("opt-13b").hidden_bytes_per_token() == 400 * KiB
    # GQA: the hidden cache is larger than KV when kv_heads < heads / 2
    m = get_model("llama-3-8b")
    assert m.hidden_bytes_per_token() == 2 * m.kv_bytes_per_token()


def test_tp_shards_kv_and_replicates_beyond_kv_heads():
    m = get_model("llama-3-8b")
    assert m.kv_bytes_per_token(tp=2) == 64 * KiB
    assert m.kv_bytes_per_token(tp=8) == 16 * KiB   # one KV head per GPU
    m70 = get_model("llama-2-70b")
    assert m70.kv_heads_per_gpu(8) == 1
    with pytest.raises(UserError, match="allowed: 1, 2, 4, 8"):
        m.check_tp(3)


def test_parameter_counts_match_public_sizes():
    expected = {"llama-2-7b": 6.74e9, "llama-2-13b": 13.0e9, "llama-2-70b": 69.0e9, "llama-3-8b": 8.03e9,
                "mistral-7b": 7.24e9, "opt-13b": 12.85e9, "opt-66b": 65.7e9}
    for name, n in expected.items():
        assert get_model(name).params() == pytest.approx(n, rel=0.02), name


def test_capacity_m_by_hand():
    m, g = get_model("llama-2-7b"), get_gpu("a100-80gb")
    params = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008) + 2 * 32000 * 4096
    assert m.params() == params
    free = 80 * GiB * 0.9 - 2 * params
    assert kv_capacity_tokens(m, g, 0.9) == int(free // (0.5 * MiB))          # ≈ 121.7K tokens
    assert 121_000 < kv_capacity_tokens(m, g, 0.9) < 122_500
    reserve = m.activation_reserve_bytes(4096)
    assert kv_capacity_tokens(m, g, 0.9, activation_reserve_bytes=reserve) == int((free - reserve) // (0.5 * MiB))
    # TP=2 on Llama-2-70B: half the weights and half the KV per GPU
    m70 = get_model("llama-2-70b")
    free70 = 80 * GiB * 0.9 - m70.params()   # 2 bytes × params / 2 GPUs
    assert kv_capacity_tokens(m70, g, 0.9, tp=2) == int(free70 // m70.kv_bytes_per_token(tp=2))
    assert kv_capacity_tokens(m, g, 0.9, kv_dtype="int8") == int(free // (0.25 * MiB))


def test_weights_that_do_not_fit_name_the_fix():
    with pytest.raises(UserError, match="raise hardware.tp"):
        kv_capacity_tokens(get_model("llama-2-70b"), get_gpu("a100-80gb"), 0.9, tp=1)


def test_activation_reserve_is_a_sane_fraction_of_memory():
    m = get_model("llama-2-7b")
    r = m.activation_reserve_bytes(4096)
    assert 0.1 * GiB < r < 2 * GiB
    assert m.activation_reserve_bytes(8192) > r


def test_allreduce_lines_by_hand():
    from costmodels.collectives import _fits
    g = get_gpu("a100-80gb")
    assert g.allreduce_time_s(1e6, 1) == 0.0
    nbytes = 4096 * 4096 * 2
    a1, b1, a2, b2 = _fits()["nccl"]["a100_dgx"]["4"]          # NCCL on an A100 NVSwitch node, 4 GPUs
    assert g.allreduce_time_s(nbytes, 4) == pytest.approx(min(a1 + nbytes / b1, a2 + nbytes / b2))
    h = get_gpu("h100-sxm")                                    # small messages: vLLM's custom kernel if faster
    a, b = _fits()["custom"]["h100_dgx"]["4"]
    c1, d1, c2, d2 = _fits()["nccl"]["h100_dgx"]["4"]
    small = 64 * 1024
    assert h.allreduce_time_s(small, 4) == pytest.approx(min(a + small / b, c1 + small / d1, c2 + small / d2))
    assert h.allreduce_time_s(small, 4, backend="nccl") == pytest.approx(min(c1 + small / d1, c2 + small / d2))
    l40s = get_gpu("l40s")   # no NVLink and no fitted node: a ring over PCIe from the datasheet
    assert l40s.allreduce_time_s(nbytes, 2) == pytest.approx(20e-6 + nbytes / (0.7 * 32e9))
    assert l40s.allreduce_time_s(nbytes, 2) > g.allreduce_time_s(nbytes, 2)
    sizes = np.geomspace(1e3, 64e6, 50)
    for gpu in (g, h, l40s):                                   # never less time for a bigger message
        t = gpu.allreduce_time_s(sizes, 4)
        assert (np.diff(t) >= 0).all(), gpu.name


def test_datasheet_ordering():
    g = GPUS
    assert g["h100-sxm"].peak_flops > g["a100-80gb"].peak_flops > g["v100"].peak_flops
    assert g["h200"].hbm_bytes_per_s > g["h100-sxm"].hbm_bytes_per_s > g["a100-80gb"].hbm_bytes_per_s > g["a100-40gb"].hbm_bytes_per_s
    assert g["h200"].mem_bytes > g["a100-80gb"].mem_bytes > g["a40"].mem_bytes > g["v100"].mem_bytes
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b", "opt-2.7b",
            "opt-6.7b", "opt-13b", "opt-30b", "opt-66b"} <= set(MODELS)
