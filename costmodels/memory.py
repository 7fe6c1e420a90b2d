"""KV capacity as vLLM computes it: GPU memory × utilization − weights − its profiling run's peak − other reservations.

vLLM sizes the KV cache after a profiling forward over max_num_batched_tokens tokens and a sampler run over
max_num_seqs rows: what is left of `gpu_memory_utilization × total` after the weights, that run's peak torch memory
and the non-torch memory the process holds (CUDA context growth, cuBLAS workspaces, NCCL buffers) becomes KV
blocks. Here each term is an estimate: the forward's per-token intermediates (ModelSpec.activation_reserve_bytes'
structure) times a fitted scale, the sampler's fp32 logits plus two fp32 working copies (12 bytes per logit, a
count, not a fit) and a fitted non-torch constant. The two fitted numbers live in profiles/vllm-memory.yaml with the
experiments they were fitted on (python -m study.fit_memory)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from costmodels.catalog import GiB, GPU, ModelSpec
from costmodels.errors import UserError
from costmodels.yamlfile import read_yaml

PARAMS_FILE = Path(__file__).resolve().parent.parent / "profiles" / "vllm-memory.yaml"
SAMPLER_BYTES_PER_LOGIT = 12       # fp32 logits, fp32 probabilities, one fp32 working copy


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU; `kv_tokens` is M."""
    gpu_total: float
    utilization: float
    weights: float
    activation: float
    sampler: float
    non_torch: float
    kv_bytes_per_token: float
    kv_tokens: int

    @property
    def budget(self) -> float:
        return self.gpu_total * self.utilization

    @property
    def kv_bytes(self) -> float:
        return self.budget - self.weights - self.activation - self.sampler - self.non_torch

    def as_dict(self) -> dict:
        return {**asdict(self), "budget": self.budget, "kv_bytes": self.kv_bytes}

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f}"   # noqa: E731
        return (f"KV space per GPU = {g(self.gpu_total)} GiB x {self.utilization:g} - weights {g(self.weights)} - "
                f"activation {g(self.activation)} - sampler {g(self.sampler)} - non-torch {g(self.non_torch)} = "
                f"{g(self.kv_bytes)} GiB = {self.kv_tokens} tokens at {self.kv_bytes_per_token / 1024:.0f} KiB each "
                f"(M: whole blocks)")


@lru_cache(maxsize=1)
def fitted_params() -> dict:
    try:
        spec = read_yaml(PARAMS_FILE)
    except FileNotFoundError:
        spec = {}
    return {"non_torch_gib": float(spec.get("non_torch_gib", 1.0)),
            "activation_scale": float(spec.get("activation_scale", 1.0))}


def forward_activation_bytes(model: ModelSpec, tokens: int, tp: int = 1) -> float:
    """The per-token intermediates of one forward (residual, normed input, QKV, attention output, the widest MLP
    product) over `tokens` tokens, 16-bit, per GPU: the structure of the profiling run's peak before scaling."""
    qkv = model.q_width / tp + 2 * model.kv_heads_per_gpu(tp) * model.head_dim
    widest_ffn = max(model.ffn, model.expert_ffn * max(1, model.experts_per_token) + model.shared_expert_ffn)
    mlp = (3 if model.gated_mlp else 2) * widest_ffn / tp
    return tokens * (3 * model.hidden + qkv + mlp) * 2


def vllm_memory_breakdown(model: ModelSpec, gpu: GPU, utilization: float = 0.9, tp: int = 1,
                          max_batched_tokens: int = 2048, max_seqs: int = 256, kv_dtype: str | None = None,
                          params: dict | None = None) -> MemoryBreakdown:
    """M and the terms it is made of, per GPU, for a vLLM-style engine with these batch limits."""
    model.check_tp(tp)
    p = {**fitted_params(), **(params or {})}
    weights = model.weight_bytes() / tp
    activation = p["activation_scale"] * forward_activation_bytes(model, max_batched_tokens, tp)
    sampler = float(SAMPLER_BYTES_PER_LOGIT * max_seqs * model.vocab)
    non_torch = p["non_torch_gib"] * GiB
    per_token = model.kv_bytes_per_token(kv_dtype, tp)
    free = gpu.mem_bytes * utilization - weights - activation - sampler - non_torch
    if free <= 0:
        raise UserError(f"memory: {model.name} does not fit in {gpu.name} at gpu_memory_utilization {utilization}: "
                        f"weights {weights / GiB:.1f} GiB per GPU plus {(activation + sampler + non_torch) / GiB:.1f} "
                        f"GiB of activations and reservations leave no KV space; raise hardware.tp or pick a larger GPU")
    return MemoryBreakdown(gpu.mem_bytes, utilization, weights, activation, sampler, non_torch, per_token,
                           int(math.floor(free / per_token)))


def fixed_reserve_breakdown(model: ModelSpec, gpu: GPU, utilization: float, tp: int, reserve_bytes: float,
                            kv_dtype: str | None = None) -> MemoryBreakdown:
    """M when the scenario names its own reserve (memory.activation_reserve_gib): it replaces every term but the
    weights."""
    model.check_tp(tp)
    weights = model.weight_bytes() / tp
    per_token = model.kv_bytes_per_token(kv_dtype, tp)
    free = gpu.mem_bytes * utilization - weights - reserve_bytes
    if free <= 0:
        raise UserError(f"memory: {model.name} weights ({weights / GiB:.1f} GiB per GPU) and the "
                        f"{reserve_bytes / GiB:.1f} GiB reserve do not fit in {gpu.name} at utilization {utilization}; "
                        "raise hardware.tp, lower memory.activation_reserve_gib or pick a larger GPU")
    return MemoryBreakdown(gpu.mem_bytes, utilization, weights, reserve_bytes, 0.0, 0.0, per_token,
                           int(math.floor(free / per_token)))
