"""Autoscaling a co-located pool (sim/cluster/autoscale.py): no request lost when replicas drain, never fewer
serving replicas than the floor, every request routed to a replica that was serving, GPU-hours = the integral of
the replicas held over time, the scale-up delay from the weights, and one-line errors."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from costmodels.errors import UserError
from sim.cluster.runner import run_scenario
from sim.scenario.config import scenario_from_dict


def _scn(autoscale, **wl):
    workload = {"kind": "onoff", "rate": 24, "on_s": 20, "off_s": 60, "off_rate": 1, "num_requests": 900,
                "prompt": {"dist": "uniform", "low": 64, "high": 800},
                "output": {"dist": "uniform", "low": 16, "high": 200}, **wl}
    return scenario_from_dict({"name": "as", "seed": 0, "model": {"name": "llama-2-7b"},
                               "hardware": {"gpu": "a100-80gb"}, "policy": {"name": "vllm-v1"},
                               "workload": workload, "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
                               "cluster": {"replicas": 4, "router": "least_tokens", "autoscale": autoscale}})


QUEUE = {"policy": "outstanding", "min": 1, "max": 4, "up_at": 6, "down_at": 2, "interval_s": 5, "cooldown_s": 10,
         "start_s": 5}


def _serving_spans(ev: pd.DataFrame) -> dict:
    """replica → [(from, to)] it could be routed to: serve/undrain opens, down/release closes."""
    spans, open_at = {}, {}
    for _, e in ev.sort_values("t_s", kind="stable").iterrows():
        r = int(e["replica"])
        if e["action"] in ("serve", "undrain"):
            open_at[r] = e["t_s"]
        elif e["action"] in ("down", "release") and r in open_at:
            spans.setdefault(r, []).append((open_at.pop(r), e["t_s"]))
    return spans


def test_autoscaling_invariants():
    res = run_scenario(_scn(QUEUE))
    s, req, ev, per = res.summary, res.requests, res.tables["scaling"], res.tables["replicas"]
    assert s["autoscale_ups"] >= 1 and s["autoscale_downs"] >= 1            # both directions fired
    assert s["completed"] == s["requests"] == 900                            # nothing lost in a scale-down
    spans = _serving_spans(ev)
    for rep, arrival in zip(req["replica"], req["arrival_s"]):              # routed only to a serving replica
        assert any(a <= arrival <= b for a, b in spans[int(rep)])
    # never fewer serving than the floor: sweep the serving spans
    marks = sorted([(a, 1) for v in spans.values() for a, _ in v] + [(b, -1) for v in spans.values() for _, b in v],
                   key=lambda m: (m[0], -m[1]))
    now, t0, end = 0, req["arrival_s"].min(), req["completion_s"].max()
    for t, d in marks:
        now += d
        if t0 <= t < end:
            assert now >= QUEUE["min"]
    # GPU-hours are the integral of the replicas held: acquire ... release, one GPU each here
    held = 0.0
    for r, g in ev.groupby("replica"):
        acq = g[g["action"] == "acquire"]["t_s"].to_numpy()
        rel = g[g["action"] == "release"]["t_s"].to_numpy()
        assert len(acq) == len(rel) and (rel >= acq).all()
        held += float((rel - acq).sum())
    assert s["gpu_seconds"] == pytest.approx(held) and per["held_s"].sum() == pytest.approx(held)
    assert s["gpu_hours"] == pytest.approx(held / 3600)
    assert held < 4 * s["makespan_s"]                                        # cheaper than holding all four
    assert s["replicas_held_mean"] == pytest.approx(held / s["makespan_s"])
    # a drained replica is released at its last completion (or when drained, if idle)
    for _, e in ev[ev["action"] == "down"].iterrows():
        rel = ev[(ev["replica"] == e["replica"]) & (ev["action"] == "release") & (ev["t_s"] >= e["t_s"])]
        last = req[(req["replica"] == e["replica"]) & (req["arrival_s"] <= e["t_s"])]["completion_s"].max()
        assert rel["t_s"].min() == pytest.approx(max(e["t_s"], last if last == last else e["t_s"]))


def test_schedule_scales_at_the_given_times_after_the_weight_load():
    from costmodels.catalog import MODELS
    sched = {"policy": "schedule", "min": 1, "max": 4, "schedule": [[0, 1], [30, 3]], "interval_s": 5,
             "start_s": 10, "load_gbps": 2}
    res = run_scenario(_scn(sched, num_requests=700))
    ev = res.tables["scaling"]
    ups = ev[ev["action"] == "up"]
    assert len(ups) == 2 and res.summary["autoscale_ups"] == 2 and res.summary["autoscale_downs"] == 0
    t0 = res.requests["arrival_s"].min()
    assert (ups["t_s"] >= t0 + 30).all() and (ups["t_s"] < t0 + 30 + 5 + 1).all()   # first look after 30 s
    # the delay: 10 s start + Llama-2-7B's fp16 weights over 2 GB/s
    load = 10 + MODELS["llama-2-7b"].weight_bytes() / 2e9
    assert load == pytest.approx(16.74, abs=0.01)
    assert np.allclose(ups["serves_from_s"] - ups["t_s"], load)
    served = res.requests.merge(ups[["replica", "serves_from_s"]], on="replica")
    assert (served["arrival_s"] >= served["serves_from_s"]).all()            # no request before it is loaded


def test_same_seed_same_autoscaled_tables():
    a, b = run_scenario(_scn(QUEUE)), run_scenario(_scn(QUEUE))
    pd.testing.assert_frame_equal(a.tables["scaling"], b.tables["scaling"])
    pd.testing.assert_frame_equal(a.requests, b.requests)


@pytest.mark.parametrize("bad, message", [
    ({"policy": "magic"}, "cluster.autoscale.policy: 'magic' is not allowed"),
    ({"policy": "outstanding", "up_at": 5}, "cluster.autoscale.down_at: needed by policy outstanding"),
    ({"min": 3, "max": 2, "up_at": 5, "down_at": 1}, "need min <= max <= cluster.replicas"),
    ({"policy": "schedule", "schedule": [[0, 9]]}, "9 replicas at t = 0 s is outside"),
    ({"up_at": 5, "down_at": 1, "speed": 2}, "unknown key(s) speed"),
])
def test_bad_autoscale_is_one_line(bad, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_scenario(_scn(bad))


def test_kv_policy_scales_on_cache_use():
    kv = {"policy": "kv", "min": 1, "max": 4, "up_at": 0.3, "down_at": 0.05, "interval_s": 5, "cooldown_s": 10,
          "start_s": 5}
    res = run_scenario(_scn(kv))
    s, ev = res.summary, res.tables["scaling"]
    assert s["autoscale_ups"] >= 1 and s["completed"] == s["requests"]
    ups = ev[ev["action"] == "up"]
    assert (ups["metric"] > 0.3).all()                  # each up was read above the threshold
    downs = ev[ev["action"] == "down"]
    assert (downs["metric"] < 0.05).all()
