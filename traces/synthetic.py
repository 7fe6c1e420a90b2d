"""Synthetic workloads: offline batches (all at t=0) and Poisson arrivals, with fixed or uniform lengths."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from traces.registry import register_workload


def draw_lengths(spec, n: int, rng: np.random.Generator, where: str) -> np.ndarray:
    """A length spec is an int (fixed) or {dist: fixed|uniform, ...}."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return np.full(n, int(spec), dtype=np.int64)
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected an integer or a mapping with 'dist', got {spec!r}")
    dist = spec.get("dist", "fixed")
    if dist == "fixed":
        return np.full(n, int(_need(spec, "value", where)), dtype=np.int64)
    if dist == "uniform":
        lo, hi = int(_need(spec, "low", where)), int(_need(spec, "high", where))
        if lo > hi:
            raise UserError(f"{where}: uniform low={lo} > high={hi}")
        return rng.integers(lo, hi + 1, size=n)
    raise UserError(f"{where}.dist: unknown length distribution {dist!r}; allowed: fixed, uniform")


def _need(spec, key, where):
    if key not in spec:
        raise UserError(f"{where}: missing {key!r}")
    return spec[key]


def _check_keys(spec, allowed, where):
    bad = set(spec) - set(allowed)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: kind, {', '.join(allowed)}")


@register_workload("offline")
def offline(spec, rng, where):
    """All requests at t = 0 (InferMax's offline snapshot)."""
    _check_keys(spec, ("num_requests", "prompt", "output"), where)
    n = int(spec.get("num_requests", 1024))
    return pd.DataFrame({"arrival_s": np.zeros(n),
                         "prompt_tokens": draw_lengths(spec.get("prompt", 128), n, rng, f"{where}.prompt"),
                         "output_tokens": draw_lengths(spec.get("output", 128), n, rng, f"{where}.output")})


@register_workload("poisson")
def poisson(spec, rng, where):
    """Poisson arrivals at `rate` requests/s (exponential gaps, not clipped)."""
    _check_keys(spec, ("num_requests", "rate", "prompt", "output"), where)
    n = int(spec.get("num_requests", 1000))
    rate = float(_need(spec, "rate", where))
    if rate <= 0:
        raise UserError(f"{where}.rate: must be > 0 requests/s, got {rate}")
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return pd.DataFrame({"arrival_s": arrivals,
                         "prompt_tokens": draw_lengths(spec.get("prompt", 128), n, rng, f"{where}.prompt"),
                         "output_tokens": draw_lengths(spec.get("output", 128), n, rng, f"{where}.output")})
