"""Roofline batch-time model: each operator takes max(FLOPs / achieved compute, bytes / achieved bandwidth)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from costmodels.base import BatchShape, CostModel, register_costmodel
from costmodels.errors import UserError
from costmodels.operators import (CLASSES, LAYER_OPS, OP_CLASS, STEP_OPS, Shard, decode_attn_work, dense_work,
                                  prefill_attn_work)

# Fractions of datasheet peak that kernels of each class reach, used for any GPU × model until fitted.
# Round values: GEMMs ~70% of tensor peak / ~80% of HBM; paged decode attention streams KV near bandwidth;
# prefill attention through vLLM's paged/chunked path reaches about a third of peak on the public A100
# profile (so on A100 these defaults are informed by that data, not independent of it).
DEFAULT_COMPUTE_EFF = {"gemm": 0.7, "elementwise": 0.5, "attn_prefill": 0.3, "attn_decode": 0.5}
DEFAULT_MEMORY_EFF = {"gemm": 0.8, "elementwise": 0.5, "attn_prefill": 0.8, "attn_decode": 0.85}
DEFAULTS = dict(launch_s=4e-6, layer_overhead_s=0.0, step_overhead_s=0.0, link_eff=0.8)


class RooflineCostModel(CostModel):
    """T = layers·(Σ_ops op_time + 2 all-reduces + layer overhead) + Σ_step_ops op_time + step overhead,
    op_time = max(F/(peak·e_c[class]), B/(bw·e_m[class])) + launch, per tensor-parallel shard."""

    kind = "roofline"

    def __init__(self, model, gpu, tp: int = 1, compute_eff: dict | None = None, memory_eff: dict | None = None,
                 launch_s: float = DEFAULTS["launch_s"], layer_overhead_s: float = 0.0, step_overhead_s: float = 0.0,
                 link_eff: float = DEFAULTS["link_eff"], kv_dtype: str | None = None, provenance: dict | None = None):
        if model is None or gpu is None:
            raise UserError("costmodel: kind 'roofline' needs model.name and hardware.gpu from the catalogs")
        model.check_tp(tp)
        super().__init__(model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype)
        self.compute_eff = _effs(DEFAULT_COMPUTE_EFF, compute_eff, "compute_eff")
        self.memory_eff = _effs(DEFAULT_MEMORY_EFF, memory_eff, "memory_eff")
        self.launch_s, self.layer_overhead_s, self.step_overhead_s = float(launch_s), float(layer_overhead_s), float(step_overhead_s)
        self.link_eff = float(link_eff)
        self.provenance = provenance or {}
        self.shard = Shard.of(model, tp, kv_dtype)
        self.layers = model.layers
        self._prepare_fast_path()

    def _prepare_fast_path(self):
        """Work is affine in tokens (dense ops) and in Σ context and batch size (decode), so batch_time can
        use pre-divided scalars; the coefficients come from the operators module, never restated here."""
        P, W = self.gpu.peak_flops, self.gpu.hbm_bytes_per_s
        self._dense = []
        for op in LAYER_OPS + STEP_OPS:
            f0, b0 = dense_work(self.shard, op, 0)
            f1, b1 = dense_work(self.shard, op, 1)
            c, e = self.compute_eff[OP_CLASS[op]], self.memory_eff[OP_CLASS[op]]
            self._dense.append((op, float(f1 - f0) / (P * c), float(b0) / (W * e), float(b1 - b0) / (W * e)))
        f0, b0 = decode_attn_work(self.shard, [0])
        f1, b1 = decode_attn_work(self.shard, [1])
        c, e = self.compute_eff["attn_decode"], self.memory_eff["attn_decode"]
        self._dec = ((f1 - f0) / (P * c), b0 / (W * e), (b1 - b0) / (W * e))
        # prefill: FLOPs = f·c·(k + (c+1)/2), bytes affine in c and k
        c, e = self.compute_eff["attn_prefill"], self.memory_eff["attn_prefill"]
        f_c, b_c = prefill_attn_work(self.shard, [1], [0])
        _, b_k = prefill_attn_work(self.shard, [0], [1])
        self._pre = (f_c / (P * c), b_c / (W * e), b_k / (W * e))

    # -- per-operator times ----------------------------------------------------------------------------
    def _roof(self, cls: str, flops, nbytes):
        return np.maximum(np.asarray(flops) / (self.gpu.peak_flops * self.compute_eff[cls]),
                          np.asarray(nbytes) / (self.gpu.hbm_bytes_per_s * self.memory_eff[cls])) + self.launch_s

    def dense_op_time(self, op: str, n):
        """Seconds of one per-layer or per-step operator over n tokens (per layer for layer ops)."""
        return self._roof(OP_CLASS[op], *dense_work(self.shard, op, n))

    def prefill_attn_time(self, chunks, contexts) -> float:
        return float(self._roof("attn_prefill", *prefill_attn_work(self.shard, chunks, contexts))) if len(chunks) else 0.0

    def decode_attn_time(self, contexts) -> float:
        return float(self._roof("attn_decode", *decode_attn_work(self.shard, contexts))) if len(contexts) else 0.0

    def allreduce_time(self, n_tokens: int) -> float:
        """Two all-reduces of the residual per layer (after attention and after the MLP)."""
        nbytes = n_tokens * self.model.hidden * self.shard.act_bytes
        return 2 * self.gpu.allreduce_time_s(nbytes / self.link_eff, self.tp) if self.tp > 1 else 0.0

    def op_times(self, shape: BatchShape) -> dict:
        """Seconds per operator: layer ops and attention per layer, step ops per iteration."""
        n = shape.num_tokens
        out = {op: float(self.dense_op_time(op, n)) for op in LAYER_OPS}
        out["attn_prefill"] = self.prefill_attn_time(shape.prefill_tokens, shape.prefill_context)
        out["attn_decode"] = self.decode_attn_time(shape.decode_context)
        out["emb"] = float(self.dense_op_time("emb", n))
        out["lm_head"] = float(self.dense_op_time("lm_head", len(shape.prefill_tokens) + len(shape.decode_context)))
        return out

    def compute_time(self, shape: BatchShape) -> float:
        """Same sum as op_times, on the scalar fast path (this runs once per simulated iteration)."""
        dc = shape.decode_context
        n = sum(shape.prefill_tokens) + len(dc)
        if n <= 0:
            return 0.0
        n_seqs = len(shape.prefill_tokens) + len(dc)
        launch, layer, step = self.launch_s, 0.0, 0.0
        for op, fc, b0, b1 in self._dense:
            if op == "lm_head":
                step += max(fc * n_seqs, b0 + b1 * n_seqs) + launch
            elif op == "emb":
                step += max(fc * n, b0 + b1 * n) + launch
            else:
                layer += max(fc * n, b0 + b1 * n) + launch
        if dc:
            fm, b0, bm = self._dec
            kv = sum(dc)
            layer += max(fm * kv, b0 * len(dc) + bm * kv) + launch
        if shape.prefill_tokens:
            fc, bc, bk = self._pre
            flops = sum(c * (k + (c + 1) / 2) for c, k in zip(shape.prefill_tokens, shape.prefill_context))
            layer += max(fc * flops, bc * sum(shape.prefill_tokens) + bk * sum(shape.prefill_context)) + launch
        if self.tp > 1:
            layer += self.allreduce_time(n)
        layer += self.layer_overhead_s
        return self.layers * layer + step + self.step_overhead_s

    # -- persistence ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        r = lambda v: float(f"{v:.6g}")  # noqa: E731
        return {"kind": "roofline", "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
                "compute_eff": {k: r(v) for k, v in self.compute_eff.items()},
                "memory_eff": {k: r(v) for k, v in self.memory_eff.items()},
                "launch_s": r(self.launch_s), "layer_overhead_s": r(self.layer_overhead_s),
                "step_overhead_s": r(self.step_overhead_s), "link_eff": r(self.link_eff),
                "provenance": self.provenance}

    def save(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, d: dict, model, gpu, tp: int = 1, kv_dtype=None, where: str = "costmodel"):
        keys = ("compute_eff", "memory_eff", "launch_s", "layer_overhead_s", "step_overhead_s", "link_eff", "provenance")
        return cls(model, gpu, tp=tp, kv_dtype=kv_dtype, **{k: d[k] for k in keys if k in d})


def _effs(defaults: dict, given: dict | None, name: str) -> dict:
    out = dict(defaults)
    for k, v in (given or {}).items():
        if k not in out:
            raise UserError(f"costmodel.{name}: unknown operator class {k!r}; allowed: {', '.join(CLASSES)}")
        if not 0 < float(v) <= 1:
            raise UserError(f"costmodel.{name}.{k}: must be in (0, 1], got {v}")
        out[k] = float(v)
    return out


@register_costmodel("roofline")
def _build_roofline(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> RooflineCostModel:
    """`kind: roofline` with optional `path:` (a fitted YAML) and/or inline efficiencies and overheads."""
    allowed = {"path", "compute_eff", "memory_eff", "launch_s", "layer_overhead_s", "step_overhead_s", "link_eff",
               "kv_dtype"}
    bad = set(spec) - allowed
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for kind 'roofline'; allowed: "
                        f"kind, {', '.join(sorted(allowed))}")
    d = {}
    if spec.get("path"):
        from costmodels.linear import resolve_profile_path
        path = resolve_profile_path(spec["path"])
        if not path.exists():
            raise UserError(f"{where}.path: {path} does not exist")
        d = yaml.safe_load(path.read_text()) or {}
    d.update({k: v for k, v in spec.items() if k not in ("path", "kv_dtype")})
    return RooflineCostModel.from_dict(d, model, gpu, tp=tp, kv_dtype=spec.get("kv_dtype"), where=where)
