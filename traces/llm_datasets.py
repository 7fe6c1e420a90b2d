"""ShareGPT-, Alpaca- and BookCorpus-like workloads (EconoServe Table 2 length statistics) with predicted lengths.

Lengths are clipped log-normals whose clipped mean matches the table's mean; arrivals are Poisson (both papers).
Kinds 'econoserve-<dataset>' attach the EconoServe-calibrated predictor by default, 'alise-<dataset>' the ALISE
one; any kind accepts an explicit `predictor:` mapping (see policies.predictors.predict_lengths)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from policies.predictors import predict_lengths
from traces.registry import register_workload

# (mean, min, max) per dataset, EconoServe Table 2 (tokens).
DATASETS = {
    "sharegpt": {"prompt": (161.31, 16, 3200), "output": (337.99, 19, 991)},
    "alpaca": {"prompt": (19.31, 9, 2470), "output": (58.41, 13, 292)},
    "bookcorpus": {"prompt": (1952.11, 18, 2048), "output": (681.2, 32, 1041)},   # prompts chunked to 2048
}
SIGMA = 0.9                       # spread of log-length; the table gives no variance
_Q = np.random.default_rng(12345).standard_normal(20000)   # fixed sample to solve the clipped mean, not drawn per run


def _mu_for_mean(mean, lo, hi, sigma):
    """Bisection on mu so E[clip(exp(mu + sigma Z), lo, hi)] = mean."""
    a, b = np.log(lo) - 3 * sigma, np.log(hi)
    for _ in range(60):
        m = 0.5 * (a + b)
        if np.clip(np.exp(m + sigma * _Q), lo, hi).mean() < mean:
            a = m
        else:
            b = m
    return 0.5 * (a + b)


def draw_dataset_lengths(dataset: str, n: int, rng: np.random.Generator, max_total: int | None = None):
    prompt_stats, out_stats = DATASETS[dataset]["prompt"], DATASETS[dataset]["output"]
    out = []
    for mean, lo, hi in (prompt_stats, out_stats):
        mu = _mu_for_mean(mean, lo, hi, SIGMA)
        out.append(np.clip(np.rint(np.exp(rng.normal(mu, SIGMA, n))), lo, hi).astype(np.int64))
    p, o = out
    if max_total:                                     # keep prompt + output within the model's context
        p = np.minimum(p, np.maximum(1, max_total - o))
    return p, o


_DEFAULT_PREDICTOR = {"econoserve": lambda ds: {"kind": "lognormal", "dataset": ds},
                      "alise": lambda ds: {"kind": "relative", "dataset": ds if ds != "bookcorpus" else "sharegpt"}}
_KEYS = ("num_requests", "rate", "predictor", "max_total_tokens")


def _builder(paper, dataset):
    def build(spec, rng, where):
        bad = set(spec) - set(_KEYS)
        if bad:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: kind, {', '.join(_KEYS)}")
        n = int(spec.get("num_requests", 1000))
        rate = float(spec.get("rate", 1.0))
        if rate <= 0 or n <= 0:
            raise UserError(f"{where}: rate and num_requests must be > 0 (got rate={rate}, num_requests={n})")
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        p, o = draw_dataset_lengths(dataset, n, rng, spec.get("max_total_tokens", 4096))
        pred_spec = spec.get("predictor") or _DEFAULT_PREDICTOR[paper](dataset)
        pred = predict_lengths(o, pred_spec, rng, f"{where}.predictor")
        return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": p, "output_tokens": o,
                             "predicted_output_tokens": pred})
    build.__doc__ = f"{dataset}-like lengths, Poisson arrivals, {paper}'s predictor error by default."
    return build


for _paper in ("econoserve", "alise"):
    for _ds in DATASETS:
        register_workload(f"{_paper}-{_ds}")(_builder(_paper, _ds))
