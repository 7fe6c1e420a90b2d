"""Least-loaded routers that learn of completions from periodic load reports (router.report_interval_s)."""
import math

import numpy as np
import pandas as pd
import pytest

from costmodels.errors import UserError
from sim.cluster.routers import build_router, report_tick
from sim.cluster.runner import run_scenario
from sim.engine.request import Request
from sim.scenario.config import scenario_from_dict

BASE = {"name": "reports", "seed": 0, "memory": {"M": 20000}, "policy": {"name": "sarathi"},
        "costmodel": {"kind": "linear"}}
FLEET = {"kind": "poisson", "num_requests": 1500, "rate": 30.0,
         "prompt": {"dist": "lognormal", "mu": 6.6, "sigma": 1.0, "min": 2, "max": 4000},
         "output": {"dist": "lognormal", "mu": 5.0, "sigma": 0.9, "min": 7, "max": 1000}}


def _cluster(router, requests=None, workload=FLEET, replicas=2, fast=True, **extra):
    raw = {**BASE, "workload": workload, "sim": {"fast_forward": fast},
           "cluster": {"replicas": replicas, "router": router}, **extra}
    return run_scenario(scenario_from_dict(raw), requests)


def test_report_tick_is_the_last_report_at_or_before_t():
    assert report_tick(0.5, 1.0) == 0.0 and report_tick(1.0, 1.0) == 1.0 and report_tick(2.99, 1.0) == 2.0
    assert report_tick(0.7, 0.25) == 0.5
    for t in np.random.default_rng(0).uniform(0, 1e4, 2000):       # never after t, never a full interval behind
        for dt in (0.1, 0.3, 1.0 / 3):
            b = report_tick(float(t), dt)
            assert b <= t < b + dt * (1 + 1e-9)


def test_a_completion_after_the_last_report_is_not_seen_by_hand():
    """Two replicas, least_requests. A (long) goes to replica 0, B (short) to replica 1 and completes at about
    0.1 s; C arrives at 0.5 s. Seeing completions at once, the router sends C to replica 1 (0 outstanding against
    1). With reports every second the last report was at 0, before B left: 1 against 1, and the tie goes to replica
    0. With reports every 0.25 s the report at 0.5 s counts B's completion: replica 1 again."""
    def reqs():
        return [Request(0, 0.0, 64, 400), Request(1, 0.01, 64, 8), Request(2, 0.5, 64, 8)]
    where = {}
    for interval in (0.0, 1.0, 0.25):
        res = _cluster({"name": "least_requests", "report_interval_s": interval}, reqs())
        r = res.requests.set_index("id")
        assert r.loc[1, "completion_s"] < 0.25                      # B leaves before the 0.25 s report
        where[interval] = int(r.loc[2, "replica"])
    assert where == {0.0: 1, 1.0: 0, 0.25: 1}


@pytest.mark.parametrize("router", ["least_tokens", "least_requests"])
@pytest.mark.parametrize("interval", [0.05, 1.0])
def test_placing_a_report_interval_at_once_is_the_plain_path(router, interval):
    """With reports every `interval`, the driver places each interval's arrivals together (fast paths on); the
    plain path places each at its own time with the same knowledge. Identical tables, four replicas; and the
    ledgers balance (every request left the replica it was sent to)."""
    spec = {"name": router, "report_interval_s": interval}
    fast, plain = _cluster(spec, replicas=4, fast=True), _cluster(spec, replicas=4, fast=False)
    pd.testing.assert_frame_equal(fast.requests, plain.requests)
    pd.testing.assert_frame_equal(fast.iterations, plain.iterations)
    pd.testing.assert_frame_equal(fast.tables["replicas"], plain.tables["replicas"])
    assert (fast.tables["replicas"]["outstanding_end"] == 0).all()
    exact = _cluster(router, replicas=4)
    assert not fast.requests["replica"].equals(exact.requests["replica"])    # the lag changes decisions
    assert fast.summary["completed"] == exact.summary["completed"]


def test_stale_reports_still_balance_the_load():
    """Own sends are counted at once, so a second-old view of completions does not herd arrivals onto one
    replica: busy time is spread within 5% of even, and more evenly than round-robin spreads it."""
    stale = _cluster({"name": "least_tokens", "report_interval_s": 1.0}, replicas=4).summary["load_imbalance"]
    rr = _cluster("round_robin", replicas=4).summary["load_imbalance"]
    assert stale < 1.05 and stale < rr, (stale, rr)


@pytest.mark.parametrize("value,message", [
    (-1.0, r"report_interval_s: must be a finite number of seconds >= 0"),
    (math.inf, r"report_interval_s: must be a finite"),
    (math.nan, r"report_interval_s: must be a finite"),
    ("1s", r"cluster.router.report_interval_s: router 'least_tokens' takes a float here, got '1s'"),
    (True, r"takes a float here"),
])
def test_a_bad_report_interval_is_one_line(value, message):
    with pytest.raises(UserError, match=message):
        build_router({"name": "least_tokens", "report_interval_s": value}, np.random.default_rng(0))


def test_only_the_least_loaded_routers_take_a_report_interval():
    with pytest.raises(UserError, match=r"unknown knob\(s\) report_interval_s for router 'power_of_two'"):
        build_router({"name": "power_of_two", "report_interval_s": 1.0}, np.random.default_rng(0))
