"""MoE in roofline v2: distinct experts a step's tokens reach (hand-worked), the grouped GEMM reading only those
experts' weights, and the fused-MoE factor pricing 8-bit experts only."""
import numpy as np
import pytest

from costmodels import get_gpu, get_model
from costmodels.base import BatchShape, Overheads
from costmodels.operators import Shard, experts_touched
from costmodels.roofline import MOE_BLOCK_ROWS, RooflineCostModel

H100 = get_gpu("h100-sxm")
MIXTRAL = get_model("mixtral-8x7b")


def test_expected_distinct_experts_hand_worked():
    """E·(1 − (1 − k/E)^b): Mixtral (E 8, top-2) one token reaches 2, two tokens 8·(1 − 0.75²) = 3.5, three
    8·(1 − 0.421875) = 4.625; Llama-4-Scout (E 16, top-1) 16 tokens 16·(1 − 0.35607) = 10.303; never above E."""
    mix = Shard.of(MIXTRAL, 2)
    assert experts_touched(mix, 1) == pytest.approx(2.0)
    assert experts_touched(mix, 2) == pytest.approx(3.5)
    assert experts_touched(mix, 3) == pytest.approx(4.625)
    scout = Shard.of(get_model("llama-4-scout-17b-16e"), 2)
    assert experts_touched(scout, 16) == pytest.approx(10.3028, abs=1e-4)
    n = np.arange(1, 5000)
    reached = experts_touched(mix, n)
    assert np.all(np.diff(reached) >= 0) and reached.max() <= 8.0 and reached[63] > 7.99   # saturates
    assert experts_touched(Shard.of(get_model("llama-2-7b")), 64) == 0.0          # dense: none


def _expert_gemms_s(cm, n):
    """The routed experts' two grouped GEMMs, by hand: the reached experts' weights (and the rows' activations)
    over bandwidth, or the FLOPs of the rows padded to the kernel's block plus the occupancy rows, over peak."""
    s, p = cm.shard, cm.params_in_use
    reached = s.experts * (1 - (1 - s.top_k / s.experts) ** n)
    work = n * s.top_k
    total = 0.0
    for k, nn in ((s.hidden, 2 * s.expert_ffn), (s.expert_ffn, s.hidden)):
        memory = (reached * k * nn * s.weight_bytes + work * (k + nn) * 2.0) / (H100.hbm_bytes_per_s *
                                                                                p["gemm_memory_eff"])
        compute = 2.0 * k * nn * (work + reached * MOE_BLOCK_ROWS / 2 + p["gemm_m_half"]) / \
            (cm.gemm_peak * p["gemm_compute_eff"])
        total += max(memory, compute) + p["gemm_overhead_s"]
    return total


def _other_moe_s(cm, n):
    """What moe_time holds besides the expert GEMMs: the router and the activation (elementwise)."""
    s = cm.shard
    return float(cm.gemm_time(n, s.hidden, s.experts, weight_bytes=2.0)) + \
        float(cm.elementwise_time(3.0 * n * s.top_k * s.expert_ffn * 2.0))


@pytest.mark.parametrize("n", [1, 2, 8, 64, 128])
def test_bf16_expert_gemms_read_only_the_reached_experts_and_take_no_engine_factor(n):
    """Mixtral-8x7B bf16 at TP2 with the `vllm` overheads (moe_gemm_scale 1.13): the experts are priced by the
    roofline alone. One decode token reads 2 experts' weights: 2 · 3 · 4096 · 7168 · 2 B = 352 MB per layer."""
    cm = RooflineCostModel(MIXTRAL, H100, tp=2, overheads=Overheads.from_spec("vllm"))
    assert cm.overheads.moe_gemm_scale > 1.05
    assert float(cm.moe_time(n)) == pytest.approx(_expert_gemms_s(cm, n) + _other_moe_s(cm, n), rel=1e-9)
    if n == 1:
        p = cm.params_in_use
        weights = 2 * 3 * 4096 * 7168 * 2
        assert weights == 352_321_536
        floor = weights / (H100.hbm_bytes_per_s * p["gemm_memory_eff"])
        assert floor < float(cm.moe_time(1)) < floor * 1.2


def test_decode_step_of_bf16_moe_is_weights_over_bandwidth_at_the_batch_that_reaches_every_expert():
    """At 128 decode requests all 8 experts are reached: the step is not faster than streaming every weight (the
    physics floor) and within 1.5x of it at the fitted memory efficiency (KV reads, all-reduces and CPU on top)."""
    cm = RooflineCostModel(MIXTRAL, H100, tp=2, overheads=Overheads.from_spec("vllm"))
    step = cm.batch_time(BatchShape([], [], [700] * 128))
    floor = MIXTRAL.weight_bytes() / 2 / H100.hbm_bytes_per_s
    assert floor < step < 1.5 * floor / cm.params_in_use["gemm_memory_eff"]


def test_fused_moe_factor_prices_8bit_experts_only():
    """The factor was fitted on an FP8 checkpoint (Llama-4-Scout): FP8 experts take it, the same model in bf16
    does not, and neither do dense models."""
    d = BatchShape([], [], [600] * 32)
    for name, moves in (("llama-4-scout-17b-16e-fp8", True), ("llama-4-scout-17b-16e", False),
                        ("mixtral-8x7b", False), ("llama-2-7b", False)):
        m = get_model(name)
        plain = RooflineCostModel(m, H100, tp=2)
        scaled = RooflineCostModel(m, H100, tp=2, overheads=Overheads(moe_gemm_scale=1.5))
        assert (scaled.batch_time(d) > plain.batch_time(d)) == moves, name


def test_grouped_gemm_fills_the_gpu_with_every_experts_rows():
    """Prefill-sized steps: the grouped GEMM's occupancy is that of all its rows together, so 2,048 tokens over 8
    experts cost about what one dense GEMM of their 4,096 rows (plus padding) costs, not 8 small GEMMs' worth."""
    cm = RooflineCostModel(MIXTRAL, H100, tp=2)
    s, p = cm.shard, cm.params_in_use
    n = 2048
    grouped = _expert_gemms_s(cm, n)
    dense = sum(float(cm.gemm_time(n * s.top_k, k, nn)) for k, nn in ((s.hidden, 2 * s.expert_ffn),
                                                                      (s.expert_ffn, s.hidden)))
    assert grouped == pytest.approx(dense, rel=0.05)
    per_expert_occupancy = 2.0 * sum(k * nn for k, nn in ((s.hidden, 2 * s.expert_ffn), (s.expert_ffn, s.hidden))) \
        * (n * s.top_k + s.experts * p["gemm_m_half"]) / (cm.gemm_peak * p["gemm_compute_eff"])
    assert grouped < per_expert_occupancy
