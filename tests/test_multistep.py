"""vLLM 0.6 multi-step scheduling (vllm-v0 `num_scheduler_steps`): n decode steps per decision, output released at
the window's end, arrivals waiting for it, the scheduler's CPU time paid once per window."""
import pytest

from costmodels.errors import UserError
from sim.engine.request import Request
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict

STEP_S = 0.004


def _run(n, reqs, plain=False):
    scn = scenario_from_dict({
        "name": "ms", "model": {"name": "llama-3-8b"}, "hardware": {"gpu": "h100-sxm"},
        "policy": {"name": "vllm-v0", "num_scheduler_steps": n}, "memory": {"M": 100000},
        "costmodel": {"kind": "roofline", "overheads": {"step_s": STEP_S}},
        "workload": {"kind": "synthetic", "num_requests": 1},
        "sim": {"keep_token_times": True, **({"fast_forward": False} if plain else {})}})
    sim = build_simulation(scn, [Request(i, a, p, o) for i, (a, p, o) in enumerate(reqs)])
    sim.run()
    return sim


def _runs(times):
    """Lengths of the runs of equal consecutive values."""
    out, k = [], 1
    for a, b in zip(times, times[1:]):
        if a == b:
            k += 1
        else:
            out.append(k)
            k = 1
    return out + [k]


def test_decode_tokens_reach_the_client_in_bursts_of_the_window():
    """One request, 100 output tokens, n = 8: its prefill step releases the first token alone (v0 gives prompts
    no lookahead), then every decision runs 8 decode steps whose 8 tokens share one release time; 99 = 12·8 + 3,
    the last window cut short by the request's end."""
    sim = _run(8, [(0.0, 200, 100)])
    r = sim.all_requests[0]
    times = r.token_times
    assert len(times) == 100
    assert _runs(times) == [1] + [8] * 12 + [3]
    assert sim.policy.windows == 13 and sim.windows_released == 13
    assert r.completion_s == times[-1] and r.first_token_s == times[0]
    one = _run(1, [(0.0, 200, 100)]).all_requests[0]
    assert _runs(one.token_times) == [1] * 100 and _run(1, [(0.0, 200, 100)]).policy.windows == 0


def test_a_request_arriving_inside_a_window_waits_for_its_end():
    """B arrives just after A's first decode window starts: it is scheduled only when that window's tokens are
    released, n - 1 steps later, so its TTFT grows with n."""
    a = (0.0, 200, 300)
    one = _run(1, [a])
    t_start = one.all_requests[0].token_times[1] - 1e-6      # inside the first decode step
    b = (t_start, 100, 20)
    for n in (1, 4, 8):
        sim = _run(n, [a, b])
        ra, rb = sim.all_requests
        releases = sorted(set(ra.token_times))
        assert rb.first_scheduled_s in releases                # decisions happen only where a window ended
        if n > 1:
            waited = rb.first_scheduled_s - rb.arrival_s
            assert waited > (n - 2) * 0.005                    # at least n - 2 decode steps of ~5+ ms
    ttft = {n: _run(n, [a, b]).all_requests[1] for n in (1, 8)}
    assert ttft[8].first_token_s - ttft[8].arrival_s > ttft[1].first_token_s - ttft[1].arrival_s


def test_the_scheduler_cpu_time_is_paid_once_per_window():
    """The engine's per-step CPU time (step_s) is charged on a decision's step only: in a decode-only stretch of
    one request with n = 4, every fourth step is STEP_S longer than the three that repeat it."""
    sim = _run(4, [(0.0, 200, 41)])
    it = sim.iters
    d = list(it["duration_s"][1:])                            # after the prefill step: 10 windows of 4 steps
    assert len(d) == 40
    for w in range(10):
        first, rest = d[4 * w], d[4 * w + 1: 4 * w + 4]
        for x in rest:
            assert first - x == pytest.approx(STEP_S, abs=2e-6)  # contexts grow by a token: sub-microsecond drift


def test_plain_and_fast_loops_agree_with_multi_step():
    reqs = [(0.0, 300, 120), (0.01, 50, 40), (0.05, 500, 80), (0.3, 120, 200)]
    fast, plain = _run(8, reqs), _run(8, reqs, plain=True)
    for x, y in zip(fast.all_requests, plain.all_requests):
        assert x.token_times == y.token_times and x.completion_s == y.completion_s


@pytest.mark.parametrize("knobs,message", [
    ({"num_scheduler_steps": 0}, "num_scheduler_steps: must be an integer >= 1"),
    ({"num_scheduler_steps": 4, "enable_chunked_prefill": True}, "runs without chunked prefill"),
])
def test_bad_multi_step_knobs_are_one_line(knobs, message):
    from policies import build_policy
    with pytest.raises(UserError, match=message):
        build_policy({"name": "vllm-v0", **knobs})
