"""Random valid scenarios must end with every request completed or reported infeasible, never "stuck": the
admission limits (watermark, reservations, max_model_len, chunk sizes) all count in the feasibility check.
Prints the tally and writes benchmarks/results/fuzz_feasibility.json.

    PYTHONPATH=. python benchmarks/fuzz_feasibility.py [N]      # N random scenarios (default 5000)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from policies import POLICIES
from sim.cluster.runner import run_scenario
from sim.errors import SimulationStuck
from sim.scenario.build import requests_from_table
from sim.scenario.config import scenario_from_dict

OUT = Path(__file__).resolve().parent / "results" / "fuzz_feasibility.json"


def random_scenario(rng: np.random.Generator) -> tuple[dict, pd.DataFrame]:
    """Small memories next to long requests, so the limits bind: M a few blocks to a few thousand tokens, prompts
    and outputs up to and beyond it, watermarks up to a third of the blocks, max_model_len sometimes set."""
    block = int(rng.choice([1, 8, 16, 32]))
    M = int(rng.integers(2, 200)) * block
    policy = {"name": str(rng.choice(sorted(POLICIES)))}
    if rng.random() < 0.3 and policy["name"] in ("vllm-v0", "orca", "vllm", "sarathi", "vllm-v1"):
        policy["max_model_len"] = int(rng.integers(1, 2 * M))
    memory = {"M": M, "block_size": block}
    if rng.random() < 0.5:
        memory["watermark"] = float(rng.choice([0.0, 0.01, 0.05, 0.2, 0.34]))
    n = int(rng.integers(1, 12))
    top = int(M * rng.choice([0.3, 1.0, 1.5]))
    table = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 2, n)),
                          "prompt_tokens": rng.integers(1, max(2, top), n),
                          "output_tokens": rng.integers(1, max(2, top // 2), n)})
    raw = {"name": "fuzz", "seed": int(rng.integers(1 << 30)), "model": {"name": "llama-2-7b"},
           "hardware": {"gpu": "a100-80gb"}, "costmodel": {"kind": "linear"}, "memory": memory, "policy": policy,
           "sim": {"watchdog_iterations": 20_000}}
    return raw, table


def main(n: int = 5000) -> dict:
    rng = np.random.default_rng(0)
    tally = {"completed_all": 0, "some_infeasible": 0, "stuck": 0, "config_errors": 0, "lost": 0}
    stuck = []
    t0 = time.perf_counter()
    for i in range(n):
        raw, table = random_scenario(rng)
        try:
            scn = scenario_from_dict(raw, source="fuzz")
        except Exception:           # a knob this policy does not take: a one-line config error, not a run
            tally["config_errors"] += 1
            continue
        try:
            res = run_scenario(scn, requests=requests_from_table(table))
        except SimulationStuck as e:
            tally["stuck"] += 1
            stuck.append({"scenario": raw, "requests": table.to_dict("list"), "error": str(e)[:300]})
            continue
        s = res.summary
        if s["completed"] + len(res.meta["infeasible_ids"]) != len(table):
            tally["lost"] += 1
        tally["some_infeasible" if res.meta["infeasible_ids"] else "completed_all"] += 1
    out = {"scenarios": n, **tally, "wall_s": time.perf_counter() - t0, "stuck_examples": stuck[:5]}
    print(json.dumps({k: v for k, v in out.items() if k != "stuck_examples"}))
    for ex in stuck[:5]:
        print("stuck:", ex["scenario"]["policy"], ex["scenario"]["memory"], ex["error"][:200])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
