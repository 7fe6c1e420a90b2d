"""Counts over a run's requests that both a single replica's run (runner.py) and a cluster's tables (results.py)
report. Its own module so that the arrows run one way: runner -> cluster -> results -> counts."""
from __future__ import annotations


def infeasible_counts(requests) -> dict:
    """How many requests were not run, by reason (reasons name limits, never a request's own lengths)."""
    out: dict = {}
    for r in requests:
        out[r.reason] = out.get(r.reason, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
