"""Prefix-caching speed benchmark: the same runs with automatic prefix caching on and off, wall time side by side.

Cases (vLLM v1 scheduler, Llama-2-7B on one H100 SXM, M as vLLM would size it):
  azure   the Azure LLM 2023 conv trace (19,366 requests, its own arrival times; no prefix identity, so caching on
          costs only its bookkeeping)
  shared  100,000 inference-perf shared_prefix requests (10 system prompts x 20 users, 100-token system prompts,
          400-token questions, 200-token outputs, constant stages at 20 req/s): nearly every prompt hits

Each configuration runs in this process, best of --repeat runs; the ratio on/off is what the issue bounds (≤ 1.5).

  PYTHONPATH=. python benchmarks/prefix_cache_bench.py [--cases azure,shared] [--repeat 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent
CONV_CSV = "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
SHARED = {"kind": "shared_prefix", "num_groups": 10, "num_prompts_per_group": 20, "system_prompt_len": 100,
          "question_len": 400, "output_len": 200, "template_tokens": 25,
          "stages": [{"rate": 20.0, "duration": 5000}]}


def scenario(case: str, caching: bool) -> dict:
    base = {"name": f"{case}-{'on' if caching else 'off'}", "seed": 0, "model": {"name": "llama-2-7b"},
            "hardware": {"gpu": "h100-sxm"}, "policy": {"name": "vllm-v1"},
            "memory": {"prefix_caching": caching}, "sim": {"record_iterations": False}}
    if case == "azure":
        from sim.paths import shared_data_dir
        root = shared_data_dir()
        if root is None or not (root / CONV_CSV).exists():
            return None
        base["workload"] = {"kind": "trace", "format": "azure", "path": str(root / CONV_CSV)}
    else:
        base["workload"] = dict(SHARED)
    return base


def run_case(case: str, repeat: int) -> dict | None:
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    out = {}
    for caching in (False, True):
        raw = scenario(case, caching)
        if raw is None:
            return None
        best, res = float("inf"), None
        for _ in range(repeat):
            t0 = time.perf_counter()
            res = run_scenario(scenario_from_dict(raw))
            best = min(best, time.perf_counter() - t0)
        s = res.summary
        out["on" if caching else "off"] = {
            "wall_s": round(best, 3), "requests": int(s["requests"]), "completed": int(s["completed"]),
            "iterations": int(s["iterations"]), "prefix_hit_rate": round(float(s.get("prefix_hit_rate", 0.0)), 4),
            "ttft_mean_s": round(float(s["ttft_mean"]), 5), "M": int(res.capacity_tokens)}
    out["ratio_on_over_off"] = round(out["on"]["wall_s"] / out["off"]["wall_s"], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="azure,shared")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "prefix_cache.json"))
    args = ap.parse_args(argv)
    results = {}
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        r = run_case(case, args.repeat)
        if r is None:
            print(f"{case}: skipped (../shared/data traces are absent)")
            continue
        results[case] = r
        print(f"{case:<7} off {r['off']['wall_s']:7.2f} s ({r['off']['iterations']} iterations)   on "
              f"{r['on']['wall_s']:7.2f} s ({r['on']['iterations']} iterations, hit rate "
              f"{r['on']['prefix_hit_rate']:.3f})   on/off {r['ratio_on_over_off']:.2f}x")
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
