"""Profiler harness: times one decoder layer's operators on random weights of a catalog model's shapes."""
from __future__ import annotations

import csv
import platform
import statistics
import time

import numpy as np

from costmodels.catalog import get_model
from costmodels.errors import UserError
from costmodels.profile_data import format_decode, format_prefill

FIELDS = ("op", "num_tokens", "prefill", "decode", "time_ms", "time_ms_min", "time_ms_max", "repeats", "model", "tp",
          "dtype", "device", "device_name", "backend", "attention_impl", "torch_version", "numpy_version", "python_version")


# -- backends: the same layer written against numpy (CPU, no PyTorch) or torch (CPU or CUDA) ---------------
class NumpyBackend:
    """float32 on the CPU; attention runs request by request over each request's own context."""
    name, dtype, attention_impl = "numpy", "fp32", "numpy-per-request"

    def __init__(self, device):
        if device != "cpu":
            raise UserError("--backend numpy runs on --device cpu only; install PyTorch (`pip install -e '.[profile]'`) for cuda")
        self.rng = np.random.default_rng(0)
        self.device_name = platform.processor() or platform.machine()
        self.versions = {"torch_version": "", "numpy_version": np.__version__}

    def randn(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    def tokens(self, n):
        return self.rng.integers(0, 100, n)

    matmul = staticmethod(np.matmul)

    @staticmethod
    def rmsnorm(x, w):
        return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)) * w

    @staticmethod
    def rope(q, k, cos, sin):
        def rot(x):
            h = x.shape[-1] // 2
            return x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin
        return rot(q), rot(k)

    @staticmethod
    def silu_mul(gu):
        g, u = np.split(gu, 2, axis=-1)
        return g / (1.0 + np.exp(-g)) * u

    @staticmethod
    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))

    @staticmethod
    def embed(table, ids):
        return table[ids]

    def prepare(self, kvs, prefill, decode, heads, kv_heads):
        """Per-request (K, V) views, GQA heads expanded once, outside the timed region."""
        rep = heads // kv_heads
        return [(np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)) if rep > 1 else (k, v) for k, v in kvs]

    def attention(self, q, prep, prefill, decode):
        """q: (tokens, heads, d), prefill chunks first then one row per decode; prep from `prepare`."""
        out, row = np.empty_like(q), 0
        for (c, ctx), (k, v) in zip(list(zip(*prefill)) + [(1, m - 1) for m in decode], prep):
            span = ctx + c
            s = np.einsum("qhd,khd->hqk", q[row:row + c], k) / np.sqrt(q.shape[-1])
            if c > 1:  # causal inside the chunk
                s += np.triu(np.full((c, span), -np.inf, dtype=np.float32), k=ctx + 1)
            s = np.exp(np.maximum(s - s.max(-1, keepdims=True), -60.0))  # no subnormals: x86 exp slows 10×
            s /= s.sum(-1, keepdims=True)
            out[row:row + c] = np.einsum("hqk,khd->qhd", s, v)
            row += c
        return out

    def time(self, fn, repeats, warmup=2):
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return ts


class TorchBackend(NumpyBackend):
    """fp16 on CUDA (float32 on CPU), timed with CUDA events. Decode attention pads the batch to its
    longest context and masks (torch SDPA); the recorded attention_impl says so."""
    name, attention_impl = "torch", "torch-sdpa-padded"

    def __init__(self, device):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: PyTorch sees no CUDA device; use --device cpu")
        self.dev = torch.device(device)
        self.tdtype = torch.float16 if device == "cuda" else torch.float32
        self.dtype = "fp16" if device == "cuda" else "fp32"
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.device_name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
        self.versions = {"torch_version": torch.__version__, "numpy_version": np.__version__}

    def randn(self, *shape):
        return (self.torch.randn(*shape, generator=self.gen, device=self.dev, dtype=self.tdtype) * 0.02)

    def tokens(self, n):
        return self.torch.randint(0, 100, (n,), generator=self.gen, device=self.dev)

    matmul = staticmethod(lambda a, b: a @ b)

    def rmsnorm(self, x, w):
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def rope(self, q, k, cos, sin):
        def rot(x):
            h = x.shape[-1] // 2
            return x * cos + self.torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin
        return rot(q), rot(k)

    def silu_mul(self, gu):
        g, u = gu.chunk(2, dim=-1)
        return self.F.silu(g) * u

    def gelu(self, x):
        return self.F.gelu(x)

    def embed(self, table, ids):
        return table[ids]

    def prepare(self, kvs, prefill, decode, heads, kv_heads):
        """Prefill: per-request (H, span, d) K/V. Decode: one padded (B, H, max m, d) K/V copy of each
        request's own cache rows plus a length mask, all built before timing."""
        torch, rep = self.torch, heads // kv_heads
        heads_first = lambda x: x.transpose(0, 1).repeat_interleave(rep, 0) if rep > 1 else x.transpose(0, 1)  # noqa: E731
        npre = len(prefill[0])
        pre = [(heads_first(k), heads_first(v)) for k, v in kvs[:npre]]
        dec = None
        if decode:
            B, mx = len(decode), max(decode)
            kd = torch.zeros(B, heads, mx, kvs[npre][0].shape[-1], dtype=self.tdtype, device=self.dev)
            vd = torch.zeros_like(kd)
            for i, (k, v) in enumerate(kvs[npre:]):
                kd[i, :, :k.shape[0]] = heads_first(k)
                vd[i, :, :v.shape[0]] = heads_first(v)
            lens = torch.tensor(decode, device=self.dev)
            mask = (torch.arange(mx, device=self.dev)[None, :] < lens[:, None])[:, None, None, :]
            dec = (kd, vd, mask)
        masks = [torch.ones(c, k + c, dtype=torch.bool, device=self.dev).tril(diagonal=k) for c, k in zip(*prefill)]
        return pre, masks, dec

    def attention(self, q, prep, prefill, decode):
        torch, F = self.torch, self.F
        pre, masks, dec = prep
        outs, row = [], 0
        for (c, _), (k, v), mask in zip(zip(*prefill), pre, masks):   # one SDPA call per prefill chunk
            outs.append(F.scaled_dot_product_attention(q[row:row + c].transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1))
            row += c
        if dec is not None:                                             # all decode rows in one padded call
            kd, vd, mask = dec
            qd = q[row:row + len(decode)].unsqueeze(2)
            outs.append(F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask).squeeze(2))
        return torch.cat(outs, 0)

    def time(self, fn, repeats, warmup=3):
        torch = self.torch
        if self.dev.type != "cuda":
            return super().time(fn, repeats, warmup)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return ts


def make_backend(device: str, backend: str = "auto"):
    if backend in ("auto", "torch"):
        try:
            import torch  # noqa: F401
            return TorchBackend(device)
        except ImportError:
            if backend == "torch" or device == "cuda":
                raise UserError("profile: PyTorch is not installed; `pip install -e '.[profile]'` "
                                "(or use --device cpu, which falls back to numpy)") from None
    return NumpyBackend(device)


# -- one decoder layer of a catalog model, random weights ---------------------------------------------------
class Layer:
    """The weights and the operator closures of one tensor-parallel shard of one decoder layer."""

    def __init__(self, model, tp, be, max_ctx):
        model.check_tp(tp, "--tp")
        self.m, self.be, self.tp = model, be, tp
        self.heads, self.kv_heads, self.d = model.heads // tp, model.kv_heads_per_gpu(tp), model.head_dim
        h, q, kv = model.hidden, self.heads * self.d, self.kv_heads * self.d
        f = model.ffn // tp
        self.w_norm = be.randn(h) + 1
        self.w_qkv, self.w_o = be.randn(h, q + 2 * kv), be.randn(q, h)
        self.w_up, self.w_down = be.randn(h, (2 if model.gated_mlp else 1) * f), be.randn(f, h)
        self.emb = be.randn(model.vocab, h)
        self.w_lm = be.randn(h, model.vocab // tp)
        # A KV pool several contexts long: requests read different rows, so decode timings are not served
        # from cache the way they would be if every request re-read the same few rows.
        self.pool = 4 * max_ctx
        self.kcache, self.vcache = be.randn(self.pool, self.kv_heads, self.d), be.randn(self.pool, self.kv_heads, self.d)
        self.q_w, self.kv_w, self.f = q, kv, f

    def inputs(self, n):
        be = self.be
        x = be.randn(n, self.m.hidden)
        return dict(x=x, qkv=be.matmul(x, self.w_qkv), attn=be.randn(n, self.q_w),
                    up=be.randn(n, self.w_up.shape[1]), act=be.randn(n, self.f),
                    cos=be.randn(n, 1, self.d), sin=be.randn(n, 1, self.d), ids=be.tokens(n))

    def dense_ops(self, n):
        """Closure per Vidur-named operator over n tokens."""
        be, t = self.be, self.inputs(n)
        q = t["qkv"][:, :self.q_w].reshape(n, self.heads, self.d)
        k = t["qkv"][:, self.q_w:self.q_w + self.kv_w].reshape(n, self.kv_heads, self.d)
        act = be.silu_mul if self.m.gated_mlp else be.gelu
        return {
            "input_layernorm": lambda: be.rmsnorm(t["x"], self.w_norm),
            "attn_pre_proj": lambda: be.matmul(t["x"], self.w_qkv),
            "attn_rope": lambda: be.rope(q, k, t["cos"], t["sin"]),
            "attn_post_proj": lambda: be.matmul(t["attn"], self.w_o),
            "post_attention_layernorm": lambda: be.rmsnorm(t["x"], self.w_norm),
            "mlp_up_proj": lambda: be.matmul(t["x"], self.w_up),
            "mlp_act": lambda: act(t["up"]),
            "mlp_down_proj": lambda: be.matmul(t["act"], self.w_down),
            "add": lambda: t["x"] + t["x"],
            "emb": lambda: be.embed(self.emb, t["ids"]),
        }

    def kv_views(self, prefill, decode):
        """Each request's own K/V rows (context + chunk for prefill, m for decode), spread over the pool."""
        spans = [k + c for c, k in zip(*prefill)] + list(decode)
        out, off = [], 0
        for span in spans:
            off = off if off + span <= self.pool else 0
            out.append((self.kcache[off:off + span], self.vcache[off:off + span]))
            off += span
        return out

    def prepared(self, prefill, decode):
        return self.be.prepare(self.kv_views(prefill, decode), prefill, decode, self.heads, self.kv_heads)

    def attention_op(self, prefill, decode):
        n = sum(prefill[0]) + len(decode)
        q = self.be.randn(n, self.heads, self.d)
        prep = self.prepared(prefill, decode)
        return lambda: self.be.attention(q, prep, prefill, decode)

    def forward(self, prefill, decode):
        """A whole layer on a mixed batch (no emb): norm, QKV, RoPE, attention, O, add, norm, MLP, add."""
        be, n = self.be, sum(prefill[0]) + len(decode)
        t = self.inputs(n)
        act = be.silu_mul if self.m.gated_mlp else be.gelu
        prep = self.prepared(prefill, decode)

        def run():
            x = be.rmsnorm(t["x"], self.w_norm)
            qkv = be.matmul(x, self.w_qkv)
            q = qkv[:, :self.q_w].reshape(n, self.heads, self.d)
            k = qkv[:, self.q_w:self.q_w + self.kv_w].reshape(n, self.kv_heads, self.d)
            q, k = be.rope(q, k, t["cos"], t["sin"])
            a = be.attention(q, prep, prefill, decode)
            r = t["x"] + be.matmul(a.reshape(n, self.q_w), self.w_o)
            return r + be.matmul(act(be.matmul(be.rmsnorm(r, self.w_norm), self.w_up)), self.w_down)
        return run


    def iteration(self, prefill, decode):
        """A whole iteration on a mixed batch: embedding, every layer (this layer's weights, once per layer), the
        final norm, lm_head for the rows that sample (each prefill chunk's last token and every decode) and a
        greedy draw. One process: no all-reduce, so only tp 1 is recorded."""
        be, layers = self.be, self.m.layers
        n = sum(prefill[0]) + len(decode)
        ids = be.tokens(n)
        step = self.forward(prefill, decode)
        sample = len(prefill[0]) + len(decode)

        def run():
            be.embed(self.emb, ids)
            for _ in range(layers):
                x = step()
            logits = be.matmul(be.rmsnorm(x[:sample], self.w_norm), self.w_lm)
            return logits.argmax(-1)
        return run


# -- grids ----------------------------------------------------------------------------------------------
def grids(max_tokens: int, max_ctx: int, quick: bool, seed: int = 0):
    """Token counts, prefill (chunk, context) pairs, decode batches with per-request contexts, mixed batches."""
    rng = np.random.default_rng(seed)
    pow2 = [2 ** i for i in range(0, 14) if 2 ** i <= max_tokens]
    step = max(1, max_tokens // (8 if quick else 64))
    tokens = sorted(set(pow2 + list(range(step, max_tokens + 1, step))))
    chunks = sorted({c for c in (16, 64, 128, 256, 512, 1024, 2048, 4096) if c <= max_tokens} | {max_tokens})
    ctxs = sorted({k for k in (0, 64, 256, 512, 1024, 2048, 3072) if k < max_ctx} | {max_ctx // 4, max_ctx // 2})
    prefill = [(c, k) for c in chunks for k in ctxs if c + k <= max_ctx]
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= (16 if quick else 256)]
    means = [m for m in (16, 64, 128, 256, 512, 1024, 2048, 3072) if m < max_ctx * 0.66]
    decode = []
    for b in batches:
        for mean in means:   # each request draws its own context around the mean
            ctx = np.clip(rng.integers(mean // 2, mean * 3 // 2 + 1, b), 1, max_ctx).tolist()
            decode.append(ctx)
    mixed = []
    for _ in range(6 if quick else 40):
        npre = int(rng.integers(0, 3))
        pf = [(int(rng.choice(chunks)), int(rng.choice(ctxs[:3]))) for _ in range(npre)]
        pf = [(c, k) for c, k in pf if c + k <= max_ctx]
        b = int(rng.choice(batches))
        dc = np.clip(rng.integers(1, max_ctx // 2, b), 1, max_ctx).tolist()
        if sum(c for c, _ in pf) + b <= max_tokens:
            mixed.append(([c for c, _ in pf], [k for _, k in pf], dc))
    return tokens, prefill, decode, mixed


def run_profile(model_name: str, device: str, out, tp: int = 1, max_tokens: int | None = None,
                repeats: int | None = None, backend: str = "auto", quick: bool = False, log=None,
                iterations: int = 12) -> int:
    """Profile and write the CSV; returns the number of rows. `iterations` mixed batches are also timed as whole
    iterations (every layer, lm_head, sampling) for validation."""
    model = get_model(model_name, "--model")
    be = make_backend(device, backend)
    max_tokens = max_tokens or (4096 if device == "cuda" else 512)
    cpu_ctx = 2 * max_tokens if quick else 2048        # CPU attention is slow: keep contexts small when quick
    max_ctx = min(model.max_context, 4096 if device == "cuda" else cpu_ctx)
    repeats = repeats or (20 if device == "cuda" else 5)
    if device == "cpu":
        # One BLAS thread: on a shared CPU, multithreaded BLAS spin-waits and times tiny GEMMs at 1000× their cost.
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
        if be.name == "torch":
            be.torch.set_num_threads(1)
    layer = Layer(model, tp, be, max_ctx)
    tokens, prefill, decode, mixed = grids(max_tokens, max_ctx, quick)
    meta = dict(model=model.name, tp=tp, dtype=be.dtype, device=device, device_name=be.device_name, backend=be.name,
                attention_impl=be.attention_impl, python_version=platform.python_version(), **be.versions)
    rows = []

    def record(op, n, pf, dc, fn):
        ts = be.time(fn, repeats)
        rows.append(dict(op=op, num_tokens=n, prefill=format_prefill(*pf) if pf else "", decode=format_decode(dc),
                         time_ms=statistics.median(ts), time_ms_min=min(ts), time_ms_max=max(ts), repeats=repeats, **meta))

    say = (lambda s: print(s, file=log, flush=True)) if log else (lambda s: None)
    say(f"profile: {model.name} tp={tp} on {device} ({be.name}, {be.device_name}); {len(tokens)} token counts, "
        f"{len(prefill)} prefill, {len(decode)} decode, {len(mixed)} mixed shapes")
    for n in tokens:
        for op, fn in layer.dense_ops(n).items():
            record(op, n, None, [], fn)
    for c, k in prefill:
        record("attn_prefill", c, ([c], [k]), [], layer.attention_op(([c], [k]), []))
    for dc in decode:
        record("attn_decode", len(dc), None, dc, layer.attention_op(([], []), dc))
    for cs, ks, dc in mixed:
        record("layer_forward", sum(cs) + len(dc), (cs, ks), dc, layer.forward((cs, ks), dc))
    if iterations and tp == 1:
        for cs, ks, dc in mixed[:iterations]:
            record("iteration_forward", sum(cs) + len(dc), (cs, ks), dc, layer.iteration((cs, ks), dc))
    _write(out, rows)
    return len(rows)


def _write(out, rows, fields=None):
    from pathlib import Path
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields or FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})



# -- all-reduce: NCCL (or gloo on CPU) across the GPUs of this node, in Vidur's all_reduce.csv format ----------
ALLREDUCE_FIELDS = ("", "time_stats.all_reduce.min", "time_stats.all_reduce.max", "time_stats.all_reduce.mean",
                    "time_stats.all_reduce.median", "time_stats.all_reduce.std", "rank", "num_workers", "size",
                    "collective", "devices_per_node", "max_devices_per_node")
ALLREDUCE_SIZES = tuple(2 ** k for k in range(9, 26))      # fp16 elements: 1 KB to 64 MB


def allreduce_rows(timer, gpus, sizes=ALLREDUCE_SIZES, repeats: int = 20, devices_per_node: int | None = None):
    """Rows of Vidur's all_reduce.csv from `timer(world, elements, repeats)` → list of milliseconds (rank 0's)."""
    rows = []
    for world in gpus:
        for size in sizes:
            ts = np.asarray(timer(world, int(size), repeats), dtype=float)
            rows.append({"": len(rows), "time_stats.all_reduce.min": ts.min(), "time_stats.all_reduce.max": ts.max(),
                         "time_stats.all_reduce.mean": ts.mean(), "time_stats.all_reduce.median": float(np.median(ts)),
                         "time_stats.all_reduce.std": ts.std(), "rank": 0, "num_workers": world, "size": int(size),
                         "collective": "all_reduce", "devices_per_node": world,
                         "max_devices_per_node": devices_per_node or max(gpus)})
    return rows


def _allreduce_worker(rank, world, init, sizes, repeats, device, queue):
    import torch
    import torch.distributed as dist
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    out = {}
    for size in sizes:
        x = torch.ones(size, dtype=torch.float16 if device == "cuda" else torch.float32, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        ts = []
        for _ in range(repeats):
            dist.barrier()
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dist.all_reduce(x)
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                dist.all_reduce(x)
                ts.append((time.perf_counter() - t0) * 1e3)
        out[size] = ts
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def torch_allreduce_timer(device: str = "cuda"):
    """A timer over torch.distributed: one process per GPU (NCCL), or CPU processes over gloo."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        raise UserError("profile --collectives: PyTorch is not installed; `pip install -e '.[profile]'`") from None
    if device == "cuda" and torch.cuda.device_count() < 2:
        raise UserError(f"profile --collectives: needs at least 2 GPUs, this node has {torch.cuda.device_count()}")
    cache: dict = {}

    def timer(world, size, repeats):
        if (world, repeats) not in cache:
            import tempfile
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            with tempfile.TemporaryDirectory() as d:
                init = f"file://{d}/rendezvous"
                mp.start_processes(_allreduce_worker, args=(world, init, ALLREDUCE_SIZES, repeats, device, q),
                                   nprocs=world, join=True, start_method="spawn")
            cache[(world, repeats)] = q.get()
        return cache[(world, repeats)][size]
    return timer


def run_collectives(out, gpus, device: str = "cuda", repeats: int = 20, timer=None) -> int:
    """Time all-reduce for each GPU count and write Vidur's all_reduce.csv (fit it: python -m costmodels.collectives
    on the folder above). Returns the number of rows."""
    if device == "cuda":
        try:
            import torch
            visible = torch.cuda.device_count()
        except ImportError:
            visible = 0
        too_many = [g for g in gpus if g > visible]
        if timer is None and too_many:
            raise UserError(f"profile --gpus: {', '.join(map(str, too_many))} GPUs asked, {visible} visible")
    rows = allreduce_rows(timer or torch_allreduce_timer(device), gpus, repeats=repeats)
    _write(out, rows, ALLREDUCE_FIELDS)
    return len(rows)
