"""Profile-fitted batch-time model: the measured per-layer times of a (GPU, model) pair, constrained where fitted.

- Non-attention operators: the profile's own per-layer times (the sum of every operator at each profiled token
  count, for each tensor-parallel degree), linear between profiled counts; beyond the last one the last
  measurement grows as roofline v2 does. Measured GEMM tile dips are kept, they are the data.
- Decode attention: t = Σ(m + 1) · c · (1 + (b_half + ch·m̄/1000)/b)^γ + ψ·b + c0 per layer (b requests reading m
  cached tokens each, m̄ their mean; the factor is the occupancy loss of small batches, larger the longer the
  contexts), fitted with every coefficient ≥ 0 and γ ≤ 1: non-negative, and monotone in context and in the number
  of requests. Up to SMALL_DECODE_BATCH requests the profile's own rows for that batch size are used instead,
  linear in the mean context between the profiled ones: there the time steps with the waves of thread blocks
  over the SMs (on the A100, at 4, 7 and 14 requests of Llama-2-7B), which no smooth form follows.
- Prefill attention: t = a1·Σck + a2·Σc² + a3·Σc + a4·Σk + a5·n per layer (chunks c after k cached tokens),
  non-negative least squares: monotone in chunk and context.
- A mixed batch's decodes: where the profile timed the engine's one varlen call over a whole mixed batch
  (`attn_mixed` rows, vLLM's FlashAttention backend) the decodes cost what that kernel charges them, fitted in the
  decode form on those rows less the prefill fit (`decode.in_varlen`; `mixed_attention: one-varlen`); with
  `mixed_attention: split` (FlashInfer-style prefill and decode kernels) they are priced as decode-only rows.
- lm_head, sampling and tensor-parallel all-reduces come from roofline v2 (the profiles do not time them).
Tensor parallelism other than the profiled one scales attention by the shard's share of heads.

It is the default model wherever a fitted file exists for the pair (profiles/<gpu>/<model>-profiled.yaml)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from costmodels.yamlfile import read_yaml

from costmodels.base import register_costmodel
from costmodels.errors import UserError
from costmodels.roofline import RooflineCostModel

DECODE_KEYS = ("per_kv_token_s", "batch_half", "per_seq_s", "fixed_s", "batch_exp")    # plus optional ctx_half,
MIXED_MODES = ("one-varlen", "split")   # how the profiled engine runs a mixed batch's attention
SMALL_DECODE_BATCH = 16          # small_batch: {b: {context: [...], s: [...]}} measured rows up to this many requests
PREFILL_KEYS = ("ck_s", "c2_s", "c_s", "k_s", "per_seq_s")


class ProfiledCostModel(RooflineCostModel):
    """Roofline v2's structure with a pair's measured dense times and fitted attention coefficients (module doc)."""

    kind = "profiled"

    def __init__(self, dense: dict, decode: dict, prefill: dict, model, gpu, tp: int = 1, emb: dict | None = None,
                 profiled_tp: int = 1, kv_dtype=None, provenance: dict | None = None, overheads=None,
                 mixed_attention: str | None = None, **roofline):
        if model is None or gpu is None:
            raise UserError("costmodel: kind 'profiled' needs model.name and hardware.gpu from the catalogs")
        self.dense_tables = {int(k): v for k, v in dense.items()}
        if tp not in self.dense_tables:
            raise UserError(f"costmodel: the profiled model of {model.name} on {gpu.name} has no tp={tp} rows "
                            f"(profiled: {sorted(self.dense_tables)}); use kind roofline or calibrate with tp={tp}")
        for name, d, keys in (("decode", decode, DECODE_KEYS), ("prefill", prefill, PREFILL_KEYS)):
            missing = [k for k in keys if k not in d]
            if missing:
                raise UserError(f"costmodel: profiled {name} attention lacks {', '.join(missing)}; refit it")
            if any(float(d[k]) < 0 for k in keys):
                raise UserError(f"costmodel: profiled {name} attention has a negative coefficient; refit it")
        in_varlen = decode.get("in_varlen")
        if in_varlen is not None:
            missing = [k for k in DECODE_KEYS if k not in in_varlen]
            if missing or any(float(in_varlen[k]) < 0 for k in DECODE_KEYS if k in in_varlen):
                raise UserError(f"costmodel: profiled decode.in_varlen lacks {', '.join(missing) or 'nothing'} or has "
                                "a negative coefficient; refit it")
        self.mixed_attention = mixed_attention or ("one-varlen" if in_varlen is not None else "split")
        if self.mixed_attention not in MIXED_MODES:
            raise UserError(f"costmodel: mixed_attention {self.mixed_attention!r} is not one of {', '.join(MIXED_MODES)}")
        if self.mixed_attention == "one-varlen" and in_varlen is None:
            raise UserError("costmodel: mixed_attention one-varlen needs decode.in_varlen (attn_mixed rows); refit "
                            "with them or use split")
        self.decode_fit, self.prefill_fit, self.emb_fit = dict(decode), dict(prefill), emb
        self.profiled_tp = int(profiled_tp)
        super().__init__(model, gpu, tp=tp, kv_dtype=kv_dtype, provenance=provenance, overheads=overheads, **roofline)
        self.provenance = provenance or {}

    def _prepare(self, n_max: int = 16384):
        self.params_in_use = self._effective_params()
        o = self.overheads
        k, a = o.kernel_overhead_scale, o.decode_attention_scale
        m, tp = self.model, self.tp
        # attention heads on this shard relative to the profiled one
        q_scale = self.profiled_tp / tp
        kv_scale = m.kv_heads_per_gpu(tp) / m.kv_heads_per_gpu(self.profiled_tp)
        d, p = self.decode_fit, self.prefill_fit
        # per-request decode time: a thread block per (request, KV head), as in roofline v2
        self._dec = (float(d["per_kv_token_s"]) * kv_scale * a, float(d["batch_half"]),
                     float(d["per_seq_s"]) * k * kv_scale,
                     float(d["fixed_s"]) * k, float(d["batch_exp"]), float(d.get("ctx_half", 0.0)))
        # measured small-batch rows, scaled like the per-request time (KV heads on the shard, the engine's kernel)
        self._small = {int(b): ([float(x) for x in row["context"]], [float(y) * kv_scale * a for y in row["s"]])
                       for b, row in (d.get("small_batch") or {}).items() if len(row["context"]) >= 2}
        # decodes inside the varlen call: a thread block per (request, query head) there, so query heads scale them
        iv = d.get("in_varlen")
        self._dec_mixed_fit = (float(iv["per_kv_token_s"]) * q_scale * a, float(iv["batch_half"]),
                               float(iv["per_seq_s"]) * k * q_scale, float(iv["fixed_s"]) * k, float(iv["batch_exp"]),
                               float(iv.get("ctx_half", 0.0))) if iv else None
        self._dec_mixed = self._dec_mixed_fit if self.mixed_attention == "one-varlen" else None
        self._set_kv_read_floor()
        self._pre = (float(p["ck_s"]) * q_scale, float(p["c2_s"]) * q_scale, float(p["c_s"]) * q_scale,
                     float(p["k_s"]) * kv_scale, float(p["per_seq_s"]) * k)
        t = self.dense_tables[tp]
        self._knots = np.asarray(t["tokens"], dtype=float)
        self._dense_s = np.asarray(t["layer_ms"], dtype=float) * 1e-3
        if k != 1.0:       # the profile timed each kernel alone: 4 GEMMs and 5 elementwise kernels per layer
            raw = self.params
            fixed = 4 * raw["gemm_overhead_s"] + 5 * raw["elementwise_overhead_s"]
            self._dense_s = np.maximum(self._dense_s - (1.0 - k) * fixed, 0.5 * self._dense_s)
        if len(self._knots) < 2 or np.any(np.diff(self._knots) <= 0) or np.any(self._dense_s <= 0):
            raise UserError("costmodel: a profiled dense table needs >= 2 increasing token counts with positive times")
        self._grow(n_max)

    def _interp(self, knots, vals, n):
        """Linear between profiled counts; below the first and beyond the last along the end segments' slopes,
        never below zero (and never falling beyond the profile)."""
        n = np.asarray(n, dtype=float)
        y = np.interp(n, knots, vals)
        lo = (vals[1] - vals[0]) / (knots[1] - knots[0])
        hi = max(0.0, (vals[-1] - vals[-2]) / (knots[-1] - knots[-2]))
        y = np.where(n < knots[0], vals[0] + (n - knots[0]) * lo, y)
        y = np.where(n > knots[-1], vals[-1] + (n - knots[-1]) * hi, y)
        return np.maximum(y, 0.0)

    def dense_ops_time(self, n):
        """Measured between profiled counts; beyond the last one, the last measurement scaled by roofline v2's
        growth (FLOP- or byte-proportional), so extrapolation follows physics rather than one noisy segment."""
        n = np.asarray(n, dtype=float)
        k, v = self._knots, self._dense_s
        t = self._interp(k, v, np.minimum(n, k[-1]))
        far = n > k[-1]
        if np.any(far):
            roof = RooflineCostModel.dense_ops_time
            t = np.where(far, v[-1] * roof(self, n) / roof(self, k[-1]), t)
        return np.where(n > 0, t, 0.0)

    def emb_time(self, n_tokens):
        if not self.emb_fit:
            return super().emb_time(n_tokens)
        n = np.asarray(n_tokens, dtype=float)
        k, v = np.asarray(self.emb_fit["tokens"], float), np.asarray(self.emb_fit["ms"], float) * 1e-3
        return np.where(n > 0, self._interp(k, v, n), 0.0)

    def op_times(self, shape):
        out = super().op_times(shape)
        n = shape.num_tokens
        out["other"] = float(self.dense_ops_time(n))
        return out

    def in_mode(self, mode: str | None):
        """This model with a mixed batch's attention priced as `mode` runs it (None or the same: itself)."""
        if mode in (None, "", self.mixed_attention) or mode not in MIXED_MODES:
            return self
        if mode == "one-varlen" and self._dec_mixed_fit is None:
            return self
        import copy
        other = copy.copy(self)
        other.mixed_attention = mode
        other._dec_mixed = self._dec_mixed_fit if mode == "one-varlen" else None
        return other

    # -- persistence --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        r = lambda v: float(f"{v:.6g}")  # noqa: E731
        return {"kind": "profiled", "model": self.model.name, "gpu": self.gpu.name, "profiled_tp": self.profiled_tp,
                "units": "dense: ms per layer (all non-attention ops); emb: ms per iteration; attention: s per layer",
                "dense": {str(k): {"tokens": [int(x) for x in v["tokens"]], "layer_ms": [r(x) for x in v["layer_ms"]]}
                          for k, v in sorted(self.dense_tables.items())},
                "emb": ({"tokens": [int(x) for x in self.emb_fit["tokens"]], "ms": [r(x) for x in self.emb_fit["ms"]]}
                        if self.emb_fit else None),
                "decode": {**{k: r(self.decode_fit[k]) for k in DECODE_KEYS},
                           **({"ctx_half": r(self.decode_fit["ctx_half"])} if "ctx_half" in self.decode_fit else {}),
                           **({"small_batch": {int(b): {"context": [r(x) for x in row["context"]],
                                                        "s": [r(y) for y in row["s"]]}
                                               for b, row in sorted(self.decode_fit["small_batch"].items())}}
                              if self.decode_fit.get("small_batch") else {}),
                           **({"in_varlen": {k: r(v) for k, v in self.decode_fit["in_varlen"].items()}}
                              if self.decode_fit.get("in_varlen") else {})},
                # files without the in-varlen fit price mixed batches one way only: they stay as they were
                **({"mixed_attention": self.mixed_attention} if self.decode_fit.get("in_varlen") else {}),
                "prefill": {k: r(self.prefill_fit[k]) for k in PREFILL_KEYS},
                "provenance": self.provenance}

    def save(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, width=120, default_flow_style=None))

    @classmethod
    def load(cls, path, model, gpu, tp: int = 1, **kw) -> "ProfiledCostModel":
        path = Path(path)
        if not path.exists():
            raise UserError(f"costmodel.path: {path} does not exist")
        d = read_yaml(path)
        if not isinstance(d.get("dense"), dict) or "decode" not in d or "prefill" not in d:
            raise UserError(f"{path}: not a profiled cost model file (needs dense, decode, prefill); refit with "
                            "`servesim calibrate --kind profiled`")
        return cls(d["dense"], d["decode"], d["prefill"], model, gpu, tp=tp, emb=d.get("emb"),
                   profiled_tp=d.get("profiled_tp", 1), provenance=d.get("provenance"),
                   mixed_attention=kw.pop("mixed_attention", None) or d.get("mixed_attention"), **kw)


def profiled_path(gpu_name: str, model_name: str) -> Path:
    from costmodels.linear import PROFILES_DIR
    return PROFILES_DIR / gpu_name / f"{model_name}-profiled.yaml"


@register_costmodel("profiled")
def _build_profiled(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> ProfiledCostModel:
    """`kind: profiled` with `path:` to a fitted YAML (default: profiles/<gpu>/<model>-profiled.yaml)."""
    from costmodels.linear import resolve_profile_path
    bad = set(spec) - {"path", "kv_dtype", "allreduce", "overheads", "params"}
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for kind 'profiled'; allowed: kind, "
                        "allreduce, kv_dtype, overheads, params, path")
    path = spec.get("path")
    path = resolve_profile_path(path) if path else profiled_path(gpu.name if gpu else "a100-80gb",
                                                                 model.name if model else "llama-2-7b")
    if not Path(path).exists():
        raise UserError(f"{where}.path: no fitted profiled model at {path}; fit one with "
                        f"`servesim calibrate PROFILE --kind profiled -o {path}` or use kind roofline")
    from costmodels.base import shown_path
    cm = ProfiledCostModel.load(path, model, gpu, tp=tp, kv_dtype=spec.get("kv_dtype"),
                                overheads=spec.get("overheads"), allreduce=spec.get("allreduce", "auto"),
                                params=spec.get("params"))
    cm.source = shown_path(path) + (" + costmodel.params" if spec.get("params") else "")
    return cm
