"""KV manager block arithmetic, watermark and swap; catalog memory math; the linear cost model by hand."""
import pytest

from costmodels import BatchShape, get_gpu, get_model, kv_capacity_tokens
from costmodels.linear import LinearCostModel
from sim.kv.paged import KVCacheManager
from sim.engine.request import Request


def test_blocks_round_up_and_free():
    m = KVCacheManager(100, block_size=16)
    assert m.total_blocks == 6 and m.capacity_tokens == 96
    r = Request(0, 0, 17, 4)
    assert m.reserve(r, 17) and r.blocks == 2 and m.used_tokens == 32
    assert m.reserve(r, 32) and r.blocks == 2           # still fits in 2 blocks
    assert m.reserve(r, 33) and r.blocks == 3
    m.free(r)
    assert m.free_blocks == 6 and r.blocks == 0


def test_watermark_applies_to_admission_only():
    m = KVCacheManager(100, block_size=1, watermark=0.1)     # 10 blocks kept free for admissions
    a, b = Request(0, 0, 1, 1), Request(1, 0, 1, 1)
    assert not m.reserve(a, 91, admission=True)
    assert m.reserve(a, 90, admission=True)
    assert m.reserve(b, 10, admission=False)                 # running growth may use the watermark
    assert m.free_blocks == 0


def test_swap_moves_blocks_between_gpu_and_cpu():
    m = KVCacheManager(64, block_size=16, swap_capacity_tokens=32)
    r = Request(0, 0, 20, 4)
    m.reserve(r, 20)
    r.cached = 20
    assert m.can_swap_out(r) and m.swap_out(r) == 20
    assert m.free_blocks == 4 and m.swap_free_blocks == 0 and r.swap_blocks == 2
    assert m.swap_in(r, 21) and m.swap_free_blocks == 2 and r.blocks == 2


def test_kv_bytes_and_capacity_by_hand():
    l2 = get_model("llama-2-7b")
    assert l2.kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2 == 512 * 1024      # 0.5 MiB
    assert get_model("llama-3-8b").kv_bytes_per_token() == 128 * 1024          # 8 KV heads
    assert get_model("llama-3-8b").kv_bytes_per_token("int8") == 64 * 1024
    assert abs(l2.params() - 6.74e9) / 6.74e9 < 0.01
    M = kv_capacity_tokens(l2, get_gpu("a100-80gb"), 0.9)
    assert M == int((80 * 2**30 * 0.9 - l2.params() * 2) // (512 * 1024))    # ≈ 122K, InferMax §5
    assert 120_000 < M < 123_000


def test_linear_model_by_hand():
    cm = LinearCostModel({"a_o": 0.002, "b_o": 0.1, "a_p": 1e-7, "b_p": 0.05, "a_d": 1e-5, "b_d": 0.02,
                          "a_pk": 2e-7, "s_d": 0.001}, layers=2)
    shape = BatchShape(prefill_tokens=[100, 50], prefill_context=[0, 200], decode_context=[300, 400])
    per_layer_ms = (0.002 * 152 + 0.1 + 1e-7 * (100**2 + 50**2) + 2e-7 * (50 * 200) + 0.05
                    + 1e-5 * 700 + 0.001 * 2 + 0.02)
    assert cm.batch_time(shape) == pytest.approx(2 * per_layer_ms * 1e-3)
    # the attention biases only apply when that part of the batch is present
    only_decode = BatchShape(decode_context=[10])
    assert cm.batch_time(only_decode) == pytest.approx(2e-3 * (0.002 + 0.1 + 1e-5 * 10 + 0.001 + 0.02))
    paper = LinearCostModel(cm.coefficients, layers=2, features="paper")
    assert paper.batch_time(shape) < cm.batch_time(shape)     # no cross / per-request terms


def test_fit_reproduces_shipped_coefficients(shared_data):
    """The committed YAML is what fitting the public Vidur profile gives (provenance is real)."""
    from costmodels.linear import default_profile_path, fit_default
    fitted = fit_default(shared_data / "profiles" / "vidur-a100-llama-2-7b")
    shipped = LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"))
    for k, v in shipped.coefficients.items():
        assert fitted.coefficients[k] == pytest.approx(v, rel=1e-4, abs=1e-12), k
