"""Harness data without PyTorch: graph-timing arithmetic, the CSV schema's timing column, calibrate's refusal of eager
rows, profile --check on the shared and committed H200 rows, and the GPU check's answer where there is no GPU."""
from __future__ import annotations

import json

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from costmodels.catalog import get_gpu, get_model
from costmodels.errors import UserError
from profiles.timing import CpuTimer, Timed, calls_per_graph, per_call_times

ROOT = Path(__file__).resolve().parent.parent
SHARED_H200 = ROOT.parent / "shared" / "data" / "profiles" / "h200-harness-4bc7dd0"
CHECKED = ROOT / "profiles" / "h200" / "gpu-check-2026-11-26"
CHECKED_H100 = ROOT / "profiles" / "h100-sxm" / "gpu-check-2026-11-26"
CHECKED_H200 = ROOT / "profiles" / "h200" / "gpu-check-2026-11-28"
# each committed GPU run with the catalog GPU it ran on
RUNS = [pytest.param(CHECKED, "h200", id="h200"), pytest.param(CHECKED_H100, "h100-sxm", id="h100")]


# -- graph-timing arithmetic --------------------------------------------------------------------------------
def test_calls_per_graph_sizes_a_replay_to_the_target_and_stays_in_bounds():
    assert calls_per_graph(0.01, target_ms=2.0) == 200          # 200 calls of 10 us fill 2 ms
    assert calls_per_graph(0.5, target_ms=2.0) == 4
    assert calls_per_graph(5.0, target_ms=2.0) == 1             # a long call: one per graph, never zero
    assert calls_per_graph(1e-6, target_ms=2.0, max_calls=256) == 256
    assert calls_per_graph(0.0) == 256 and calls_per_graph(float("nan")) == 256   # no estimate: the most calls


def test_per_call_time_is_graph_time_over_calls_and_the_median_is_kept():
    assert per_call_times([2.0, 4.0, 3.0], 4) == [0.5, 1.0, 0.75]
    assert Timed(per_call_times([2.0, 4.0, 3.0], 4), "graph", 4).median == 0.75
    with pytest.raises(ValueError):
        per_call_times([1.0], 0)


def test_cpu_timer_times_the_call_itself():
    import time as _t
    t = CpuTimer().time(lambda: _t.sleep(0.004), repeats=3, warmup=0)
    assert t.mode == "cpu" and len(t.per_call_ms) == 3 and t.median >= 3.5


# -- schema, refusal of eager rows, --check ------------------------------------------------------------------------
def test_old_harness_files_read_as_eager_and_calibrate_refuses_them_unless_told(tmp_path):
    from costmodels.calibrate import calibrate
    from costmodels.profile_data import read_profile
    old = pd.DataFrame([{"op": op, "num_tokens": n, "prefill": "", "decode": "", "time_ms": 0.01 * n, "device": "cuda"}
                        for op in ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                                   "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add", "emb")
                        for n in (1, 2, 4, 8, 16, 32, 64, 128)])
    path = tmp_path / "old.csv"
    old.to_csv(path, index=False)
    assert set(read_profile(path)["timing"]) == {"eager"}
    with pytest.raises(UserError, match="timed eager"):
        calibrate([path], get_model("tiny-llama"), get_gpu("a100-80gb"), "linear")
    cm, errs, _ = calibrate([path], get_model("tiny-llama"), get_gpu("a100-80gb"), "linear", allow_eager=True)
    assert cm.kind == "linear"
    bad = old.assign(timing="warp")
    bad.to_csv(path, index=False)
    with pytest.raises(UserError, match="timing 'warp' is not one of"):
        read_profile(path)


@pytest.mark.skipif(not SHARED_H200.exists(), reason="../shared/data/profiles/h200-harness-4bc7dd0 not present")
def test_check_flags_the_first_harness_eager_padded_attention():
    from costmodels.profile_check import check_profile
    from costmodels.profile_data import read_profiles
    df = check_profile(read_profiles([SHARED_H200 / "l2-7b-tp1.csv"]))
    attn = df.set_index("family").loc["attn_prefill"]
    assert "not FlashAttention" in attn["flag"] and "timed eager" in attn["flag"] and attn["ratio_median"] > 5
    assert (df["flag"] != "").all() and set(df["gpu"]) == {"h200"}


@pytest.mark.parametrize("folder,gpu", RUNS)
def test_check_on_the_committed_rows_passes_the_engine_timed_iterations(folder, gpu):
    """Measured data (each folder's README): graph-replayed whole iterations within ±25% of the shipped model,
    eager ones flagged, no padded attention anywhere, the MoE experts compared with the roofline's MoE time."""
    from costmodels.profile_check import check_profile
    from costmodels.profile_data import read_profiles
    df = check_profile(read_profiles(sorted(folder.glob("*.csv"))))
    assert set(df["gpu"]) == {gpu}
    fam = df.set_index(["model", "dtype", "family"])
    for model, dtype in (("llama-2-7b", "fp16"), ("llama-3-8b", "bf16")):
        assert fam.loc[(model, dtype, "iteration (graph)"), "flag"] == ""
        # Python dispatch between kernels: the eager iterations run at least 20% slower than the same batches
        # replayed (on the H100 Llama-2-7B's eager rows stay inside ±25% only because its shipped profiled model,
        # fitted on Vidur's H100 rows, is itself slow: the graph rows sit at 0.86x of it)
        eager, graph = (fam.loc[(model, dtype, f"iteration ({m})"), "ratio_median"] for m in ("eager", "graph"))
        assert eager > 1.2 * graph, (model, eager, graph)
    assert not df["flag"].str.contains("not FlashAttention").any()
    moe = fam.loc[("mixtral-8x7b", "bf16", "moe_mlp")]
    assert moe["n"] == 37 and moe["compared_with"].startswith("roofline")


@pytest.mark.parametrize("folder,gpu", RUNS)
def test_committed_moe_rows_never_beat_the_weight_read_floor(folder, gpu):
    """Physical sanity of the measured MoE rows: once a step's tokens reach all 8 experts (16 tokens and more), the
    routed experts' weights are read at least once, so no row may be faster than those bytes at the measured copy
    bandwidth (summary.json: 4.24 TB/s on the H200, 3.02 TB/s on the H100)."""
    summary = json.loads((folder / "summary.json").read_text())
    m = get_model("mixtral-8x7b")
    floor_ms = m.experts * 3 * m.hidden * m.expert_ffn * 2 / summary["copy_bw_bytes_per_s"] * 1e3
    rows = pd.read_csv(folder / "mixtral-moe.csv")
    big = rows[rows["num_tokens"] >= 16]
    assert len(big) > 30 and (big["time_ms"] >= floor_ms).all()


@pytest.mark.parametrize("folder,gpu", RUNS)
def test_calibrating_the_committed_rows_holds_out_whole_decode_iterations(folder, gpu):
    """Measured data: a profiled fit of each model's rows holds out its graph-replayed pure-decode iterations (never
    fitted) within 5%, while the eager iterations are far off the same fit — the reason calibrate refuses eager
    operator rows. (Mixed iterations are 18-23% off: the harness runs their decodes inside the varlen prefill
    kernel, slower than the split-KV decode rows the fit learned; the README says so.)"""
    from costmodels.calibrate import fit, predict_op, split_contiguous
    from costmodels.profile_data import read_profile
    for model, tag in (("llama-2-7b", "l2-7b"), ("llama-3-8b", "l3-8b")):
        train, test = split_contiguous(read_profile(folder / f"{tag}.csv"))
        cm = fit("profiled", train, get_model(model), get_gpu(gpu))
        it = test[test["op"] == "iteration_forward"]
        ape = pd.Series([abs(predict_op(cm, r) * 1e3 / r["time_ms"] - 1) for _, r in it.iterrows()], index=it.index)
        decode = (it["prefill"] == "")
        assert ape[decode & (it["timing"] == "graph")].mean() < 0.05, model
        assert ape[it["timing"] == "eager"].mean() > 0.20, model


def test_pricing_mixed_decodes_inside_the_varlen_call_predicts_the_committed_mixed_iterations():
    """Measured data: the committed run timed no attn_mixed rows, but its mixed layers (batches other than the whole
    iterations') less the measured non-attention sum stand in for them. Fitted on those, the held-out mixed
    iterations (decodes inside the varlen prefill call) are predicted far better than by the decode-kernel rows, and
    the pure-decode iterations are untouched."""
    from profiles.mixed_from_layers import compare
    for model, tag in (("llama-2-7b", "l2-7b"), ("llama-3-8b", "l3-8b")):
        r = compare(CHECKED / f"{tag}.csv", get_model(model), get_gpu("h200"))
        b, a = r["before"], r["after"]
        assert r["derived"] >= 8 and a["n"] == b["n"] and a["in_varlen"] and not b["in_varlen"]
        assert b["mixed"] > 15 and a["mixed"] < b["mixed"] / 2, (model, b, a)
        assert abs(a["pure_decode"] - b["pure_decode"]) < 1e-9
        assert a["all"] < 5.0 < b["all"], (model, b, a)


def test_the_h100_run_timed_mixed_batches_both_ways_and_its_acceptance_holds_from_the_rows():
    """Measured data: the H100 run (the first with attn_mixed rows) priced a mixed batch's decodes inside the varlen
    call; recomputed here from the committed CSVs, every held-out graph-replayed iteration set is within 5% for both
    ways of running mixed batches, the same figures the run's summary.json recorded on the GPU, and batch-1 decode
    stayed within 10% of the compiled yardstick at every context."""
    from profiles.mixed_from_layers import iteration_errors
    summary = json.loads((CHECKED_H100 / "summary.json").read_text())
    acc = summary["acceptance"]
    assert acc["decode_b1_max_ratio"] <= 1.10 and len(summary["decode_b1"]) == 6
    for model, tag in (("llama-2-7b", "l2-7b"), ("llama-3-8b", "l3-8b")):
        rows = pd.read_csv(CHECKED_H100 / f"{tag}.csv")
        assert (rows["op"] == "attn_mixed").sum() == 64
        assert set(rows["mixed_attention"].dropna()) == {"one-varlen", "split"}
        for mode in ("one-varlen", "split"):
            e = iteration_errors([CHECKED_H100 / f"{tag}.csv"], get_model(model), get_gpu("h100-sxm"), mode=mode)
            assert e["n"] == 20 and e["all"] <= 5.0, (model, mode, e)
            assert e["all"] == pytest.approx(acc["iterations"][model][mode]["all"], rel=1e-6)


def test_the_h200_run_times_the_yardstick_at_the_harness_contexts_and_its_figures_recompute_from_the_rows():
    """Measured data: the second H200 run of 2026-11-28 timed the compiled yardstick at exactly the contexts of the
    harness's batch-1 iterations (the first run matched 2,571 tokens to a yardstick at 2,048); recomputed from the
    committed CSVs, the held-out iteration errors equal the ones the GPU run recorded. Llama-2-7B is within 5% both
    ways and batch-1 decode within 10%; Llama-3-8B's 5.13% / 5.53% is a miss this run recorded, asserted as such."""
    from profiles.gpu_check import b1_contexts
    from profiles.mixed_from_layers import iteration_errors
    summary = json.loads((CHECKED_H200 / "summary.json").read_text())
    acc, b1 = summary["acceptance"], summary["decode_b1"]
    contexts = b1_contexts(CHECKED_H200 / "l2-7b.csv")
    assert len(contexts) == 6 and sorted(r["context"] for r in b1) == list(contexts)
    assert all(r["reference_context"] == r["context"] for r in b1)
    run3 = json.loads((CHECKED_H200 / "run3-summary.json").read_text())
    assert sorted(r["context"] for r in run3["decode_b1"]) == list(contexts)
    assert all(r["reference_context"] == r["context"] for r in run3["decode_b1"])
    assert acc["decode_b1_max_ratio"] == pytest.approx(max(r["harness_iteration_ms"] / r["reference_ms"] for r in b1))
    assert acc["decode_b1_max_ratio"] <= 1.10
    for model, tag in (("llama-2-7b", "l2-7b"), ("llama-3-8b", "l3-8b")):
        for mode in ("one-varlen", "split"):
            e = iteration_errors([CHECKED_H200 / f"{tag}.csv"], get_model(model), get_gpu("h200"), mode=mode)
            assert e["n"] == 20 and e["all"] == pytest.approx(acc["iterations"][model][mode]["all"], rel=1e-6)
            assert (e["all"] <= 5.0) == (model == "llama-2-7b"), (model, mode, e)


def _mixed_table(n_rows=24, seed=0):
    """A synthetic profile: prefill rows and attn_mixed rows from known laws (decodes in the varlen call at 8 ns a
    KV token plus 3 us a request), decode-kernel rows 4x cheaper."""
    import numpy as np
    rng = np.random.default_rng(seed)
    pre = lambda c, k: 1e-9 * (0.02 * c * k + 0.01 * c * c + 2 * c) + 5e-6      # noqa: E731
    rows = []
    for c in (16, 64, 128, 256, 512, 1024):
        for k in (0, 256, 512):
            rows.append(("attn_prefill", c, f"{c}:{k}", "", pre(c, k) * 1e3))
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for mean in (128, 512, 1024, 2048):
            m = rng.integers(mean // 2, mean * 3 // 2, b)
            rows.append(("attn_decode", b, "", ";".join(map(str, m)), (2e-9 * m.sum() + 1e-6 * b + 4e-6) * 1e3))
    for _ in range(n_rows):
        c, k, b = int(rng.choice([64, 256, 512])), int(rng.choice([0, 256])), int(rng.choice([1, 4, 16, 64, 128]))
        m = rng.integers(16, 2048, b)
        t = pre(c, k) + 8e-9 * m.sum() + 3e-6 * b
        rows.append(("attn_mixed", c + b, f"{c}:{k}", ";".join(map(str, m)), t * 1e3))
    df = pd.DataFrame(rows, columns=["op", "num_tokens", "prefill", "decode", "time_ms"])
    df["mixed_attention"] = ["one-varlen" if op == "attn_mixed" else "" for op in df["op"]]
    return df


def test_calibrate_learns_the_decodes_cost_inside_the_varlen_call_and_prices_each_way(tmp_path):
    """attn_mixed rows fit decode.in_varlen; the model prices a mixed batch's decodes with it in mode one-varlen and
    as decode-kernel rows in mode split; the simulator's fast path (time_from_sums) agrees with compute_time; the
    fit survives a save and load."""
    import numpy as np
    from costmodels.base import BatchShape
    from costmodels.calibrate import fit_decode, fit_mixed_decode, fit_prefill, predict_op
    from costmodels.profiled import ProfiledCostModel
    from costmodels.roofline import RooflineCostModel
    t = _mixed_table()
    model, gpu = get_model("llama-2-7b"), get_gpu("h200")
    pre = fit_prefill(t)
    c = fit_mixed_decode(t, pre)
    mix = t[t["op"] == "attn_mixed"]
    base = RooflineCostModel(model, gpu)
    dense = {1: {"tokens": [1, 4096], "layer_ms": [0.1, 2.0]}}
    keys = ("per_kv_token_s", "batch_half", "per_seq_s", "fixed_s", "batch_exp", "ctx_half")
    decode = dict(zip(keys, fit_decode(t, model, gpu, context_half=True)))
    decode["in_varlen"] = dict(zip(keys, c))
    cm = ProfiledCostModel(dense, decode, dict(zip(("ck_s", "c2_s", "c_s", "k_s", "per_seq_s"), pre)), model, gpu)
    assert cm.mixed_attention == "one-varlen" and base._dec_mixed is None
    err = [abs(predict_op(cm, r) * 1e3 / r["time_ms"] - 1) for _, r in mix.iterrows()]
    assert np.mean(err) < 0.03, np.mean(err)
    shape = BatchShape([256], [0], [1500, 700, 30])
    split = cm.in_mode("split")
    assert split.batch_decode_attn_time(shape) == split.decode_attn_time(shape.decode_context)
    assert cm.batch_decode_attn_time(shape) > 2 * split.batch_decode_attn_time(shape)    # 8 ns vs 2 ns a token
    assert cm.compute_time(shape) > split.compute_time(shape)
    assert cm.batch_decode_attn_time(BatchShape([], [], [1500])) == split.batch_decode_attn_time(BatchShape([], [], [1500]))
    assert cm.time_from_sums(259, 1, 256 * 256, 0, 0, 3, 2230) == cm.compute_time(shape)
    cm.save(tmp_path / "m.yaml")
    back = ProfiledCostModel.load(tmp_path / "m.yaml", model, gpu)
    # the file keeps 6 significant digits
    assert back.mixed_attention == "one-varlen" and back.compute_time(shape) == pytest.approx(cm.compute_time(shape),
                                                                                              rel=1e-5)
    assert ProfiledCostModel.load(tmp_path / "m.yaml", model, gpu, mixed_attention="split").compute_time(shape) == \
        pytest.approx(split.compute_time(shape), rel=1e-5)


def test_a_bad_mixed_attention_value_is_one_line(tmp_path):
    from costmodels.profile_data import read_profile
    t = _mixed_table(4)
    t.loc[t.index[-1], "mixed_attention"] = "both"
    t.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(UserError, match=r"p.csv: row \d+: mixed_attention 'both' is not one of one-varlen, split"):
        read_profile(tmp_path / "p.csv")


def test_profile_check_cli_prints_the_family_table(capsys):
    from sim.cli import main
    assert main(["profile", "--check", "--from", str(CHECKED / "mixtral-moe.csv")]) == 0
    out = capsys.readouterr().out
    assert "moe_mlp" in out and "families flagged" in out



def test_gpu_check_without_a_gpu_says_so():
    r = subprocess.run([sys.executable, "-m", "profiles.gpu_check", "--out", "/tmp/never"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        pytest.skip("this machine has a CUDA GPU")
    assert r.returncode == 2 and ("no CUDA GPU" in r.stderr or "PyTorch is not installed" in r.stderr) and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [(["--skip", "moe,nosuch"], "--skip: unknown stage(s) nosuch; allowed: moe, "
                                                                     "fp8, reference, bandwidth, calibrate"),
                                          (["--repeats", "0"], "--repeats: must be >= 1, got 0"),
                                          (["--token-points", "0"], "--token-points: must be >= 1, got 0")])
def test_gpu_check_refuses_bad_options_before_any_stage(capsys, tmp_path, args, message):
    """On a lent GPU these were found after minutes of device time: --repeats 0 failed the profile stage and then
    the check stage with `No objects to concatenate`; an unknown --skip stage and --token-points 0 were ignored."""
    from profiles.gpu_check import main
    assert main(["--device", "cpu", "--gpu", "a100-80gb", "--out", str(tmp_path / "gc"), *args]) == 2
    assert capsys.readouterr().err.strip() == f"gpu-check: {message}"
    assert not (tmp_path / "gc").exists()
