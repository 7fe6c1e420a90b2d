"""Hardware and model catalogs (datasheet and public-config facts) and the memory arithmetic built on them."""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodels.errors import UserError

GiB = 1024 ** 3

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
TP_DEGREES = (1, 2, 4, 8)


def _dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise UserError(f"dtype: {dtype!r} is not allowed; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class GPU:
    """One accelerator. Memory in bytes (GiB-based, as the driver reports); rates per second."""
    name: str
    mem_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float            # dense fp16/bf16 tensor-core FLOP/s
    pcie_bytes_per_s: float      # host link, one direction
    nvlink_bytes_per_s: float    # per-GPU interconnect, one direction (0 = none)
    pcie_latency_s: float = 10e-6
    nvlink_latency_s: float = 8e-6  # per all-reduce step, launch plus hop (NCCL small-message regime)

    def link_bytes_per_s(self) -> float:
        """The link tensor-parallel shards talk over: NVLink where the part has it, else PCIe."""
        return self.nvlink_bytes_per_s or self.pcie_bytes_per_s

    def allreduce_time_s(self, nbytes: float, tp: int) -> float:
        """Ring all-reduce of `nbytes` over `tp` GPUs: 2(tp−1)/tp of the data crosses each link, in 2(tp−1) steps."""
        if tp <= 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (tp - 1)
        return steps * self.nvlink_latency_s + (steps / tp) * nbytes / self.link_bytes_per_s()


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shapes, from its public config."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_context: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    dtype: str = "fp16"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        h, kvd = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kvd
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + mlp) + emb

    def weight_bytes(self, dtype: str | None = None) -> float:
        return self.params() * DTYPE_BYTES[dtype or self.dtype]

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads one tensor-parallel shard holds; vLLM replicates KV heads when tp exceeds their number."""
        return max(1, -(-self.kv_heads // tp))

    def kv_bytes_per_token(self, kv_dtype: str | None = None, tp: int = 1) -> float:
        """K and V for every layer: 2 · layers · kv_heads · head_dim · bytes (GQA-aware); per GPU when tp > 1.
        INT8 KV adds its per-channel scale and zero point only per block, which is negligible per token."""
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * _dtype_bytes(kv_dtype or self.dtype)

    def hidden_bytes_per_token(self, dtype: str | None = None, tp: int = 1) -> float:
        """Apt-Serve's hidden cache: one hidden vector per layer. Not smaller than KV for GQA models."""
        return self.layers * self.hidden * _dtype_bytes(dtype or self.dtype) / tp

    def hidden_to_kv_ratio(self) -> float:
        """Apt-Serve: hidden-cache bytes per token over KV bytes per token, d / (2·d_kv); 0.5 for MHA, >1 for GQA."""
        return self.hidden_bytes_per_token() / self.kv_bytes_per_token()

    def kv_proj_flops_per_token(self, tp: int = 1) -> float:
        """FLOPs to rebuild one token's K and V in every layer from its hidden state (Apt-Serve restore)."""
        return 2.0 * self.layers * self.hidden * 2 * self.kv_heads_per_gpu(tp) * self.head_dim

    def activation_reserve_bytes(self, max_batched_tokens: int = 4096, tp: int = 1) -> float:
        """Peak transient memory of one forward pass over `max_batched_tokens` (what vLLM's profiling run
        reserves): the widest per-token intermediates live at once (residual, normed input, QKV, attention
        output, gated-MLP up/gate and product) plus fp32 logits for one sampled token per 256 batched tokens
        (at least one), as a round estimate rather than a measurement."""
        b = DTYPE_BYTES[self.dtype]
        qkv = self.hidden / tp + 2 * self.kv_heads_per_gpu(tp) * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * self.ffn / tp
        per_token = (3 * self.hidden + qkv + mlp) * b
        logits = max(1, max_batched_tokens // 256) * self.vocab * 4
        return max_batched_tokens * per_token + logits

    def check_tp(self, tp: int, where: str = "hardware.tp") -> None:
        """Tensor parallelism splits heads and FFN evenly: tp must be 1, 2, 4 or 8 and divide both."""
        if tp not in TP_DEGREES:
            raise UserError(f"{where}: tensor-parallel degree {tp} is not supported; allowed: 1, 2, 4, 8")
        if self.heads % tp or self.ffn % tp:
            raise UserError(f"{where}: {self.name} has {self.heads} heads and FFN {self.ffn}, not divisible by tp={tp}")


GPUS = {g.name: g for g in [
    GPU("a100-40gb", 40 * GiB, 1555e9, 312e12, 32e9, 300e9),
    GPU("a100-80gb", 80 * GiB, 2039e9, 312e12, 32e9, 300e9),
    GPU("h100-sxm", 80 * GiB, 3350e9, 989e12, 64e9, 450e9),
    GPU("h200", 141e9, 4800e9, 989e12, 64e9, 450e9),
    GPU("a40", 48 * GiB, 696e9, 149.7e12, 32e9, 56.25e9),
    GPU("l40s", 48 * GiB, 864e9, 362e12, 32e9, 0.0),
    GPU("v100", 32 * GiB, 900e9, 125e12, 16e9, 150e9),
]}

MODELS = {m.name: m for m in [
    ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    ModelSpec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    ModelSpec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
    ModelSpec("opt-2.7b", 32, 2560, 32, 32, 10240, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    ModelSpec("opt-6.7b", 32, 4096, 32, 32, 16384, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    ModelSpec("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    ModelSpec("opt-30b", 48, 7168, 56, 56, 28672, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    ModelSpec("opt-66b", 64, 9216, 72, 72, 36864, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    # Not a real model: Llama-shaped and small enough to profile on a CPU in the test suite.
    ModelSpec("tiny-llama", 2, 256, 4, 2, 688, 1024, 2048),
]}


def _lookup(table: dict, name: str, what: str, where: str):
    key = str(name).lower()
    if key not in table:
        raise UserError(f"{where}: unknown {what} {name!r}; allowed: {', '.join(table)}")
    return table[key]


def get_gpu(name: str, where: str = "hardware.gpu") -> GPU:
    return _lookup(GPUS, name, "GPU", where)


def get_model(name: str, where: str = "model.name") -> ModelSpec:
    return _lookup(MODELS, name, "model", where)


def kv_capacity_tokens(model: ModelSpec, gpu: GPU, gpu_memory_utilization: float = 0.9, tp: int = 1,
                       activation_reserve_bytes: float = 0.0, kv_dtype: str | None = None) -> int:
    """M = (GPU memory × utilization − weights − activation reserve) / KV bytes per token, per TP shard."""
    model.check_tp(tp)
    free = gpu.mem_bytes * gpu_memory_utilization - model.weight_bytes() / tp - activation_reserve_bytes
    per_token = model.kv_bytes_per_token(kv_dtype, tp)
    if free <= 0:
        raise UserError(f"memory: {model.name} weights ({model.weight_bytes() / GiB / tp:.1f} GiB per GPU) do not fit "
                        f"in {gpu.name} at utilization {gpu_memory_utilization}; raise hardware.tp or pick a larger GPU")
    return int(math.floor(free / per_token))
