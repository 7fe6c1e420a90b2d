"""Every valid scenario ends with each request completed or reported infeasible, never "stuck": the admission
limits (watermark, first chunk, projected peak, growth by recompute) all count."""
import numpy as np
import pandas as pd
import pytest

from benchmarks.fuzz_feasibility import random_scenario
from sim.cluster.runner import run_scenario
from sim.scenario.build import requests_from_table
from sim.scenario.config import scenario_from_dict


def _run(raw, table):
    res = run_scenario(scenario_from_dict(raw, source="test"), requests=requests_from_table(pd.DataFrame(table)))
    return res


def _raw(policy, M, block=1, watermark=None):
    mem = {"M": M, "block_size": block, **({"watermark": watermark} if watermark is not None else {})}
    return {"name": "t", "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
            "costmodel": {"kind": "linear"}, "memory": mem, "policy": policy}


def test_random_small_scenarios_never_stick_and_lose_nothing():
    rng = np.random.default_rng(7)
    for _ in range(250):
        raw, table = random_scenario(rng)
        res = run_scenario(scenario_from_dict(raw, source="fuzz"), requests=requests_from_table(table))
        assert res.summary["completed"] + len(res.meta["infeasible_ids"]) == len(table)


def test_first_chunk_must_clear_the_watermark():
    # 26 tokens, a third held back by the watermark: a 25-token prompt enters as one chunk and never fits
    res = _run(_raw({"name": "vllm-v1"}, 26, watermark=0.34),
               {"arrival_s": [0.0, 0.0], "prompt_tokens": [25, 4], "output_tokens": [1, 3]})
    assert res.meta["infeasible_ids"] == [0]
    assert "watermark" in res.meta["infeasible_reasons"].popitem()[0]
    assert res.summary["completed"] == 1


def test_lightllm_refuses_a_request_whose_projected_peak_exceeds_M():
    # prompt + output - 1 = 31 fits M = 31, but LightLLM projects prompt + output = 32 and would wait forever
    res = _run(_raw({"name": "lightllm"}, 31),
               {"arrival_s": [0.0, 0.1], "prompt_tokens": [22, 5], "output_tokens": [10, 5]})
    assert res.meta["infeasible_ids"] == [0]
    assert "projected peak" in next(iter(res.meta["infeasible_reasons"]))


def test_growth_by_recompute_past_the_watermark_is_dropped_mid_run():
    # M = 40 with 12 tokens held back for admission. B (prompt 18) is admitted beside A; when the two fill M, B
    # (the latest) is preempted by recompute holding 28 tokens, and resuming needs prompt + generated = 29 > 28:
    # vLLM v0 ignores such a sequence, so it is dropped as infeasible instead of the run ending stuck.
    raw = _raw({"name": "vllm-v0", "preemption_mode": "recompute"}, 40, watermark=0.3)
    res = _run(raw, {"arrival_s": [0.0, 0.001], "prompt_tokens": [2, 18], "output_tokens": [30, 20]})
    assert res.meta["infeasible_ids"] == [1]
    assert "after a preemption" in next(iter(res.meta["infeasible_reasons"]))
    assert res.summary["completed"] == 1 and res.summary["evictions"] == 1
    # one token less of prompt and B resumes within the limit: both complete
    res = _run(raw, {"arrival_s": [0.0, 0.001], "prompt_tokens": [2, 17], "output_tokens": [30, 20]})
    assert res.meta["infeasible_ids"] == [] and res.summary["completed"] == 2


def test_a_mid_run_drop_on_a_replica_leaves_the_router_count_right():
    # two replicas behind least-requests; each gets the pair that strands its second request after a preemption
    raw = _raw({"name": "vllm-v0", "preemption_mode": "recompute"}, 40, watermark=0.3)
    raw["cluster"] = {"replicas": 2, "router": "least_requests"}
    res = _run(raw, {"arrival_s": [0.0, 0.0, 0.001, 0.001], "prompt_tokens": [2, 2, 18, 18],
                     "output_tokens": [30, 30, 20, 20]})
    assert res.summary["completed"] + len(res.meta["infeasible_ids"]) == 4
    assert sorted(res.meta["infeasible_ids"]) == [2, 3]
    assert all("after a preemption" in k for k in res.meta["infeasible_reasons"])
