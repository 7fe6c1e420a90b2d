"""The cost-model interface: a batch's shape in, seconds out; plus a registry of model kinds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from costmodels.errors import UserError
from costmodels.yamlfile import read_yaml


@dataclass
class BatchShape:
    """What one iteration processes, per request, with no simulation state attached.

    prefill_tokens[i] / prefill_context[i]: chunk length and KV tokens already cached before the chunk
    (context > 0 for later chunks of a chunked prefill and for refills after eviction).
    decode_context[i]: KV tokens a decode step reads, including the token being processed (m + 1).
    The extra fields let research policies pay for what they do (swap traffic, hidden-cache recompute,
    quantized KV) without the cost model knowing the policy.
    """
    prefill_tokens: list = field(default_factory=list)
    prefill_context: list = field(default_factory=list)
    decode_context: list = field(default_factory=list)
    swap_in_tokens: int = 0
    swap_out_tokens: int = 0
    hidden_recompute_tokens: int = 0   # Apt-Serve: hidden-cached tokens whose K/V is recomputed this step
    dequant_tokens: int = 0            # ALISE: INT8 KV tokens dequantized this step
    swap_hidden_tokens: int = 0        # KV moved over PCIe in the background, overlapped with this step's compute
    kv_bits: int = 16                  # bits per stored KV element: scales swap volume (quantized KV moves fewer bytes)
    # Decode requests given only in aggregate (the engine's decode cohort): their count and Σ(m + 1). Only a
    # cost model whose accepts_decode_sums() is True is handed a shape with these set.
    cohort_decodes: int = 0
    cohort_decode_context: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_tokens) + len(self.decode_context) + self.cohort_decodes


DEQUANT_MODES = ("fused", "separate")
OVERHEAD_KEYS = ("step_s", "per_seq_s", "frontend_s", "frontend_per_token_s", "frontend_steps",
                 "kernel_overhead_scale", "decode_attention_scale", "allreduce_per_byte_scale", "moe_gemm_scale")


@dataclass
class Overheads:
    """CPU time a real engine spends besides the GPU's, as a client measures it.

    step_s + per_seq_s · (sequences in the batch) is added to every iteration: scheduling, preparing inputs,
    launching the step, processing outputs (detokenising, stop checks) that the engine does not overlap with the
    GPU. frontend_s + frontend_per_token_s × (prompt tokens) + frontend_steps × (the request's first step) is added
    to its TTFT and end-to-end latency: HTTP handling, tokenisation and the hand-off into the engine (growing with
    the prompt), and streaming the tokens back, which trails the engine by a fraction of a step as the front end's
    event loop serves every running stream. Two factors say how an engine's runtime differs from kernels timed one
    by one (roofline v2 and profiled): kernel_overhead_scale multiplies every kernel's fixed time
    (CUDA graphs remove most launch gaps), decode_attention_scale the decode attention's KV-read time (the
    engine's attention kernel against the profiled one); the first also scales the fixed time of vLLM's custom
    all-reduce, whose published times were taken without CUDA graphs. allreduce_per_byte_scale, where set,
    multiplies that all-reduce's per-byte time as the engine runs it (CUDA graphs, registered buffers; unset: the
    published line within its data, NCCL beyond). moe_gemm_scale multiplies the routed experts' grouped GEMMs (the
    engine's fused MoE kernel against the dense GEMM efficiencies they are priced at). Zero and one by default (InferMax's model
    has none); the `vllm` preset holds values fitted on measured vLLM runs (profiles/overheads.yaml says on which)."""
    step_s: float = 0.0
    per_seq_s: float = 0.0
    frontend_s: float = 0.0
    frontend_per_token_s: float = 0.0
    frontend_steps: float = 0.0
    kernel_overhead_scale: float = 1.0
    decode_attention_scale: float = 1.0
    allreduce_per_byte_scale: float | None = None
    moe_gemm_scale: float = 1.0
    provenance: dict = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec, where: str = "costmodel.overheads") -> "Overheads":
        """None or 'none': zeros; a preset name from profiles/overheads.yaml; or a mapping (preset plus overrides)."""
        if spec is None or spec == "none":
            return cls()
        if isinstance(spec, str):
            spec = {"preset": spec}
        if not isinstance(spec, dict):
            raise UserError(f"{where}: expected a preset name or a mapping of step_s, per_seq_s, frontend_s")
        spec = dict(spec)
        base = {}
        prov = {}
        if "preset" in spec:
            name = spec.pop("preset")
            presets = overhead_presets()
            if name not in presets:
                raise UserError(f"{where}.preset: unknown preset {name!r}; allowed: none, {', '.join(sorted(presets))}")
            base = {k: presets[name][k] for k in OVERHEAD_KEYS if k in presets[name]}
            prov = dict(presets[name].get("provenance", {}), preset=name)
        bad = set(spec) - set(OVERHEAD_KEYS)
        if bad:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: preset, "
                            f"{', '.join(OVERHEAD_KEYS)}")
        base.update(spec)
        if "preset" in prov and spec:
            prov["overridden"] = sorted(spec)       # the summary names the preset and what was changed in it
        for k, v in base.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < 10):
                raise UserError(f"{where}.{k}: must be a number of seconds in [0, 10), got {v!r}")
        return cls(**{k: float(v) for k, v in base.items()}, provenance=prov)


def overhead_presets() -> dict:
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "profiles" / "overheads.yaml"
    if not path.exists():
        return {}
    return read_yaml(path).get("presets", {})


class CostModel:
    """Predicts GPU time of one batch. Subclasses follow scikit-learn's contract: knobs in __init__,
    `fit(...)` where it applies, and `batch_time(shape)` as the prediction."""

    kind = "base"
    source = "built-in"            # the fitted file the predictions rest on (set by the builders), or built-in
    # Fractions of peak that the memory-side kernels reach. Hidden-cache K/V rebuild is a GEMM at about 200 of
    # 312 TFLOP/s on an A100 (Apt-Serve spec §2.3); INT8 dequantization is a streaming read/write (round figure).
    recompute_compute_eff = 0.64
    stream_memory_eff = 0.8
    cuda_core_fraction = 0.25      # non-tensor fp16 FLOP/s relative to the tensor-core peak (A100: 78 of 312)
    dequant = "fused"              # INT8 KV dequantization: fused into attention, or a separate pass (DEQUANT_MODES)

    def __init__(self, model=None, gpu=None, kv_bytes_per_token: float | None = None, tp: int = 1,
                 kv_dtype: str | None = None, overheads=None):
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.kv_dtype = kv_dtype
        if kv_bytes_per_token is None and model is not None:
            kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype, tp)
        self.kv_bytes_per_token = kv_bytes_per_token or 0.0
        self.set_overheads(overheads)

    def set_overheads(self, overheads) -> None:
        """CPU and front-end overheads (Overheads, a preset name, a mapping, or None for none)."""
        self.overheads = overheads if isinstance(overheads, Overheads) else Overheads.from_spec(overheads)
        o = self.overheads
        self._cpu = (o.step_s, o.per_seq_s)

    def cpu_time(self, n_seqs: int) -> float:
        """CPU seconds one iteration adds (0 with no overheads)."""
        a, b = self._cpu
        return a + b * n_seqs if (a or b) else 0.0

    def cpu_times(self, n_seqs):
        """cpu_time for an array of sequence counts, the same floats element by element."""
        import numpy as np
        a, b = self._cpu
        n = np.asarray(n_seqs, dtype=float)
        return a + b * n if (a or b) else np.zeros_like(n)

    def describe(self) -> str:
        """One line naming the model a run used (the run summary prints it)."""
        what = {"linear": "linear (InferMax features)", "roofline": "roofline v2", "profiled": "profiled"}.get(
            self.kind, self.kind)
        pair = f"{self.model.name} on {self.gpu.name}, tp={self.tp}" if self.model is not None and self.gpu is not None \
            else "no catalog pair"
        o = getattr(self, "overheads", None)
        over = f"; overheads {o.provenance.get('preset', 'custom')}" if o is not None and (
            o.step_s or o.per_seq_s or o.frontend_s or o.frontend_per_token_s) else ""
        return f"{what} ({pair}){over}"

    def basis(self) -> dict:
        """What this model's times rest on, for the run summary: its kind, the file its coefficients came from
        ('built-in' when they are the code's own) and the overheads preset ('none' when it charges none)."""
        o = self.overheads
        charged = o.step_s or o.per_seq_s or o.frontend_s or o.frontend_per_token_s or o.frontend_steps
        preset = o.provenance.get("preset")
        if preset:
            over = preset + (f" with {', '.join(o.provenance['overridden'])} set" if o.provenance.get("overridden")
                             else "")
        else:
            over = "custom" if charged else "none"
        return {"costmodel_kind": self.kind, "costmodel_file": self.source, "overheads": over}

    def compute_time(self, shape: BatchShape) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def accepts_decode_sums(self) -> bool:
        """Does batch_time honour BatchShape.cohort_decodes / cohort_decode_context exactly? Only models whose
        decode cost depends on the count and Σ(m + 1) alone can. True also promises that, with no memory action
        in the shape, batch_time equals time_from_sums of the shape's integer sums (the engine's fast path).
        The safe default is False."""
        return False

    def swap_time(self, tokens: int) -> float:
        """Seconds to move `tokens` KV entries over PCIe (one direction)."""
        if tokens <= 0 or self.gpu is None:
            return 0.0
        return self.gpu.pcie_latency_s + tokens * self.kv_bytes_per_token / self.gpu.pcie_bytes_per_s

    def hidden_recompute_time(self, tokens: int) -> float:
        """Seconds to rebuild K and V of `tokens` hidden-cached tokens in every layer (Apt-Serve): a
        K/V projection GEMM, compute- or memory-bound, whichever is slower."""
        if tokens <= 0 or self.gpu is None or self.model is None:
            return 0.0
        flops = tokens * self.model.kv_proj_flops_per_token(self.tp)
        nbytes = tokens * (self.model.hidden_bytes_per_token(tp=self.tp) + self.model.kv_bytes_per_token(tp=self.tp))
        return max(flops / (self.gpu.peak_flops * self.recompute_compute_eff),
                   nbytes / (self.gpu.hbm_bytes_per_s * self.stream_memory_eff))

    def dequant_time(self, tokens: int) -> float:
        """Seconds to dequantize `tokens` INT8 KV entries to fp16 (ALISE), by `self.dequant`:

        'fused' (default): dequantization inside the attention kernel, as ALISE's Triton kernels do (spec alise
        §2.7): a scale and a zero-point operation per element on the CUDA cores (taken as 1/4 of the tensor-core
        peak); attention itself is still charged at FP16 bytes, so the halved read traffic is not credited.
        'separate': a streaming pass before attention, reading 1 byte and writing 2 per element (an upper bound)."""
        if tokens <= 0 or self.gpu is None or self.model is None:
            return 0.0
        fp16_bytes = self.model.kv_bytes_per_token(None, self.tp)
        if self.dequant == "separate":
            nbytes = tokens * (self.model.kv_bytes_per_token("int8", self.tp) + fp16_bytes)
            return nbytes / (self.gpu.hbm_bytes_per_s * self.stream_memory_eff)
        elements = tokens * fp16_bytes / 2
        return 2 * elements / (self.gpu.peak_flops * self.cuda_core_fraction)

    def memory_time(self, shape: BatchShape) -> float:
        """Seconds the research policies' memory actions add to an iteration: swap traffic over PCIe in each
        direction, hidden-cache K/V recomputation and INT8 KV dequantization. Charged by every kind."""
        t = 0.0
        scale = shape.kv_bits / 16.0       # quantized KV (memory.kv_quant_bits) moves fewer bytes
        if shape.swap_in_tokens or shape.swap_out_tokens:
            t += self.swap_time(shape.swap_in_tokens * scale) + self.swap_time(shape.swap_out_tokens * scale)
        if shape.hidden_recompute_tokens:
            t += self.hidden_recompute_time(shape.hidden_recompute_tokens)
        if shape.dequant_tokens:
            t += self.dequant_time(shape.dequant_tokens)
        return t

    def batch_time(self, shape: BatchShape) -> float:
        """Seconds for the whole iteration: compute plus the memory actions that are not hidden."""
        t = self.compute_time(shape) + self.memory_time(shape)
        if shape.swap_hidden_tokens:       # background copies (ALISE) cost only the part the step does not cover
            t += max(0.0, self.swap_time(shape.swap_hidden_tokens * shape.kv_bits / 16.0) - t)
        return t

    def decode_stretch_times(self, cached, k: int, last_step=None):
        """Batch times of k decode-only iterations of the same requests (fast-forward).

        `cached` holds each request's KV tokens before the first of them; iteration j (1-based) reads
        cached + j tokens per request. `last_step[i]` (default k) is the last iteration request i is in (it
        completes there). This default asks batch_time once per iteration, so any model is exact; models
        with a closed form override it."""
        import numpy as np
        base = np.asarray(cached, dtype=np.int64)
        last = np.full(len(base), k) if last_step is None else np.asarray(last_step)
        return np.array([self.batch_time(BatchShape(decode_context=(base[last >= j] + j).tolist()))
                         for j in range(1, k + 1)], dtype=float)


COSTMODELS: dict[str, Callable] = {}


def register_costmodel(kind: str, replace: bool = False):
    def deco(builder):
        from costmodels.registry import register
        register(COSTMODELS, kind, builder, "costmodel", replace)
        return builder
    return deco


def shown_path(path) -> str:
    """A file as the summary names it: relative to the repository when it lies inside, else as given."""
    from pathlib import Path
    p = Path(path).resolve()
    root = Path(__file__).resolve().parent.parent
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(path)


def build_costmodel(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> CostModel:
    """Build the cost model a scenario's `costmodel:` section names."""
    spec = dict(spec or {})
    kind = spec.pop("kind", "linear")
    if kind not in COSTMODELS:
        raise UserError(f"{where}.kind: unknown cost model {kind!r}; allowed: {', '.join(sorted(COSTMODELS))}")
    dequant = spec.pop("dequant", CostModel.dequant)
    if dequant not in DEQUANT_MODES:
        raise UserError(f"{where}.dequant: {dequant!r} is not allowed; allowed: {', '.join(DEQUANT_MODES)}")
    cm = COSTMODELS[kind](spec, model=model, gpu=gpu, tp=tp, where=where)
    cm.dequant = dequant
    return cm
