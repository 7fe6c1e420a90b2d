"""Arrival processes (offline, Poisson, Gamma, constant rate, on/off bursts) and time-scaling a trace to a rate."""
from __future__ import annotations

import numpy as np

from costmodels import values
from costmodels.errors import UserError


def _positive(spec, key, where, default=None) -> float:
    if key not in spec and default is None:
        raise UserError(f"{where}: missing {key!r}")
    v = spec.get(key, default)
    if key == "rate":                   # requests/s: no slower than one per MAX_GAP_S, or times lose precision
        return values.rate(v, f"{where}.{key}")
    if key.endswith("_s"):
        return values.seconds(v, f"{where}.{key}")
    if not values.is_number(v) or not v > 0:
        raise UserError(f"{where}.{key}: must be a number > 0, got {values.describe(v)}")
    return float(values.finite(v, f"{where}.{key}"))


def offline(n, rng, spec, where):
    """Everything at t = 0 (InferMax's offline snapshot; the rate → ∞ limit)."""
    return np.zeros(n)


def poisson(n, rng, spec, where):
    """Exponential gaps at `rate` requests/s; not clipped (Vidur's clipping adds ~5% load)."""
    return np.cumsum(rng.exponential(1.0 / _positive(spec, "rate", where), size=n))


def gamma(n, rng, spec, where):
    """Gamma gaps with mean 1/rate and coefficient of variation `cv` (shape 1/cv², as Apt-Serve); cv = 1 is Poisson."""
    rate, cv = _positive(spec, "rate", where), _positive(spec, "cv", where, 1.0)
    shape = 1.0 / cv ** 2
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))


def constant(n, rng, spec, where):
    """One request every 1/rate seconds, the first at t = 0."""
    return np.arange(n) / _positive(spec, "rate", where)


def onoff(n, rng, spec, where):
    """Bursts: Poisson at `rate` for `on_s` seconds, then `off_rate` (default 0) for `off_s` seconds, repeating.

    Drawn by thinning a Poisson process at the peak rate, so any off_rate ≤ rate is exact."""
    on_rate = _positive(spec, "rate", where)
    on_s, off_s = _positive(spec, "on_s", where), _positive(spec, "off_s", where)
    off_rate = float(values.finite(spec.get("off_rate", 0.0), f"{where}.off_rate", "a rate in requests/s"))
    if not 0 <= off_rate <= on_rate:
        raise UserError(f"{where}.off_rate: must be between 0 and rate={on_rate}, got {off_rate}")
    period = on_s + off_s
    out, t = [], 0.0
    while sum(len(c) for c in out) < n:
        m = max(64, 2 * (n - sum(len(c) for c in out)))
        cand = t + np.cumsum(rng.exponential(1.0 / on_rate, size=m))
        t = cand[-1]
        in_on = (cand % period) < on_s
        accept = rng.random(m) < np.where(in_on, 1.0, off_rate / on_rate)
        out.append(cand[accept])
    return np.concatenate(out)[:n]


PROCESSES = {"offline": (offline, ()), "poisson": (poisson, ("rate",)), "gamma": (gamma, ("rate", "cv")),
             "constant": (constant, ("rate",)), "onoff": (onoff, ("rate", "on_s", "off_s", "off_rate"))}


def draw_arrivals(spec: dict, n: int, rng: np.random.Generator, where: str) -> np.ndarray:
    """`spec` = {process: NAME, ...its knobs}."""
    spec = dict(spec or {})
    name = spec.pop("process", "poisson")
    if name not in PROCESSES:
        raise UserError(f"{where}.process: unknown arrival process {name!r}; allowed: {', '.join(PROCESSES)}")
    fn, keys = PROCESSES[name]
    bad = set(spec) - set(keys)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for process {name}; "
                        f"allowed: process{', ' if keys else ''}{', '.join(keys)}")
    return fn(n, rng, spec, where)


def mean_rate(arrivals: np.ndarray) -> float:
    """Requests per second over the span first → last arrival (n / span, as the Azure profile quotes it)."""
    span = float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0
    return len(arrivals) / span if span > 0 else float("inf")


def scale_to_rate(arrivals: np.ndarray, target_rate: float, where: str = "rate") -> np.ndarray:
    """Stretch or compress time so the mean rate becomes `target_rate`; gap ratios (the burst shape, CV) are kept."""
    target_rate = values.rate(target_rate, where)
    current = mean_rate(arrivals)
    if not np.isfinite(current):
        raise UserError(f"{where}: cannot time-scale a trace whose requests all arrive at once")
    t0 = arrivals[0]
    return t0 + (arrivals - t0) * (current / target_rate)


def interarrival_cv(arrivals: np.ndarray) -> float:
    gaps = np.diff(np.sort(arrivals))
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")
