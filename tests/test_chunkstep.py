"""The scheduler-free steps of a busy replica: chunkstep's batch is schedule()'s, and cohort.quiet_steps' run is
_cohort_steps' step-by-step loop, bit for bit, including where either declines (KV short, budget, queued work)."""
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sim.engine import chunkstep, loop
from sim.engine.cohort import DecodeCohort, quiet_steps
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict
from tests.test_fastforward import assert_same_runs as _same


def _raw(policy, M, seed, rate, **policy_knobs):
    return {"name": "c", "seed": seed, "model": {"name": "llama-2-7b", "max_model_len": 4096},
            "hardware": {"gpu": "a100-80gb"}, "costmodel": {"kind": "linear"},
            "policy": {"name": policy, **policy_knobs}, "memory": {"M": M, "block_size": 16},
            "workload": {"kind": "poisson", "num_requests": 60, "rate": rate,
                         "prompt": {"dist": "uniform", "low": 200, "high": 1600},
                         "output": {"dist": "uniform", "low": 2, "high": 200}}}


def _run(raw, record=False):
    sim = build_simulation(scenario_from_dict({**raw, "sim": {"keep_token_times": True,
                                                              "record_iterations": record}}))
    return sim, sim.run()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["sarathi", "vllm-v1", "vllm-v1-nocache", "sarathi-p=c", "sarathi-rmax"]),
       seed=st.integers(0, 10_000), rate=st.sampled_from([2.0, 8.0, 30.0]),
       M=st.sampled_from([2500, 12_000, 200_000]), record=st.booleans())
def test_chunk_steps_are_the_schedulers_batches(policy, seed, rate, M, record):
    """With the rule on and off (every step through schedule()), the same tables and counters; the rule fires.
    Admissions are made by the rule without prefix caching (vLLM v1 with it off, Sarathi), declined at a running
    cap (R_max 3) or the watermark."""
    knobs = {"vllm-v1-nocache": {}, "sarathi-rmax": {"R_max": 3}}.get(policy, {})
    raw = _raw(policy.replace("-nocache", "").replace("-rmax", ""), M, seed, rate, **knobs)
    if policy == "vllm-v1-nocache":
        raw["memory"]["prefix_caching"] = False
    on_sim, on = _run(raw, record)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunkstep, "rule", lambda policy, view: None)
        off_sim, off = _run(raw, record)
    _same((off_sim, off), (on_sim, on))
    assert off_sim.chunk_steps == 0
    if policy == "sarathi" and rate == 2.0:
        assert on_sim.chunk_steps > 0      # prompts of up to 1,600 tokens in chunks of 512 beside the decodes


@pytest.mark.parametrize("M,rate", [(2500, 1.0), (1500, 3.0)])
def test_a_step_that_does_not_fit_goes_to_the_scheduler(M, rate):
    """vLLM v1 with a 600-token budget (prompts in chunks beside the decodes, blocks reserved a chunk at a time)
    on so little KV that the cohort's blocks and a chunk's often do not both fit: next_batch declines (changing
    nothing) and schedule() evicts; the tables are still the scheduler's."""
    raw = _raw("vllm-v1", M, 7, rate, C=600)
    declined = []
    real = chunkstep.next_batch

    def spy(knobs, view):
        free, blocks = view.memory.free_blocks, view.loose[0].blocks
        batch = real(knobs, view)
        if batch is None:
            assert (view.memory.free_blocks, view.loose[0].blocks) == (free, blocks)
            declined.append(view.iteration)
        return batch
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunkstep, "next_batch", spy)
        on_sim, on = _run(raw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunkstep, "rule", lambda policy, view: None)
        off_sim, off = _run(raw)
    _same((off_sim, off), (on_sim, on))
    assert declined and on_sim.chunk_steps > 0
    assert on.summary["evictions"] > 0


@pytest.mark.parametrize("watermark", [0.0, 0.2])
def test_admissions_at_the_watermark_go_to_the_scheduler(watermark):
    """Sarathi on tight KV with an admission watermark: the rule admits while free blocks stay above it and leaves
    the rest to schedule(); the tables are the scheduler's either way."""
    raw = _raw("sarathi", 3000, 3, 4.0)
    raw["memory"]["watermark"] = watermark
    on_sim, on = _run(raw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunkstep, "rule", lambda policy, view: None)
        off_sim, off = _run(raw)
    _same((off_sim, off), (on_sim, on))
    assert on_sim.chunk_steps > 0


def test_the_rule_is_only_the_unified_schedulers_own():
    """A subclass (its schedule may differ), prefill-first order and unchunked prefill keep the scheduler."""
    for policy, knobs in [("vllm", {}), ("sarathi-nocp", {}), ("orca", {}), ("aptserve", {})]:
        sim = build_simulation(scenario_from_dict({**_raw(policy, 50_000, 0, 5.0, **knobs)}))
        sim.run()
        assert sim.chunk_steps == 0, policy


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["sarathi", "vllm-v1"]), seed=st.integers(0, 10_000),
       rate=st.sampled_from([3.0, 30.0]), M=st.sampled_from([2500, 200_000]))
def test_quiet_steps_are_the_step_by_step_loop(policy, seed, rate, M):
    """cohort.quiet_steps against _cohort_steps' general loop (the one a per-step record or adapters take):
    the same tables and counters, KV peaks and sums included."""
    raw = _raw(policy, M, seed, rate)
    quick_sim, quick = _run(raw)
    with pytest.MonkeyPatch.context() as m:        # used tokens read through the manager: the general loop
        m.setattr(loop, "KVCacheManager", type("Other", (), {"used_tokens": property(lambda self: 0)}))
        slow_sim, slow = _run(raw)
    _same((slow_sim, slow), (quick_sim, quick))


class _Memory:
    block_size = 4

    def __init__(self, free):
        self.free_blocks = free


class _Req:
    def __init__(self, cached, blocks, output, generated):
        self.cached, self.blocks, self.output_tokens, self.generated = cached, blocks, output, generated
        self.cohort = None


def _cohort(free):
    """Blocks of 4 tokens. a: 6 cached in 2 blocks, 4 tokens to go (its last at step 4), a new block at step 3;
    b: 4 cached in 1 block, 9 to go, a new block at steps 1, 5, 9."""
    a, b = _Req(6, 2, 5, 1), _Req(4, 1, 10, 1)
    cohort = DecodeCohort(None, _Memory(free))
    cohort.join(a)
    cohort.join(b)
    return cohort, a, b


@pytest.mark.parametrize("free,arrival,limit,steps,expect", [
    # steps 1..4 take 1, 0, 1, 0 blocks; step 4 is a's last: the run stops after it (not counted in the free sum)
    (10, math.inf, math.inf, 99, (4.0, 3.0, 4, 8, 9 + 9 + 8, "a")),
    (1, math.inf, math.inf, 99, (2.0, 1.0, 2, 0, 0 + 0, None)),          # step 3's block does not fit
    (10, 2.5, math.inf, 99, (3.0, 2.0, 3, 8, 9 + 9 + 8, None)),          # steps start before the arrival
    (10, math.inf, 2.5, 99, (2.0, 1.0, 2, 9, 9 + 9, None)),              # and end before the limit
    (10, math.inf, math.inf, 1, (1.0, 0.0, 1, 9, 9, None)),              # at most `steps`
])
def test_quiet_steps_by_hand(free, arrival, limit, steps, expect):
    """Two members, one-second steps (parts: base 1, the rest 0) from t = 0: the clock, the last step's start,
    steps taken, free blocks, the free-block sum over steps that completed no one, the completed members."""
    cohort, a, b = _cohort(free)
    t, start, k, free_after, free_sum, done = quiet_steps(cohort, 0.0, 0.0, 0, cohort.cached, free, arrival, limit,
                                                          steps, (1.0, 0.0, 0.0, 0.0, 0.0))
    assert (t, start, k, free_after, free_sum) == expect[:5]
    assert list(done) == ([a] if expect[5] == "a" else [])
    assert cohort.ends[:k].tolist() == [1.0, 2.0, 3.0, 4.0][:k]
    assert 4 not in cohort.done_at if done else 4 in cohort.done_at
