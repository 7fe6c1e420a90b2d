"""ALISE: preemptive SRTF on predicted length, overrun doubling, aging, EWT swap vs Defer/Recompute, invariants."""
import pytest

from sim.scenario.config import scenario_from_dict
from sim.engine.request import Request
from sim.scenario.build import build_simulation
from tests.kv_invariants import instrument


def _sim(policy, requests=None, M=4096, workload=None, **mem):
    raw = {"seed": 0, "memory": {"M": M, "block_size": 16, "swap_space_gib": 16, **mem}, "policy": policy,
           "workload": workload or {"kind": "alise-alpaca", "num_requests": 400, "rate": 70.0}}
    return build_simulation(scenario_from_dict(raw), requests)


def test_short_job_preempts_long_one_at_iteration_level():
    reqs = [Request(0, 0.0, 32, 400), Request(1, 0.05, 32, 10)]
    sim = _sim({"name": "alise", "max_batch": 1}, reqs)
    sim.run()
    long, short = reqs
    assert short.completion_s < long.completion_s
    assert short.completion_s - short.arrival_s < 0.02 * 12      # it did not wait for the long job's 400 steps
    fcfs = [Request(0, 0.0, 32, 400), Request(1, 0.05, 32, 10)]
    _sim({"name": "vllm", "R_max": 1}, fcfs).run()
    assert fcfs[1].completion_s > fcfs[0].completion_s           # FCFS: head-of-line blocking


def test_overrun_doubles_the_prediction_and_demotes():
    r = Request(0, 0.0, 32, 50, predicted_output_tokens=10)
    sim = _sim({"name": "alise"}, [r])
    sim.run()
    assert r.meta.overruns == 3 and r.meta.n_hat == 80           # 10 → 20 → 40 → 80 ≥ 50
    assert r.meta.min_level >= 1


def test_aging_promotes_a_starving_long_job():
    def workload():
        reqs = [Request(0, 0.0, 32, 300)]
        reqs += [Request(i, 0.01 + 0.05 * i, 32, 8) for i in range(1, 200)]   # short jobs, slightly overloading
        return reqs
    done = {}
    for K in (0.0, 1.0):
        reqs = workload()
        sim = _sim({"name": "alise", "max_batch": 1, "aging_s": K}, reqs)
        sim.run()
        done[K] = reqs[0].completion_s
        if K:
            assert sim.policy.stats["promotions"] > 0
    assert done[1.0] < done[0.0]


@pytest.mark.parametrize("name", ["alise", "alise-defer", "alise-recompute"])
@pytest.mark.parametrize("bits", [16, 8])
def test_invariants_under_swap_quantized_kv_and_strawmen(name, bits):
    sim = _sim({"name": name}, kv_quant_bits=bits, M=2048 if bits == 16 else 1024)
    seen = instrument(sim)
    res = sim.run()
    s = res.summary
    assert s["completed"] == 400 and seen["steps"] > 100
    if name == "alise":
        assert s["swaps"] > 0 and s["evictions"] == 0            # preempted KV goes to CPU, never dropped
    elif name == "alise-recompute":
        assert s["swaps"] == 0 and s["evictions"] > 0
    else:
        assert s["swaps"] == 0


def test_overlapped_swaps_cost_less_than_serial_ones():
    spans = {}
    for overlap in (True, False):
        sim = _sim({"name": "alise", "swap_overlap": overlap}, M=1536)
        res = sim.run()
        assert res.summary["swaps"] > 0
        spans[overlap] = res.iterations["duration_s"].sum()
    assert spans[True] < spans[False]


def test_estimator_is_fitted_to_the_cost_model():
    sim = _sim({"name": "alise"})
    sim.policy.bind(sim.view)
    p = sim.policy
    from policies.length_aware import decode_step_time_s, prefill_time_s
    assert p.t0 * 512 == pytest.approx(prefill_time_s(sim.costmodel, 512), rel=0.25)
    assert p.alpha * 1000 + p.beta == pytest.approx(decode_step_time_s(sim.costmodel, 1, 1001), rel=0.05)
    assert p.alpha > 0 and p.beta > 0
