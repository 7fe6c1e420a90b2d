"""InferMax's serial TTFT toy (§4.7): requests with given (prefill, decode) times run one at a time."""
from __future__ import annotations

import pandas as pd

from sim.scenario.config import scenario_from_dict
from sim.scenario.build import requests_from_table
from sim.cluster.runner import run_scenario

# A cost model where every token of a batch costs exactly one second: prefill time = I, decode step = 1.
UNIT_COST = {"kind": "linear", "coefficients": {"step_a": 1000.0}}   # step_* are ms per iteration


def serial_avg_ttft(jobs, first: int = 0) -> float:
    """Average TTFT when `jobs` = [(prefill_s, decode_s), ...] run serially (R_max = 1), starting with `first`.

    A job (p, d) is a request with p prompt tokens and d decode steps (output d + 1 tokens) under UNIT_COST.
    Offline ties are broken by request id, so `first` is given the lowest id."""
    order = [first] + [i for i in range(len(jobs)) if i != first]
    rows = [{"arrival_s": 0.0, "prompt_tokens": jobs[i][0], "output_tokens": jobs[i][1] + 1} for i in order]
    scn = scenario_from_dict({"costmodel": UNIT_COST, "memory": {"M": 1000, "block_size": 1},
                              "policy": {"name": "vllm", "R_max": 1}}, source="toy")
    res = run_scenario(scn, requests=requests_from_table(pd.DataFrame(rows)))
    return float(res.requests["ttft_s"].mean())
