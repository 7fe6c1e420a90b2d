"""Closed-loop sessions: a turn arrives when the one before it completes plus its pause; history reuse; bad input."""
import pytest

from costmodels.errors import UserError
from policies import build_policy
from sim.cluster.runner import run_scenario
from sim.engine import Simulation
from sim.kv.paged import KVCacheManager
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict
from tests.helpers import TokenCost, make_requests


def test_hand_worked_two_turns():
    first, second, other = make_requests([(8, 3, 0.0), (12, 2, 0.0), (4, 2, 5.0)])
    second.after, second.think_s = first, 2.2
    sim = Simulation([first, second, other], build_policy({"name": "vllm-v1"}),
                     TokenCost(per_prefill_token=0.25, decode_step=0.5), KVCacheManager(100, 1), keep_token_times=True)
    res = sim.run()
    # turn 1: prefill 8 (1 + 2 = 3 s), two decodes of 1.5 s: completes at 6.0; turn 2 arrives at 6.0 + 2.2
    assert first.completion_s == 6.0
    assert second.arrival_s == pytest.approx(8.2)
    # the other request arrived at 5.0, mid-step: admitted at 6.0, prefill 4 tokens to 8.0, its last token at 9.5;
    # turn 2 arrived during that step and starts at 9.5: prefill 12 tokens, 1 + 3 s
    assert other.first_scheduled_s == 6.0 and other.completion_s == 9.5
    assert second.first_scheduled_s == 9.5 and second.token_times[0] == 13.5
    req = res.requests.set_index("id")
    assert req.loc[1, "ttft_s"] == pytest.approx(13.5 - 8.2)     # counted from the turn's own arrival
    assert res.summary["session_turns_released"] == 1 and res.summary["session_think_s_mean"] == 2.2


def _scn(**wl):
    w = {"kind": "multi_turn", "closed_loop": True, "conversations": 30, "start": {"process": "poisson", "rate": 2},
         "turns": {"dist": "uniform", "low": 2, "high": 6}, "system_prompt_len": 600, "user_tokens": 80,
         "output": 120, "think_time_s": 1.5, "max_model_len": 8192}
    w.update(wl)
    return scenario_from_dict({"name": "s", "seed": 1, "model": {"name": "llama-3.1-8b", "max_model_len": 8192},
                               "hardware": {"gpu": "h100-sxm"}, "policy": {"name": "vllm-v1"}, "workload": w})


def test_each_turn_waits_for_the_one_before_it_and_reuses_its_history():
    sim = build_simulation(_scn())
    res = sim.run()
    req = res.requests
    assert (req["status"] == "done").all() and (req["generated_tokens"] == req["output_tokens"]).all()
    later = [r for r in sim.all_requests if r.after is not None]
    assert later and res.summary["session_turns_released"] == len(later)
    for r in later:
        assert r.arrival_s == r.after.completion_s + r.think_s      # exactly: the timer's event time
        assert r.first_scheduled_s >= r.arrival_s
        assert r.hit_tokens >= 600                              # at least the system prompt and the history cached
    a = build_simulation(_scn()).run()
    assert a.requests.equals(res.requests) and a.iterations.equals(res.iterations)


def test_zero_pauses_and_a_pause_trace():
    res = build_simulation(_scn(think="constant", think_time_s=0)).run()
    assert res.summary["session_think_s_mean"] == 0.0
    sim = build_simulation(_scn(think=[0.5, 4.0]))
    sim.run()
    assert sorted({r.think_s for r in sim.all_requests if r.after is not None}) == [0.5, 4.0]


def test_a_turn_that_cannot_run_ends_its_session():
    t0, t1, t2 = make_requests([(8, 2), (200, 2), (8, 2)])
    t1.after, t2.after = t0, t1                          # t1 needs more KV than M: t2 is never sent
    sim = Simulation([t0, t1, t2], build_policy({"name": "vllm-v1"}), TokenCost(), KVCacheManager(100, 1))
    res = sim.run()
    assert t0.state == "done" and t1.state == "infeasible" and t2.state == "infeasible"
    assert "earlier turn of its session" in t2.reason
    assert res.summary["session_turns_abandoned"] == 1 and res.summary["session_turns_released"] == 0


@pytest.mark.parametrize("wl, fragment", [
    ({"think_time_s": -1}, "think_time_s: must be a number >= 0"),
    ({"think": [1.0, -2.0]}, "think: a list of pauses must hold numbers >= 0"),
    ({"think": "weibull"}, "think: 'weibull' is not allowed"),
    ({"closed_loop": False, "think": "constant"}, "need closed_loop: true"),
])
def test_bad_pauses_are_one_line(wl, fragment):
    with pytest.raises(UserError) as e:
        build_simulation(_scn(**wl))
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_disaggregated_cluster_refuses_closed_loop_sessions():
    scn = _scn()
    scn.cluster = {"disaggregation": {"prefill": 1, "decode": 1}}
    with pytest.raises(UserError, match="closed-loop sessions run on a serve pool"):
        run_scenario(scn)


def test_a_turn_refused_up_front_is_never_sent():
    """A later turn whose history passes max_model_len is refused before the run; its predecessor's completion
    does not send it (it used to join the queue as a refused request and never leave)."""
    scn = _scn(system_prompt_len=1500, output=400, turns={"dist": "uniform", "low": 4, "high": 7})
    scn.model.max_model_len = 3000
    sim = build_simulation(scn)
    res = sim.run()
    req = res.requests
    assert len(req) == len(sim.all_requests) and set(req["status"]) == {"done", "infeasible"}
    assert (req["status"] == "infeasible").sum() == len(sim.infeasible) > 0
    assert res.summary["session_turns_released"] == sum(1 for r in sim.all_requests
                                                        if r.after is not None and r.state == "done")
