"""Backends of the profiler harness: one decoder layer's operators written against numpy (CPU, no PyTorch), eager
torch (the first harness: unfused operators, padded attention), and the engine kernels (engine_ops) on torch."""
from __future__ import annotations

import platform

import numpy as np

from costmodels.errors import UserError
from profiles.timing import CpuTimer, make_timer


class NumpyBackend:
    """float32 on the CPU; attention runs request by request over each request's own context."""
    name, dtype, attention_impl, engine = "numpy", "fp32", "numpy-per-request", False

    def __init__(self, device, timing: str = "cpu"):
        if device != "cpu":
            raise UserError("--backend numpy runs on --device cpu only; install PyTorch (`pip install -e '.[profile]'`) for cuda")
        self.rng = np.random.default_rng(0)
        self.device_name = platform.processor() or platform.machine()
        self.versions = {"torch_version": "", "numpy_version": np.__version__}
        self.timer = CpuTimer()

    def kernels_impl(self, op: str) -> str:
        return "numpy"

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


class TorchBackend(NumpyBackend):
    """The first harness's eager PyTorch (`--kernels eager`): unfused RMSNorm/RoPE/SiLU, decode attention padded to
    the batch's longest context with a mask, a boolean causal mask per prefill chunk. fp16/bf16 on CUDA (the model's
    dtype), float32 on CPU; CUDA-graph timing unless --timing eager."""
    name, attention_impl, engine = "torch", "torch-sdpa-padded", False

    def __init__(self, device, timing: str = "graph", dtype: str = "fp16"):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: PyTorch sees no CUDA device; use --device cpu")
        self.dev = torch.device(device)
        self.tdtype = (torch.bfloat16 if dtype == "bf16" else torch.float16) if device == "cuda" else torch.float32
        self.dtype = ("bf16" if dtype == "bf16" else "fp16") if device == "cuda" else "fp32"
        self.timer = make_timer(torch, device, timing)
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.device_name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
        self.versions = {"torch_version": torch.__version__, "numpy_version": np.__version__}

    def kernels_impl(self, op: str) -> str:
        return {"attention": self.attention_impl}.get(op, "torch-eager-unfused")

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


class EngineBackend(TorchBackend):
    """What a serving engine runs (`--kernels engine`, the default with torch): attention through the fastest
    implementation that works here (engine_ops.ATTENTION_ORDER), fused RMSNorm-with-residual, rotary and SiLU-and-mul
    (Triton) where they run, FP8 GEMMs through torch._scaled_mm when asked; each operator timed as a CUDA graph."""
    name, engine = "torch", True

    def __init__(self, device, timing: str = "graph", dtype: str = "fp16", attention: str | None = None):
        super().__init__(device, timing, "bf16" if dtype == "fp8" else dtype)
        from profiles import engine_ops
        self.ops = engine_ops
        self.el = engine_ops.Elementwise(self.torch, self.dev, self.tdtype)
        ok, self.attn_tried = engine_ops.working_attentions(self.torch, self.dev, self.tdtype, prefer=attention)
        self.attn = next(a for a in ok if not getattr(a, "decode_only", False))
        self.decode_candidates = [a for a in ok if a.name not in engine_ops.RACE_EXCLUDED] or ok[:1]
        self.attention_impl = self.attn.name
        self.last_attn = self.attn.name     # what the latest batch's attention ended up as (raced for decode)
        self.fp8 = dtype == "fp8"
        if self.fp8:
            why = engine_ops.fp8_available(self.torch, self.dev)
            if why:
                raise UserError(f"--dtype fp8: {why}")
            self.dtype = "fp8"

    def kernels_impl(self, op: str) -> str:
        from costmodels.operators import GEMM_SHAPES
        if op in ("attention", "attn_prefill", "attn_decode"):
            return self.last_attn
        if op in ("input_layernorm", "post_attention_layernorm"):
            return self.el.impl["rmsnorm"] + " (residual add fused)"
        if op == "attn_rope":
            return self.el.impl["rope"] + " + KV-cache write"
        if op == "mlp_act":
            return self.el.impl["silu_mul"]
        if op in GEMM_SHAPES:
            return "fp8-scaled-mm" if self.fp8 and op != "lm_head" else "torch-matmul"
        if op == "mixed":    # whole layers and iterations: every choice above
            return (f"{self.last_attn}; {self.el.impl['rmsnorm']}; {self.el.impl['rope']}; {self.el.impl['silu_mul']}; "
                    f"{'fp8-scaled-mm' if self.fp8 else 'torch-matmul'}")
        return {"emb": "torch-embedding", "add": "torch-add"}.get(op, op)


def make_backend(device: str, backend: str = "auto", kernels: str = "engine", timing: str = "graph",
                 dtype: str = "fp16", attention: str | None = None):
    """numpy (CPU without torch), or torch with the engine's kernels (default) or the first harness's eager ones."""
    if backend in ("auto", "torch"):
        try:
            import torch  # noqa: F401
        except ImportError:
            if backend == "torch" or device == "cuda":
                raise UserError("profile: PyTorch is not installed; `pip install -e '.[profile]'` "
                                "(or use --device cpu, which falls back to numpy)") from None
        else:
            if kernels == "eager":
                if dtype == "fp8":
                    raise UserError("--dtype fp8 needs --kernels engine")
                return TorchBackend(device, timing, dtype)
            return EngineBackend(device, timing, dtype, attention)
    return NumpyBackend(device)
