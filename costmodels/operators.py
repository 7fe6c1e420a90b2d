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

# GEMM shapes per operator: (K, N) of the weight, M is the number of tokens (lm_head: sampled sequences).
GEMM_SHAPES = {"attn_pre_proj": ("hidden", "qkv"), "attn_post_proj": ("q_width", "hidden"),
               "mlp_up_proj": ("hidden", "up"), "mlp_down_proj": ("ffn", "hidden"), "lm_head": ("hidden", "vocab")}


@dataclass(frozen=True)
class Shard:
    """The per-GPU sizes of one model under tensor parallelism, and element sizes in bytes."""
    hidden: int          # residual width (not sharded)
    q_width: int         # query/attention-output width on this GPU (heads/tp · head_dim)
    kv_width: int        # K (or V) width on this GPU (kv heads/tp, replicated when tp > kv heads)
    ffn: int             # dense FFN width on this GPU
    gated: bool
    vocab: int           # vocabulary slice on this GPU
    act_bytes: float     # activation element size (16-bit)
    kv_bytes: float      # KV cache element size (INT8/FP8 KV reads 1 byte per element)
    weight_bytes: float = 2.0   # weight element size (FP8 checkpoints: 1)
    experts: int = 0            # routed experts (MoE layers)
    top_k: int = 0
    expert_ffn: int = 0         # one expert's FFN width on this GPU
    shared_ffn: int = 0         # shared-expert FFN width on this GPU
    moe_fraction: float = 0.0   # share of layers that are MoE
    mla_latent: int = 0         # MLA: cached latent width per token and layer

    @classmethod
    def of(cls, model, tp: int = 1, kv_dtype: str | None = None) -> "Shard":
        from costmodels.catalog import DTYPE_BYTES
        return cls(hidden=model.hidden, q_width=model.heads // tp * model.head_dim,
                   kv_width=model.kv_heads_per_gpu(tp) * model.head_dim, ffn=model.ffn // tp,
                   gated=model.gated_mlp, vocab=model.vocab // tp, act_bytes=2.0,
                   kv_bytes=DTYPE_BYTES[kv_dtype or model.kv_dtype_default()],
                   weight_bytes=DTYPE_BYTES[model.dtype], experts=model.experts, top_k=model.experts_per_token,
                   expert_ffn=model.expert_ffn // tp, shared_ffn=model.shared_expert_ffn // tp,
                   moe_fraction=model.moe_layer_count() / model.layers,
                   mla_latent=(model.kv_lora_rank + model.qk_rope_dim) if model.kv_lora_rank else 0)

    @property
    def up(self) -> int:
        return 2 * self.ffn if self.gated else self.ffn

    @property
    def qkv(self) -> int:
        return self.q_width + 2 * self.kv_width

    def dim(self, name: str) -> int:
        return self.qkv if name == "qkv" else self.up if name == "up" else getattr(self, name)


def gemm_dims(s: Shard, op: str):
    """(K, N) of an operator's weight matrix on this shard."""
    k, n = GEMM_SHAPES[op]
    return s.dim(k), s.dim(n)


def dense_work(s: Shard, op: str, n):
    """(FLOPs, bytes) of a per-layer or per-step operator over n tokens (n may be an array), dense FFN.
    lm_head runs on n sampled sequences, not on every token."""
    n = np.asarray(n, dtype=float)
    h, b = s.hidden, s.act_bytes
    if op in GEMM_SHAPES:
        k, m = gemm_dims(s, op)
        wb = b if op == "lm_head" else s.weight_bytes     # 8-bit checkpoints keep lm_head in 16 bits
        return 2.0 * n * k * m, k * m * wb + n * (k + m) * b
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 4.0 * n * h, (2.0 * n * h + h) * b
    if op == "attn_rope":
        return 6.0 * n * (s.q_width + s.kv_width), 2.0 * n * (s.q_width + s.kv_width) * b
    if op == "mlp_act":   # gated: act(gate)·up reads 2f writes f; plain: reads f writes f
        return (5.0 if s.gated else 4.0) * n * s.ffn, (3.0 if s.gated else 2.0) * n * s.ffn * b
    if op == "add":       # one residual add; vLLM fuses the other into the RMSNorm kernel
        return n * h, 3.0 * n * h * b
    if op == "emb":
        return 0.0 * n, 2.0 * n * h * b
    raise KeyError(op)


def experts_touched(s: Shard, n) -> np.ndarray:
    """Expected distinct routed experts the n tokens of a step reach, with uniform top-k routing:
    E · (1 − (1 − k/E)^n). (An imbalance knob in the roofline scales the busiest expert's work.)"""
    n = np.asarray(n, dtype=float)
    if not s.experts:
        return np.zeros_like(n)
    return s.experts * (1.0 - (1.0 - s.top_k / s.experts) ** n)


def prefill_attn_work(s: Shard, chunks, contexts):
    """(FLOPs, bytes) of causal prefill attention, summed over requests: chunk c attends to its k cached
    tokens and causally to itself; reads Q and the K/V span, writes O and the chunk's new K/V."""
    c = np.asarray(chunks, dtype=float)
    k = np.asarray(contexts, dtype=float)
    flops = 4.0 * s.q_width * c * (k + (c + 1) / 2)
    kvw = s.mla_latent / 2 if s.mla_latent else s.kv_width
    nbytes = 2.0 * c * s.q_width * s.act_bytes + 2.0 * (k + c) * kvw * s.kv_bytes + 2.0 * c * kvw * s.kv_bytes
    return float(flops.sum()), float(nbytes.sum())


def decode_attn_work(s: Shard, contexts):
    """(FLOPs, bytes) of decode attention, summed over requests, each over its own context length m
    (the KV tokens it reads, the new one included)."""
    m = np.asarray(contexts, dtype=float)
    flops = 4.0 * s.q_width * m
    kvw = s.mla_latent / 2 if s.mla_latent else s.kv_width
    nbytes = 2.0 * m * kvw * s.kv_bytes + 2.0 * s.q_width * s.act_bytes
    return float(flops.sum()), float(nbytes.sum())
