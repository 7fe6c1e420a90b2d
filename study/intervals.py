"""Confidence on decision numbers: mean and a 95 % interval by bootstrap over seeds (and, for SLO attainment,
over each seed's requests), and how many seeds an interval of a wanted half-width needs.

Attainment is a share of requests, so resampling a seed's n requests with replacement draws its met count from
Binomial(n, met/n): the two-stage bootstrap draws seeds with replacement, then each drawn seed's met count, and
pools. Percentile intervals; the generator is seeded, so the same inputs give the same interval every time."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.errors import UserError

LEVEL = 0.95
REPS = 4000
RNG_SEED = 20240601


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval; `n` the seeds it rests on."""
    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return 0.5 * (self.hi - self.lo)

    def text(self, digits: int = 3) -> str:
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def _percentiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    a = (1.0 - level) / 2.0
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1.0 - a))


def mean_interval(values, level: float = LEVEL, reps: int = REPS, seed: int = RNG_SEED) -> Interval:
    """Mean over seeds and its bootstrap interval (resampling the seeds' values with replacement)."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if not len(v):
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if len(v) == 1:
        return Interval(float(v[0]), float(v[0]), float(v[0]), 1)
    rng = np.random.default_rng(seed)
    draws = v[rng.integers(0, len(v), size=(reps, len(v)))].mean(axis=1)
    lo, hi = _percentiles(draws, level)
    return Interval(float(v.mean()), lo, hi, len(v))


def attainment_interval(counts, level: float = LEVEL, reps: int = REPS, seed: int = RNG_SEED) -> Interval:
    """Pooled attainment of [(met, n) per seed] and its two-stage bootstrap interval (seeds, then requests)."""
    c = np.asarray([(m, n) for m, n in counts if n > 0], dtype=float).reshape(-1, 2)
    if not len(c):
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    met, n = c[:, 0], c[:, 1]
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(c), size=(reps, len(c))) if len(c) > 1 else np.zeros((reps, 1), dtype=int)
    drawn = rng.binomial(n[pick].astype(np.int64), met[pick] / n[pick])
    draws = drawn.sum(axis=1) / n[pick].sum(axis=1)
    lo, hi = _percentiles(draws, level)
    return Interval(float(met.sum() / n.sum()), lo, hi, len(c))


def seeds_needed(iv: Interval, half_width: float) -> int:
    """Seeds for an interval of `half_width`, from this one's (the half-width falls as 1/sqrt(seeds))."""
    if iv.n < 1 or not iv.half_width == iv.half_width:
        return 0
    if iv.half_width <= half_width:
        return iv.n
    return int(math.ceil(iv.n * (iv.half_width / half_width) ** 2))


def parse_seeds(values, flag: str = "--seeds") -> list:
    """Seeds from the command line: integers >= 0, comma-separated, one or several flags; a range A-B too."""
    out = []
    for v in values if isinstance(values, (list, tuple)) else [values]:
        for x in str(v).split(","):
            x = x.strip()
            if not x:
                raise UserError(f"{flag}: an empty item in {str(v)!r}")
            lo, sep, hi = x.partition("-")
            try:
                seeds = range(int(lo), int(hi) + 1) if sep and lo else [int(x)]
            except ValueError:
                raise UserError(f"{flag}: expected integers >= 0 separated by commas (or a range such as 0-4), "
                                f"got {x!r}") from None
            if not seeds:                        # 3-1: an empty range would leave no seed, far from the flag
                raise UserError(f"{flag}: the range {x!r} is empty; give its low end first (such as {hi}-{lo})")
            for s in seeds:
                if s < 0:
                    raise UserError(f"{flag}: seeds must be >= 0, got {s}")
                out.append(s)
    if len(set(out)) != len(out):
        raise UserError(f"{flag}: a seed is given twice ({', '.join(map(str, out))})")
    return out


def over_seeds(table, group_by: list, metrics: list):
    """A results table with a seed column, folded over the seeds: per group, each metric's mean and 95 % interval
    (bootstrap over seeds; SLO attainment over seeds and requests, its met count taken as attainment × requests,
    exact when every request has a target) and the seeds a ±0.01 attainment interval would need."""
    import pandas as pd
    ok = table[table["status"] == "ok"] if "status" in table else table
    # seeds whose rows came out identical (a trace replay behind a deterministic router) are one draw, not several
    shown = [m for m in metrics if m in ok]
    ok = ok.drop_duplicates(subset=[c for c in group_by + shown + ["requests"] if c in ok])
    rows = []
    groups = ok.groupby(group_by, sort=False, dropna=False) if group_by else [((), ok)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(group_by, key))
        row["seeds"] = int(g["seed"].nunique())           # distinct runs (identical seeds folded)
        for m in metrics:
            if m not in g:
                continue
            vals = pd.to_numeric(g[m], errors="coerce")
            if m.startswith("slo_attainment") and "requests" in g:
                n = pd.to_numeric(g["requests"], errors="coerce")
                iv = attainment_interval([(round(a * k), k) for a, k in zip(vals, n) if a == a and k == k])
                row["seeds_for_0.01"] = seeds_needed(iv, 0.01)
            else:
                iv = mean_interval(vals)
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = iv.mean, iv.lo, iv.hi
        rows.append(row)
    return pd.DataFrame(rows)
