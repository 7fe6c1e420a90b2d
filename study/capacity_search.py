"""Effective throughput of a scenario file: the capacity search of study.capacity, with runs shared between targets."""
from __future__ import annotations

from study.capacity import search_capacity
from sim.scenario.config import load_scenario, scenario_from_dict
from sim.cluster.runner import run_scenario


def attainment_at(scn_or_path, rate: float, overrides=(), rate_key: str = "workload.rate") -> float:
    """SLO attainment of one run of the scenario at `rate` (same seed, so runs differ only by rate)."""
    ov = list(overrides) + [f"{rate_key}={rate}"]
    scn = load_scenario(scn_or_path, ov) if not isinstance(scn_or_path, dict) else scenario_from_dict(scn_or_path, ov)
    return run_scenario(scn).summary["slo_attainment"]


def effective_throughput(scn_or_path, target: float, overrides=(), lo: float = 0.25, hi: float = 64.0,
                         rel_tol: float = 0.04, cache: dict | None = None) -> float:
    """Highest rate (within rel_tol) whose attainment meets `target`; 0 if even `lo` misses it.

    `cache` (rate → attainment) lets the 90% and 60% searches of one policy reuse each other's runs."""
    cache = {} if cache is None else cache

    def evaluate(rate):
        key = round(rate, 6)
        if key not in cache:
            cache[key] = attainment_at(scn_or_path, rate, overrides)
        return cache[key]

    return search_capacity(evaluate, target, lo, rate_min=lo, rate_max=hi, rel_tol=rel_tol).capacity_rps
