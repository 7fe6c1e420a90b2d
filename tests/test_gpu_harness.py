"""The profiler harness with PyTorch on a CPU (CI has no GPU): kernel selection and its fallbacks, the engine layer,
the fused kernels under Triton's interpreter, the MoE layer, the CSV a profile writes, and the GPU check's whole path."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from costmodels.catalog import get_model

ROOT = Path(__file__).resolve().parent.parent

# -- kernel selection on a CPU (torch CPU build) ---------------------------------------------------------------
torch = pytest.importorskip("torch", reason="the torch code paths need PyTorch (CPU is enough)")
from profiles import engine_ops as E  # noqa: E402


def _batch(prefill=([16, 8], [0, 24]), decode=(5, 40, 17), heads=4, kv_heads=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = E.PackedBatch(torch, prefill, list(decode), "cpu")
    qkv = torch.randn(b.total_q, (heads + 2 * kv_heads) * d, generator=g)
    q = qkv[:, :heads * d].view(b.total_q, heads, d)            # a view into QKV, as engines pass it
    k, v = torch.randn(b.total_k, kv_heads, d, generator=g), torch.randn(b.total_k, kv_heads, d, generator=g)
    return b, q, k, v


def test_packed_batch_offsets_put_prefill_chunks_first_then_one_row_per_decode():
    b = E.PackedBatch(torch, ([16, 8], [0, 24]), [5, 40], "cpu")
    assert b.q_lens == [16, 8, 1, 1] and b.k_lens == [16, 32, 5, 40]
    assert b.cu_q.tolist() == [0, 16, 24, 25, 26] and b.cu_k.tolist() == [0, 16, 48, 53, 93]
    assert b.contexts == [0, 24, 4, 39] and (b.max_q, b.max_k) == (16, 40)


def test_reference_attention_is_causal_bottom_right():
    """Hand-worked: a chunk of 2 after 1 cached token; query i sees the cached token and chunk tokens 0..i."""
    b = E.PackedBatch(torch, ([2], [1]), [], "cpu")
    q = torch.zeros(2, 1, 2)                      # zero queries: uniform weights over what each row sees
    v = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[4.0, 4.0]]])
    out = E.reference_attention(torch, q, torch.zeros(3, 1, 2), v, b)
    assert torch.allclose(out[0, 0], torch.tensor([0.5, 0.5]))          # sees rows 0, 1
    assert torch.allclose(out[1, 0], torch.tensor([5 / 3, 5 / 3]))      # sees rows 0, 1, 2


@pytest.mark.parametrize("impl", ["sdpa-per-request", "sdpa-padded"])
def test_cpu_attention_fallbacks_match_the_reference_on_mixed_gqa_batches(impl):
    b, q, k, v = _batch()
    got = E.working_attentions(torch, "cpu", torch.float32, prefer=impl)[0][0].prepare(k, v, b)(q)
    assert torch.allclose(got, E.reference_attention(torch, q, k, v, b), atol=1e-5)


def test_selection_skips_what_this_machine_lacks_and_says_why():
    ok, tried = E.working_attentions(torch, "cpu", torch.float32)
    outcome = dict(tried)
    assert [a.name for a in ok] == ["sdpa-per-request", "sdpa-padded"]
    assert outcome["torch-flash-varlen"].startswith("skipped: needs CUDA")
    assert outcome["vllm-flash-varlen"].startswith("skipped") and outcome["flash-attn-varlen"].startswith("skipped")
    assert E.pick_attention(torch, "cpu", torch.float32)[0].name == "sdpa-per-request"


def test_a_candidate_that_fails_or_is_wrong_is_passed_over(monkeypatch):
    class Broken(E.Attention):
        name = "broken"

        def prepare(self, k, v, b):
            raise RuntimeError("no kernel image for this device")

    class Wrong(E.Attention):
        name = "wrong"

        def prepare(self, k, v, b):
            return lambda q: torch.zeros_like(q)
    real = E.attention_candidates

    def fake(torch_, dev, heads):
        return [("broken", lambda: Broken(torch_), ""), ("wrong", lambda: Wrong(torch_), "")] + real(torch_, dev, heads)
    monkeypatch.setattr(E, "attention_candidates", fake)
    impl, tried = E.pick_attention(torch, "cpu", torch.float32)
    assert impl.name == "sdpa-per-request"
    assert dict(tried)["broken"].startswith("failed: RuntimeError") and dict(tried)["wrong"].startswith("wrong")


def test_kernels_sized_at_prepare_time_take_the_layers_head_count():
    """Candidates are validated on a 4-head batch; a layer with another head count must re-size them (a kernel left
    at 4 heads would time a quarter of the work)."""
    from profiles.backends import make_backend
    from profiles.layer import Layer
    from costmodels.catalog import get_model
    be = make_backend("cpu", "torch", "engine", attention="sdpa-padded")
    model = get_model("llama-2-7b")
    small = type(model)(**{**model.__dict__, "name": "two-layer", "layers": 2, "hidden": 512, "heads": 8,
                           "kv_heads": 8, "ffn": 64, "vocab": 64})
    layer = Layer(small, 1, be, 64)
    b, run, _ = layer.packed(([], []), [3, 9])
    q = be.randn(b.total_q, 8, small.head_dim)
    assert be.attn.heads == 8
    assert torch.allclose(run(q), E.reference_attention(torch, q, layer.kcache[:b.total_k], layer.vcache[:b.total_k], b),
                          atol=1e-5)
    with pytest.raises(ValueError, match="prepared for 8 query heads"):
        run(be.randn(b.total_q, 4, small.head_dim))


def test_race_on_a_cpu_keeps_the_first_working_candidate():
    b, q, k, v = _batch(prefill=([], []))
    ok, _ = E.working_attentions(torch, "cpu", torch.float32)
    name, run = E.race(torch, ok, k, v, b, q)
    assert name == ok[0].name and torch.allclose(run(q), E.reference_attention(torch, q, k, v, b), atol=1e-5)


def test_torch_elementwise_fallbacks_compute_what_engines_do():
    el = E.Elementwise(torch, "cpu", torch.float32, use_triton=False)
    assert el.impl == {"rmsnorm": "torch-rms_norm", "silu_mul": "torch-silu-mul", "rope": "torch-rotary"}
    g = torch.Generator().manual_seed(3)
    x, r, w = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g), torch.rand(8, generator=g) + 0.5
    r0 = r.clone()
    out = el.rmsnorm(x, w, r)                           # fused add: the residual becomes x + r, then normalised
    s = x + r0
    assert torch.allclose(r, s) and torch.allclose(out, s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w,
                                                     atol=1e-6)
    gu = torch.randn(2, 6, generator=g)
    assert torch.allclose(el.silu_mul(gu), gu[:, :3] * torch.sigmoid(gu[:, :3]) * gu[:, 3:])
    # rotary on one head of width 4 at position 0 with cos=1, sin=0 is the identity; with cos=0, sin=1 it rotates
    qkv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
    cos, sin = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    el.rope(qkv, 4, 4, 4, cos, sin, torch.tensor([0]))
    assert qkv.tolist() == [[-3.0, -4.0, 1.0, 2.0, -7.0, -8.0, 5.0, 6.0]]


def test_triton_kernels_match_torch_under_the_interpreter():
    """The fused kernels are checked against torch on the GPU before use; here Triton's interpreter runs them on
    the CPU (skipped where Triton is not installed)."""
    pytest.importorskip("triton")
    code = ("import torch; from profiles import engine_ops as E; "
            "el = E.Elementwise(torch, 'cpu', torch.float32, use_triton=True); print(sorted(el.impl.values()))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-500:]
    assert "['triton-fused-rms_norm', 'triton-fused-rotary', 'triton-fused-silu-mul']" in r.stdout


def test_split_kv_decode_kernel_matches_the_reference_under_the_interpreter():
    """The Triton split-KV decode kernel (grouped heads read each K/V row once; partials merged by log-sum-exp) on
    MHA and GQA decode batches, several splits per request, contexts across block edges."""
    pytest.importorskip("triton")
    code = """
import torch
from profiles import engine_ops as E
errs = []
for H, Hkv, sms in ((8, 2, 8), (4, 4, 2), (6, 1, 64)):
    g = torch.Generator().manual_seed(H)
    b = E.PackedBatch(torch, ([], []), [1, 70, 200, 64, 65], "cpu")
    q = torch.randn(b.total_q, H, 32, generator=g)
    k, v = (torch.randn(b.total_k, Hkv, 32, generator=g) for _ in range(2))
    out = E.TritonSplitKvDecode(torch, H, sms).prepare(k, v, b)(q)
    errs.append(float((out - E.reference_attention(torch, q, k, v, b)).abs().max()))
print(max(errs))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-500:]
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-4


def test_moe_layer_routes_each_token_to_k_experts_and_weights_them_equally():
    act = lambda gu: torch.nn.functional.silu(gu[:, :gu.shape[1] // 2]) * gu[:, gu.shape[1] // 2:]  # noqa: E731
    moe = E.MoeMlp(torch, "cpu", torch.float32, hidden=16, expert_ffn=8, experts=4, top_k=2, act=act)
    assert moe.pick()[0] == "per-expert-loop"            # no grouped GEMM on a CPU
    x = torch.randn(6, 16)
    tok, weights, offs, bounds, reached = moe.routing(6)
    counts = torch.bincount(tok, minlength=6)
    assert counts.tolist() == [2] * 6 and offs[-1].item() == 12 and reached == sum(b > a for a, b in bounds)
    run, _ = moe.op(x)
    # the same sum written token by token
    want = torch.zeros_like(x)
    for e, (a, b) in enumerate(bounds):
        for t in tok[a:b].tolist():
            want[t] += 0.5 * (act((x[t:t + 1] @ moe.w_up[e].t())) @ moe.w_down[e].t())[0]
    assert torch.allclose(run(), want, atol=1e-5)


# -- the harness on a CPU: schema, engine layer ------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_engine_profile(tmp_path_factory):
    from profiles.harness import FIELDS, run_profile
    out = tmp_path_factory.mktemp("prof") / "tiny.csv"
    n = run_profile("tiny-llama", "cpu", out, quick=True, repeats=2, iterations=3, token_points=4, mixed_count=4)
    df = pd.read_csv(out)
    assert len(df) == n and list(df.columns) == list(FIELDS)
    return out, df


def test_engine_profile_rows_say_how_they_were_timed_and_what_ran(cpu_engine_profile):
    _, df = cpu_engine_profile
    assert set(df["timing"]) == {"cpu"} and set(df["backend"]) == {"torch"}
    impl = df.groupby("op")["kernels_impl"].first()
    assert impl["attn_decode"] == "sdpa-per-request" and impl["attn_prefill"] == "sdpa-per-request"
    assert impl["input_layernorm"].startswith("torch-rms_norm") and "KV-cache write" in impl["attn_rope"]
    assert {"iteration_forward", "layer_forward", "attn_prefill", "attn_decode", "mlp_up_proj"} <= set(df["op"])


def test_engine_layer_attention_reads_the_batch_it_was_given():
    """The engine layer's attention over its packed pool equals the reference on the same rows."""
    from profiles.backends import make_backend
    from profiles.layer import Layer
    be = make_backend("cpu", "torch", "engine")
    layer = Layer(get_model("tiny-llama"), 1, be, 128)
    prefill, decode = ([5, 3], [0, 7]), [9, 2]
    b, run, slots = layer.packed(prefill, decode)
    q = be.randn(b.total_q, layer.heads, layer.d)
    want = E.reference_attention(torch, q, layer.kcache[:b.total_k], layer.vcache[:b.total_k], b)
    assert torch.allclose(run(q), want, atol=1e-5)
    assert slots.tolist() == [0, 1, 2, 3, 4, 12, 13, 14, 23, 25]      # each request's new tokens, at its span's end


def test_bad_profile_options_are_one_line(tmp_path, capsys):
    from sim.cli import main
    for argv, want in ((["profile", "--device", "cpu", "--out", str(tmp_path / "a.csv"), "--attention", "magic"],
                        "--attention: 'magic' is not one of"),
                       (["profile", "--device", "cpu"], "--out CSV is required"),
                       (["profile", "--from", "x.csv"], "--from: only with --check")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and want in err, err


# -- the one-command GPU check, end to end on a CPU ---------------------------------------------------------------
def test_gpu_check_dry_run_on_a_cpu_writes_the_report(tmp_path):
    from profiles.gpu_check import main
    assert main(["--device", "cpu", "--gpu", "a100-80gb", "--quick", "--repeats", "2", "--token-points", "4",
                 "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "## Check" in report and "## calibrate tiny-llama" in report and "## Acceptance" in report
    # a mixed batch timed both ways an engine runs it, each held out against the model priced that way
    assert set(summary["acceptance"]["iterations"]["tiny-llama"]) == {"one-varlen", "split"}
    assert {"one-varlen", "split"} <= set(pd.read_csv(tmp_path / "tiny.csv")["mixed_attention"].dropna())
    assert not any(str(v).startswith("failed") for v in summary["stages_s"].values()), summary["stages_s"]
    assert summary["timing_modes"] == {"cpu": len(pd.read_csv(tmp_path / "tiny.csv"))}
    assert math.isfinite(summary["calibrate"]["tiny-llama"]["other (sum of non-attention ops)"])
    assert (tmp_path / "tiny-profiled.yaml").exists()




# -- a mixed batch both ways engines run it; the split-KV kernel's split count -------------------------------------
def test_split_mixed_runs_prefills_and_decodes_apart_and_matches_the_reference():
    """FlashInfer-style: the prefill chunks through the general kernel, the decodes through the decode kernel, over
    one pool holding the prefills' K/V rows first; the same output as one call over the whole batch."""
    b, q, k, v = _batch(prefill=([16, 8], [0, 24]), decode=(5, 40, 17, 130))
    ok, _ = E.working_attentions(torch, "cpu", torch.float32)
    label, run = E.split_mixed(torch, ok[0], ok, k, v, ([16, 8], [0, 24]), [5, 40, 17, 130], "cpu", q[b.total_q - 4:])
    assert label == "split: sdpa-per-request + sdpa-per-request"
    assert torch.allclose(run(q), E.reference_attention(torch, q, k, v, b), atol=1e-5)


def test_engine_layer_times_a_mixed_batch_both_ways_and_they_agree():
    from profiles.backends import make_backend
    from profiles.layer import Layer
    be = make_backend("cpu", "torch", "engine")
    layer = Layer(get_model("tiny-llama"), 1, be, 128)
    prefill, decode = ([5, 3], [0, 7]), [9, 2, 30]
    outs = {}
    for way in ("one-varlen", "split"):
        b, run, _ = layer.packed(prefill, decode, way)
        q = torch.randn(b.total_q, layer.heads, layer.d, generator=torch.Generator().manual_seed(3))
        outs[way] = run(q)
        assert be.last_attn.startswith("split: ") == (way == "split")
    assert torch.allclose(outs["one-varlen"], outs["split"], atol=1e-5)
    with pytest.raises(ValueError, match="not one of"):
        layer.packed(prefill, decode, "both")


def test_split_count_grows_with_the_context_until_the_gpu_is_full():
    """Few requests with long contexts: more slices of the context (programs for every SM), none under one block of
    keys, at most MAX_SPLITS; a batch that fills the GPU alone is not split."""
    sms = 132
    s = [E.decode_splits(1, 32, m, sms) for m in (1, 64, 65, 249, 1024, 2571, 8192)]
    assert s == sorted(s) and s[0] == s[1] == 1 and s[2] == 2 and s[3] == 4
    assert s[-1] == E.decode_splits(1, 32, 10 ** 6, sms) <= E.MAX_SPLITS
    assert E.decode_splits(1, 32, 2571, sms) * 32 >= E.PROGRAMS_PER_SM * sms      # every SM gets its programs
    assert E.decode_splits(256, 32, 2571, sms) == 1
    assert E.decode_splits(1, 8, 2571, sms) >= E.decode_splits(1, 32, 2571, sms)  # fewer KV heads: more slices
    # the race tries the heuristic, half and twice it and the first rule (2 programs per SM, at most 16)
    v = E.split_variants(1, 32, 2571, sms)
    assert E.decode_splits(1, 32, 2571, sms) in v and 9 in v and all(1 <= x <= E.MAX_SPLITS for x in v)
    assert E.split_variants(1, 32, 40, sms) == [1]


def test_split_kv_kernel_is_exact_for_every_split_count_under_the_interpreter():
    """Splits are whole 64-key blocks, so a large count leaves trailing splits empty: the merge must ignore them."""
    pytest.importorskip("triton")
    code = """
import torch
from profiles import engine_ops as E
g = torch.Generator().manual_seed(5)
b = E.PackedBatch(torch, ([], []), [1, 70, 300, 64], "cpu")
q = torch.randn(b.total_q, 8, 32, generator=g)
k, v = (torch.randn(b.total_k, 2, 32, generator=g) for _ in range(2))
ref = E.reference_attention(torch, q, k, v, b)
impl = E.TritonSplitKvDecode(torch, 8, 4)
errs = [float((impl.prepare(k, v, b, s)(q) - ref).abs().max()) for s in (1, 2, 3, 5, 7, 32, 64)]
label, run = E.race(torch, [impl], k, v, b, q)
errs.append(float((run(q) - ref).abs().max()))
print(label)
print(max(errs))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-500:]
    label, err = r.stdout.strip().splitlines()[-2:]
    assert label == f"triton-split-kv-decode ({E.decode_splits(4, 2, 300, 4)} splits)"
    assert float(err) < 1e-4
