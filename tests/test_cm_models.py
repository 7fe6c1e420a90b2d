"""Roofline v2 and the profiled model: physics floors and monotonicity for every catalog GPU × model, hand-worked
regimes, TP, MoE and FP8, the exact fast-path identities, held-out accuracy on the public A100 profile."""
import numpy as np
import pytest

from costmodels import GPUS, MODELS, BatchShape, build_costmodel, get_gpu, get_model
from costmodels.calibrate import fit, heldout_errors, split_contiguous
from costmodels.catalog import DTYPE_BYTES
from costmodels.operators import Shard, experts_touched
from costmodels.profile_data import read_profiles
from costmodels.profiled import ProfiledCostModel
from costmodels.roofline import RooflineCostModel

L7, A100, H100 = get_model("llama-2-7b"), get_gpu("a100-80gb"), get_gpu("h100-sxm")


def _valid_tps(m):
    return [tp for tp in (1, 2, 4, 8) if not (m.heads % tp or m.ffn % tp or (m.expert_ffn and m.expert_ffn % tp))]


def floors(m, g, tp, shape):
    """Weight-read and FLOP floors of one iteration on one shard: every weight the batch needs is read once, every
    GEMM FLOP done at peak. MoE: only the experts the batch's tokens can reach."""
    s = Shard.of(m, tp)
    n = shape.num_tokens
    wb = DTYPE_BYTES[m.dtype]
    dense = m.hidden * (s.q_width + 2 * s.kv_width) + s.q_width * m.hidden
    mlp = (3 if m.gated_mlp else 2) * m.hidden * s.ffn
    moe_layers = m.moe_layer_count()
    expert = (3 if m.gated_mlp else 2) * m.hidden * s.expert_ffn
    reached = float(experts_touched(s, n)) if m.is_moe else 0.0
    shared = (3 if m.gated_mlp else 2) * m.hidden * s.shared_ffn
    weights = (m.layers * dense + (m.layers - moe_layers) * mlp + moe_layers * (reached * expert + shared)) * wb
    flops = 2.0 * n * (m.layers * dense + (m.layers - moe_layers) * mlp
                       + moe_layers * (m.experts_per_token * expert + shared))
    peak = g.fp8_flops if (m.dtype == "fp8" and g.fp8_flops) else g.peak_flops
    return weights / g.hbm_bytes_per_s, flops / peak


def test_every_gpu_and_model_respects_the_floors_and_grows_with_work():
    shapes = [BatchShape([], [], [300]), BatchShape([], [], [1000] * 64), BatchShape([2048], [0]),
              BatchShape([512], [1024], [800] * 32)]
    for m in MODELS.values():
        for g in GPUS.values():
            for tp in _valid_tps(m):
                cm = RooflineCostModel(m, g, tp=tp)
                for shape in shapes:
                    t = cm.batch_time(shape)
                    w, f = floors(m, g, tp, shape)
                    assert np.isfinite(t) and t >= max(w, f), (m.name, g.name, tp)
                # monotone in prefill tokens, decode batch and decode context
                pre = [cm.batch_time(BatchShape([c], [0])) for c in (16, 64, 256, 1024, 4096)]
                dec_b = [cm.batch_time(BatchShape([], [], [512] * b)) for b in (1, 2, 8, 32, 128)]
                dec_m = [cm.batch_time(BatchShape([], [], [m_] * 16)) for m_ in (16, 256, 2048, 8192)]
                for seq in (pre, dec_b, dec_m):
                    assert all(a <= b for a, b in zip(seq, seq[1:])), (m.name, g.name, tp, seq)


def test_decode_steps_with_the_kv_filling_memory_read_it_no_faster_than_bandwidth():
    """Issue #29's physics floor: a decode step whose batch fills the KV cache (b = 1 .. 1,024 requests, every catalog
    GPU × model × TP that fits) takes at least the weights' read (the reachable experts' for MoE) plus the KV's read
    at the GPU's peak bandwidth, and grows with the batch at a fixed per-request context."""
    from costmodels.catalog import kv_capacity_tokens
    from sim.errors import UserError
    checked = 0
    for m in MODELS.values():
        for g in GPUS.values():
            for tp in _valid_tps(m):
                try:
                    cap = kv_capacity_tokens(m, g, tp=tp)
                except (UserError, ValueError):
                    continue                     # the weights do not fit this GPU at this TP
                if cap < 64:
                    continue
                cm = RooflineCostModel(m, g, tp=tp)
                kv_token = m.kv_bytes_per_token(tp=tp)
                prev = 0.0
                for b in (1, 16, 81, 82, 128, 256, 1024):
                    ctx = max(1, min(cap // b - 1, m.max_context - 1))
                    shape = BatchShape([], [], [ctx] * b)
                    w, _ = floors(m, g, tp, shape)
                    kv = b * (ctx + 1) * kv_token / g.hbm_bytes_per_s
                    t = cm.batch_time(shape)
                    assert t >= w + kv, (m.name, g.name, tp, b, t, w + kv)
                    fixed = cm.batch_time(BatchShape([], [], [256] * b))
                    assert fixed >= prev, (m.name, g.name, tp, b)
                    prev = fixed
                    checked += 1
    assert checked > 1000


def test_a_batch_1_decode_by_hand():
    """One decode token of Llama-2-7B on an A100, term by term: the weight read dominates."""
    cm = RooflineCostModel(L7, A100)
    p = cm.params
    bw = A100.hbm_bytes_per_s
    gemm = lambda k, n: (k * n * 2 + (k + n) * 2) / (bw * p["gemm_memory_eff"]) + p["gemm_overhead_s"]  # noqa: E731
    elem = lambda nbytes: nbytes / (bw * p["elementwise_memory_eff"]) + p["elementwise_overhead_s"]  # noqa: E731
    h, f = 4096, 11008
    layer = (gemm(h, 3 * h) + gemm(h, h) + gemm(h, 2 * f) + gemm(f, h)               # QKV, O, up+gate, down
             + 2 * elem((2 * h + h) * 2) + elem(2 * (h + h) * 2) + elem(3 * f * 2) + elem(3 * h * 2))
    kv_token = 2 * h * 2
    attn = (17 * kv_token / (bw * p["decode_memory_eff"]) * (1 + p["decode_batch_half"]) ** p["decode_batch_exp"]
            + p["decode_per_seq_s"] + 2 * h * 2 / (bw * p["decode_memory_eff"]) + p["decode_fixed_s"])
    step = (elem(2 * h * 2) + elem(2 * h * 2) + gemm(h, 32000)                        # embedding, norm, lm_head
            + 3 * elem(32000 * 4) + p["sampling_fixed_s"])
    assert cm.batch_time(BatchShape([], [], [17])) == pytest.approx(32 * (layer + attn) + step, rel=1e-9)
    weights = 32 * (4 * h * h + 3 * h * f) * 2 / (bw * p["gemm_memory_eff"])
    assert weights / cm.batch_time(BatchShape([], [], [17])) > 0.8


def test_large_prefill_is_compute_bound_and_decode_attention_scales_with_kv():
    cm = RooflineCostModel(L7, A100)
    ta, tb = cm.batch_time(BatchShape([2048], [0])), cm.batch_time(BatchShape([4096], [0]))
    assert 1.9 < tb / ta < 2.6
    d1, d2 = cm.decode_attn_time([2000] * 64), cm.decode_attn_time([4000] * 64)
    assert d2 == pytest.approx(2 * d1, rel=0.05)
    q = RooflineCostModel(L7, A100, kv_dtype="int8")          # 8-bit KV: the per-token read halves
    assert q.decode_attn_time([4000] * 64) - q.decode_attn_time([2000] * 64) == pytest.approx((d2 - d1) / 2)


def test_tensor_parallel_divides_work_and_adds_all_reduces():
    m70 = get_model("llama-2-70b")
    shape = BatchShape([1024], [0], [1000] * 32)
    t2, t4 = RooflineCostModel(m70, A100, tp=2), RooflineCostModel(m70, A100, tp=4)
    assert t4.batch_time(shape) < t2.batch_time(shape) < 2 * t4.batch_time(shape)
    n = shape.num_tokens
    assert float(t4.dense_layer_time(n) - t4.dense_ops_time(n)) == pytest.approx(
        2 * A100.allreduce_time_s(n * 8192 * 2, 4))


def test_decode_per_request_time_follows_the_kv_heads_a_shard_holds():
    """A thread block per (request, KV head): the fitted per-request time (Llama-2-7B, 32 KV heads) scales with
    the KV heads on the shard; the query read is per request as before. Hand-worked for 32, 16 and 8 KV heads."""
    for model, tp, kv_heads in ((L7, 1, 32), (L7, 2, 16), (get_model("llama-3.1-70b"), 4, 2)):
        cm = RooflineCostModel(model, H100, tp=tp)
        p, s = cm.params_in_use, cm.shard
        q_read = 2 * s.q_width * s.act_bytes / (H100.hbm_bytes_per_s * p["decode_memory_eff"])
        slope = cm.decode_attn_time_sums(2, 0) - cm.decode_attn_time_sums(1, 0)
        assert slope == pytest.approx(p["decode_per_seq_s"] * kv_heads / 32 + q_read, rel=1e-12), model.name
    # the profiled model scales its fitted per-request time the same way when run at another TP
    prof = build_costmodel({"kind": "profiled"}, L7, A100, tp=1), build_costmodel({"kind": "profiled"}, L7, A100, tp=2)
    assert prof[1]._dec[2] == pytest.approx(prof[0]._dec[2] / 2, rel=1e-12)


def test_engine_allreduce_reaches_vllms_custom_limit_with_its_fitted_per_byte_time():
    """Without engine overheads the custom all-reduce line applies within its data (1 MB) and NCCL above; with the
    `vllm` runtime factor it applies up to vLLM's own limit (32 MB at TP4 on Hopper) with its per-byte time scaled,
    never above NCCL's time, and stays monotone in size."""
    from costmodels.collectives import _fits, two_line_time
    a, b = _fits()["custom"]["h100_dgx"]["4"]
    nccl = _fits()["nccl"]["h100_dgx"]["4"]
    big = 4 * 1024 ** 2
    assert H100.allreduce_time_s(big, 4) == pytest.approx(float(two_line_time(nccl, big)))
    k = 0.5
    assert H100.allreduce_time_s(big, 4, per_byte_scale=k) == pytest.approx(
        min(a + k * big / b, float(two_line_time(nccl, big))))
    assert H100.allreduce_time_s(64 * 1024, 4, per_byte_scale=k) == pytest.approx(
        min(a + k * 64 * 1024 / b, float(two_line_time(nccl, 64 * 1024))))
    assert H100.allreduce_time_s(64 * 1024 ** 2, 4, per_byte_scale=k) == pytest.approx(
        float(two_line_time(nccl, 64 * 1024 ** 2)))              # above vLLM's 32 MB: NCCL
    sizes = np.geomspace(1e3, 64e6, 200)
    t = H100.allreduce_time_s(sizes, 4, per_byte_scale=k)
    assert np.all(np.diff(t) >= -1e-12) and np.all(t <= two_line_time(nccl, sizes) + 1e-15)


def test_moe_reads_only_the_experts_its_tokens_reach_and_fp8_halves_weights():
    mix = get_model("mixtral-8x7b")
    s = Shard.of(mix, 1)
    assert float(experts_touched(s, 1)) == pytest.approx(2.0)           # top-2 of 8 for one token
    assert float(experts_touched(s, 64)) == pytest.approx(8.0, rel=1e-6)
    cm = RooflineCostModel(mix, H100, tp=2)
    one, many = (cm.batch_time(BatchShape([], [], [100] * b)) for b in (1, 64))
    assert 2.0 < many / one < 4.5           # 64 tokens read all 8 experts, one token 2 of them
    bf16 = RooflineCostModel(get_model("llama-4-scout-17b-16e"), H100, tp=2)
    fp8 = RooflineCostModel(get_model("llama-4-scout-17b-16e-fp8"), H100, tp=2)
    d = BatchShape([], [], [600] * 32)
    assert 0.45 < fp8.batch_time(d) / bf16.batch_time(d) < 0.8
    assert get_model("llama-4-scout-17b-16e").params() == pytest.approx(107.8e9, rel=0.03)   # 109B incl. vision


def test_moe_gemm_scale_prices_only_the_routed_experts():
    """The engine's fused-MoE factor multiplies the routed experts' grouped GEMMs and nothing else: a dense model
    does not move, and a MoE decode step rises by less than the factor (attention, the shared expert and the rest
    keep their price)."""
    from costmodels.base import Overheads
    d = BatchShape([], [], [600] * 32)
    scout = get_model("llama-4-scout-17b-16e-fp8")
    plain = RooflineCostModel(scout, H100, tp=2)
    slow = RooflineCostModel(scout, H100, tp=2, overheads=Overheads(moe_gemm_scale=1.5))
    assert 1.0 < slow.batch_time(d) / plain.batch_time(d) < 1.5
    experts = lambda cm: float(cm.moe_time(32.0))
    assert experts(slow) > experts(plain)
    assert RooflineCostModel(L7, H100, overheads=Overheads(moe_gemm_scale=1.5)).batch_time(d) == \
        RooflineCostModel(L7, H100).batch_time(d)


def test_fast_path_sums_and_stretches_are_the_same_floats():
    rng = np.random.default_rng(1)
    for kind in ("roofline", "profiled", "linear"):
        cm = build_costmodel({"kind": kind, "overheads": {"step_s": 3e-3, "per_seq_s": 2e-5}}, L7, A100)
        assert cm.accepts_decode_sums()
        for _ in range(30):
            npre, ndec = int(rng.integers(0, 3)), int(rng.integers(0, 100))
            pt, pc = rng.integers(1, 2048, npre).tolist(), rng.integers(0, 2048, npre).tolist()
            dc = rng.integers(1, 6000, ndec).tolist()
            if npre + ndec == 0:
                continue
            shape = BatchShape(pt, pc, dc)
            assert cm.batch_time(shape) == cm.time_from_sums(
                sum(pt) + ndec, npre, sum(c * c for c in pt), sum(c * k for c, k in zip(pt, pc)), sum(pc), ndec,
                sum(dc))
        cached = rng.integers(10, 3000, 40)
        last = rng.integers(1, 30, 40)
        k = 30
        last[0] = k                     # a stretch's every step has a request in it
        got = cm.decode_stretch_times(cached, k, last)
        for j in range(1, k + 1):
            alive = last >= j
            want = cm.time_from_sums(int(alive.sum()), 0, 0, 0, 0, int(alive.sum()), int((cached[alive] + j).sum()))
            assert got[j - 1] == want, (kind, j)


@pytest.fixture(scope="module")
def vidur(shared_data):
    table = read_profiles([shared_data / "profiles" / "vidur-a100-llama-2-7b"], tp=None)
    train, test = split_contiguous(table, 0.25, 0)
    return table, train, test


def test_profiled_meets_heldout_accuracy_on_contiguous_blocks(vidur):
    table, train, test = vidur
    cm = fit("profiled", train, L7, A100)
    e = heldout_errors(cm, test, reference=table).set_index("what")
    assert e.loc["attn_prefill", "mape_pct"] <= 8.0
    assert e.loc["attn_decode", "mape_pct"] <= 6.0
    assert abs(e.loc["attn_decode, batch <= 8", "bias_pct"]) <= 5.0
    assert e.loc["iteration (mixed-batch grid)", "mape_pct"] <= 8.0
    # non-negative, monotone attention; measured small-batch rows increasing in context
    small = cm.decode_fit.pop("small_batch")
    assert all(v >= 0 for v in cm.decode_fit.values()) and all(v >= 0 for v in cm.prefill_fit.values())
    assert small and max(small) <= 16
    for row in small.values():
        assert all(a < b for a, b in zip(row["context"], row["context"][1:])) and min(row["s"]) > 0


def test_roofline_fitted_on_a100_transfers_to_h100_without_refit(shared_data, vidur):
    table, _, _ = vidur
    a100_fit = fit("roofline", table, L7, A100)
    h100 = read_profiles([shared_data / "profiles" / "vidur-h100-llama-2-7b"], tp=None)
    e = heldout_errors(RooflineCostModel(L7, H100, params=a100_fit.params), h100, n_mixed=0).set_index("what")
    assert e.loc["iteration non-attention (tp 1)", "mape_pct"] <= 6.0
    for tp in (2, 4, 8):
        assert e.loc[f"iteration non-attention (tp {tp})", "mape_pct"] <= 8.0


def test_shipped_defaults_load_agree_and_round_trip(tmp_path):
    shape = BatchShape([512], [0], [1000] * 64)
    times = {k: build_costmodel({"kind": k}, L7, A100).batch_time(shape) for k in ("linear", "roofline", "profiled")}
    lo, hi = min(times.values()), max(times.values())
    assert hi / lo < 1.2, times
    cm = build_costmodel({"kind": "profiled"}, L7, A100)
    cm.save(tmp_path / "p.yaml")
    again = ProfiledCostModel.load(tmp_path / "p.yaml", L7, A100)
    assert again.batch_time(shape) == pytest.approx(cm.batch_time(shape), rel=1e-5)
    auto = build_costmodel({"kind": "auto"}, L7, A100)
    assert auto.kind == "profiled" and "profiled" in auto.describe()
    assert build_costmodel({"kind": "auto"}, get_model("qwen2.5-7b"), H100).kind == "roofline"


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


def test_bad_costmodel_input_is_one_line():
    from costmodels.errors import UserError
    with pytest.raises(UserError, match="unknown parameter 'gemm_eff'"):
        build_costmodel({"kind": "roofline", "params": {"gemm_eff": 0.5}}, L7, A100)
    with pytest.raises(UserError, match=r"gemm_compute_eff: must be a number in \[0.05, 1\]"):
        build_costmodel({"kind": "roofline", "params": {"gemm_compute_eff": 2}}, L7, A100)
    with pytest.raises(UserError, match="allowed: auto, nccl, custom"):
        build_costmodel({"kind": "roofline", "allreduce": "mpi"}, L7, A100)
    with pytest.raises(UserError, match="no tp=3 rows|tensor-parallel degree 3"):
        build_costmodel({"kind": "profiled"}, L7, A100, tp=3)
    with pytest.raises(UserError, match="unknown preset 'sglang'"):
        build_costmodel({"kind": "roofline", "overheads": "sglang"}, L7, A100)


def test_refitting_the_shipped_files_from_a_folder_without_profiles_is_one_line(tmp_path, capsys):
    """python -m costmodels.shipped on a data folder that lacks a profile the fits read: one line, exit 2, and the
    shipped coefficient files untouched."""
    from costmodels.linear import PROFILES_DIR
    from costmodels.shipped import main
    (tmp_path / "profiles" / "vidur-a100-llama-2-7b").mkdir(parents=True)
    before = (PROFILES_DIR / "roofline-efficiencies.yaml").read_bytes()
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("costmodels.shipped: ") and "vidur-a100-llama-2-7b: folder has no mlp.csv" in err
    assert "\n" not in err
    assert (PROFILES_DIR / "roofline-efficiencies.yaml").read_bytes() == before
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"no profiles under {tmp_path / 'nowhere'}"
