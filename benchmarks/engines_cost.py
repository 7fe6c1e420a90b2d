"""What each 2026-engine feature costs to simulate: the same example with the feature on and off, wall time side by side.

Cases (each an example file, its feature turned off by one override):
  speculative       examples/speculative.yaml            off: speculative=null
  sglang-radix      examples/sglang-radix.yaml (sglang)  off: the same scheduler, prefix caching off
  multi-lora        examples/multi-lora.yaml             off: lora=null
  disk-tier         examples/sglang-radix.yaml on vLLM v1 with CPU and disk tiers   off: no disk tier
  sessions          examples/agentic-sessions.yaml       off: closed_loop false (the same turns, open loop)
Best of --repeat runs each, in this process, the runs with and without the feature taken in turn; the ratio on/off
is what issue #32 bounds (<= 1.3). Features that turn the exact fast paths off (speculation, LoRA, sessions) are
also timed against the off run without them (sim.fast_forward false), which isolates the feature's own work.

  PYTHONPATH=. python benchmarks/engines_cost.py [--repeat 3] [--cases speculative,...] [--out FILE]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent
DISK = ["policy.name=vllm-v1", "memory.cpu_offload_gib=1", "memory.disk_offload_gib=20", "memory.disk_gb_per_s=20"]
CASES = {
    "speculative": ("speculative.yaml", [], ["speculative=null"], True),
    "sglang-radix": ("sglang-radix.yaml", ["policy.name=sglang"], ["policy.name=sglang", "memory.prefix_caching=false"],
                     False),
    "multi-lora": ("multi-lora.yaml", ["lora.max_loras=16", "lora.max_cpu_loras=32"], ["lora=null"], True),
    "disk-tier": ("sglang-radix.yaml", DISK, DISK[:2] + ["memory.disk_offload_gib=0"], False),
    "sessions": ("agentic-sessions.yaml", [], ["workload.closed_loop=false"], True),
}


def _once(name, overrides):
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import load_scenario
    scn = load_scenario(REPO / "examples" / name, overrides)
    t0 = time.perf_counter()
    res = run_scenario(scn)
    return time.perf_counter() - t0, res.summary


def timed(name, variants, repeat):
    """Best of `repeat` wall times of each variant (a list of overrides), the variants run in turn each round so
    that a machine that slows down or speeds up during the benchmark weighs on all of them alike."""
    best, summaries = [float("inf")] * len(variants), [None] * len(variants)
    for _ in range(repeat):
        for i, overrides in enumerate(variants):
            t, summaries[i] = _once(name, overrides)
            best[i] = min(best[i], t)
    return best, summaries


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (default: all)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engines_cost.json"))
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    rows = {}
    for case in cases:
        name, on, off, slow_paths = CASES[case]
        variants = [on, off] + ([off + ["sim.fast_forward=false"]] if slow_paths else [])
        times, summaries = timed(name, variants, args.repeat)
        (t_on, t_off), (s_on, s_off) = times[:2], summaries[:2]
        row = {"on_s": round(t_on, 4), "off_s": round(t_off, 4), "ratio": round(t_on / t_off, 3),
               "iterations_on": int(s_on["iterations"]), "iterations_off": int(s_off["iterations"])}
        if slow_paths:
            row["off_plain_loop_s"] = round(times[2], 4)
            row["ratio_plain_loop"] = round(t_on / times[2], 3)
        rows[case] = row
        extra = f", {row['ratio_plain_loop']}x the plain loop" if slow_paths else ""
        print(f"{case:<13} on {t_on:.3f} s, off {t_off:.3f} s: {row['ratio']}x{extra} "
              f"(iterations {row['iterations_on']} / {row['iterations_off']})")
    write_json(args.out, {"cases": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
