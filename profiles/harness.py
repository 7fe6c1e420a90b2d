"""Profiler harness: times one decoder layer's operators, whole layers and whole iterations of a catalog model on
random weights, and writes the profile CSV that `servesim calibrate` fits."""
from __future__ import annotations

import csv
import platform
import re
import time

import numpy as np

from costmodels.catalog import get_model
from costmodels.errors import UserError
from costmodels.profile_data import MIXED_MODES, format_decode, format_prefill

FIELDS = ("op", "num_tokens", "prefill", "decode", "time_ms", "time_ms_min", "time_ms_max", "repeats", "model", "tp",
          "dtype", "device", "device_name", "backend", "attention_impl", "torch_version", "numpy_version", "python_version",
          "timing", "calls", "mixed_attention", "kernels_impl", "kernels")
# timing: 'graph' (a CUDA graph of `calls` calls replayed; the time is per call), 'eager' (CUDA events around one Python
# call: launch and dispatch included), 'cpu' (wall clock). kernels_impl: the harness's choice for the operator
# (attention implementation, fused or torch elementwise kernel, grouped or looped experts, fp8); kernels: what the
# profiler saw it launch. mixed_attention, on rows of batches with prefills and decodes: 'one-varlen' (one varlen call
# over the whole batch, vLLM's FlashAttention backend) or 'split' (the prefills through it, the decodes through the
# decode kernel, FlashInfer-style); empty elsewhere and for backends with one way only.


# The backends and the layer live in their own modules; these names stay importable from here.
from profiles.backends import EngineBackend, NumpyBackend, TorchBackend, make_backend  # noqa: E402,F401
from profiles.layer import Layer  # noqa: E402

PARTS = ("dense", "attention", "layers", "iterations", "moe")
DECODE_ITERATION_BATCHES = (1, 8, 32, 128)
DECODE_ITERATION_CONTEXTS = (256, 1024, 2048)
MOE_OPS = ("moe_mlp",)


# -- grids ----------------------------------------------------------------------------------------------
def grids(max_tokens: int, max_ctx: int, quick: bool, seed: int = 0, token_points: int | None = None,
          max_batch: int | None = None, mixed_count: int | None = None):
    """Token counts, prefill (chunk, context) pairs, decode batches with per-request contexts, mixed batches."""
    rng = np.random.default_rng(seed)
    pow2 = [2 ** i for i in range(0, 14) if 2 ** i <= max_tokens]
    step = max(1, max_tokens // (token_points or (8 if quick else 64)))
    tokens = sorted(set(pow2 + list(range(step, max_tokens + 1, step))))
    chunks = sorted({c for c in (16, 64, 128, 256, 512, 1024, 2048, 4096) if c <= max_tokens} | {max_tokens})
    ctxs = sorted({k for k in (0, 64, 256, 512, 1024, 2048, 3072) if k < max_ctx} | {max_ctx // 4, max_ctx // 2})
    prefill = [(c, k) for c in chunks for k in ctxs if c + k <= max_ctx]
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= (max_batch or (16 if quick else 256))]
    means = [m for m in (16, 64, 128, 256, 512, 1024, 2048, 3072) if m < max_ctx * 0.66]
    decode = []
    for b in batches:
        for mean in means:   # each request draws its own context around the mean
            ctx = np.clip(rng.integers(mean // 2, mean * 3 // 2 + 1, b), 1, max_ctx).tolist()
            decode.append(ctx)
    mixed = mixed_batches(rng, chunks, ctxs, batches, max_ctx, max_tokens, mixed_count or (6 if quick else 40))
    return tokens, prefill, decode, mixed


def mixed_batches(rng, chunks, ctxs, batches, max_ctx, max_tokens, count, min_prefill: int = 0):
    """Up to `count` batches of 0-2 prefill chunks (short cached contexts) and a batch of decodes with contexts drawn
    uniformly: (chunks, contexts, decode contexts)."""
    out = []
    for _ in range(count):
        npre = int(rng.integers(min_prefill, 3))
        pf = [(int(rng.choice(chunks)), int(rng.choice(ctxs[:3]))) for _ in range(npre)]
        pf = [(c, k) for c, k in pf if c + k <= max_ctx]
        b = int(rng.choice(batches))
        dc = np.clip(rng.integers(1, max_ctx // 2, b), 1, max_ctx).tolist()
        if sum(c for c, _ in pf) + b <= max_tokens and len(pf) >= min_prefill:
            out.append(([c for c, _ in pf], [k for _, k in pf], dc))
    return out


def mixed_attention_grid(max_tokens: int, max_ctx: int, quick: bool, count: int | None = None, seed: int = 2,
                         max_batch: int | None = None):
    """Mixed batches (at least one prefill chunk and one decode) for `attn_mixed` rows, from another seed than the
    mixed layers and iterations, so the batches timed whole stay held out of what calibrate fits."""
    rng = np.random.default_rng(seed)
    chunks = sorted({c for c in (16, 64, 128, 256, 512, 1024, 2048) if c < max_tokens})
    ctxs = sorted({k for k in (0, 64, 256, 512) if k < max_ctx})
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= (max_batch or (16 if quick else 256))]
    return mixed_batches(rng, chunks, ctxs, batches, max_ctx, max_tokens, count or (6 if quick else 40), min_prefill=1)


def decode_iterations(max_ctx: int, seed: int = 1):
    """Pure-decode whole iterations, as engines replay them from CUDA graphs: (batch, contexts around a mean)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in DECODE_ITERATION_BATCHES:
        for mean in DECODE_ITERATION_CONTEXTS:
            if mean < max_ctx:
                out.append(np.clip(rng.integers(mean // 2, mean * 3 // 2 + 1, b), 1, max_ctx).tolist())
    return out


MIN_TOKENS = 32       # the smallest --max-tokens whose grids hold decode and mixed batches


def run_profile(model_name: str, device: str, out, tp: int = 1, max_tokens: int | None = None,
                repeats: int | None = None, backend: str = "auto", quick: bool = False, log=None,
                iterations: int = 12, kernels: str = "engine", timing: str = "graph", dtype: str | None = None,
                attention: str | None = None, token_points: int | None = None, max_batch: int | None = None,
                parts=PARTS, mixed_count: int | None = None, mixed_attention_count: int | None = None) -> int:
    """Profile and write the CSV; returns the number of rows. `iterations` mixed batches are also timed as whole
    iterations (every layer, lm_head, sampling) for validation: on CUDA both graph-replayed and eager, recorded
    apart (column `timing`), plus pure-decode iterations replayed as graphs. MoE models get `moe_mlp` rows (the
    routed experts as grouped GEMMs). `parts` picks what to time (PARTS). With the engine kernels a batch with
    prefills and decodes is timed both ways an engine runs it (column mixed_attention), and `attn_mixed` rows time
    the attention of other mixed batches (the decodes' cost inside the varlen call, which calibrate fits)."""
    bad = set(parts) - set(PARTS)
    if bad:
        raise UserError(f"profile parts: {', '.join(sorted(bad))} not among {', '.join(PARTS)}")
    # (0 fell back to the default without a word; below 32 tokens the grids have no decode or mixed batch to draw)
    if max_tokens is not None and max_tokens < MIN_TOKENS:
        raise UserError(f"--max-tokens: must be >= {MIN_TOKENS} (the largest token count and context timed), "
                        f"got {max_tokens}")
    if repeats is not None and repeats < 1:
        raise UserError(f"--repeats: must be >= 1 (timed repeats per point), got {repeats}")
    if iterations < 0:
        raise UserError(f"--iterations: must be >= 0 (0: no whole iterations), got {iterations}")
    from costmodels.catalog import with_dtype
    model = get_model(model_name, "--model")
    catalog_name = model.name
    want_dtype = dtype or (model.dtype if model.dtype in ("fp16", "bf16", "fp8") else "fp16")
    be = make_backend(device, backend, kernels, timing, want_dtype, attention)
    if want_dtype == "fp8" and be.dtype == "fp8":
        model = with_dtype(model, "fp8")
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
    tokens, prefill, decode, mixed = grids(max_tokens, max_ctx, quick, token_points=token_points, max_batch=max_batch,
                                           mixed_count=mixed_count)
    dec_iters = decode_iterations(max_ctx) if be.engine and device == "cuda" and tp == 1 and iterations else []
    mixed_attn = mixed_attention_grid(max_tokens, max_ctx, quick, mixed_attention_count, max_batch=max_batch)
    spans = [sum(dc) for dc in decode] + [sum(c + k for c, k in zip(cs, ks)) + sum(dc)
                                          for cs, ks, dc in mixed + mixed_attn]
    spans += [sum(dc) for dc in dec_iters] + [c + k for c, k in prefill]
    layer = Layer(model, tp, be, max_ctx, pool_tokens=max(spans))
    meta = dict(model=catalog_name, tp=tp, dtype=be.dtype, device=device, device_name=be.device_name, backend=be.name,
                attention_impl=be.attention_impl, python_version=platform.python_version(), **be.versions)
    rows, seen_kernels, failed = [], {}, []
    eager_timer = None
    if device == "cuda" and be.name == "torch":
        from profiles.timing import EagerCudaTimer
        eager_timer = EagerCudaTimer(be.torch)

    def record(op, n, pf, dc, fn, impl_key=None, timer=None, mixed=""):
        try:
            t = (timer or be.timer).time(fn, repeats)
        except Exception as e:   # noqa: BLE001 — on a GPU one shape a kernel refuses must not lose the whole profile
            if device != "cuda":
                raise
            failed.append(f"{op} n={n}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
            return
        impl = be.kernels_impl(impl_key or op)
        key = (op, t.mode, re.sub(r" \(\d+ splits\)", "", impl))   # split counts share their kernels
        if key not in seen_kernels:   # which kernels ran: once per operator (the profiler costs ~0.1 s a call)
            seen_kernels[key] = _kernels(be, fn) if device == "cuda" else ""
        rows.append(dict(op=op, num_tokens=n, prefill=format_prefill(*pf) if pf else "", decode=format_decode(dc),
                         time_ms=t.median, time_ms_min=min(t.per_call_ms), time_ms_max=max(t.per_call_ms),
                         repeats=repeats, **meta, timing=t.mode, calls=t.calls, mixed_attention=mixed,
                         kernels_impl=impl + (f" [{t.note}]" if t.note else ""),
                         kernels=seen_kernels[key]))

    say = (lambda s: print(s, file=log, flush=True)) if log else (lambda s: None)
    say(f"profile: {model.name} tp={tp} on {device} ({be.name}, {be.device_name}, {be.dtype}); kernels: "
        f"{'engine' if be.engine else be.attention_impl}, timing {be.timer.mode}; {len(tokens)} token counts, "
        f"{len(prefill)} prefill, {len(decode)} decode, {len(mixed)} mixed shapes, {len(mixed_attn)} mixed attention")
    if be.engine:
        say(f"  attention: {be.attn.name} (tried: {'; '.join(f'{n} {o}' for n, o in be.attn_tried)}); "
            f"elementwise: {', '.join(f'{k} {v}' for k, v in be.el.impl.items())}")
    t0 = time.perf_counter()
    for n in tokens if "dense" in parts else []:
        for op, fn in layer.dense_ops(n).items():
            record(op, n, None, [], fn)
    for c, k in prefill if "attention" in parts else []:
        record("attn_prefill", c, ([c], [k]), [], layer.attention_op(([c], [k]), []))
    for dc in decode if "attention" in parts else []:
        record("attn_decode", len(dc), None, dc, layer.attention_op(([], []), dc))

    def ways(cs, dc):
        """The engine's ways of running this batch's attention ('' where there is one)."""
        return MIXED_MODES if be.engine and cs and dc else ("",)
    for cs, ks, dc in mixed_attn if "attention" in parts else []:
        for way in ways(cs, dc):
            record("attn_mixed", sum(cs) + len(dc), (cs, ks), dc, layer.attention_op((cs, ks), dc, way or MIXED_MODES[0]),
                   "attention", mixed=way)
    for cs, ks, dc in mixed if "layers" in parts else []:
        for way in ways(cs, dc):
            record("layer_forward", sum(cs) + len(dc), (cs, ks), dc, layer.forward((cs, ks), dc, way or MIXED_MODES[0]),
                   "mixed", mixed=way)
    if iterations and tp == 1 and "iterations" in parts:
        for cs, ks, dc in mixed[:iterations]:
            for way in ways(cs, dc):
                fn = layer.iteration((cs, ks), dc, way or MIXED_MODES[0])
                record("iteration_forward", sum(cs) + len(dc), (cs, ks), dc, fn, "mixed", mixed=way)
                if eager_timer is not None and be.timer.mode == "graph" and way in ("", MIXED_MODES[0]):
                    record("iteration_forward", sum(cs) + len(dc), (cs, ks), dc, fn, "mixed", timer=eager_timer,
                           mixed=way)
        for dc in dec_iters:
            record("iteration_forward", len(dc), None, dc, layer.iteration(([], []), dc), "mixed")
    if model.is_moe and be.engine and "moe" in parts:
        _moe_rows(model, tp, be, tokens, record, say)
    say(f"  {len(rows)} rows in {time.perf_counter() - t0:.1f} s" + (f"; {len(failed)} shapes failed, first: {failed[0]}"
                                                                     if failed else ""))
    _write(out, rows)
    return len(rows)


def _kernels(be, fn):
    if not be.engine and be.name != "torch":
        return ""
    from profiles.engine_ops import kernel_names
    return kernel_names(be.torch, fn)


def _moe_rows(model, tp, be, tokens, record, say):
    """One MoE layer's routed experts (router, grouped up/gate and down GEMMs, SiLU-and-mul, gather/scatter) at each
    token count: `moe_mlp` rows, compared with the cost model's MoE time by --check."""
    from profiles.engine_ops import MoeMlp
    moe = MoeMlp(be.torch, be.dev, be.tdtype, model.hidden, model.expert_ffn // tp, model.experts,
                 model.experts_per_token, be.el.silu_mul)
    impl, _ = moe.pick()
    be_impl = be.kernels_impl
    be.kernels_impl = lambda op: impl if op == "moe_mlp" else be_impl(op)   # noqa: E731 — this profile's choice
    say(f"  moe: {model.experts} experts, top-{model.experts_per_token}, expert FFN {model.expert_ffn // tp}: {impl}")
    for n in tokens:
        x = be.randn(n, model.hidden)
        fn = moe.op(x)[0]
        try:
            fn()
        except Exception:   # noqa: BLE001 — e.g. a grouped GEMM that refuses empty groups: this shape loops
            fn = moe.op(x, "loop")[0]
        record("moe_mlp", n, None, [], fn)
    be.kernels_impl = be_impl


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
    if repeats < 1:
        raise UserError(f"--repeats: must be >= 1 (timed repeats per point), got {repeats}")
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
