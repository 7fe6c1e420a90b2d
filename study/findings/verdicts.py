"""The rules every seed-paper claim is judged by (issue #28): one definition of capacity (a rate is sustained only
if the system serves what is offered *and* meets the paper's latency rule), effects over several seeds with a 95%
confidence interval, and the stamp that ties a report row to the source files it was computed from."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.errors import UserError
from sim.paths import REPO_ROOT

SERVED_MIN = 0.95        # a rate is sustained only if ≥ 95% of the offered load completes in steady state
STEADY = (0.1, 0.9)      # the steady-state window: between these quantiles of the arrival times
TIE = 0.02               # an effect smaller than this (relative) is a tie, whatever the seeds say
SEEDS = (0, 1, 2)        # every seed-paper claim runs on these (more where cheap)


# ---- capacity ------------------------------------------------------------------------------------------------
def served_ratio(arrival_s, completion_s) -> float:
    """Steady-state served fraction of the offered load: requests completed inside the window between the 10% and
    90% arrival quantiles over requests that arrived inside it. A system that keeps up completes about as many as
    arrive (≈ 1); one that falls behind completes its service rate / the offered rate. Unfinished requests have
    completion NaN (or inf)."""
    a = np.asarray(arrival_s, float)
    c = np.asarray(completion_s, float)
    if a.size < 10:
        raise UserError(f"served_ratio: need at least 10 requests for a steady-state window, got {a.size}")
    t0, t1 = np.quantile(a, STEADY[0]), np.quantile(a, STEADY[1])
    arrived = int(np.sum((a >= t0) & (a <= t1)))
    done = int(np.sum((c >= t0) & (c <= t1)))
    return done / arrived if arrived else float("nan")


def sustained(served: float, latency_ok: bool = True) -> bool:
    """The one capacity rule: served ≥ 95% of the offered load in steady state, and the paper's latency rule."""
    return bool(latency_ok) and served == served and served >= SERVED_MIN


def sustainable_rate(rates, latencies, threshold, served=None) -> float:
    """Largest rate that is sustained: normalized latency ≤ threshold *and* served ratio ≥ SERVED_MIN (one rule,
    capacity.sustained). Between the last sustained rate and the first that is not, the crossing is interpolated
    linearly on whichever criteria fail there (the earliest crossing wins)."""
    served = [1.0] * len(rates) if served is None else list(served)
    if not (len(rates) == len(latencies) == len(served)):
        raise UserError("sustainable_rate: rates, latencies and served ratios must have the same length")
    best = 0.0
    for i, (r, lat, sv) in enumerate(zip(rates, latencies, served)):
        if sustained(sv, lat <= threshold):
            best = r
            continue
        if i > 0:
            r0, l0, s0 = rates[i - 1], latencies[i - 1], served[i - 1]
            cross = [r]
            if lat > threshold:
                cross.append(r0 + (r - r0) * (threshold - l0) / (lat - l0))
            if not sv >= SERVED_MIN and s0 > sv:
                cross.append(r0 + (r - r0) * (s0 - SERVED_MIN) / (s0 - sv))
            best = max(r0, min(cross))
        break
    return best


# ---- seeds and confidence ------------------------------------------------------------------------------------
HOLDS, OPPOSITE, UNTESTABLE = "holds", "opposite", "untestable"

# two-sided 95% Student t quantiles by degrees of freedom (no scipy at run time)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    if df < 1:
        return math.inf
    keys = sorted(_T975)
    for k in keys:
        if df <= k:
            return _T975[k]
    return 1.96


@dataclass(frozen=True)
class SeedEffect:
    """An effect measured on several seeds: mean, 95% CI (Student t) and what it says about a claimed direction."""
    values: tuple
    mean: float
    lo: float
    hi: float
    verdict: str           # holds | opposite | untestable
    reason: str = ""       # why untestable (tie, CI spans zero, saturated, too few seeds)

    @property
    def n(self) -> int:
        return len(self.values)

    def text(self, fmt: str = "{:+.3g}", unit: str = "") -> str:
        f = lambda v: fmt.format(v) + unit      # noqa: E731
        return f"{f(self.mean)} [95% CI {f(self.lo)}, {f(self.hi)}; {self.n} seeds]"


def seed_effect(values, tie: float = TIE, saturated: str = "") -> SeedEffect:
    """Judge a claimed *positive* effect (sign the values so that the paper's direction is > 0) from per-seed
    values. `tie` is the smallest effect that counts (same units as the values: a relative effect uses TIE).
    The direction holds only if the whole 95% CI lies above zero and the mean exceeds the tie threshold; it is
    opposite if the whole CI lies below zero and the mean is below -tie; anything else is untestable here."""
    v = np.asarray([x for x in values if x == x], float)
    if v.size == 0:
        return SeedEffect(tuple(), float("nan"), float("nan"), float("nan"), UNTESTABLE, "no values")
    m = float(v.mean())
    if v.size < 2:
        return SeedEffect(tuple(v.tolist()), m, -math.inf, math.inf, UNTESTABLE, "one seed: no confidence interval")
    half = t975(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    lo, hi = m - half, m + half
    vals = tuple(float(x) for x in v)
    if saturated:
        return SeedEffect(vals, m, lo, hi, UNTESTABLE, saturated)
    if lo > 0 and m > tie:
        return SeedEffect(vals, m, lo, hi, HOLDS)
    if hi < 0 and m < -tie:
        return SeedEffect(vals, m, lo, hi, OPPOSITE)
    if abs(m) <= tie:
        why = f"a tie: mean effect {m:+.3g} within ±{tie:g}"
    else:
        why = f"the 95% CI [{lo:+.3g}, {hi:+.3g}] spans zero"
    return SeedEffect(vals, m, lo, hi, UNTESTABLE, why)


def combine(effects) -> tuple:
    """Several effects that must all hold for one claim: (direction, untestable reason). The direction holds when
    every effect holds; it fails when any is opposite; otherwise the claim is untestable, with the first reason."""
    effects = list(effects)
    if any(e.verdict == OPPOSITE for e in effects):
        return False, ""
    if all(e.verdict == HOLDS for e in effects):
        return True, ""
    return True, next(e.reason for e in effects if e.verdict == UNTESTABLE)


# ---- claim helpers -------------------------------------------------------------------------------------------
def fmt_effect(e: SeedEffect, kind: str = "ratio") -> str:
    """'1.74x [1.6, 1.9]' for a ratio effect (values are ratio − 1), '+3.1 pp [..]' for points, else relative."""
    if kind == "ratio":
        return f"{1 + e.mean:.2f}x [95% CI {1 + e.lo:.2f}, {1 + e.hi:.2f}]"
    if kind == "pp":
        return f"{e.mean:+.1f} pp [95% CI {e.lo:+.1f}, {e.hi:+.1f}]"
    return f"{100 * e.mean:+.1f}% [95% CI {100 * e.lo:+.1f}, {100 * e.hi:+.1f}]"


def ratio_outcome(paper: str, ratios: dict, paper_vals: dict | None = None, note: str = "", unit: str = "x",
                  saturated: str = ""):
    """Outcome of a claim 'ours > baseline' stated as ratios per seed (name → [ratio per seed]): direction holds
    for every name by the CI rule; magnitude compares each mean ratio with the paper's (registry.within_ratio)."""
    from study.findings.registry import Outcome, within_ratio
    eff = {k: seed_effect([r - 1 for r in v], saturated=saturated) for k, v in ratios.items()}
    direction, why = combine(eff.values())
    mag = None if paper_vals is None else all(within_ratio(1 + eff[k].mean, p) for k, p in paper_vals.items())
    n = max(e.n for e in eff.values())
    ours = "; ".join(f"{k}: {fmt_effect(e)}" for k, e in eff.items()) + f" ({n} seeds)"
    return Outcome(paper, ours, direction, mag, note, untestable=why)
