"""ALISE: preemptive SRTF on predicted length, overrun doubling, aging, EWT swap vs Defer/Recompute, invariants."""
import pytest

from sim.scenario.config import scenario_from_dict
from sim.engine.request import Request
from sim.scenario.build import build_simulation
from tests.kv_invariants import instrument


def _sim(policy, requests=None, M=4096, workload=None, **mem):
    raw = {"seed": 0, "memory": {"M": M, "block_size": 16, "swap_space_gib": 16, **mem}, "policy": policy,
           "costmodel": {"kind": "linear"},     # the loads below were sized on InferMax's A100 model
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


@pytest.mark.parametrize("kind", ["linear", "roofline", "auto"])
def test_a_background_swap_costs_only_what_the_step_does_not_cover(kind):
    """The cost-model rule behind ALISE's overlap: a step with KV copied in the background takes
    max(compute, copy), never more than the same copy charged serially."""
    from costmodels import BatchShape, build_costmodel, get_gpu, get_model
    cm = build_costmodel({"kind": kind}, get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
    for tokens in (16, 512, 4096, 65536):
        base = BatchShape(prefill_tokens=[64], prefill_context=[0], decode_context=[500] * 32)
        compute = cm.batch_time(base)
        hidden = cm.batch_time(BatchShape(prefill_tokens=[64], prefill_context=[0], decode_context=[500] * 32,
                                          swap_hidden_tokens=tokens))
        serial = cm.batch_time(BatchShape(prefill_tokens=[64], prefill_context=[0], decode_context=[500] * 32,
                                          swap_out_tokens=tokens))
        assert hidden == pytest.approx(max(compute, cm.swap_time(tokens)))
        assert compute <= hidden <= serial


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
