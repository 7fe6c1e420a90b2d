"""InferMax's linear batch-time model (spec infermax §3): per-layer terms in tokens, Σc², and KV reads."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import yaml
from costmodels.yamlfile import read_yaml

from costmodels.base import BatchShape, CostModel, register_costmodel
from costmodels.errors import UserError

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

# Coefficient names, all in milliseconds per layer except step_* (whole model, once per iteration).
#   other   = a_o·N + b_o                                   (N = all tokens in the batch)
#   prefill = a_p·Σc² + a_pk·Σc·k + a_pr·Σk + s_p·n_p + b_p (only if the batch has prefill tokens)
#   decode  = a_d·K + s_d·n_d + b_d                         (only if the batch has decode tokens; K = Σ(m+1))
#   step    = step_a·N + step_b                             (embedding/sampling, once per iteration)
COEFFS = ("a_o", "b_o", "a_p", "a_pk", "a_pr", "s_p", "b_p", "a_d", "s_d", "b_d", "step_a", "step_b")
FEATURE_SETS = ("paper", "extended")

# Vidur per-layer ops that make up T_other (everything in a layer that is not attention itself).
OTHER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


class LinearCostModel(CostModel):
    """T(batch) = layers·(other + 𝟙[prefill]·prefill + 𝟙[decode]·decode) + step, in seconds.

    InferMax's model, kept for the optimal-schedule solver and the InferMax findings. One straight line in tokens
    cannot follow the non-attention time, which is flat while the weights' read dominates (up to ~100 tokens on
    an A100) and linear after: fitted on relative error over the public A100 Llama-2-7B profile, the line is about
    30% low at 1 token, 12% low at 32, 15-22% high at 128-256 and within 4% above 1,000 tokens, so small decode
    batches come out too fast (a batch-1 step reads the weights at ~99% of peak bandwidth). The profiled model
    (the default wherever a profile exists) and roofline v2 do not have this error."""

    kind = "linear"

    def __init__(self, coefficients: dict | None = None, layers: int = 32, features: str = "extended",
                 overhead_s: float = 0.0, model=None, gpu=None, tp: int = 1, provenance: dict | None = None,
                 overheads=None):
        super().__init__(model=model, gpu=gpu, tp=tp, overheads=overheads)
        if features not in FEATURE_SETS:
            raise UserError(f"costmodel.features: {features!r} is not allowed; allowed: {', '.join(FEATURE_SETS)}")
        c = {k: 0.0 for k in COEFFS}
        for k, v in (coefficients or {}).items():
            if k not in c:
                raise UserError(f"costmodel.coefficients: unknown coefficient {k!r}; allowed: {', '.join(COEFFS)}")
            c[k] = float(v)
        self.coefficients = c
        self.layers = int(layers)
        self.features = features
        self.overhead_s = float(overhead_s)
        self.provenance = provenance or {}
        if features == "paper":      # InferMax paper text: Σc² and KV reads only, no cross/per-request terms
            c["a_pk"] = c["a_pr"] = c["s_p"] = c["s_d"] = 0.0
        # Pre-scaled to seconds for the whole model, so batch_time is a handful of multiply-adds.
        L = self.layers * 1e-3
        self._k = {k: v * (1e-3 if k.startswith("step") else L) for k, v in c.items()}

    # -- prediction -------------------------------------------------------------------------------------
    def compute_time(self, shape: BatchShape) -> float:
        pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
        n_decode = len(dc) + shape.cohort_decodes          # integer sums: aggregate or not, the same floats
        return self.time_from_sums(
            sum(pt) + n_decode, len(pt), sum(c * c for c in pt), sum(c * k for c, k in zip(pt, pc)),
            sum(pc), n_decode, sum(dc) + shape.cohort_decode_context)

    def accepts_decode_sums(self) -> bool:
        """True unless a subclass changed how a shape becomes a time (it might read decode_context)."""
        cls = type(self)
        return (cls.compute_time is LinearCostModel.compute_time and cls.batch_time is CostModel.batch_time
                and cls.memory_time is CostModel.memory_time)

    def time_from_sums(self, n_tokens, n_prefill, sum_c2, sum_ck, sum_k_prefill, n_decode, kv_read) -> float:
        """The same prediction from the batch's aggregate features (the solver and fast paths use this)."""
        if n_tokens <= 0:
            return 0.0
        k = self._k
        t = k["a_o"] * n_tokens + k["b_o"] + k["step_a"] * n_tokens + k["step_b"] + self.overhead_s
        if n_prefill:
            t += k["a_p"] * sum_c2 + k["a_pk"] * sum_ck + k["a_pr"] * sum_k_prefill + k["s_p"] * n_prefill + k["b_p"]
        if n_decode:
            t += k["a_d"] * kv_read + k["s_d"] * n_decode + k["b_d"]
        return t + self.cpu_time(n_prefill + n_decode)

    def decode_stretch_times(self, cached, k: int, last_step=None):
        """Closed form of k decode-only iterations: per iteration only the batch size and KV read change.

        Evaluates exactly the float operations of time_from_sums, in its order, so fast-forward reproduces
        the step-by-step clock bit for bit."""
        if type(self).compute_time is not LinearCostModel.compute_time or \
                type(self).batch_time is not CostModel.batch_time:
            return super().decode_stretch_times(cached, k, last_step)
        cached = np.asarray(cached, dtype=np.int64)
        last = np.full(len(cached), k) if last_step is None else np.minimum(np.asarray(last_step), k)
        # n_j = #requests with last ≥ j, and Σ cached over them: suffix sums of per-last-step bins.
        n = np.bincount(last, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        csum = np.bincount(last, weights=cached, minlength=k + 1)[::-1].cumsum()[::-1][1:].astype(np.int64)
        kv_read = csum + n * np.arange(1, k + 1, dtype=np.int64)
        c = self._k
        nf = n.astype(float)
        base = c["a_o"] * nf + c["b_o"] + c["step_a"] * nf + c["step_b"] + self.overhead_s
        return base + (c["a_d"] * kv_read.astype(float) + c["s_d"] * nf + c["b_d"]) + self.cpu_times(n)

    # -- fitting ----------------------------------------------------------------------------------------
    @classmethod
    def fit_vidur(cls, mlp: "pd.DataFrame", attention: "pd.DataFrame", layers: int = 32, tp: int = 1,
                  stat: str = "median") -> "LinearCostModel":
        """Fit per-layer coefficients on Vidur-format profiles (times in ms per layer).

        Each term is fitted by non-negative least squares on relative error (rows scaled by 1/y), so the
        fit spends its accuracy where batch times are small as well as large."""
        m = mlp[mlp["num_tensor_parallel_workers"] == tp]
        if m.empty:
            raise UserError(f"profile mlp: no rows for num_tensor_parallel_workers={tp}")
        n = m["num_tokens"].to_numpy(float)
        other = sum(m[f"time_stats.{op}.{stat}"].to_numpy(float) for op in OTHER_OPS)
        a_o, b_o = _nnls_rel(np.c_[n, np.ones_like(n)], other)
        emb = m[f"time_stats.emb.{stat}"].to_numpy(float)
        step_a, step_b = _nnls_rel(np.c_[n, np.ones_like(n)], emb)

        a = attention
        pre = a[a["is_prefill"].astype(bool)]
        c = pre["prefill_chunk_size"].to_numpy(float)
        k = pre["kv_cache_size"].to_numpy(float)
        y = pre[f"time_stats.attn_prefill.{stat}"].to_numpy(float) + _reshape_ms(pre, stat)
        a_p, a_pk, a_pr, b_p = _nnls_rel(np.c_[c * c, c * k, k, np.ones_like(c)], y)

        dec = a[~a["is_prefill"].astype(bool)]
        b = dec["batch_size"].to_numpy(float)
        kv = dec["kv_cache_size"].to_numpy(float)
        y = dec[f"time_stats.attn_decode.{stat}"].to_numpy(float) + _reshape_ms(dec, stat)
        a_d, s_d, b_d = _nnls_rel(np.c_[b * (kv + 1), b, np.ones_like(b)], y)
        coeffs = dict(a_o=a_o, b_o=b_o, a_p=a_p, a_pk=a_pk, a_pr=a_pr, s_p=0.0, b_p=b_p,
                      a_d=a_d, s_d=s_d, b_d=b_d, step_a=step_a, step_b=step_b)
        return cls(coeffs, layers=layers, tp=tp)

    # -- persistence ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": "linear", "layers": self.layers, "units": "ms per layer (step_*: ms per iteration)",
                "coefficients": {k: float(f"{v:.6g}") for k, v in self.coefficients.items()},
                "provenance": self.provenance}

    def save(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path, **kw) -> "LinearCostModel":
        path = Path(path)
        if not path.exists():
            raise UserError(f"costmodel.path: {path} does not exist")
        d = read_yaml(path)
        if "coefficients" not in d:
            raise UserError(f"{path}: no 'coefficients' mapping; expected keys {', '.join(COEFFS)}")
        return cls(d["coefficients"], layers=kw.pop("layers", d.get("layers", 32)),
                   provenance=d.get("provenance"), **kw)


def _reshape_ms(df, stat):
    total = 0.0
    for op in ("attn_input_reshape", "attn_output_reshape"):
        col = f"time_stats.{op}.{stat}"
        if col in df:
            total = total + df[col].fillna(0.0).to_numpy(float)
    return total


def _nnls_rel(X, y):
    from scipy.optimize import nnls
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(X * w[:, None], y * w)
    return [float(v) for v in coef]


def default_profile_path(gpu_name: str, model_name: str, kind: str = "linear") -> Path:
    return PROFILES_DIR / gpu_name / f"{model_name}-{kind}.yaml"


def resolve_profile_path(path) -> Path:
    """A fitted-model path from a scenario: as given (relative to the cwd) if it exists, else relative to
    the repository (so `profiles/a100-80gb/...` works from anywhere). Kept here so costmodels needs no sim."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    q = PROFILES_DIR.parent / p
    return q if q.exists() else p


@register_costmodel("linear")
def _build_linear(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel") -> LinearCostModel:
    allowed = {"path", "coefficients", "features", "overhead_s", "kv_dtype", "overheads"}
    bad = set(spec) - allowed
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for kind 'linear'; allowed: "
                        f"kind, {', '.join(sorted(allowed))}")
    kw = dict(features=spec.get("features", "extended"), overhead_s=spec.get("overhead_s", 0.0),
              model=model, gpu=gpu, tp=tp, overheads=spec.get("overheads"))
    layers = model.layers if model is not None else 32
    if spec.get("coefficients"):
        lm = LinearCostModel(spec["coefficients"], layers=layers, **kw)
        lm.source = "scenario (costmodel.coefficients)"
        return _with_kv_dtype(lm, spec.get("kv_dtype"))
    path = spec.get("path") or default_profile_path(gpu.name if gpu else "a100-80gb",
                                                    model.name if model else "llama-2-7b")
    if not Path(path).exists():
        raise UserError(f"{where}.path: no fitted linear profile at {path}; fit one with `servesim calibrate` "
                        f"or give costmodel.coefficients")
    lm = LinearCostModel.load(path, layers=layers, **kw)
    from costmodels.base import shown_path
    lm.source = shown_path(path)
    return _with_kv_dtype(lm, spec.get("kv_dtype"))


def _with_kv_dtype(lm: LinearCostModel, kv_dtype):
    """Swap and dequantization terms move KV of this dtype (e.g. int8 halves swap traffic)."""
    if kv_dtype and lm.model is not None:
        lm.kv_dtype = kv_dtype
        lm.kv_bytes_per_token = lm.model.kv_bytes_per_token(kv_dtype, lm.tp)
    return lm


def fit_default(vidur_dir, out_path=None) -> LinearCostModel:
    """Fit the shipped A100-80GB Llama-2-7B coefficients from the public Vidur profiles."""
    import pandas as pd
    vidur_dir = Path(vidur_dir)
    mlp = pd.read_csv(vidur_dir / "mlp.csv")
    att = pd.read_csv(vidur_dir / "attention_sample.csv")
    lm = LinearCostModel.fit_vidur(mlp, att, layers=32)
    lm.provenance = {
        "source": "microsoft/vidur profiling data, A100 Llama-2-7B (MIT): mlp.csv, attention_sample.csv",
        "fitted_by": "costmodels.linear.fit_default (NNLS on relative error, median kernel times, TP=1)",
        "date": _dt.date.today().isoformat(),
    }
    if out_path:
        lm.save(out_path)
    return lm


if __name__ == "__main__":  # python -m costmodels.linear ../shared/data/profiles/vidur-a100-llama-2-7b
    import sys
    m = fit_default(sys.argv[1], default_profile_path("a100-80gb", "llama-2-7b"))
    print(yaml.safe_dump(m.to_dict(), sort_keys=False))
