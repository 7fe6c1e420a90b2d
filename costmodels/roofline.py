"""Roofline v2: a batch's GPU time from each operator's FLOPs and bytes over the GPU's datasheet peaks, with
efficiencies fitted once on public kernel profiles, for any GPU × model pair (dense or MoE, fp16/bf16 or FP8).

Per transformer layer, on one tensor-parallel shard:
- GEMMs (QKV, output, MLP up/gate and down; MoE router, routed experts and shared expert): the slower of compute,
  FLOPs / (peak · e_c · M/(M + M_half)), and memory, bytes / (bandwidth · e_m), plus a per-kernel overhead. M is the
  number of rows (tokens); a GEMM of few rows fills the GPU's tiles only partly, which M/(M + M_half) stands for.
  FP8 checkpoints read one byte per weight and compute at the FP8 peak where the GPU has one.
- elementwise kernels (norms, RoPE, activation, residual add, embedding): bytes / (bandwidth · e_el) + overhead.
- decode attention: the KV bytes every request reads over bandwidth · e_dec, times (1 + b_half/b)^γ (a few
  requests cannot keep every SM streaming), plus per-request and fixed overheads; the per-request overhead scales
  with the KV heads a shard holds (a thread block per request and KV head), relative to the fitted model's;
- prefill attention: per layer a·Σck + a2·Σc² + a3·Σc + a4·Σk + a5·n over the chunks c with k cached tokens
  before them; a and a2 are FLOPs over peak (4·q_width per c·k and c² term, each with its own efficiency), a3
  and a4 bytes over bandwidth (a chunk token's Q/O/new K,V; a cached token's K,V), a5 seconds per request;
- two all-reduces of the batch's hidden states (tensor parallelism, costmodels.collectives; with the engine's
  overheads set, vLLM's custom all-reduce as its CUDA graphs run it, up to vLLM's size limit), expert-parallel
  all-to-all for MoE when configured.
Per iteration: the lm_head GEMM and sampling over the sequences that sample, and a fixed step overhead.

The decode cost depends only on the decode count and Σ(m + 1) and the rest on the batch's sums, so the engine's
aggregate decode fast paths apply (accepts_decode_sums); the per-layer dense time is a table over token counts.
Efficiencies: profiles/roofline-efficiencies.yaml, fitted per GPU family where a shared profile exists (with the
data named there); other GPUs take the A100 fit's fractions of their own datasheet peaks."""
from __future__ import annotations

import bisect
import math
from pathlib import Path

import numpy as np
import yaml
from costmodels.yamlfile import read_yaml

from costmodels.base import BatchShape, CostModel, register_costmodel
from costmodels.errors import UserError
from costmodels.operators import LAYER_OPS, Shard, dense_work, experts_touched, prefill_attn_work

EFFICIENCY_PATH = Path(__file__).resolve().parent.parent / "profiles" / "roofline-efficiencies.yaml"
# Rows of one tile of the fused MoE kernel along the token dimension (vLLM's configs use 16-64; the small end,
# which its decode-sized launches pick): each reached expert's rows are padded up to a multiple of it.
MOE_BLOCK_ROWS = 16
# KV heads of the model the decode-attention parameters are fitted on (Llama-2-7B, the shared A100 attention profile)
DECODE_FIT_KV_HEADS = 32

# Parameter names, what they are, and the range a fit may take them to.
PARAMS = {
    "gemm_compute_eff": ("fraction of peak FLOP/s a large GEMM reaches", (0.05, 1.0)),
    "gemm_m_half": ("rows at which a GEMM reaches half its compute efficiency", (0.0, 2048.0)),
    "gemm_memory_eff": ("fraction of peak bandwidth a weight-streaming GEMM reaches", (0.05, 1.0)),
    "gemm_overhead_s": ("per-GEMM fixed time", (0.0, 1e-4)),
    "elementwise_memory_eff": ("fraction of peak bandwidth elementwise kernels reach", (0.02, 1.0)),
    "elementwise_overhead_s": ("per-elementwise-kernel fixed time", (0.0, 1e-4)),
    "decode_memory_eff": ("fraction of peak bandwidth decode attention reaches at large batch (above 1: L2 hits)",
                          (0.05, 1.5)),
    "decode_batch_half": ("decode occupancy: time × (1 + b_half/b)^exp for b requests", (0.0, 1024.0)),
    "decode_batch_exp": ("exponent of the decode occupancy factor", (0.0, 4.0)),
    "decode_per_seq_s": ("decode attention time per request", (0.0, 1e-4)),
    "decode_fixed_s": ("decode attention fixed time per layer", (0.0, 1e-3)),
    "prefill_ck_eff": ("fraction of peak FLOP/s for the chunk x context part", (0.01, 1.0)),
    "prefill_cc_eff": ("fraction of peak FLOP/s for the chunk x chunk part", (0.01, 1.0)),
    "prefill_token_eff": ("fraction of bandwidth for a chunk token's Q/O/K/V bytes", (0.001, 10.0)),
    "prefill_context_eff": ("fraction of bandwidth for a cached token's K/V bytes", (0.001, 10.0)),
    "prefill_per_seq_s": ("prefill attention time per request per layer", (0.0, 1e-3)),
    "sampling_fixed_s": ("sampling and logits processing, fixed per iteration", (0.0, 1e-2)),
    "step_overhead_s": ("GPU-side fixed time per iteration (graph launch, sync)", (0.0, 1e-2)),
    "moe_imbalance": ("busiest expert's tokens over the average (>= 1)", (1.0, 16.0)),
}
FITTABLE = tuple(PARAMS)


def load_efficiencies(family: str | None) -> tuple[dict, dict]:
    """(parameters, provenance) for a GPU family from the shipped file; the A100 ('ampere') fit for others."""
    if not EFFICIENCY_PATH.exists():
        return {}, {}
    d = read_yaml(EFFICIENCY_PATH)
    fams = d.get("families", {})
    entry = fams.get(family) or fams.get(d.get("default_family", "ampere")) or {}
    return dict(entry.get("params", {})), dict(entry.get("provenance", {}))


def piecewise_linear(xs, ys, x: float) -> float:
    """y at x within the measured points (xs increasing, xs[0] <= x <= xs[-1]): linear between the two around it.
    Pure Python, so the plain and the fast paths get the same float."""
    k = min(bisect.bisect_right(xs, x) - 1, len(xs) - 2)
    return ys[k] + (x - xs[k]) * (ys[k + 1] - ys[k]) / (xs[k + 1] - xs[k])


class RooflineCostModel(CostModel):
    """Roofline v2 (module docstring). `params` override the shipped efficiencies for the GPU's family."""

    kind = "roofline"

    def __init__(self, model, gpu, tp: int = 1, params: dict | None = None, kv_dtype: str | None = None,
                 allreduce: str = "auto", expert_parallel: bool = False, provenance: dict | None = None,
                 overheads: dict | None = None):
        if model is None or gpu is None:
            raise UserError("costmodel: kind 'roofline' needs model.name and hardware.gpu from the catalogs")
        model.check_tp(tp)
        super().__init__(model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype, overheads=overheads)
        shipped, prov = load_efficiencies(gpu.family)
        p = {**DEFAULT_PARAMS, **shipped}
        for k, v in (params or {}).items():
            if k not in PARAMS:
                raise UserError(f"costmodel.params: unknown parameter {k!r}; allowed: {', '.join(PARAMS)}")
            lo, hi = PARAMS[k][1]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= float(v) <= hi:
                raise UserError(f"costmodel.params.{k}: must be a number in [{lo:g}, {hi:g}], got {v!r}")
            p[k] = float(v)
        self.params = p
        if allreduce not in ("auto", "nccl", "custom"):
            raise UserError(f"costmodel.allreduce: {allreduce!r} is not allowed; allowed: auto, nccl, custom")
        self.allreduce, self.expert_parallel = allreduce, bool(expert_parallel)
        self.provenance = provenance if provenance is not None else prov
        self.shard = Shard.of(model, tp, kv_dtype)
        self.layers = model.layers
        self.fp8 = model.dtype == "fp8"
        self.gemm_peak = gpu.fp8_flops if (self.fp8 and gpu.fp8_flops) else gpu.peak_flops
        self._prepare()

    # -- per-operator times (seconds, per layer unless said) -------------------------------------------------
    def gemm_time(self, m, k, n, weight_bytes=None, m_rows=None):
        """One GEMM of m rows against a k × n weight (m may be an array); m_rows: rows per tile group (MoE)."""
        p, g = self.params_in_use, self.gpu
        m = np.asarray(m, dtype=float)
        rows = m if m_rows is None else np.asarray(m_rows, dtype=float)
        wb = self.shard.weight_bytes if weight_bytes is None else weight_bytes
        peak = self.gemm_peak if weight_bytes is None else g.peak_flops
        occupancy = rows / (rows + p["gemm_m_half"]) if p["gemm_m_half"] else 1.0
        compute = 2.0 * m * k * n / (peak * p["gemm_compute_eff"] * np.maximum(occupancy, 1e-12))
        memory = (k * n * wb + m * (k + n) * self.shard.act_bytes) / (g.hbm_bytes_per_s * p["gemm_memory_eff"])
        return np.where(m > 0, np.maximum(compute, memory) + p["gemm_overhead_s"], 0.0)

    def elementwise_time(self, nbytes):
        p = self.params_in_use
        nbytes = np.asarray(nbytes, dtype=float)
        return np.where(nbytes > 0, nbytes / (self.gpu.hbm_bytes_per_s * p["elementwise_memory_eff"])
                        + p["elementwise_overhead_s"], 0.0)

    def dense_op_time(self, op: str, n):
        """Seconds of one per-layer or per-step operator over n tokens (dense FFN), as a profile times it."""
        s = self.shard
        if op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head"):
            from costmodels.operators import gemm_dims
            k, nn = gemm_dims(s, op)
            return self.gemm_time(n, k, nn, weight_bytes=s.act_bytes if op == "lm_head" else None)
        return self.elementwise_time(dense_work(s, op, n)[1])

    def moe_time(self, n):
        """Router, routed experts and shared expert, per MoE layer.

        The routed experts run as one grouped GEMM per projection (vLLM's fused MoE kernel): it reads the weights
        of only the experts the step's tokens reach (experts_touched: E·(1 − (1 − k/E)^n) for n tokens, top-k of
        E), and its row tiles of all those experts fill the GPU together, so the tile occupancy is that of the
        step's total rows (the n·k assignments, each reached expert's rows padded to the kernel's block of
        MOE_BLOCK_ROWS) rather than of one expert's. `moe_gemm_scale` (fitted on an FP8 checkpoint) prices the
        8-bit kernel's extra work (per-token activation quantisation and scaling) and applies to 8-bit experts only;
        16-bit experts are priced by the roofline alone."""
        s, p = self.shard, self.params_in_use
        n = np.asarray(n, dtype=float)
        h, up = s.hidden, (2 if s.gated else 1)
        t = self.gemm_time(n, h, s.experts, weight_bytes=s.act_bytes)           # router (16-bit)
        reached = np.maximum(experts_touched(s, n), 1e-12)
        assignments = n * s.top_k
        local = reached / self.tp if self.expert_parallel else reached
        f = s.expert_ffn * self.tp if self.expert_parallel else s.expert_ffn     # EP: whole experts per GPU
        work = assignments / (self.tp if self.expert_parallel else 1)
        padded = work + local * MOE_BLOCK_ROWS / 2.0                            # half a block per expert, expected
        scale = self.overheads.moe_gemm_scale if s.weight_bytes < 2 else 1.0
        for k, nn in ((h, up * f), (f, h)):
            compute = 2.0 * k * nn * (padded + p["gemm_m_half"]) / (self.gemm_peak * p["gemm_compute_eff"]) * \
                p["moe_imbalance"]
            memory = (local * k * nn * s.weight_bytes + work * (k + nn) * s.act_bytes) / \
                (self.gpu.hbm_bytes_per_s * p["gemm_memory_eff"])
            t = t + np.where(n > 0, scale * np.maximum(compute, memory) + p["gemm_overhead_s"], 0.0)
        t = t + self.elementwise_time((3.0 if s.gated else 2.0) * work * f * s.act_bytes)
        if s.shared_ffn:
            t = t + self.gemm_time(n, h, up * s.shared_ffn) + self.gemm_time(n, s.shared_ffn, h)
            t = t + self.elementwise_time((3.0 if s.gated else 2.0) * n * s.shared_ffn * s.act_bytes)
        if self.expert_parallel and self.tp > 1:    # dispatch and combine: each token's hidden state out and back
            link = self.gpu.link_bytes_per_s()
            t = t + np.where(n > 0, 2 * (20e-6 + (self.tp - 1) / self.tp * assignments * h * s.act_bytes / link), 0.0)
        return t

    def dense_layer_time(self, n):
        """Every per-layer operator that does not read the KV cache, at n tokens, averaged over dense and MoE
        layers, with the tensor-parallel all-reduces."""
        n = np.asarray(n, dtype=float)
        t = self.dense_ops_time(n)
        if self.tp > 1:
            o = self.overheads
            t = t + 2 * self.gpu.allreduce_time_s(n * self.shard.hidden * self.shard.act_bytes, self.tp, self.allreduce,
                                                  o.kernel_overhead_scale, o.allreduce_per_byte_scale)
        return t

    def dense_ops_time(self, n):
        """The per-layer operators without the all-reduces between them (what a kernel profile times)."""
        s = self.shard
        n = np.asarray(n, dtype=float)
        t = sum(self.dense_op_time(op, n) for op in ("input_layernorm", "attn_pre_proj", "attn_rope",
                                                       "attn_post_proj", "post_attention_layernorm", "add"))
        dense_mlp = sum(self.dense_op_time(op, n) for op in ("mlp_up_proj", "mlp_act", "mlp_down_proj"))
        f = s.moe_fraction
        return t + ((1 - f) * dense_mlp if f < 1 else 0.0) + (f * self.moe_time(n) if f > 0 else 0.0)

    def emb_time(self, n_tokens):
        """The embedding lookup of the iteration's tokens."""
        return self.elementwise_time(dense_work(self.shard, "emb", n_tokens)[1])

    def sample_time(self, n_seqs):
        """Once per iteration for the sequences that sample: final norm, lm_head, logits processing and the draw
        (the fp32 logits read a few times: softmax, top-k/p, sampling)."""
        s, p = self.shard, self.params_in_use
        n_seqs = np.asarray(n_seqs, dtype=float)
        t = self.elementwise_time(2.0 * n_seqs * s.hidden * s.act_bytes)
        t = t + self.gemm_time(n_seqs, s.hidden, s.vocab, weight_bytes=s.act_bytes)
        return t + np.where(n_seqs > 0, 3 * self.elementwise_time(n_seqs * s.vocab * 4.0) + p["sampling_fixed_s"], 0.0)

    def decode_attn_time_sums(self, n_decode, kv_read):
        """Decode attention per layer from the count and Σ(m + 1) (the exact function the fast paths use)."""
        if not n_decode:
            return 0.0
        return self._decode_layer_s(n_decode, kv_read)

    def _decode_layer_s(self, n: int, kv_read) -> float:
        """Decode attention per layer for n requests reading kv_read = Σ(m + 1) tokens: a measured small-batch row
        where the model has one (profiled), else the smooth form; the one function every path calls, so the
        plain and the fast paths get the same float."""
        row = self._small.get(n)
        if row is not None:
            xs, ys = row
            x = kv_read / n
            if xs[0] <= x <= xs[-1]:
                return piecewise_linear(xs, ys, x)
            # outside the measured contexts: the smooth form's shape, scaled to meet the nearest measured point
            end = 0 if x < xs[0] else -1
            return self._smooth_decode_s(n, kv_read) * ys[end] / self._smooth_decode_s(n, n * xs[end])
        return self._smooth_decode_s(n, kv_read)

    def _smooth_decode_s(self, n: int, kv_read) -> float:
        c = self._dec
        if c[5]:
            occ = math.pow(1.0 + (c[1] + c[5] * (kv_read / n) / 1000.0) / n, c[4])
        else:
            occ = self._occupancy(n)
        return max(kv_read * c[0] * occ + c[2] * n + c[3], kv_read * self._kv_read_s)

    def _set_kv_read_floor(self):
        """Seconds to stream one cached token's K and V of a layer at the GPU's peak bandwidth: no decode attention
        is faster than its KV over that (issue #29's physics floor). decode_memory_eff above 1 is an L2-hit allowance
        fitted where each request's KV was small; at hundreds of requests nothing else offsets it, so without the
        floor gigabytes of KV were read at up to 1.35x peak."""
        s = self.shard
        kvw = s.mla_latent / 2 if s.mla_latent else s.kv_width
        self._kv_read_s = 2.0 * kvw * s.kv_bytes / self.gpu.hbm_bytes_per_s

    def _occupancy(self, b: int) -> float:
        """(1 + b_half/b)^γ, from a table (math.pow per entry, so every path gets the same float)."""
        if b >= len(self._occ):
            self._grow(max(b, 2 * self._n_max))
        return self._occ[b]

    def prefill_attn_time_sums(self, n_prefill, sum_c, sum_c2, sum_ck, sum_k):
        if not n_prefill:
            return 0.0
        a = self._pre
        return a[0] * sum_ck + a[1] * sum_c2 + a[2] * sum_c + a[3] * sum_k + a[4] * n_prefill

    def prefill_attn_time(self, chunks, contexts) -> float:
        c = [int(x) for x in chunks]
        k = [int(x) for x in contexts]
        return self.prefill_attn_time_sums(len(c), sum(c), sum(x * x for x in c), sum(x * y for x, y in zip(c, k)),
                                           sum(k))

    def decode_attn_time(self, contexts) -> float:
        return self.decode_attn_time_sums(len(contexts), int(sum(contexts)))

    # A mixed batch's decodes as the engine runs them: with `_dec_mixed` set (a profile timed one varlen call over
    # the whole batch, vLLM's FlashAttention backend) they ride in the prefill's kernel and cost what that kernel
    # charges them; None (the default, FlashInfer-style prefill and decode kernels) prices them as decode-only rows.
    _dec_mixed = None

    def _mixed_decode_s(self, n: int, kv_read) -> float:
        c = self._dec_mixed
        occ = math.pow(1.0 + (c[1] + c[5] * (kv_read / n) / 1000.0) / n, c[4])
        return max(kv_read * c[0] * occ + c[2] * n + c[3], kv_read * self._kv_read_s)

    def batch_decode_attn_time(self, shape: BatchShape) -> float:
        """Decode attention per layer of the batch's decodes, priced as the batch runs them (see _dec_mixed)."""
        dc = shape.decode_context
        if dc and shape.prefill_tokens and self._dec_mixed is not None:
            return self._mixed_decode_s(len(dc), int(sum(dc)))
        return self.decode_attn_time(dc)

    def op_times(self, shape: BatchShape) -> dict:
        """Seconds per operator (layer ops and attention per layer, step ops per iteration), dense FFN view."""
        n = shape.num_tokens
        out = {op: float(self.dense_op_time(op, n)) for op in LAYER_OPS}
        out["attn_prefill"] = self.prefill_attn_time(shape.prefill_tokens, shape.prefill_context)
        out["attn_decode"] = self.batch_decode_attn_time(shape)
        out["emb"] = float(self.emb_time(n))
        out["lm_head"] = float(self.dense_op_time("lm_head", len(shape.prefill_tokens) + len(shape.decode_context)))
        return out

    # -- the engine's path ------------------------------------------------------------------------------------
    def _effective_params(self) -> dict:
        """The parameters as the engine's runtime sees them (Overheads' kernel and decode-attention factors)."""
        p = dict(self.params)
        o = self.overheads
        k = o.kernel_overhead_scale
        if k != 1.0:
            for key in ("gemm_overhead_s", "elementwise_overhead_s", "decode_fixed_s", "decode_per_seq_s",
                        "prefill_per_seq_s"):
                p[key] = p[key] * k
        if o.decode_attention_scale != 1.0:
            p["decode_memory_eff"] = p["decode_memory_eff"] / o.decode_attention_scale
        return p

    def _prepare(self, n_max: int = 16384):
        """Constants of the attention terms and the per-token-count tables."""
        self.params_in_use = self._effective_params()
        s, g, p = self.shard, self.gpu, self.params_in_use
        kvw = s.mla_latent / 2 if s.mla_latent else s.kv_width
        kv_token = 2.0 * kvw * s.kv_bytes                          # K and V bytes of one cached token per layer
        # decode kernels run a thread block per (request, KV head): the per-request time was fitted on a model with
        # DECODE_FIT_KV_HEADS KV heads and scales with the KV heads this shard holds (GQA and TP shrink it)
        kv_heads = DECODE_FIT_KV_HEADS if s.mla_latent else self.model.kv_heads_per_gpu(self.tp)
        per_seq = p["decode_per_seq_s"] * kv_heads / DECODE_FIT_KV_HEADS
        self._dec = (kv_token / (g.hbm_bytes_per_s * p["decode_memory_eff"]), p["decode_batch_half"],
                     per_seq + 2.0 * s.q_width * s.act_bytes / (g.hbm_bytes_per_s * p["decode_memory_eff"]),
                     p["decode_fixed_s"], p["decode_batch_exp"], 0.0)
        self._small = {}                # measured decode rows by batch size (the profiled model's; none here)
        self._set_kv_read_floor()
        chunk_bytes = 2.0 * s.q_width * s.act_bytes + 2.0 * kv_token     # Q, O; the chunk's K/V read and written
        self._pre = (4.0 * s.q_width / (g.peak_flops * p["prefill_ck_eff"]),
                     4.0 * s.q_width / (g.peak_flops * p["prefill_cc_eff"]) / 2.0,
                     chunk_bytes / (g.hbm_bytes_per_s * p["prefill_token_eff"]),
                     kv_token / (g.hbm_bytes_per_s * p["prefill_context_eff"]),
                     p["prefill_per_seq_s"])
        self._grow(n_max)

    def _grow(self, n_max: int):
        """Tables by token count: all layers' dense time, the embedding, and sampling by sequence count."""
        n = np.arange(n_max + 1)
        bh, ex = self._dec[1], self._dec[4]
        self._occ = [1.0] + [math.pow(1.0 + bh / b, ex) for b in range(1, n_max + 1)]
        self._layer = (self.layers * self.dense_layer_time(n)).tolist()
        self._emb = self.emb_time(n).tolist()
        self._step = self.sample_time(n).tolist()
        self._n_max = n_max
        self._arrays = None             # the tables as numpy arrays, made when a closed-form stretch first needs them

    def _table_arrays(self):
        """(occupancy, layers, embedding, sampling) tables as arrays: the same floats as the lists the scalar path
        indexes, converted once per growth rather than once per stretch (16k entries each by default)."""
        if self._arrays is None:
            self._arrays = tuple(np.asarray(x) for x in (self._occ, self._layer, self._emb, self._step))
        return self._arrays

    def accepts_decode_sums(self) -> bool:
        cls = type(self)
        return (cls.compute_time is RooflineCostModel.compute_time and cls.batch_time is CostModel.batch_time
                and cls.memory_time is CostModel.memory_time)

    def compute_time(self, shape: BatchShape) -> float:
        pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
        n_decode = len(dc) + shape.cohort_decodes
        return self.time_from_sums(
            sum(pt) + n_decode, len(pt), sum(c * c for c in pt), sum(c * k for c, k in zip(pt, pc)),
            sum(pc), n_decode, sum(dc) + shape.cohort_decode_context)

    def time_from_sums(self, n_tokens, n_prefill, sum_c2, sum_ck, sum_k_prefill, n_decode, kv_read) -> float:
        """The iteration's seconds from the batch's integer sums (what the engine's fast paths pass)."""
        if n_tokens <= 0:
            return 0.0
        if n_tokens > self._n_max:
            self._grow(max(n_tokens, 2 * self._n_max))
        seqs = n_prefill + n_decode
        attn = 0.0
        if n_decode:
            c = self._dec
            if n_prefill and self._dec_mixed is not None:
                attn = self._mixed_decode_s(n_decode, kv_read)
            elif c[5] or n_decode in self._small:
                attn = self._decode_layer_s(n_decode, kv_read)
            else:
                attn = max(kv_read * c[0] * self._occ[n_decode] + c[2] * n_decode + c[3], kv_read * self._kv_read_s)
        if n_prefill:
            a = self._pre
            attn += (a[0] * sum_ck + a[1] * sum_c2 + a[2] * (n_tokens - n_decode) + a[3] * sum_k_prefill
                     + a[4] * n_prefill)
        t = self._layer[n_tokens] + self.layers * attn + self._emb[n_tokens] + self._step[seqs]
        return t + self.params_in_use["step_overhead_s"] + self.cpu_time(seqs)

    def decode_stretch_times(self, cached, k: int, last_step=None):
        """k decode-only iterations in closed form, the same float operations as time_from_sums element by element."""
        if not self.accepts_decode_sums():
            return super().decode_stretch_times(cached, k, last_step)
        cached = np.asarray(cached, dtype=np.int64)
        last = np.full(len(cached), k) if last_step is None else np.minimum(np.asarray(last_step), k)
        n = np.bincount(last, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        csum = np.bincount(last, weights=cached, minlength=k + 1)[::-1].cumsum()[::-1][1:].astype(np.int64)
        kv_read = csum + n * np.arange(1, k + 1, dtype=np.int64)
        if n.max() > self._n_max:
            self._grow(int(n.max()))
        c = self._dec
        occ, layer, emb, step = self._table_arrays()
        if c[5]:                       # context-dependent occupancy: the scalar path's function, element by element
            attn = np.array([self._decode_layer_s(b, kv) if b else c[3]
                             for b, kv in zip(n.tolist(), kv_read.tolist())])
        else:
            attn = np.maximum(kv_read.astype(float) * c[0] * occ[n] + c[2] * n.astype(float) + c[3],
                              kv_read.astype(float) * self._kv_read_s)
            for i in np.flatnonzero(np.isin(n, list(self._small))) if self._small else ():
                attn[i] = self._decode_layer_s(int(n[i]), int(kv_read[i]))     # measured small-batch rows
        layer, emb, step = layer[n], emb[n], step[n]
        t = layer + self.layers * attn + emb + step
        return t + self.params_in_use["step_overhead_s"] + self.cpu_times(n)

    # -- persistence ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        r = lambda v: float(f"{v:.6g}")  # noqa: E731
        return {"kind": "roofline", "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
                "params": {k: r(v) for k, v in self.params.items()}, "provenance": self.provenance}

    def save(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


# Used only where profiles/roofline-efficiencies.yaml is missing: round values (GEMMs ~70% of tensor peak and
# ~80% of bandwidth); the shipped file replaces them with fitted ones.
DEFAULT_PARAMS = {
    "gemm_compute_eff": 0.7, "gemm_m_half": 64.0, "gemm_memory_eff": 0.8, "gemm_overhead_s": 5e-6,
    "elementwise_memory_eff": 0.6, "elementwise_overhead_s": 3e-6,
    "decode_memory_eff": 0.9, "decode_batch_half": 4.0, "decode_batch_exp": 0.5, "decode_per_seq_s": 1e-6,
    "decode_fixed_s": 7e-6,
    "prefill_ck_eff": 0.3, "prefill_cc_eff": 0.3, "prefill_token_eff": 0.5, "prefill_context_eff": 0.5,
    "prefill_per_seq_s": 1e-5, "sampling_fixed_s": 1e-4, "step_overhead_s": 0.0, "moe_imbalance": 1.0,
}


@register_costmodel("roofline")
def _build_roofline(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> RooflineCostModel:
    """`kind: roofline` with optional `path:` (a fitted YAML), `params:` overrides, `allreduce`, `expert_parallel`."""
    allowed = {"path", "params", "kv_dtype", "allreduce", "expert_parallel", "overheads"}
    bad = set(spec) - allowed
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for kind 'roofline'; allowed: "
                        f"kind, {', '.join(sorted(allowed))}")
    params = {}
    if spec.get("path"):
        from costmodels.linear import resolve_profile_path
        path = resolve_profile_path(spec["path"])
        if not path.exists():
            raise UserError(f"{where}.path: {path} does not exist")
        d = read_yaml(path)
        if "params" not in d:
            raise UserError(f"{path}: no 'params' mapping (a roofline v2 file); refit with `servesim calibrate "
                            "--kind roofline`")
        params.update(d["params"])
    given = spec.get("params") or {}
    if not isinstance(given, dict):
        raise UserError(f"{where}.params: expected a mapping of parameter: value")
    params.update(given)
    cm = RooflineCostModel(model, gpu, tp=tp, params=params, kv_dtype=spec.get("kv_dtype"),
                           allreduce=spec.get("allreduce", "auto"), expert_parallel=spec.get("expert_parallel", False),
                           overheads=spec.get("overheads"))
    from costmodels.base import shown_path
    if spec.get("path"):
        cm.source = shown_path(resolve_profile_path(spec["path"]))
    elif load_efficiencies(gpu.family)[0]:      # the GPU family's fitted efficiencies (else the code's defaults)
        cm.source = shown_path(EFFICIENCY_PATH)
    if given:
        cm.source += " + costmodel.params"
    return cm
