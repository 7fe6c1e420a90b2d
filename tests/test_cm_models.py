"""Roofline and profiled batch-time models: physics, extrapolation, per-request decode, accuracy on Vidur data."""
import numpy as np
import pytest

from costmodels import GPUS, MODELS, BatchShape, build_costmodel, get_gpu, get_model
from costmodels.calibrate import fit, heldout_errors, split_by_config
from costmodels.operators import LAYER_OPS
from costmodels.profile_data import read_profiles
from costmodels.profiled import PiecewiseLinear, ProfiledCostModel
from costmodels.roofline import RooflineCostModel

L7, A100 = get_model("llama-2-7b"), get_gpu("a100-80gb")


def test_roofline_defaults_work_for_every_model_and_gpu():
    shape = BatchShape([256], [0], [512] * 16)
    for m in MODELS.values():
        for g in GPUS.values():
            t = RooflineCostModel(m, g).batch_time(shape)
            assert np.isfinite(t) and t > 0, (m.name, g.name)
    # a faster GPU is faster on the same batch, a bigger model slower
    assert RooflineCostModel(L7, get_gpu("h100-sxm")).batch_time(shape) < RooflineCostModel(L7, A100).batch_time(shape)
    assert RooflineCostModel(get_model("llama-2-13b"), A100).batch_time(shape) > RooflineCostModel(L7, A100).batch_time(shape)


def test_roofline_regimes():
    rm = RooflineCostModel(L7, A100)
    # one decode token is bound by reading the weights (layers and LM head) plus one launch per kernel
    # (10 per layer: 9 dense ops and decode attention; emb and LM head once)
    weight_bytes = 32 * 2 * (4 * 4096 ** 2 + 3 * 4096 * 11008) + 2 * 32000 * 4096
    t1 = rm.batch_time(BatchShape([], [], [16]))
    expect = weight_bytes / (A100.hbm_bytes_per_s * rm.memory_eff["gemm"]) + (32 * 10 + 2) * rm.launch_s
    assert t1 == pytest.approx(expect, rel=0.02)
    # large prefill is compute-bound: time grows ~linearly in tokens
    ta, tb = rm.batch_time(BatchShape([2048], [0])), rm.batch_time(BatchShape([4096], [0]))
    assert 1.9 < tb / ta < 2.6
    # decode attention scales with the KV it reads; INT8 KV halves that read
    d1 = rm.decode_attn_time([2000] * 64)
    assert rm.decode_attn_time([4000] * 64) == pytest.approx(2 * d1, rel=0.05)
    q = RooflineCostModel(L7, A100, kv_dtype="int8")
    assert q.decode_attn_time([2000] * 64) == pytest.approx(d1 / 2, rel=0.05)


def test_tensor_parallel_divides_work_and_adds_allreduce():
    m70 = get_model("llama-2-70b")
    shape = BatchShape([1024], [0], [1000] * 32)
    t2, t4 = RooflineCostModel(m70, A100, tp=2), RooflineCostModel(m70, A100, tp=4)
    assert t4.batch_time(shape) < t2.batch_time(shape) < 2 * t4.batch_time(shape)
    assert t4.allreduce_time(shape.num_tokens) > 0 and RooflineCostModel(L7, A100).allreduce_time(1024) == 0


def test_piecewise_linear_interpolates_and_extrapolates():
    f = PiecewiseLinear([0, 10, 20], [1, 3, 4])
    assert f(5) == pytest.approx(2.0)
    assert f(30) == pytest.approx(5.0)      # last slope 0.1 continues
    assert f(-10) == pytest.approx(-1.0)    # first slope 0.2 continues
    g = PiecewiseLinear([0, 10, 20], [1, 3, 2.5])
    assert g(100) == pytest.approx(2.5)     # a falling last segment is noise: continue flat, never down
    assert (f + g)(15) == pytest.approx(f(15) + g(15)) and (f + g)(50) == pytest.approx(f(50) + g(50))


@pytest.fixture(scope="module")
def vidur(shared_data):
    table = read_profiles([shared_data / "profiles" / "vidur-a100-llama-2-7b"])
    train, test = split_by_config(table, 0.25, 0)
    return table, train, test


@pytest.fixture(scope="module")
def profiled_errors(vidur):
    table, train, test = vidur
    cm = fit("profiled", train, L7, A100)
    return cm, heldout_errors(cm, test, reference=table).set_index("what")


def test_profiled_meets_heldout_accuracy(profiled_errors):
    _, e = profiled_errors
    for op in LAYER_OPS:
        assert e.loc[op, "mape_pct"] <= 5.0, op
    for op in ("attn_prefill", "attn_decode"):
        assert e.loc[op, "mape_pct"] <= 10.0, op
    assert e.loc["iteration (mixed-batch grid)", "mape_pct"] <= 5.0
    assert e.loc["iteration (mixed-batch grid)", "n"] > 300


def test_profiled_decode_is_charged_per_request_and_extrapolates(profiled_errors):
    cm, _ = profiled_errors
    ctx = [100, 3000, 40, 2500]
    expect = cm.f["attn_decode.batch"](4) + sum(cm.f["attn_decode.context"](m) for m in ctx)
    assert cm.decode_attn_time(ctx) == pytest.approx(float(expect) * 1e-3)
    # outside the profiled range (4096 tokens, 4096 context, batch 128): finite, positive, growing
    big = [cm.batch_time(BatchShape([c], [0])) for c in (4096, 6144, 8192)]
    assert all(np.isfinite(big)) and big[0] < big[1] < big[2]
    long = [cm.decode_attn_time([m] * 200) for m in (4000, 8000, 16000)]
    assert long[0] < long[1] < long[2]
    # batches 8× the profiled maximum stay in line with the linear model (fitted on the same data)
    lin = build_costmodel({"kind": "linear"}, L7, A100)
    for b, m in ((1024, 200), (1024, 1000), (512, 3000)):
        shape = BatchShape([], [], [m] * b)
        assert cm.batch_time(shape) == pytest.approx(lin.batch_time(shape), rel=0.15), (b, m)


def test_roofline_defaults_within_30pct_and_fitted_within_15pct(vidur):
    table, train, test = vidur
    it = "iteration (mixed-batch grid)"
    default = heldout_errors(RooflineCostModel(L7, A100), test, reference=table).set_index("what")
    fitted = heldout_errors(fit("roofline", train, L7, A100), test, reference=table).set_index("what")
    assert default.loc[it, "mape_pct"] <= 30.0
    assert fitted.loc[it, "mape_pct"] <= 15.0
    assert fitted.loc[it, "p90_ape_pct"] <= 30.0


def test_shipped_defaults_load_and_agree(tmp_path):
    shape = BatchShape([512], [0], [1000] * 64)
    times = {k: build_costmodel({"kind": k}, L7, A100).batch_time(shape) for k in ("linear", "roofline", "profiled")}
    lo, hi = min(times.values()), max(times.values())
    assert hi / lo < 1.15, times
    cm = build_costmodel({"kind": "profiled"}, L7, A100)
    cm.save(tmp_path / "p.yaml")
    again = ProfiledCostModel.load(tmp_path / "p.yaml", layers=32)
    assert again.batch_time(shape) == pytest.approx(cm.batch_time(shape), rel=1e-5)


def test_memory_terms_charged_identically_by_every_kind():
    base = BatchShape([], [], [1000] * 8)
    kinds = {k: build_costmodel({"kind": k}, L7, A100) for k in ("linear", "roofline", "profiled")}
    kv = 0.5 * 1024 ** 2
    swap = A100.pcie_latency_s * 2 + (300 + 200) * kv / A100.pcie_bytes_per_s
    recompute_flops = 1000 * 2 * 32 * 4096 * 2 * 4096
    recompute_bytes = 1000 * (32 * 4096 * 2 + kv)
    recompute = max(recompute_flops / (A100.peak_flops * 0.64), recompute_bytes / (A100.hbm_bytes_per_s * 0.8))
    fused = 2 * 500 * kv / 2 / (A100.peak_flops * 0.25)          # scale + zero point per fp16 element, CUDA cores
    separate = 500 * (kv / 2 + kv) / (A100.hbm_bytes_per_s * 0.8)   # read int8, write fp16
    for name, cm in kinds.items():
        t0 = cm.batch_time(base)
        extra = BatchShape([], [], [1000] * 8, swap_in_tokens=300, swap_out_tokens=200)
        assert cm.batch_time(extra) - t0 == pytest.approx(swap, rel=1e-9), name
        extra = BatchShape([], [], [1000] * 8, hidden_recompute_tokens=1000)
        assert cm.batch_time(extra) - t0 == pytest.approx(recompute, rel=1e-9), name
        extra = BatchShape([], [], [1000] * 8, dequant_tokens=500)
        assert cm.batch_time(extra) - t0 == pytest.approx(fused, rel=1e-9), name
        sep = build_costmodel({"kind": name, "dequant": "separate"}, L7, A100)
        assert sep.batch_time(extra) - sep.batch_time(base) == pytest.approx(separate, rel=1e-9), name
    # INT8 KV halves swap traffic
    q = build_costmodel({"kind": "linear", "kv_dtype": "int8"}, L7, A100)
    assert q.swap_time(1000) - A100.pcie_latency_s == pytest.approx((kinds["linear"].swap_time(1000) - A100.pcie_latency_s) / 2)


@pytest.mark.parametrize("kind", ["roofline", "profiled"])
def test_fast_path_equals_the_operator_sum(kind):
    cm = build_costmodel({"kind": kind}, L7, A100)
    rng = np.random.default_rng(1)
    for _ in range(20):
        npre, ndec = int(rng.integers(0, 3)), int(rng.integers(0, 100))
        shape = BatchShape(rng.integers(1, 2048, npre).tolist(), rng.integers(0, 2048, npre).tolist(),
                           rng.integers(1, 6000, ndec).tolist())
        if shape.num_tokens == 0:
            continue
        t = cm.op_times(shape)
        step = sum(v for k, v in t.items() if k in ("emb", "lm_head"))
        slow = cm.layers * sum(v for k, v in t.items() if k not in ("emb", "lm_head")) + step
        assert cm.compute_time(shape) == pytest.approx(slow, rel=1e-6)
