"""Workloads for the Apt-Serve and BROS studies: ShareGPT-like lognormal lengths, Gamma arrivals, RT/BE mixes."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from traces.registry import register_workload

# Lognormal (mu, sigma) of token counts matching ShareGPT's moments as vLLM's benchmark samples it
# (BROS Table 2: prompt 222.8 ± 256.4, output 234.5 ± 268.5); spec bros.md §9 gives these fits.
SHAREGPT_PROMPT = (4.9844, 0.9184)
SHAREGPT_OUTPUT = (5.0387, 0.9152)


def _check_keys(spec, allowed, where):
    bad = set(spec) - set(allowed)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: kind, {', '.join(allowed)}")


def _positive(spec, key, default, where):
    v = spec.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise UserError(f"{where}.{key}: must be a positive number, got {v!r}")
    return v


def gamma_arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times with Gamma gaps of mean 1/rate and coefficient of variation cv (cv = 1 is Poisson)."""
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))


def sharegpt_like_lengths(n: int, rng: np.random.Generator, *, prompt=SHAREGPT_PROMPT, output=SHAREGPT_OUTPUT,
                          min_tokens: int = 4, max_total: int = 2048):
    """(prompt, output) pairs from independent lognormals, redrawn until each lies in Apt-Serve's filter
    (both >= min_tokens, prompt + output <= max_total) — a truncated distribution, no row silently dropped."""
    p = np.empty(n, dtype=np.int64)
    o = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while len(todo):
        pp = np.rint(rng.lognormal(prompt[0], prompt[1], size=len(todo))).astype(np.int64)
        oo = np.rint(rng.lognormal(output[0], output[1], size=len(todo))).astype(np.int64)
        ok = (pp >= min_tokens) & (oo >= min_tokens) & (pp + oo <= max_total)
        p[todo[ok]], o[todo[ok]] = pp[ok], oo[ok]
        todo = todo[~ok]
    return p, o


@register_workload("aptserve-sharegpt")
def aptserve_sharegpt(spec, rng, where):
    """ShareGPT-like chat requests with Gamma(rate, cv) arrivals (Apt-Serve §6: Poisson main runs, CV sweep)."""
    _check_keys(spec, ("num_requests", "rate", "cv", "max_total"), where)
    n = int(_positive(spec, "num_requests", 500, where))
    rate = float(_positive(spec, "rate", 2.0, where))
    cv = float(_positive(spec, "cv", 1.0, where))
    p, o = sharegpt_like_lengths(n, rng, max_total=int(_positive(spec, "max_total", 2048, where)))
    return pd.DataFrame({"arrival_s": gamma_arrivals(n, rate, cv, rng), "prompt_tokens": p, "output_tokens": o})


@register_workload("bros-mix")
def bros_mix(spec, rng, where):
    """Real-time ShareGPT-like Poisson stream plus best-effort FlexGen-style batches (BROS §7.1).

    BE batches of `be_batch` requests (prompt U(512,1024), output U(32,128)) arrive every `be_period_s`
    while the RT stream lasts. The paper submits the next BE batch when the previous one completes (closed
    loop); a static table cannot react, so a fixed period sets the offered BE load instead."""
    _check_keys(spec, ("rt_requests", "rt_rate", "be_batch", "be_period_s", "max_total"), where)
    n = int(_positive(spec, "rt_requests", 300, where))
    rate = float(_positive(spec, "rt_rate", 2.0, where))
    be_batch = int(_positive(spec, "be_batch", 32, where))
    period = float(_positive(spec, "be_period_s", 20.0, where))
    p, o = sharegpt_like_lengths(n, rng, max_total=int(_positive(spec, "max_total", 2048, where)))
    rt_arr = gamma_arrivals(n, rate, 1.0, rng)
    n_batches = max(1, int(np.ceil(rt_arr[-1] / period)))
    nb = n_batches * be_batch
    be = pd.DataFrame({"arrival_s": np.repeat(np.arange(n_batches) * period, be_batch),
                       "prompt_tokens": rng.integers(512, 1025, size=nb),
                       "output_tokens": rng.integers(32, 129, size=nb), "cls": "be"})
    rt = pd.DataFrame({"arrival_s": rt_arr, "prompt_tokens": p, "output_tokens": o, "cls": "rt"})
    return pd.concat([rt, be], ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
