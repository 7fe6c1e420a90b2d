"""Effective throughput: the highest request rate whose SLO attainment still meets a target (bisection)."""
from __future__ import annotations

from sim.config import load_scenario, scenario_from_dict
from sim.runner import run_scenario


def attainment_at(scn_or_path, rate: float, overrides=(), rate_key: str = "workload.rate") -> float:
    """SLO attainment of one run of the scenario at `rate` (same seed, so runs differ only by rate)."""
    ov = list(overrides) + [f"{rate_key}={rate}"]
    scn = load_scenario(scn_or_path, ov) if not isinstance(scn_or_path, dict) else scenario_from_dict(scn_or_path, ov)
    return run_scenario(scn).summary["slo_attainment"]


def effective_throughput(scn_or_path, target: float, overrides=(), lo: float = 0.25, hi: float = 64.0,
                         rel_tol: float = 0.04, cache: dict | None = None) -> float:
    """Largest rate r (within rel_tol) with attainment(r) >= target, assuming attainment falls with rate.

    Doubles from `lo` until a rate fails, then bisects. Returns 0 if even `lo` fails. `cache` (rate →
    attainment) lets one search reuse the runs of another (e.g. the 90% and 60% searches of one policy)."""
    cache = {} if cache is None else cache

    def att(r):
        r = round(r, 4)
        if r not in cache:
            cache[r] = attainment_at(scn_or_path, r, overrides)
        return cache[r]

    if att(lo) < target:
        return 0.0
    good, bad = lo, None
    r = lo
    while r < hi:
        r *= 2
        if att(r) >= target:
            good = r
        else:
            bad = r
            break
    if bad is None:
        return good
    while (bad - good) / good > rel_tol:
        mid = (good * bad) ** 0.5
        if att(mid) >= target:
            good = mid
        else:
            bad = mid
    return good
