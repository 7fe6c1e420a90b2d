"""Profile-fitted batch-time model: one piecewise-linear regression per operator (scikit-learn fit)."""
from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import numpy as np
import yaml

from costmodels.base import BatchShape, CostModel, register_costmodel
from costmodels.errors import UserError
from costmodels.operators import LAYER_OPS

MAX_KNOTS = 48
BATCH_KNOTS = 2   # ψ(B) is affine: per-request kernel overhead; a spline there trades off against φ and wiggles


class PiecewiseLinear:
    """y(x) through (knots, values), continued linearly beyond both ends: smooth enough inside the profiled
    range, proportional scaling outside it, never a lookup miss."""

    def __init__(self, knots, values, end_slopes=None):
        self.x = np.asarray(knots, dtype=float)
        self.y = np.asarray(values, dtype=float)
        if len(self.x) == 1:  # one profiled point: a constant
            self.x, self.y = np.r_[self.x, self.x + 1], np.r_[self.y, self.y]
        if end_slopes is None:
            # Beyond the profile, more work never takes less time: a falling last segment (noise) continues flat.
            end_slopes = ((self.y[1] - self.y[0]) / (self.x[1] - self.x[0]),
                          max(0.0, (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2])))
        self.slope_lo, self.slope_hi = float(end_slopes[0]), float(end_slopes[1])
        self._xs, self._ys = self.x.tolist(), self.y.tolist()
        # Far-away end points on the extrapolation lines, so np.interp alone evaluates many x exactly.
        far = 1e12
        self._xe = np.r_[self.x[0] - far, self.x, self.x[-1] + far]
        self._ye = np.r_[self.y[0] - far * self.slope_lo, self.y, self.y[-1] + far * self.slope_hi]

    def scalar(self, x: float) -> float:
        """One value without numpy overhead (the per-iteration path)."""
        xs, ys = self._xs, self._ys
        if x <= xs[0]:
            return ys[0] + (x - xs[0]) * self.slope_lo
        if x >= xs[-1]:
            return ys[-1] + (x - xs[-1]) * self.slope_hi
        i = bisect_right(xs, x)
        return ys[i - 1] + (x - xs[i - 1]) * (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])

    def total(self, xs) -> float:
        """Σ y(x) over many x (one per request)."""
        return float(np.interp(xs, self._xe, self._ye).sum())

    def __add__(self, other: "PiecewiseLinear") -> "PiecewiseLinear":
        """The exact sum: piecewise linear on the union of knots, with summed end slopes beyond them."""
        knots = np.union1d(self.x, other.x)
        return PiecewiseLinear(knots, self(knots) + other(knots),
                               (self.slope_lo + other.slope_lo, self.slope_hi + other.slope_hi))

    def __call__(self, x):
        x = np.asarray(x, dtype=float)
        y = np.interp(x, self.x, self.y)
        y = np.where(x < self.x[0], self.y[0] + (x - self.x[0]) * self.slope_lo, y)
        return np.where(x > self.x[-1], self.y[-1] + (x - self.x[-1]) * self.slope_hi, y)

    def to_dict(self) -> dict:
        return {"knots": [float(f"{v:.6g}") for v in self.x], "values_ms": [float(f"{v:.6g}") for v in self.y]}

    @classmethod
    def from_dict(cls, d: dict) -> "PiecewiseLinear":
        return cls(d["knots"], d["values_ms"])


def _knots(x, n_max=MAX_KNOTS):
    """Knots at quantiles of the distinct profiled x values: dense where the profile is dense."""
    u = np.unique(np.asarray(x, dtype=float))
    n = int(min(n_max, max(2, len(u) // 3)))
    return np.unique(np.quantile(u, np.linspace(0, 1, n)))


def _basis(knots):
    from sklearn.preprocessing import SplineTransformer
    st = SplineTransformer(knots=np.asarray(knots)[:, None], degree=1, extrapolation="linear")
    return st.fit(np.asarray(knots)[:, None])


def _summed_basis(st, groups):
    """Σ over each row's requests of the basis at their own values (per-request additivity)."""
    flat = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    idx = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    B = st.transform(flat[:, None])
    out = np.zeros((len(groups), B.shape[1]))
    np.add.at(out, idx, B)
    return out


def _fit_relative(X, y, alpha=1e-6):
    """Ridge regression minimising relative error (weights 1/y²), so small kernels count as much as large."""
    from sklearn.linear_model import Ridge
    return Ridge(alpha=alpha).fit(X, y, sample_weight=1.0 / np.maximum(y, 1e-9) ** 2)


class ProfiledCostModel(CostModel):
    """T = layers·(Σ_ops f_op(N) + Σ_prefill φ_p(c,k) + [decode]·(ψ(B) + Σ_decode φ_d(m))) + emb(N) (+ all-reduce).

    f_op: per-operator piecewise-linear in tokens. φ_p(c,k) = g1(c·(k + c/2)) + g2(c) + g3(k) per prefill request.
    Decode attention is charged per request from its own context m (φ_d), plus a batch-size term ψ(B)."""

    kind = "profiled"

    def __init__(self, functions: dict, layers: int = 32, model=None, gpu=None, tp: int = 1, kv_dtype=None,
                 floors_ms: dict | None = None, provenance: dict | None = None):
        super().__init__(model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype)
        self.f = {k: (v if isinstance(v, PiecewiseLinear) else PiecewiseLinear.from_dict(v)) for k, v in functions.items()}
        missing = [op for op in LAYER_OPS if op not in self.f]
        if missing:
            raise UserError(f"costmodel: profiled model lacks operator(s) {', '.join(missing)}; refit with `servesim calibrate`")
        self.layers = int(layers)
        self.floors_ms = dict(floors_ms or {})
        self.provenance = provenance or {}
        # All non-attention layer ops as one function of tokens (exact sum), floored like each op.
        self._other = self.f[LAYER_OPS[0]]
        for op in LAYER_OPS[1:]:
            self._other = self._other + self.f[op]
        self._other_floor = sum(self.floors_ms.get(op, 0.0) for op in LAYER_OPS)

    # -- per-operator times, seconds ---------------------------------------------------------------------
    def _floor(self, name, t_ms):
        return max(float(t_ms), self.floors_ms.get(name, 0.0)) * 1e-3

    def dense_op_time(self, op: str, n) -> float:
        if op not in self.f:
            return 0.0
        return self._floor(op, self.f[op](n))

    def prefill_attn_time(self, chunks, contexts) -> float:
        if not len(chunks) or "attn_prefill.flops" not in self.f:
            return 0.0
        ff, fc, fk = self.f["attn_prefill.flops"].scalar, self.f["attn_prefill.chunk"].scalar, self.f["attn_prefill.context"].scalar
        t = sum(ff(c * (k + c / 2)) + fc(c) + fk(k) for c, k in zip(chunks, contexts))
        return self._floor("attn_prefill", t)

    def decode_attn_time(self, contexts) -> float:
        if not len(contexts) or "attn_decode.context" not in self.f:
            return 0.0
        t = self.f["attn_decode.batch"](len(contexts)) + np.sum(self.f["attn_decode.context"](contexts))
        return self._floor("attn_decode", t)

    def op_times(self, shape: BatchShape) -> dict:
        n = shape.num_tokens
        out = {op: self.dense_op_time(op, n) for op in LAYER_OPS}
        out["attn_prefill"] = self.prefill_attn_time(shape.prefill_tokens, shape.prefill_context)
        out["attn_decode"] = self.decode_attn_time(shape.decode_context)
        out["emb"] = self.dense_op_time("emb", n)
        return out

    def compute_time(self, shape: BatchShape) -> float:
        """Layers × (non-attention ops + attention) + emb, on the scalar fast path."""
        dc = shape.decode_context
        n = sum(shape.prefill_tokens) + len(dc)
        if n <= 0:
            return 0.0
        layer = max(self._other.scalar(n), self._other_floor) * 1e-3
        if dc and "attn_decode.context" in self.f:
            t = self.f["attn_decode.batch"].scalar(len(dc)) + self.f["attn_decode.context"].total(dc)
            layer += self._floor("attn_decode", t)
        layer += self.prefill_attn_time(shape.prefill_tokens, shape.prefill_context)
        emb = self._floor("emb", self.f["emb"].scalar(n)) if "emb" in self.f else 0.0
        if self.tp > 1 and self.gpu is not None and self.model is not None:
            layer += 2 * self.gpu.allreduce_time_s(n * self.model.hidden * 2, self.tp)
        return self.layers * layer + emb

    # -- fitting ------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, table, layers: int = 32, **kw) -> "ProfiledCostModel":
        """Fit every operator present in a harness-format table (costmodels.profile_data)."""
        from costmodels.profile_data import parse_decode, parse_prefill
        f, floors = {}, {}
        for op, g in table.groupby("op"):
            y = g["time_ms"].to_numpy(float)
            floors[op] = float(y.min()) * 0.5
            if op in LAYER_OPS or op == "emb":
                n = g["num_tokens"].to_numpy(float)
                st = _basis(_knots(n))
                reg = _fit_relative(st.transform(n[:, None]), y)
                f[op] = PiecewiseLinear(st.bsplines_[0].t[1:-1], reg.predict(st.transform(st.bsplines_[0].t[1:-1, None])))
            elif op == "attn_decode":
                ctx = [parse_decode(s) for s in g["decode"]]
                b = np.array([len(c) for c in ctx], dtype=float)
                sb, sm = _basis(_knots(b, BATCH_KNOTS)), _basis(_knots(np.concatenate(ctx), 24))
                X = np.c_[sb.transform(b[:, None]), _summed_basis(sm, ctx)]
                reg = _fit_relative(X, y)
                nb = sb.transform(b[:1, None]).shape[1]
                kb, km = sb.bsplines_[0].t[1:-1], sm.bsplines_[0].t[1:-1]
                f["attn_decode.batch"] = PiecewiseLinear(kb, sb.transform(kb[:, None]) @ reg.coef_[:nb] + reg.intercept_)
                f["attn_decode.context"] = PiecewiseLinear(km, sm.transform(km[:, None]) @ reg.coef_[nb:])
            elif op == "attn_prefill":
                pairs = [parse_prefill(s) for s in g["prefill"]]
                cs = [np.asarray(p[0], dtype=float) for p in pairs]
                ks = [np.asarray(p[1], dtype=float) for p in pairs]
                fl = [c * (k + c / 2) for c, k in zip(cs, ks)]
                parts = [("flops", fl, 16), ("chunk", cs, 16), ("context", ks, 16)]
                sts = [_basis(_knots(np.concatenate(v), nk)) for _, v, nk in parts]
                X = np.hstack([_summed_basis(st, v) for st, (_, v, _) in zip(sts, parts)])
                X = np.c_[X, [len(c) for c in cs]]    # per-request constant
                reg = _fit_relative(X, y)
                off = 0
                for st, (name, _, _) in zip(sts, parts):
                    kn = st.bsplines_[0].t[1:-1]
                    nb = len(st.bsplines_[0].t) - 2
                    vals = st.transform(kn[:, None]) @ reg.coef_[off:off + nb]
                    if name == "chunk":
                        vals = vals + reg.coef_[-1] + reg.intercept_   # Vidur prefill rows hold one request each
                    f[f"attn_prefill.{name}"] = PiecewiseLinear(kn, vals)
                    off += nb
        return cls(f, layers=layers, floors_ms=floors, **kw)

    # -- persistence --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": "profiled", "layers": self.layers, "units": "ms (per layer; emb per iteration)",
                "floors_ms": {k: float(f"{v:.6g}") for k, v in self.floors_ms.items()},
                "functions": {k: v.to_dict() for k, v in self.f.items()}, "provenance": self.provenance}

    def save(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, width=120, default_flow_style=None))

    @classmethod
    def load(cls, path, **kw) -> "ProfiledCostModel":
        path = Path(path)
        if not path.exists():
            raise UserError(f"costmodel.path: {path} does not exist")
        d = yaml.safe_load(path.read_text()) or {}
        if "functions" not in d:
            raise UserError(f"{path}: no 'functions' mapping; not a profiled cost model file")
        kw.setdefault("layers", d.get("layers", 32))
        return cls(d["functions"], floors_ms=d.get("floors_ms"), provenance=d.get("provenance"), **kw)


@register_costmodel("profiled")
def _build_profiled(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> ProfiledCostModel:
    """`kind: profiled` with `path:` to a fitted YAML (default: profiles/<gpu>/<model>-profiled.yaml)."""
    from costmodels.linear import default_profile_path, resolve_profile_path
    bad = set(spec) - {"path", "kv_dtype"}
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for kind 'profiled'; allowed: kind, kv_dtype, path")
    path = spec.get("path")
    path = resolve_profile_path(path) if path else default_profile_path(gpu.name if gpu else "a100-80gb",
                                                                    model.name if model else "llama-2-7b", "profiled")
    if not Path(path).exists():
        raise UserError(f"{where}.path: no fitted profiled model at {path}; fit one with "
                        f"`servesim calibrate PROFILE.csv --kind profiled -o {path}`")
    return ProfiledCostModel.load(path, layers=model.layers if model else 32, model=model, gpu=gpu, tp=tp,
                                  kv_dtype=spec.get("kv_dtype"))
