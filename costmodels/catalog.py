"""Hardware and model catalogs (datasheet and public-config facts) and the memory arithmetic built on them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from costmodels.errors import UserError

GiB = 1024 ** 3
MiB = 1024 ** 2

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
TP_DEGREES = (1, 2, 4, 8)
# set by model_from_hf_config while it builds a spec, so that a refusal names the file and its keys
_CHECK_SOURCE: dict = {}
MAX_LAYERS = 1024       # deepest public decoder stacks are ~10^2 layers; more is a typo or a unit slip


def _dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise UserError(f"dtype: {dtype!r} is not allowed; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class GPU:
    """One accelerator. Memory in bytes as the driver reports it; rates per second; datasheet facts."""
    name: str
    mem_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float            # dense fp16/bf16 tensor-core FLOP/s
    pcie_bytes_per_s: float      # host link, one direction
    nvlink_bytes_per_s: float    # per-GPU interconnect, one direction (0 = none)
    pcie_latency_s: float = 10e-6
    nvlink_latency_s: float = 8e-6   # kept for files written by older versions; collectives use costmodels.collectives
    sms: int = 108                   # streaming multiprocessors (compute units): wave quantisation of GEMM tiles
    fp8_flops: float = 0.0           # dense FP8 tensor-core FLOP/s (0: no FP8 units; FP8 weights run at fp16 rate)
    node_kind: str | None = None     # fitted collective data for its tensor-parallel group (profiles/collectives.yaml)
    family: str = ""                 # efficiency class in profiles/roofline-efficiencies.yaml

    def link_bytes_per_s(self) -> float:
        """The link tensor-parallel shards talk over: NVLink where the part has it, else PCIe."""
        return self.nvlink_bytes_per_s or self.pcie_bytes_per_s

    def allreduce_time_s(self, nbytes: float, tp: int, backend: str = "auto", latency_scale: float = 1.0,
                         per_byte_scale: float | None = None) -> float:
        """One all-reduce of `nbytes` over `tp` GPUs (costmodels.collectives)."""
        from costmodels.collectives import allreduce_time_s
        return allreduce_time_s(self, nbytes, tp, backend, latency_scale, per_byte_scale)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shapes, from its public config (dense or mixture-of-experts).

    `dtype` is the weights' storage type (fp8 for FP8-quantized checkpoints, whose embeddings and lm_head stay
    16-bit); the KV cache is 16-bit unless a scenario asks otherwise. MoE fields: `experts` routed experts, of
    which `experts_per_token` serve each token, each an FFN of `expert_ffn`; `shared_expert_ffn` is an FFN every
    token also passes; every `moe_layer_step`-th layer is MoE (the others dense with `ffn`), after the first
    `dense_layers`. MLA (DeepSeek-style) models cache a latent of `kv_lora_rank + qk_rope_dim` per layer instead of
    per-head K and V."""
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
    head_dim: int = 0                # 0: hidden / heads
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    moe_layer_step: int = 1
    dense_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    hf_id: str = ""                  # the Hugging Face repository the facts come from
    aliases: tuple = field(default=(), compare=False)

    def __post_init__(self):
        if not self.head_dim and isinstance(self.heads, int) and self.heads > 0 and isinstance(self.hidden, int):
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        self.check(_CHECK_SOURCE.get("where"), _CHECK_SOURCE.get("names"))

    def check(self, where: str | None = None, names: dict | None = None) -> None:
        """Refuse a shape no transformer can have, in one line naming the field and the rule. `names` maps field
        names to the ones the source uses (a config.json's keys)."""
        where = where or f"model {self.name!r}"
        nm = lambda f: (names or {}).get(f, f)  # noqa: E731
        for f in ("layers", "hidden", "heads", "kv_heads", "vocab", "max_context", "head_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise UserError(f"{where}: {nm(f)} must be a positive integer, got {v!r}")
        for f in ("ffn", "experts", "experts_per_token", "expert_ffn", "shared_expert_ffn", "dense_layers",
                  "kv_lora_rank", "qk_rope_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"{where}: {nm(f)} must be a non-negative integer, got {v!r}")
        if self.layers > MAX_LAYERS:
            raise UserError(f"{where}: {nm('layers')} {self.layers} is more than any model has (at most {MAX_LAYERS})")
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise UserError(f"{where}: {nm('heads')} {self.heads} must be a multiple of {nm('kv_heads')} "
                            f"{self.kv_heads} (each KV head serves a whole group of query heads)")
        if self.dtype not in DTYPE_BYTES:
            raise UserError(f"{where}: dtype {self.dtype!r} is not allowed; allowed: {', '.join(DTYPE_BYTES)}")
        if self.is_moe:
            if not 1 <= self.experts_per_token <= self.experts:
                raise UserError(f"{where}: {nm('experts_per_token')} {self.experts_per_token} must be between 1 and "
                                f"{nm('experts')} {self.experts}")
            if not self.expert_ffn:
                raise UserError(f"{where}: a mixture-of-experts model needs {nm('expert_ffn')} > 0")
            if isinstance(self.moe_layer_step, bool) or not isinstance(self.moe_layer_step, int) or \
                    self.moe_layer_step < 1:
                raise UserError(f"{where}: {nm('moe_layer_step')} must be an integer >= 1, got {self.moe_layer_step!r}")
            if self.dense_layers >= self.layers:
                raise UserError(f"{where}: {nm('dense_layers')} {self.dense_layers} leaves no MoE layer of "
                                f"{self.layers}")
        elif self.experts_per_token or self.expert_ffn or self.shared_expert_ffn:
            raise UserError(f"{where}: {nm('experts_per_token')} or {nm('expert_ffn')} is set but {nm('experts')} is 0")
        if (not self.is_moe or self.moe_layer_count() < self.layers) and not self.ffn:
            raise UserError(f"{where}: {nm('ffn')} must be > 0 (the model has dense FFN layers)")
        if self.qk_rope_dim and not self.kv_lora_rank:
            raise UserError(f"{where}: {nm('qk_rope_dim')} is set without {nm('kv_lora_rank')} (MLA needs both)")

    # -- structure --------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def moe_layer_count(self) -> int:
        if not self.is_moe:
            return 0
        return sum(1 for i in range(self.dense_layers, self.layers) if (i - self.dense_layers + 1) % self.moe_layer_step == 0)

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    def params(self) -> int:
        h, kvd = self.hidden, self.kv_heads * self.head_dim
        attn = h * self.q_width * 2 + 2 * h * kvd
        if self.is_mla:     # latent down-projection and per-head up-projections (approximate: same order)
            attn = h * self.q_width * 2 + h * (self.kv_lora_rank + self.qk_rope_dim) + \
                self.kv_lora_rank * self.heads * self.head_dim * 2
        mult = 3 if self.gated_mlp else 2
        moe = self.moe_layer_count()
        dense_mlp = mult * h * self.ffn
        moe_mlp = mult * h * (self.experts * self.expert_ffn + self.shared_expert_ffn) + h * self.experts
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.layers * attn + (self.layers - moe) * dense_mlp + moe * moe_mlp + emb

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def weight_bytes(self, dtype: str | None = None) -> float:
        """All weights; an 8-bit checkpoint keeps its embeddings and lm_head in 16 bits."""
        b = DTYPE_BYTES[dtype or self.dtype]
        emb = self.embedding_params()
        return (self.params() - emb) * b + emb * max(b, 2)

    def kv_dtype_default(self) -> str:
        return self.dtype if DTYPE_BYTES.get(self.dtype, 2) >= 2 else "fp16"

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads one tensor-parallel shard holds; vLLM replicates KV heads when tp exceeds their number."""
        return max(1, -(-self.kv_heads // tp))

    def kv_bytes_per_token(self, kv_dtype: str | None = None, tp: int = 1) -> float:
        """K and V for every layer: 2 · layers · kv_heads · head_dim · bytes (GQA-aware); per GPU when tp > 1.
        MLA: one latent of kv_lora_rank + qk_rope_dim per layer, replicated on every shard.
        INT8 KV adds its per-channel scale and zero point only per block, which is negligible per token."""
        b = _dtype_bytes(kv_dtype or self.kv_dtype_default())
        if self.is_mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_dim) * b
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * b

    def hidden_bytes_per_token(self, dtype: str | None = None, tp: int = 1) -> float:
        """Apt-Serve's hidden cache: one hidden vector per layer. Not smaller than KV for GQA models."""
        return self.layers * self.hidden * _dtype_bytes(dtype or self.kv_dtype_default()) / tp

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
        b = 2
        qkv = self.q_width / tp + 2 * self.kv_heads_per_gpu(tp) * self.head_dim
        widest_ffn = max(self.ffn, self.expert_ffn * max(1, self.experts_per_token) + self.shared_expert_ffn)
        mlp = (3 if self.gated_mlp else 2) * widest_ffn / tp
        per_token = (3 * self.hidden + qkv + mlp) * b
        logits = max(1, max_batched_tokens // 256) * self.vocab * 4
        return max_batched_tokens * per_token + logits

    def check_tp(self, tp: int, where: str = "hardware.tp") -> None:
        """Tensor parallelism splits heads and FFN evenly: tp must be 1, 2, 4 or 8 and divide both."""
        if tp not in TP_DEGREES:
            raise UserError(f"{where}: tensor-parallel degree {tp} is not supported; allowed: 1, 2, 4, 8")
        for what, v in (("heads", self.heads), ("FFN", self.ffn), ("expert FFN", self.expert_ffn)):
            if v and v % tp:
                raise UserError(f"{where}: {self.name} has {what} {v}, not divisible by tp={tp}")
        if not self.is_mla and self.kv_heads % tp and tp % self.kv_heads:
            raise UserError(f"{where}: {self.name} has {self.kv_heads} KV heads: tp={tp} must divide them or be a "
                            "multiple of them (then each shard holds a copy)")


# GPU memory is what the driver reports as total (torch.cuda.mem_get_info), which for the HBM3 H100/H200 parts is
# a little under the marketed size. node_kind names the fitted collective data; family the efficiency class.
GPUS = {g.name: g for g in [
    GPU("a100-40gb", 40 * GiB, 1555e9, 312e12, 32e9, 300e9, sms=108, node_kind="a100_dgx", family="ampere"),
    GPU("a100-80gb", 80 * GiB, 2039e9, 312e12, 32e9, 300e9, sms=108, node_kind="a100_dgx", family="ampere"),
    GPU("h100-sxm", 81559 * MiB, 3350e9, 989.4e12, 64e9, 450e9, sms=132, fp8_flops=1978.9e12, node_kind="h100_dgx",
        family="hopper"),
    GPU("h100-pcie", 81559 * MiB, 2000e9, 756e12, 64e9, 300e9, sms=114, fp8_flops=1513e12,
        node_kind="h100_pairwise_nvlink", family="hopper"),
    GPU("h200", 143771 * MiB, 4800e9, 989.4e12, 64e9, 450e9, sms=132, fp8_flops=1978.9e12, node_kind="h100_dgx",
        family="hopper"),
    GPU("a40", 48 * GiB, 696e9, 149.7e12, 32e9, 56.25e9, sms=84, node_kind="a100_pairwise_nvlink", family="ampere"),
    GPU("l40s", 46068 * MiB, 864e9, 362e12, 32e9, 0.0, sms=142, fp8_flops=733e12, family="ada"),
    GPU("v100", 32 * GiB, 900e9, 125e12, 16e9, 150e9, sms=80, family="volta"),
    GPU("mi300x", 192 * GiB, 5.3e12, 1307e12, 64e9, 448e9, sms=304, fp8_flops=2615e12, family="cdna3"),
]}

MODELS = {m.name: m for m in [
    ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, hf_id="meta-llama/Llama-2-7b-hf"),
    ModelSpec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, hf_id="meta-llama/Llama-2-13b-hf"),
    ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, hf_id="meta-llama/Llama-2-70b-hf"),
    ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, hf_id="meta-llama/Meta-Llama-3-8B"),
    ModelSpec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, hf_id="meta-llama/Meta-Llama-3-70B"),
    ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, dtype="bf16",
              hf_id="meta-llama/Llama-3.1-8B-Instruct", aliases=("meta-llama/Llama-3.1-8B",)),
    ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072, dtype="bf16",
              hf_id="meta-llama/Llama-3.1-70B-Instruct", aliases=("meta-llama/Llama-3.1-70B",)),
    ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, hf_id="mistralai/Mistral-7B-v0.1"),
    ModelSpec("mistral-nemo-12b", 40, 5120, 32, 8, 14336, 131072, 1024000, dtype="bf16", head_dim=128,
              hf_id="mistralai/Mistral-Nemo-Instruct-2407", aliases=("mistralai/Mistral-Nemo-Base-2407",)),
    ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, dtype="bf16",
              hf_id="Qwen/Qwen2.5-7B-Instruct", aliases=("Qwen/Qwen2.5-7B",)),
    ModelSpec("qwen3-14b", 40, 5120, 40, 8, 17408, 151936, 40960, dtype="bf16", head_dim=128,
              hf_id="Qwen/Qwen3-14B"),
    ModelSpec("yi-34b", 60, 7168, 56, 8, 20480, 64000, 4096, dtype="bf16", hf_id="01-ai/Yi-34B"),
    ModelSpec("codellama-34b", 48, 8192, 64, 8, 22016, 32000, 16384, dtype="bf16",
              hf_id="codellama/CodeLlama-34b-Instruct-hf", aliases=("codellama/CodeLlama-34b-hf",)),
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, dtype="bf16", experts=8, experts_per_token=2,
              expert_ffn=14336, hf_id="mistralai/Mixtral-8x7B-Instruct-v0.1", aliases=("mistralai/Mixtral-8x7B-v0.1",)),
    ModelSpec("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, dtype="bf16", experts=8, experts_per_token=2,
              expert_ffn=16384, hf_id="mistralai/Mixtral-8x22B-Instruct-v0.1",
              aliases=("mistralai/Mixtral-8x22B-v0.1",)),
    ModelSpec("llama-4-scout-17b-16e", 48, 5120, 40, 8, 16384, 202048, 262144, dtype="bf16", head_dim=128,
              experts=16, experts_per_token=1, expert_ffn=8192, shared_expert_ffn=8192,
              hf_id="meta-llama/Llama-4-Scout-17B-16E-Instruct"),
    ModelSpec("llama-4-scout-17b-16e-fp8", 48, 5120, 40, 8, 16384, 202048, 262144, dtype="fp8", head_dim=128,
              experts=16, experts_per_token=1, expert_ffn=8192, shared_expert_ffn=8192,
              hf_id="RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"),
    # DeepSeek-V2-Lite: MLA (a 512 + 64 latent per layer), 64 routed experts (6 per token) + 2 shared, first layer dense
    ModelSpec("deepseek-v2-lite", 27, 2048, 16, 16, 10944, 102400, 32768, dtype="bf16", head_dim=128,
              experts=64, experts_per_token=6, expert_ffn=1408, shared_expert_ffn=2 * 1408, dense_layers=1,
              kv_lora_rank=512, qk_rope_dim=64, hf_id="deepseek-ai/DeepSeek-V2-Lite"),
    ModelSpec("opt-2.7b", 32, 2560, 32, 32, 10240, 50272, 2048, gated_mlp=False, tied_embeddings=True,
              hf_id="facebook/opt-2.7b"),
    ModelSpec("opt-6.7b", 32, 4096, 32, 32, 16384, 50272, 2048, gated_mlp=False, tied_embeddings=True,
              hf_id="facebook/opt-6.7b"),
    ModelSpec("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False, tied_embeddings=True,
              hf_id="facebook/opt-13b"),
    ModelSpec("opt-30b", 48, 7168, 56, 56, 28672, 50272, 2048, gated_mlp=False, tied_embeddings=True,
              hf_id="facebook/opt-30b"),
    ModelSpec("opt-66b", 64, 9216, 72, 72, 36864, 50272, 2048, gated_mlp=False, tied_embeddings=True,
              hf_id="facebook/opt-66b"),
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


def model_by_hf_id(hf_id: str, precision: str | None = None) -> ModelSpec | None:
    """The catalog entry for a Hugging Face repository id (as the validation data names models)."""
    for m in MODELS.values():
        if hf_id in (m.hf_id, *m.aliases):
            return m
    return None


def kv_capacity_tokens(model: ModelSpec, gpu: GPU, gpu_memory_utilization: float = 0.9, tp: int = 1,
                       activation_reserve_bytes: float = 0.0, kv_dtype: str | None = None,
                       other_reserve_bytes: float = 0.0) -> int:
    """M = (GPU memory × utilization − weights − activation reserve − other reservations) / KV bytes per token,
    per TP shard."""
    model.check_tp(tp)
    free = (gpu.mem_bytes * gpu_memory_utilization - model.weight_bytes() / tp - activation_reserve_bytes
            - other_reserve_bytes)
    per_token = model.kv_bytes_per_token(kv_dtype, tp)
    if free <= 0:
        raise UserError(f"memory: {model.name} weights ({model.weight_bytes() / GiB / tp:.1f} GiB per GPU) do not fit "
                        f"in {gpu.name} at utilization {gpu_memory_utilization}; raise hardware.tp or pick a larger GPU")
    return int(math.floor(free / per_token))


# -- Hugging Face config.json -------------------------------------------------------------------------------------
def model_from_hf_config(cfg: dict, name: str, where: str = "config.json") -> ModelSpec:
    """A catalog entry from a Hugging Face config.json (a multimodal config's text_config is used): GQA, head_dim,
    tied embeddings, MoE fields (Mixtral, Llama 4, Qwen-MoE, DeepSeek), MLA, vocabulary, weight precision."""
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: expected a JSON object")
    top = cfg
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k in ("quantization_config",
                                                                              "tie_word_embeddings")}}

    def need(*keys):
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise UserError(f"{where}: missing field {keys[0]!r} (a decoder-only transformer config is needed)")

    def num(v, key):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UserError(f"{where}: field {key!r} must be a non-negative integer, got {v!r}")
        return v
    hidden = num(need("hidden_size", "d_model", "n_embd"), "hidden_size")
    layers = num(need("num_hidden_layers", "n_layer", "num_layers"), "num_hidden_layers")
    heads = num(need("num_attention_heads", "n_head"), "num_attention_heads")
    if not hidden or not layers or not heads:
        raise UserError(f"{where}: hidden_size, num_hidden_layers and num_attention_heads must be > 0")
    kv_heads = num(cfg.get("num_key_value_heads") or heads, "num_key_value_heads")
    if not cfg.get("head_dim") and hidden % heads:
        raise UserError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads} (and no "
                        "head_dim is given)")
    head_dim = num(cfg.get("head_dim") or hidden // heads, "head_dim")
    experts = num(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0,
                  "num_local_experts")
    inter = cfg.get("intermediate_size_mlp") or cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden
    expert_ffn = num(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0,
                     "moe_intermediate_size")
    shared = 0
    if experts:
        if cfg.get("shared_expert_intermediate_size"):
            shared = num(cfg["shared_expert_intermediate_size"], "shared_expert_intermediate_size")
        elif cfg.get("n_shared_experts"):
            shared = num(cfg["n_shared_experts"], "n_shared_experts") * expert_ffn
        elif str(cfg.get("model_type", "")).startswith("llama4"):
            shared = expert_ffn               # Llama 4: one shared expert of intermediate_size per MoE layer
    quant = top.get("quantization_config") or cfg.get("quantization_config") or {}
    torch_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    served = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp16"}   # fp32 checkpoints served in 16 bits
    if torch_dtype not in served and not _quantized_dtype(quant):
        raise UserError(f"{where}: torch_dtype {torch_dtype!r} is not a serving precision; allowed: "
                        f"{', '.join(served)} (or a quantization_config)")
    dtype = _quantized_dtype(quant) or served[torch_dtype]
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
    gated = not str(cfg.get("model_type", "")).startswith("opt") and act in ("silu", "swiglu", "gelu_pytorch_tanh",
                                                                             "geglu", "gelu")
    if experts and cfg.get("num_experts_per_tok") is not None and \
            not 1 <= num(cfg["num_experts_per_tok"], "num_experts_per_tok") <= experts:
        raise UserError(f"{where}: num_experts_per_tok {cfg['num_experts_per_tok']} must be between 1 and "
                        f"the {experts} experts")
    if experts and not expert_ffn:
        raise UserError(f"{where}: a mixture-of-experts config needs intermediate_size or moe_intermediate_size")
    if kv_heads > heads or heads % max(kv_heads, 1):
        raise UserError(f"{where}: num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}")
    _CHECK_SOURCE.update(where=where, names=HF_FIELD_NAMES)    # the catalog's rules, told in the config's names
    try:
        spec = ModelSpec(
            name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=num(inter, "intermediate_size"),
            vocab=num(need("vocab_size"), "vocab_size"),
            max_context=num(cfg.get("max_position_embeddings") or 4096, "max_position_embeddings"),
            gated_mlp=gated, tied_embeddings=bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            dtype=dtype, head_dim=head_dim, experts=experts,
            experts_per_token=num(cfg.get("num_experts_per_tok") or (2 if experts else 0), "num_experts_per_tok"),
            expert_ffn=expert_ffn, shared_expert_ffn=shared,
            moe_layer_step=num(cfg.get("interleave_moe_layer_step") or cfg.get("moe_layer_freq") or 1,
                               "interleave_moe_layer_step") or 1,
            dense_layers=num(cfg.get("first_k_dense_replace") or 0, "first_k_dense_replace"),
            kv_lora_rank=num(cfg.get("kv_lora_rank") or 0, "kv_lora_rank"),
            qk_rope_dim=num(cfg.get("qk_rope_head_dim") or 0, "qk_rope_head_dim") if cfg.get("kv_lora_rank") else 0,
            hf_id=str(top.get("_name_or_path", "")))
    finally:
        _CHECK_SOURCE.clear()
    return spec


# ModelSpec fields -> the config.json keys they come from (for messages about an imported config)
HF_FIELD_NAMES = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                  "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
                  "max_context": "max_position_embeddings", "experts_per_token": "num_experts_per_tok",
                  "expert_ffn": "moe_intermediate_size", "experts": "num_local_experts",
                  "dense_layers": "first_k_dense_replace", "moe_layer_step": "interleave_moe_layer_step",
                  "kv_lora_rank": "kv_lora_rank", "qk_rope_dim": "qk_rope_head_dim"}


def _quantized_dtype(quant) -> str | None:
    """Weight storage type a quantization_config names: FP8 (quant_method fp8, compressed-tensors float 8-bit
    weights), INT8, or 4-bit (AWQ, GPTQ, 4-bit weights); None if none."""
    if not isinstance(quant, dict) or not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8", "modelopt") or "fp8" in str(quant.get("quant_algo", "")).lower():
        return "fp8"
    if method in ("awq", "gptq", "marlin", "bitsandbytes") and quant.get("bits", quant.get("w_bit", 4)) == 4:
        return "int4"
    weights = []

    def walk(d):
        if isinstance(d, dict):
            if isinstance(d.get("weights"), dict):
                weights.append(d["weights"])
            for v in d.values():
                walk(v)
    walk(quant)
    for w in weights:
        bits, kind = w.get("num_bits"), str(w.get("type", "int")).lower()
        if bits == 8:
            return "fp8" if kind == "float" else "int8"
        if bits == 4:
            return "int4"
    if "float-quantized" in str(quant.get("format", "")):
        return "fp8"
    return None


def load_model_config(path, name: str | None = None) -> ModelSpec:
    """Read a local config.json (nothing is downloaded) into a ModelSpec named after its folder unless named."""
    import json
    from pathlib import Path
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise UserError(f"{path}: no such config.json (give the file or the model folder holding it)")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{p}: not a JSON file ({str(e).splitlines()[0]})") from None
    return model_from_hf_config(cfg, name or p.parent.name.lower(), str(p))


def spec_as_python(m: ModelSpec) -> str:
    """The catalog line for a ModelSpec (what `servesim model import` prints)."""
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    core = ", ".join(repr(getattr(m, k)) for k in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                                                   "max_context"))
    extra = [f"{f.name}={getattr(m, f.name)!r}" for f in fields(ModelSpec)
             if f.name not in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_context",
                               "aliases")
             and getattr(m, f.name) != defaults[f.name]
             and not (f.name == "head_dim" and m.head_dim == m.hidden // m.heads)]
    return f"ModelSpec({', '.join([core] + extra)})"


def with_dtype(m: ModelSpec, dtype: str) -> ModelSpec:
    """The same model stored in another weight precision (e.g. an FP8 checkpoint)."""
    _dtype_bytes(dtype)
    return replace(m, name=f"{m.name}-{dtype}" if dtype != m.dtype else m.name, dtype=dtype)
