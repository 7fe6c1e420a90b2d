"""Per-iteration MFU and memory-bandwidth utilization, estimated after the run from the iteration rows and catalogs.

Per GPU of a tensor-parallel group, for an iteration of t = prefill + decode tokens, b requests, taking d seconds:
  FLOPs ≈ [2 · (non-embedding parameters active per token) · t + 2 · vocab · hidden · b     (lm_head: one sampled
           token per request) + 4 · layers · q_width · t · c̄] / tp                       (QKᵀ and AV)
  bytes ≈ weights / tp + (KV read + KV written) · KV bytes per token per GPU
  mfu = FLOPs / (d · peak FLOP/s),  mbu = bytes / (d · HBM bytes/s)
The rows do not say which requests ran or how long each one's context was, so c̄ is the mean context of the requests
holding KV (kv_cached_tokens / running), and the KV read is that mean context over the b requests of the batch, less
the t tokens the step itself wrote: min(b, running) · c̄ − t. Both are exact for a decode step that takes every running
request, and averages elsewhere (a fresh prompt's chunk is charged the mean context, not its own). d is the
whole step, CPU overheads included, as a profiler's wall-clock MFU would count it. MoE models count the experts a
token is routed to for FLOPs and every expert's weights for bytes (what a large batch touches)."""
from __future__ import annotations

import numpy as np


def active_params(model) -> float:
    """Non-embedding parameters one token passes through (a MoE token: its routed and shared experts only)."""
    p = float(model.params() - model.embedding_params())
    if model.is_moe:
        mult = 3 if model.gated_mlp else 2
        idle = model.experts - max(1, model.experts_per_token)
        p -= model.moe_layer_count() * mult * model.hidden * idle * model.expert_ffn
    return p


def utilization(it, costmodel) -> tuple[np.ndarray, np.ndarray]:
    """(mfu, mbu) arrays for an iteration table; NaN where the cost model names no catalog model or GPU, or the
    iteration took no time."""
    n = len(it)
    model, gpu = getattr(costmodel, "model", None), getattr(costmodel, "gpu", None)
    if model is None or gpu is None or n == 0:
        return np.full(n, np.nan), np.full(n, np.nan)
    tp = max(1, int(getattr(costmodel, "tp", 1) or 1))
    tokens = it["prefill_tokens"].to_numpy(float) + it["decode_tokens"].to_numpy(float)
    batch = it["batch_size"].to_numpy(float)
    cached = it["kv_cached_tokens"].to_numpy(float)
    running = np.maximum(it["running"].to_numpy(float), 1.0)
    dur = it["duration_s"].to_numpy(float)
    flops = (2.0 * active_params(model) * tokens + 2.0 * model.vocab * model.hidden * batch
             + 4.0 * model.layers * model.q_width * tokens * (cached / running)) / tp
    kv_per_token = float(getattr(costmodel, "kv_bytes_per_token", 0.0) or model.kv_bytes_per_token(None, tp))
    read = np.maximum(np.minimum(batch, running) * (cached / running) - tokens, 0.0)
    nbytes = model.weight_bytes() / tp + (read + tokens) * kv_per_token
    fp8 = getattr(model, "dtype", "") == "fp8" and getattr(gpu, "fp8_flops", 0.0)
    peak = gpu.fp8_flops if fp8 else gpu.peak_flops
    with np.errstate(divide="ignore", invalid="ignore"):
        mfu = np.where(dur > 0, flops / (dur * peak), np.nan)
        mbu = np.where(dur > 0, nbytes / (dur * gpu.hbm_bytes_per_s), np.nan)
    return mfu, mbu
