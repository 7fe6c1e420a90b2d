"""Profile files, the `calibrate` and `profile` commands, and the CPU profiler harness end to end."""
import pandas as pd
import pytest

from costmodels import BatchShape, build_costmodel, get_gpu, get_model
from costmodels.errors import UserError
from costmodels.operators import LAYER_OPS
from costmodels.profile_data import parse_decode, read_profile
from sim.cli import main


def _write(tmp_path, rows, name="p.csv"):
    p = tmp_path / name
    pd.DataFrame(rows).to_csv(p, index=False)
    return p


def _one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error:") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_profiles_get_one_clear_line(tmp_path, capsys):
    base = ["calibrate", "--model", "tiny-llama", "--gpu", "a100-80gb", "-o", str(tmp_path / "o.yaml")]
    missing = _write(tmp_path, [{"op": "add", "num_tokens": 4, "time_ms": 0.1}])
    assert "missing column(s) prefill, decode" in _one_line_error(capsys, base + [str(missing)])
    neg = _write(tmp_path, [{"op": "add", "num_tokens": 4, "prefill": "", "decode": "", "time_ms": 0.1},
                            {"op": "add", "num_tokens": 8, "prefill": "", "decode": "", "time_ms": -1}])
    assert "row 3: time_ms must be a positive number" in _one_line_error(capsys, base + [str(neg)])
    bad_op = _write(tmp_path, [{"op": "matmul", "num_tokens": 4, "prefill": "", "decode": "", "time_ms": 0.1}])
    assert "unknown op 'matmul'" in _one_line_error(capsys, base + [str(bad_op)])
    bad_shape = _write(tmp_path, [{"op": "attn_decode", "num_tokens": 2, "prefill": "", "decode": "5;x", "time_ms": 0.1}])
    assert "decode like 'm;m'" in _one_line_error(capsys, base + [str(bad_shape)])
    assert "does not exist" in _one_line_error(capsys, base + [str(tmp_path / "nope.csv")])
    few = _write(tmp_path, [{"op": "add", "num_tokens": 4, "prefill": "", "decode": "", "time_ms": 0.1}])
    assert "needs rows for op(s)" in _one_line_error(capsys, base + ["--kind", "linear", str(few)])


def test_vidur_files_are_read_into_the_harness_table(shared_data):
    d = shared_data / "profiles" / "vidur-a100-llama-2-7b"
    mlp = read_profile(d / "mlp.csv", tp=2)
    assert set(mlp["op"]) == set(LAYER_OPS) | {"emb"} and (mlp["time_ms"] > 0).all()
    att = read_profile(d / "attention_sample.csv")
    dec = att[att["op"] == "attn_decode"].iloc[0]
    ctx = parse_decode(dec["decode"])
    assert len(ctx) == dec["num_tokens"] and len(set(ctx)) == 1
    with pytest.raises(UserError, match="no rows for num_tensor_parallel_workers=3"):
        read_profile(d / "mlp.csv", tp=3)


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "tiny.csv"
    assert main(["profile", "--device", "cpu", "--backend", "numpy", "--model", "tiny-llama", "--out", str(out),
                 "--quick", "--max-tokens", "32", "--repeats", "2"]) == 0
    return out


def test_cpu_harness_writes_every_operator_with_metadata(cpu_profile):
    df = pd.read_csv(cpu_profile, keep_default_na=False)
    assert set(LAYER_OPS) | {"emb", "attn_prefill", "attn_decode", "layer_forward", "iteration_forward"} <= set(df["op"])
    # a whole iteration runs every layer: it takes longer than the same batch's one layer (best of the repeats,
    # which another process on the same cores disturbs least)
    it, lf = (df[df["op"] == op].set_index(["prefill", "decode"])["time_ms_min"] for op in ("iteration_forward",
                                                                                          "layer_forward"))
    both = it.index.intersection(lf.index)
    assert len(both) and (it.loc[both] > lf.loc[both]).all()
    assert (df["time_ms"] > 0).all() and (df["time_ms_min"] <= df["time_ms"]).all()
    assert (df["device"] == "cpu").all() and df["numpy_version"].astype(str).str.len().min() > 0
    dec = [parse_decode(s) for s in df.loc[df["op"] == "attn_decode", "decode"]]
    assert any(len(set(c)) > 1 for c in dec), "decode batches should carry per-request contexts"
    pre = df[df["op"] == "attn_prefill"]["prefill"]
    assert any(int(s.split(":")[1]) > 0 for s in pre), "prefill over cached context"


@pytest.mark.parametrize("kind", ["linear", "roofline", "profiled"])
def test_calibrate_accepts_the_harness_csv(cpu_profile, tmp_path, capsys, kind):
    out = tmp_path / f"tiny-{kind}.yaml"
    assert main(["calibrate", str(cpu_profile), "--model", "tiny-llama", "--gpu", "a100-80gb", "--kind", kind,
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held-out error" in text and "layer_forward" in text and "iteration_forward (measured whole" in text
    cm = build_costmodel({"kind": kind, "path": str(out)} if kind != "linear" else {"kind": kind, "path": str(out)},
                         get_model("tiny-llama"), get_gpu("a100-80gb"))
    small, large = cm.batch_time(BatchShape([], [], [16] * 2)), cm.batch_time(BatchShape([1024], [0], [16] * 2))
    assert 0 < small < large


def test_profile_without_torch_on_cuda_says_how_to_fix(tmp_path, capsys):
    try:
        import torch  # noqa: F401
        pytest.skip("PyTorch installed: the no-torch message is not reachable")
    except ImportError:
        pass
    err = _one_line_error(capsys, ["profile", "--device", "cuda", "--model", "tiny-llama", "--out", str(tmp_path / "x.csv")])
    assert "pip install" in err


def test_numpy_attention_matches_a_direct_softmax():
    import numpy as np
    from profiles.harness import Layer, NumpyBackend
    be = NumpyBackend("cpu")
    layer = Layer(get_model("tiny-llama"), 1, be, 64)
    prefill, decode = ([3], [2]), [4]
    q = be.randn(4, layer.heads, layer.d) * 50
    out = be.attention(q, layer.prepared(prefill, decode), prefill, decode)
    kv = layer.kv_views(prefill, decode)
    rep = layer.heads // layer.kv_heads

    def ref(qrow, k, v, visible):
        k, v = np.repeat(k[:visible], rep, 1), np.repeat(v[:visible], rep, 1)
        s = np.einsum("hd,khd->hk", qrow, k) / np.sqrt(layer.d)
        p = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("hk,khd->hd", p / p.sum(-1, keepdims=True), v)
    for i in range(3):                          # chunk token i sees 2 cached + i + 1 chunk tokens
        assert np.allclose(out[i], ref(q[i], *kv[0], 2 + i + 1), atol=1e-5)
    assert np.allclose(out[3], ref(q[3], *kv[1], 4), atol=1e-5)


def test_torch_backend_attention_matches_numpy():
    torch = pytest.importorskip("torch")
    import numpy as np
    from profiles.harness import Layer, NumpyBackend, TorchBackend
    nb, tb = NumpyBackend("cpu"), TorchBackend("cpu")
    model = get_model("tiny-llama")
    ln, lt = Layer(model, 1, nb, 64), Layer(model, 1, tb, 64)
    lt.kcache, lt.vcache = torch.from_numpy(ln.kcache), torch.from_numpy(ln.vcache)   # same caches
    prefill, decode = ([3, 5], [2, 0]), [4, 9, 1]
    q = nb.randn(3 + 5 + 3, ln.heads, ln.d) * 50
    want = nb.attention(q, ln.prepared(prefill, decode), prefill, decode)
    got = tb.attention(torch.from_numpy(q), lt.prepared(prefill, decode), prefill, decode).numpy()
    assert np.allclose(got, want, atol=1e-4)


def test_collectives_rows_are_vidurs_format_and_fit_back_to_their_line(tmp_path):
    """`servesim profile --collectives` writes Vidur's all_reduce.csv; with a known latency-bandwidth timer the
    collectives fit recovers the line (torch.distributed itself needs GPUs or PyTorch, absent in CI)."""
    import numpy as np
    from costmodels.collectives import fit_two_lines, read_nccl, two_line_time
    from profiles.harness import run_collectives
    lat, bw = 12e-6, 150e9                       # seconds, bytes/s

    def timer(world, elements, repeats):
        t = (lat + 2 * elements / bw * (world - 1) / world) * 1e3
        return [t * (1 + 0.01 * k) for k in range(repeats)]
    out = tmp_path / "net" / "mynode" / "all_reduce.csv"
    assert run_collectives(out, [2, 4], device="cpu", repeats=3, timer=timer) == 2 * 17
    df = pd.read_csv(out)
    assert {"time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"} <= set(df.columns)
    data = read_nccl(tmp_path / "net")
    assert set(data) == {("mynode", 2), ("mynode", 4)}
    s, y = data[("mynode", 4)]
    p = fit_two_lines(s, y)
    assert np.max(np.abs(two_line_time(p, s) - y) / y) < 0.03


def test_collectives_bad_gpu_counts_are_one_line(tmp_path, capsys):
    err = _one_line_error(capsys, ["profile", "--collectives", "--gpus", "1,2", "--out", str(tmp_path / "a.csv")])
    assert "at least 2 GPUs" in err
    err = _one_line_error(capsys, ["profile", "--collectives", "--gpus", "two", "--out", str(tmp_path / "a.csv")])
    assert "comma-separated" in err
