"""FLOPs and bytes of every operator in one transformer iteration, per GPU shard (shared by roofline and fitting)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Per-layer operators that do not depend on attention context (Vidur's names, so profiles line up).
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
ATTN_OPS = ("attn_prefill", "attn_decode")
STEP_OPS = ("emb", "lm_head")          # once per iteration, not per layer
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head")

# The efficiency class each operator's roofline uses.
OP_CLASS = {op: ("gemm" if op in GEMM_OPS else "elementwise") for op in LAYER_OPS + STEP_OPS}
OP_CLASS.update(attn_prefill="attn_prefill", attn_decode="attn_decode")
CLASSES = ("gemm", "elementwise", "attn_prefill", "attn_decode")


@dataclass(frozen=True)
class Shard:
    """The per-GPU sizes of one model under tensor parallelism, and element sizes in bytes."""
    hidden: int          # residual width (not sharded)
    q_width: int         # query/attention-output width on this GPU (heads/tp · head_dim)
    kv_width: int        # K (or V) width on this GPU (kv heads/tp, replicated when tp > kv heads)
    ffn: int             # FFN width on this GPU
    gated: bool
    vocab: int           # vocabulary slice on this GPU
    act_bytes: float     # activation/weight element size
    kv_bytes: float      # KV cache element size (INT8 KV reads 1 byte per element)

    @classmethod
    def of(cls, model, tp: int = 1, kv_dtype: str | None = None) -> "Shard":
        from costmodels.catalog import DTYPE_BYTES
        return cls(hidden=model.hidden, q_width=model.hidden // tp,
                   kv_width=model.kv_heads_per_gpu(tp) * model.head_dim, ffn=model.ffn // tp,
                   gated=model.gated_mlp, vocab=model.vocab // tp, act_bytes=DTYPE_BYTES[model.dtype],
                   kv_bytes=DTYPE_BYTES[kv_dtype or model.dtype])


def dense_work(s: Shard, op: str, n):
    """(FLOPs, bytes) of a per-layer or per-step operator over n tokens (n may be an array).
    lm_head runs on n sampled sequences, not on every token."""
    n = np.asarray(n, dtype=float)
    h, b = s.hidden, s.act_bytes
    up = 2 * s.ffn if s.gated else s.ffn
    qkv = s.q_width + 2 * s.kv_width
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 4.0 * n * h, (2.0 * n * h + h) * b
    if op == "attn_pre_proj":
        return 2.0 * n * h * qkv, (h * qkv + n * (h + qkv)) * b
    if op == "attn_rope":
        return 6.0 * n * (s.q_width + s.kv_width), 2.0 * n * (s.q_width + s.kv_width) * b
    if op == "attn_post_proj":
        return 2.0 * n * s.q_width * h, (s.q_width * h + n * (s.q_width + h)) * b
    if op == "mlp_up_proj":
        return 2.0 * n * h * up, (h * up + n * (h + up)) * b
    if op == "mlp_act":   # gated: act(gate)·up reads 2f writes f; plain: reads f writes f
        return (5.0 if s.gated else 4.0) * n * s.ffn, (3.0 if s.gated else 2.0) * n * s.ffn * b
    if op == "mlp_down_proj":
        return 2.0 * n * s.ffn * h, (s.ffn * h + n * (s.ffn + h)) * b
    if op == "add":       # one residual add; vLLM fuses the other into the RMSNorm kernel
        return n * h, 3.0 * n * h * b
    if op == "emb":
        return 0.0 * n, 2.0 * n * h * b
    if op == "lm_head":
        return 2.0 * n * h * s.vocab, (h * s.vocab + n * (h + s.vocab)) * b
    raise KeyError(op)


def prefill_attn_work(s: Shard, chunks, contexts):
    """(FLOPs, bytes) of causal prefill attention, summed over requests: chunk c attends to its k cached
    tokens and causally to itself; reads Q and the K/V span, writes O and the chunk's new K/V."""
    c = np.asarray(chunks, dtype=float)
    k = np.asarray(contexts, dtype=float)
    flops = 4.0 * s.q_width * c * (k + (c + 1) / 2)
    nbytes = 2.0 * c * s.q_width * s.act_bytes + 2.0 * (k + c) * s.kv_width * s.kv_bytes + 2.0 * c * s.kv_width * s.kv_bytes
    return float(flops.sum()), float(nbytes.sum())


def decode_attn_work(s: Shard, contexts):
    """(FLOPs, bytes) of decode attention, summed over requests, each over its own context length m
    (the KV tokens it reads, the new one included)."""
    m = np.asarray(contexts, dtype=float)
    flops = 4.0 * s.q_width * m
    nbytes = 2.0 * m * s.kv_width * s.kv_bytes + 2.0 * s.q_width * s.act_bytes
    return float(flops.sum()), float(nbytes.sum())
