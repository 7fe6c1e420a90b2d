"""Output-length predictors with controlled error (oracle, log-normal, relative, bucket) and their error reports.

The papers' predictors (EconoServe: fine-tuned OPT-13B; ALISE: BERT retrieval + MLP) are replaced by error
models calibrated to the error figures each paper reports, so a run's predictor error is known and sweepable."""
from __future__ import annotations

import math

import numpy as np

from costmodels.errors import UserError

# EconoServe Fig 5a at the sweetspot padding (spec econoserve §2.2): over-/under-provisioned KVC as a share of
# the allocated KVC, per request. (mu, sigma) of log(pred/true) solved so the padded allocation reproduces
# both numbers (see calibrate_lognormal; tests re-derive them).
ECONOSERVE_TARGETS = {          # dataset: (padding, over, under)
    "alpaca": (0.10, 0.0262, 0.0930),
    "sharegpt": (0.15, 0.0562, 0.1342),
    "bookcorpus": (0.20, 0.0512, 0.2192),
}
# ALISE §3.1: mean relative prediction error 3.4 % (Alpaca), 9.2 % (ShareGPT); proxy predictors 1.4×/1.6× worse.
ALISE_MAE = {"alpaca": 0.034, "sharegpt": 0.092, "alpaca-proxy": 0.048, "sharegpt-proxy": 0.148}

KINDS = ("oracle", "lognormal", "relative", "bucket")

_Z, _W = np.polynomial.hermite_e.hermegauss(80)      # Gauss–Hermite nodes for E[f(Z)], Z ~ N(0, 1)
_W = _W / _W.sum()


def provisioning_expectation(mu: float, sigma: float, padding: float) -> tuple[float, float]:
    """(E[over], E[under]) of a padded allocation x = (1+padding)·exp(N(mu, sigma²)) relative to truth = 1:
    over = max(0, x−1)/x, under = max(0, 1−x)/x (both as a share of the allocation, as EconoServe defines)."""
    x = (1.0 + padding) * np.exp(mu + sigma * _Z)
    return float(_W @ (np.maximum(0, x - 1) / x)), float(_W @ (np.maximum(0, 1 - x) / x))


def calibrate_lognormal(padding: float, over: float, under: float) -> tuple[float, float]:
    """Solve (mu, sigma) so the padded allocation's expected over/under provisioning hit the targets."""
    from scipy.optimize import least_squares
    f = lambda p: np.array(provisioning_expectation(p[0], abs(p[1]), padding)) - (over, under)  # noqa: E731
    sol = least_squares(f, x0=[-0.1, 0.3], xtol=1e-12, ftol=1e-12)
    return float(sol.x[0]), float(abs(sol.x[1]))


def predict_lengths(true_lengths, spec: dict | None, rng: np.random.Generator, where: str = "predictor"):
    """Predicted output lengths (ints ≥ 1) for `true_lengths` under the error model `spec`.

    kinds: oracle; lognormal {mu, sigma} or {dataset: alpaca|sharegpt|bookcorpus} (EconoServe calibration);
    relative {mae} or {dataset} (ALISE: pred = true·(1+ε), ε ~ N(0, σ²), σ = mae·√(π/2));
    bucket {width, accuracy}: the true bin with probability `accuracy`, else a neighbouring bin, at its midpoint."""
    spec = dict(spec or {"kind": "oracle"})
    kind = spec.pop("kind", "oracle")
    true = np.asarray(true_lengths, dtype=float)
    if kind == "oracle":
        out = true
    elif kind == "lognormal":
        if "dataset" in spec:
            ds = spec.pop("dataset")
            if ds not in ECONOSERVE_TARGETS:
                raise UserError(f"{where}.dataset: {ds!r} is not allowed; allowed: {', '.join(ECONOSERVE_TARGETS)}")
            mu, sigma = calibrate_lognormal(*ECONOSERVE_TARGETS[ds])
        else:
            mu, sigma = float(spec.pop("mu", 0.0)), float(spec.pop("sigma", 0.3))
        out = true * np.exp(rng.normal(mu, sigma, size=len(true)))
    elif kind == "relative":
        if "dataset" in spec:
            ds = spec.pop("dataset")
            if ds not in ALISE_MAE:
                raise UserError(f"{where}.dataset: {ds!r} is not allowed; allowed: {', '.join(ALISE_MAE)}")
            mae = ALISE_MAE[ds]
        else:
            mae = float(spec.pop("mae", 0.092))
        bias = float(spec.pop("bias", 0.0))
        out = true * (1.0 + bias + rng.normal(0.0, mae * math.sqrt(math.pi / 2), size=len(true)))
    elif kind == "bucket":
        width, acc = int(spec.pop("width", 50)), float(spec.pop("accuracy", 0.8))
        b = np.floor((true - 1) / width)
        miss = rng.random(len(true)) >= acc
        b = np.maximum(0, b + miss * rng.choice([-1, 1], size=len(true)))
        out = b * width + width / 2.0
    else:
        raise UserError(f"{where}.kind: {kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    if spec:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(spec))} for predictor kind {kind!r}")
    return np.maximum(1, np.rint(out)).astype(np.int64)


def provisioning_report(true_lengths, allocated_lengths) -> dict:
    """EconoServe's Fig 5a / Fig 4c metrics for allocations vs true lengths (per-request means)."""
    t = np.asarray(true_lengths, float)
    a = np.maximum(np.asarray(allocated_lengths, float), 1.0)
    return {"over_provision_pct": float(np.mean(np.maximum(0, a - t) / a) * 100),
            "under_provision_pct": float(np.mean(np.maximum(0, t - a) / a) * 100),
            "under_provisioned_requests_pct": float(np.mean(a < t) * 100)}


def error_report(true_lengths, predicted) -> dict:
    """ALISE's predictor metrics: mean relative absolute error and signed bias."""
    t = np.asarray(true_lengths, float)
    p = np.asarray(predicted, float)
    rel = (p - t) / t
    return {"mean_rel_abs_error": float(np.mean(np.abs(rel))), "mean_rel_bias": float(np.mean(rel))}
