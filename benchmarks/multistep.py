"""vLLM 0.6 multi-step scheduling in the simulator: TTFT, TPOT and throughput against num_scheduler_steps.

Llama-3-8B on one H100 (roofline v2, the `vllm` overheads), vllm-v0 without chunked prefill, a Poisson stream at
the given rates; n = 1 is plain v0. Prints one line per (rate, n) and writes JSON. What the published material
says, which these runs should show in direction (vLLM RFC #6854 and its discussion; the v0.6.0 release blog):
multi-step amortises the per-step CPU time over n steps (TPOT and throughput improve), a new request starts only
at a window's end (TTFT grows with n) and tokens reach the client in bursts of n.

  PYTHONPATH=. python benchmarks/multistep.py [--rates 10,30] [--steps 1,4,8,16] [--out benchmarks/results/multistep.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent


def run(rate: float, n: int, num_requests: int = 600) -> dict:
    from sim.scenario.build import build_simulation
    from sim.scenario.config import scenario_from_dict
    scn = scenario_from_dict({
        "name": f"multistep-{rate}-{n}", "seed": 0, "model": {"name": "llama-3-8b"}, "hardware": {"gpu": "h100-sxm"},
        "policy": {"name": "vllm-v0", "num_scheduler_steps": n}, "costmodel": {"kind": "roofline",
                                                                             "overheads": "vllm"},
        "workload": {"kind": "synthetic", "num_requests": num_requests,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt": {"dist": "uniform", "low": 100, "high": 900},
                     "output": {"dist": "uniform", "low": 50, "high": 450}}})
    t0 = time.perf_counter()
    sim = build_simulation(scn)
    sim.run()
    res = sim.result()
    s = res.summary
    return {"rate": rate, "num_scheduler_steps": n, "ttft_mean_s": round(float(s["ttft_mean"]), 4),
            "tpot_mean_s": round(float(s["tpot_mean"]), 5), "e2e_mean_s": round(float(s["e2e_mean"]), 3),
            "request_throughput": round(float(s["request_throughput"]), 3), "windows": sim.policy.windows,
            "windows_released": sim.windows_released, "wall_s": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,30")
    ap.add_argument("--steps", default="1,4,8,16")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "multistep.json"))
    args = ap.parse_args(argv)
    rows = []
    for rate in (float(x) for x in args.rates.split(",")):
        for n in (int(x) for x in args.steps.split(",")):
            r = run(rate, n)
            rows.append(r)
            print(f"rate {rate:>5} req/s  n {n:>2}: TTFT {1e3 * r['ttft_mean_s']:7.1f} ms  TPOT "
                  f"{1e3 * r['tpot_mean_s']:6.2f} ms  e2e {r['e2e_mean_s']:6.2f} s  {r['request_throughput']:6.2f} req/s"
                  f"  windows {r['windows']}", flush=True)
    write_json(args.out, {"runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
