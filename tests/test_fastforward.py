"""Exact fast-forward: the closed-form path gives the plain loop's request and iteration tables, bit for bit."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from costmodels.base import BatchShape, CostModel
from policies import POLICIES
from sim.scenario.config import scenario_from_dict
from sim.engine.fastforward import _block_events
from sim.metrics import p99_sorted
from sim.scenario.build import build_simulation, requests_from_table

PRESETS = ["vllm", "sarathi", "vllm-v1", "orca", "rank-i", "lightllm", "vllm-ef", "sarathi-nohy",
           "fastertransformer", "deepspeed-fastgen"]
# Decode- and prefill-first presets: the ones that run the steady decode cohort (sim/engine/cohort.py).
COHORT_PRESETS = ["sarathi", "sarathi-ef", "sarathi-p=c", "sarathi-nocp", "sarathi-nohy", "deepspeed-fastgen",
                  "vllm", "vllm-hy", "vllm-ef", "vllm-hy-ef", "fastertransformer"]


def _run(raw, table, fast_forward, stretches=True):
    """One run; `stretches=False` keeps the exact fast paths but turns the stretch skipping off (cohort alone)."""
    raw = {**raw, "sim": {**raw.get("sim", {}), "fast_forward": fast_forward}}
    sim = build_simulation(scenario_from_dict(raw), requests_from_table(table))
    if not stretches:
        sim.fast_forward = None
    return sim, sim.run()


def _workload(seed, n, rate, max_prompt, max_output):
    rng = np.random.default_rng(seed)
    arrivals = np.zeros(n) if rate == 0 else np.cumsum(rng.exponential(1.0 / rate, size=n))
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": rng.integers(1, max_prompt + 1, size=n),
                         "output_tokens": rng.integers(1, max_output + 1, size=n)})


def _assert_identical(raw, table, stretches=True):
    return _assert_equal_runs(_run(raw, table, False), _run(raw, table, True, stretches))


def assert_same_runs(a_run, b_run):
    """Two runs' (sim, result): identical tables, summaries and (where kept) token times."""
    (a_sim, a), (b_sim, b) = a_run, b_run
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.summary.keys() == b.summary.keys()
    for k, v in a.summary.items():
        assert v == b.summary[k] or (v != v and b.summary[k] != b.summary[k]), k    # NaN == NaN
    if a_sim.keep_token_times:
        for x, y in zip(a_sim.all_requests, b_sim.all_requests):
            assert x.token_times == y.token_times, x


def _assert_equal_runs(plain_run, fast_run):
    """The plain loop's (sim, result) and the fast paths': identical tables, summaries and token times."""
    assert_same_runs(plain_run, fast_run)
    plain_sim = plain_run[0]
    assert plain_sim.fast_forward_iterations == 0 and plain_sim.cohort is None
    return fast_run


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS), seed=st.integers(0, 10_000), n=st.integers(1, 60),
       rate=st.sampled_from([0, 2.0, 20.0, 200.0]), M=st.sampled_from([600, 1500, 6000, 100_000]),
       block=st.sampled_from([1, 16]), max_prompt=st.sampled_from([8, 300, 700]),
       max_output=st.sampled_from([1, 40, 300]), swap=st.booleans())
def test_fast_forward_matches_plain_loop(preset, seed, n, rate, M, block, max_prompt, max_output, swap):
    policy = {"name": preset}
    if swap:
        policy["preemption"] = "swap"
    raw = {"memory": {"M": M, "block_size": block, "swap_space_gib": 0.002}, "policy": policy}
    _assert_identical(raw, _workload(seed, n, rate, max_prompt, max_output))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(COHORT_PRESETS), seed=st.integers(0, 10_000), n=st.integers(1, 80),
       rate=st.sampled_from([0, 1.0, 5.0, 50.0]), M=st.sampled_from([600, 2000, 8000, 100_000]),
       block=st.sampled_from([1, 4, 16]), max_prompt=st.sampled_from([8, 300, 700]),
       max_output=st.sampled_from([1, 60, 400, 1000]), swap=st.booleans(), stretches=st.booleans(),
       R_max=st.sampled_from([0, 8]), keep=st.booleans(), max_iterations=st.sampled_from([0, 150]))
def test_decode_cohort_matches_plain_loop(preset, seed, n, rate, M, block, max_prompt, max_output, swap, stretches,
                                          R_max, keep, max_iterations):
    """The cohort path (with and without stretches) over decode-heavy online workloads, KV pressure (eviction
    fallbacks), swap, a batch cap, kept token times and truncation: the plain loop's tables, bit for bit."""
    policy = {"name": preset, "R_max": R_max}
    if swap:
        policy["preemption"] = "swap"
    raw = {"memory": {"M": M, "block_size": block, "swap_space_gib": 0.002}, "policy": policy,
           "sim": {"keep_token_times": keep, "max_iterations": max_iterations}}
    _assert_identical(raw, _workload(seed, n, rate, max_prompt, max_output), stretches)


@pytest.mark.parametrize("stretches", [False, True])
def test_decode_cohort_carries_a_decode_heavy_run_and_falls_back_under_kv_pressure(stretches):
    """Sarathi with M small enough to evict: the cohort takes most decode tokens and still gives the plain tables."""
    table = _workload(11, 150, 20.0, 400, 600)
    sim, res = _assert_identical({"memory": {"M": 6000, "block_size": 16}, "policy": {"name": "sarathi"}},
                                 table, stretches)
    assert res.summary["evictions"] > 100                    # shortfalls took the per-request path
    assert res.summary["generated_tokens"] == int(table["output_tokens"].sum())
    assert sim.cohort.tokens > 0.9 * res.summary["generated_tokens"]


@pytest.mark.parametrize("knobs,M,seed,rate", [
    ({}, 100_000, 12, 8.0), ({"C": 256, "P": 256}, 100_000, 12, 8.0), ({}, 6000, 12, 8.0),
    ({"P": 64, "preemption": "swap"}, 5000, 12, 8.0),
    # A decode swapped out from the middle (longest input) comes back behind a running prefill whose chunk the
    # small P cut short: the running order then interleaves them, and such steps take the per-request path.
    ({"P": 32, "preemption": "swap", "victim": "longest_input"}, 5000, 13, 30.0),
    ({"P": 32, "preemption": "swap", "victim": "longest_input", "p_counts_decode_tokens": False}, 5000, 13, 30.0)])
def test_running_first_cohort_takes_decodes_beside_running_prefill_chunks(knobs, M, seed, rate):
    """vLLM v1 (running first): the cohort takes the decodes whenever the running prefills are the tail of the
    running order; budget or KV short enough to preempt, or a decode behind a prefill, take the per-request
    path; the tables stay those of the plain loop."""
    table = _workload(seed, 150, rate, 600, 300)
    sim, res = _assert_identical({"memory": {"M": M, "block_size": 16},
                                  "policy": {"name": "vllm-v1", **knobs}}, table, True)
    assert res.summary["generated_tokens"] == int(table["output_tokens"].sum())
    assert sim.cohort.tokens > 0.5 * res.summary["generated_tokens"]
    if M < 10_000:
        assert res.summary["evictions"] + res.summary["swaps"] > 0


@pytest.mark.parametrize("name", ["sarathi", "vllm"])
def test_cohort_stretch_after_a_swap_in_records_no_swaps(name):
    """A steady cohort stretch that starts right after a step that swapped requests in moves nothing itself:
    its iteration rows carry zero swap traffic, as the plain loop's do (they used to repeat the swap-in)."""
    table = _workload(12, 150, 8.0, 600, 300)
    sim, res = _assert_identical({"memory": {"M": 5000, "block_size": 16},
                                  "policy": {"name": name, "preemption": "swap"}}, table, True)
    assert res.summary["swaps"] > 0 and sim.fast_forward_iterations > 0


def test_decode_cohort_is_off_where_it_does_not_apply():
    table = _workload(2, 5, 1.0, 50, 50)
    for raw in ({"policy": {"name": "vllm-v1", "hybrid": False}}, {"policy": {"name": "vllm", "evict_for_waiting": True}},
                {"policy": {"name": "sarathi"}, "memory": {"kv_quant_bits": 8}},
                {"policy": {"name": "sarathi"}, "sim": {"fast_forward": False}}):
        sim = build_simulation(scenario_from_dict(raw), requests_from_table(table))
        sim.run()
        assert sim.cohort is None, raw


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_fast_paths_match_plain_loop(name):
    """Every registered policy, research ones included, runs the SimPy-free fast path (replayed arrivals):
    the same tables as under SimPy, with arrivals all at once, in bursts with idle gaps, and under KV pressure."""
    for seed, rate, M in ((1, 0, 4000), (2, 0.7, 3000), (3, 30.0, 1500)):
        _assert_identical({"memory": {"M": M, "block_size": 16}, "policy": {"name": name}},
                          _workload(seed, 25, rate, 300, 120))


@pytest.mark.parametrize("preset", ["sarathi", "vllm", "vllm-v1", "sarathi-nohy"])
@pytest.mark.parametrize("idle", [False, True])
def test_arrivals_exactly_at_iteration_ends_keep_simpys_order(preset, idle):
    """Ties between an arrival and an iteration's end are ordered by SimPy's event creation order; the fast
    paths replay the arrivals without SimPy (sim/engine/arrivals.py). Arrivals are placed one by one exactly on the
    plain loop's iteration boundaries (back to back, so an arrival created at a tie meets the next one)."""
    table = _workload(8, 12, 0.5 if idle else 20.0, 200, 60)
    raw = {"memory": {"M": 3000, "block_size": 16}, "policy": {"name": preset}}
    t_min = 0.0
    for _ in range(8):
        _, plain = _run(raw, table, False)
        starts = plain.iterations["start_s"].to_numpy()
        later = starts[starts > t_min]
        if len(later) < 2:
            break
        t_min = float(later[1])             # a boundary the previous insertion did not move
        extra = pd.DataFrame({"arrival_s": [t_min], "prompt_tokens": [30], "output_tokens": [20]})
        table = pd.concat([table, extra], ignore_index=True).sort_values("arrival_s", kind="stable",
                                                                        ignore_index=True)
        for stretches in (False, True):
            _assert_identical(raw, table, stretches)


@pytest.mark.parametrize("preset", ["vllm", "sarathi", "vllm-v1"])
def test_fast_forward_skips_most_iterations_of_a_decode_heavy_run_and_keeps_invariants(preset):
    table = _workload(3, 200, 5.0, 200, 400)
    sim, res = _assert_identical({"memory": {"M": 8000, "block_size": 16}, "policy": {"name": preset}}, table)
    it, req = res.iterations, res.requests
    assert sim.fast_forward_iterations > 0.5 * len(it)       # long decode tails are skipped in closed form
    assert (it["kv_alloc_tokens"] <= sim.memory.capacity_tokens).all()
    assert (it["kv_cached_tokens"] <= it["kv_alloc_tokens"]).all()
    assert np.all(np.diff(it["start_s"]) > 0)
    ends = (it["start_s"] + it["duration_s"]).to_numpy()
    assert np.all(it["start_s"].to_numpy()[1:] >= ends[:-1])     # one GPU: iterations never overlap
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert res.summary["generated_tokens"] == int(table["output_tokens"].sum())


def test_fast_forward_respects_max_iterations_and_watchdog_counts_skipped_progress():
    table = _workload(1, 20, 0, 50, 300)
    raw = {"memory": {"M": 100_000, "block_size": 16}, "policy": {"name": "vllm"}, "sim": {"max_iterations": 77}}
    sim, res = _assert_identical(raw, table)
    assert res.summary["truncated"] and len(res.iterations) == 77 and sim.view.iteration == 77


def test_cost_model_without_closed_form_is_asked_per_iteration():
    """A cost model that only implements compute_time still fast-forwards exactly (default hook)."""
    class MaxContext(CostModel):
        def compute_time(self, shape: BatchShape) -> float:
            ctx = shape.decode_context + shape.prefill_context
            return 1e-3 + 1e-6 * sum(shape.prefill_tokens) + 1e-7 * (max(ctx) if ctx else 0) * len(ctx)

    table = _workload(5, 30, 10.0, 100, 200)
    out = []
    for ff in (False, True):
        sim = build_simulation(scenario_from_dict({"memory": {"M": 5000, "block_size": 16}, "policy": {"name": "sarathi"},
                                                   "sim": {"fast_forward": ff}}), requests_from_table(table))
        sim.costmodel = MaxContext()
        sim.view.costmodel = sim.costmodel
        out.append((sim, sim.run()))
    pd.testing.assert_frame_equal(out[0][1].requests, out[1][1].requests, check_exact=True)
    pd.testing.assert_frame_equal(out[0][1].iterations, out[1][1].iterations, check_exact=True)
    assert out[1][0].fast_forward_iterations > 0


def test_linear_closed_form_equals_batch_time_bit_for_bit():
    sim = build_simulation(scenario_from_dict({}), requests_from_table(_workload(0, 1, 0, 1, 1)))
    cm = sim.costmodel
    cached = np.array([5, 900, 33, 4096, 1])
    got = cm.decode_stretch_times(cached, 50)
    want = [cm.batch_time(BatchShape(decode_context=[int(c) + j for c in cached])) for j in range(1, 51)]
    assert got.tolist() == want
    last = np.array([50, 3, 17, 50, 1])        # requests leave the batch after their last step
    got = cm.decode_stretch_times(cached, 50, last_step=last)
    want = [cm.batch_time(BatchShape(decode_context=[int(c) + j for c, l in zip(cached, last) if j <= l]))
            for j in range(1, 51)]
    assert got.tolist() == want


def test_block_events_match_a_brute_force_count():
    rng = np.random.default_rng(0)
    for _ in range(200):
        bs = int(rng.choice([1, 4, 16]))
        n = int(rng.integers(1, 12))
        slack = rng.integers(0, 40, size=n)
        k = int(rng.integers(1, 80))
        last = rng.integers(1, k + 1, size=n)
        need = lambda s, j: math.ceil(max(0, j - s) / bs)   # noqa: E731  (blocks taken by step j)
        brute = [sum(need(s, j) - need(s, j - 1) for s, l in zip(slack, last) if j <= l) for j in range(1, k + 1)]
        assert _block_events(slack, last, bs, k).tolist() == brute


def test_finalize_is_numpys_mean_percentile_and_max():
    from sim.metrics import finalize_request
    from sim.engine.request import Request
    rng = np.random.default_rng(4)
    for n in list(range(1, 60)) + [101, 257, 1000, 4097]:
        times = np.cumsum(rng.random(n) * rng.choice([1e-3, 1.0]) + rng.choice([0.0, 1e4]))
        gaps = np.diff(times)
        want = (float(gaps.mean()), float(np.percentile(gaps, 99)), float(gaps.max())) if n > 1 else None
        for split in sorted({0, n // 2, n}):        # part kept per request, the rest as the cohort's array
            r = Request(0, 0.0, 1, n)
            r.token_times = times[:split].tolist()
            finalize_request(r, tail=times[split:] if split < n else None)
            assert r.tbt == want if want else all(x != x for x in r.tbt)
            assert r.token_times == [times[0], times[-1]]


def test_finalize_many_is_finalize_request_one_by_one():
    """Batched TBT statistics (equal token counts reduced row-wise) give each request's own floats."""
    from sim.metrics import finalize_many, finalize_request
    from sim.engine.request import Request
    rng = np.random.default_rng(5)
    for keep in (False, True):
        one, many = [], []
        for i in range(600):
            n = int(rng.choice([1, 2, 3, 8, 9, 100, 101, 102, 129, 130, 257, 1000]))
            times = np.cumsum(rng.random(n) * rng.choice([1e-3, 1.0]) + rng.choice([0.0, 1e4]))
            h = int(rng.integers(0, n + 1))
            a, b = Request(i, 0.0, 1, n), Request(i, 0.0, 1, n)
            a.token_times, b.token_times = times[:h].tolist(), times[:h].tolist()
            finalize_request(a, keep, times[h:])
            one.append(a)
            many.append((b, times[h:]))
        finalize_many(many, keep)
        for a, (b, _) in zip(one, many):
            assert a.tbt == b.tbt or all(x != x for x in a.tbt + b.tbt)     # NaN: fewer than two tokens
            assert a.token_times == b.token_times


def test_p99_helper_is_numpys_percentile():
    rng = np.random.default_rng(1)
    for n in list(range(1, 40)) + [101, 257, 999]:
        x = np.diff(np.cumsum(rng.random(n + 1) * rng.choice([1e-3, 1.0])))
        assert p99_sorted(sorted(x.tolist())) == float(np.percentile(x, 99))


@pytest.mark.parametrize("fast_forward", [False, True])
def test_summary_without_iteration_table_matches_the_table(fast_forward):
    table = _workload(7, 120, 8.0, 400, 300)
    raw = {"memory": {"M": 6000, "block_size": 16}, "policy": {"name": "sarathi"},
           "sim": {"fast_forward": fast_forward}}
    _, full = _run(raw, table, fast_forward)
    _, lean = _run({**raw, "sim": {**raw["sim"], "record_iterations": False}}, table, fast_forward)
    assert len(lean.iterations) == 0
    pd.testing.assert_frame_equal(full.requests, lean.requests, check_exact=True)
    for key in ("iterations", "kv_util_max"):
        assert lean.summary[key] == full.summary[key]
    for key in ("batch_size_mean", "running_mean", "kv_util_mean"):
        assert lean.summary[key] == pytest.approx(full.summary[key], rel=1e-12)


@pytest.mark.parametrize("preset", ["vllm", "sarathi", "alise"])
def test_fast_forward_is_exact_with_int8_kv(preset):
    """Quantized KV charges dequantization per step, which the closed-form stretch lacks: the tables still match."""
    raw = {"memory": {"M": 4000, "block_size": 16, "kv_quant_bits": 8}, "policy": {"name": preset}}
    _assert_identical(raw, _workload(3, 40, 0, 300, 200))
