"""Multi-LoRA, closed-loop sessions and speculative decoding on the exact fast paths: the plain SimPy loop's tables,
bit for bit."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict
from tests.test_fastforward import _assert_equal_runs


def _poisson(n, rate, seed):
    return {"kind": "poisson", "num_requests": n, "rate": rate,
            "prompt": {"dist": "uniform", "low": 50, "high": 900}, "output": {"dist": "uniform", "low": 1, "high": 300}}


def _raw(policy, M, workload, seed, **extra):
    return {"name": "f", "seed": seed, "model": {"name": "llama-3.1-8b", "max_model_len": 8192},
            "hardware": {"gpu": "h100-sxm"}, "policy": {"name": policy}, "memory": {"M": M, "block_size": 16},
            "workload": workload, **extra}


def _both(raw, **sim_opts):
    """(plain, fast): the SimPy loop and the fast paths on the same scenario; asserts their tables are identical."""
    out = []
    for fast in (False, True):
        sim = build_simulation(scenario_from_dict({**raw, "sim": {"fast_forward": fast, "keep_token_times": True,
                                                                  **sim_opts}}))
        out.append((sim, sim.run()))
    _assert_equal_runs(out[0], out[1])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "sarathi", "vllm"]), seed=st.integers(0, 10_000),
       rate=st.sampled_from([2.0, 10.0, 40.0]), M=st.sampled_from([6000, 30_000, 200_000]),
       adapters=st.sampled_from([3, 12]), max_loras=st.sampled_from([1, 2, 4]),
       base_fraction=st.sampled_from([0.0, 0.3]))
def test_lora_fast_paths_match_plain_loop(policy, seed, rate, M, adapters, max_loras, base_fraction):
    """Adapter loads, max_loras skips (counted once per request per step), KV pressure: the same tables and
    counters as the plain loop, which charges every step's adapters one by one."""
    raw = _raw(policy, M, _poisson(60, rate, seed), seed,
               lora={"adapters": adapters, "max_loras": max_loras, "base_fraction": base_fraction,
                     "max_cpu_loras": max_loras + 1})
    (plain_sim, plain), (fast_sim, fast) = _both(raw)
    assert fast.summary["lora_compute_time_s"] == plain.summary["lora_compute_time_s"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "sarathi", "vllm"]), seed=st.integers(0, 10_000),
       rate=st.sampled_from([0.5, 3.0, 20.0]), M=st.sampled_from([8000, 200_000]),
       think=st.sampled_from([0.0, 0.05, 2.0]), think_kind=st.sampled_from(["constant", "exponential"]))
def test_session_fast_paths_match_plain_loop(policy, seed, rate, M, think, think_kind):
    """Closed-loop turns released at completions (zero pauses included: a turn arrives at the instant its
    predecessor completed), prefix reuse, KV pressure: the fast paths' SessionClock gives the SimPy tables."""
    w = {"kind": "multi_turn", "closed_loop": True, "conversations": 12, "start": {"process": "poisson", "rate": rate},
         "turns": {"dist": "uniform", "low": 2, "high": 5}, "system_prompt_len": 300, "user_tokens": 60,
         "output": 80, "think": think_kind, "think_time_s": think, "max_model_len": 8192}
    (plain_sim, plain), (fast_sim, fast) = _both(_raw(policy, M, w, seed))
    later = [r for r in fast_sim.all_requests if r.after is not None]
    assert fast.summary["session_turns_released"] == len(later) > 0
    assert all(r.arrival_s == r.after.completion_s + r.think_s for r in later)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "sarathi", "sglang"]), seed=st.integers(0, 10_000),
       rate=st.sampled_from([2.0, 20.0, 200.0]), M=st.sampled_from([3000, 12_000, 200_000]),
       method=st.sampled_from(["eagle", "ngram", "draft_model"]), k=st.integers(1, 5),
       a=st.sampled_from([0.0, 0.4, 0.8, 1.0]), lists=st.booleans(), record=st.booleans())
def test_speculative_fast_paths_match_plain_loop(policy, seed, rate, M, method, k, a, lists, record):
    """Steady verify steps taken without the scheduler (sim/engine/specstretch.py): acceptance draws from the one
    generator in the scheduled order, per-request lists, drafts' KV reserved and trimmed under KV pressure
    (preemptions), prefix caching (vLLM v1), budgets clipping verify passes: the plain loop's tables."""
    spec = {"method": method, "k": k, "acceptance_rate": a}
    if method == "draft_model":
        spec["draft_model"] = "tiny-llama"
    if lists:                                      # the first requests' first verify passes from a list
        spec["accepted"] = {i: [(i + j) % (k + 1) for j in range(5)] for i in range(0, 40, 3)}
    raw = _raw(policy, M, _poisson(40, rate, seed), seed, speculative=spec)
    out = _both(raw, record_iterations=record)
    assert out[1][1].summary["spec_draft_time_s"] == out[0][1].summary["spec_draft_time_s"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "sarathi"]), seed=st.integers(0, 10_000),
       rate=st.sampled_from([1.0, 4.0, 30.0]), M=st.sampled_from([5000, 200_000]),
       method=st.sampled_from(["eagle", "ngram", "draft_model"]), k=st.integers(1, 6),
       a=st.sampled_from([0.0, 0.5, 0.8, 1.0]), record=st.booleans())
def test_speculative_windows_match_plain_loop(policy, seed, rate, M, method, k, a, record):
    """Long outputs, so most steady verify steps are uniform and worked out a window at a time
    (sim/engine/specwalk.py): arrivals cut windows, completions end them, trims at block boundaries, KV pressure
    sends them back to the step-by-step loop; the plain loop's tables, and windows were taken."""
    spec = {"method": method, "k": k, "acceptance_rate": a}
    if method == "draft_model":
        spec["draft_model"] = "tiny-llama"
    w = {"kind": "poisson", "num_requests": 30, "rate": rate,
         "prompt": {"dist": "uniform", "low": 20, "high": 600}, "output": {"dist": "uniform", "low": 60, "high": 400}}
    raw = _raw(policy, M, w, seed, speculative=spec)
    out = _both(raw, record_iterations=record)
    assert out[1][1].summary["spec_draft_time_s"] == out[0][1].summary["spec_draft_time_s"]
    if M > 100_000:
        assert out[1][0].spec_window_iterations > 0


@pytest.mark.parametrize("example,overrides,share", [
    ("multi-lora.yaml", ["workload.num_requests=150"], 0.5),
    ("multi-lora.yaml", ["workload.num_requests=150", "lora.max_loras=16", "lora.max_cpu_loras=32"], 0.5),
    ("agentic-sessions.yaml", ["workload.conversations=20"], 0.5),
    ("speculative.yaml", ["workload.num_requests=120"], 0.5),
    # KV pressure: admissions and preemptions every few steps, so fewer steady ones
    ("speculative.yaml", ["workload.num_requests=120", "workload.rate=40", "memory.M=20000"], 0.3)])
def test_examples_take_the_fast_paths_exactly(example, overrides, share):
    """The examples' LoRA and session runs now skip most iterations in closed form, and the speculative runs
    take most steps without the scheduler, with the plain tables."""
    from pathlib import Path
    from sim.scenario.config import load_scenario
    root = Path(__file__).resolve().parent.parent / "examples"
    runs = []
    for fast in ("false", "true"):
        sim = build_simulation(load_scenario(root / example, overrides + [f"sim.fast_forward={fast}"]))
        runs.append((sim, sim.run()))
    _assert_equal_runs(*runs)
    sim, res = runs[1]
    assert sim.fast_forward_iterations > share * len(res.iterations)
