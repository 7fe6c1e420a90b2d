"""Times the default scenario and a 10,000-request Poisson scenario; prints and writes JSON figures."""
from __future__ import annotations

import argparse
import json
import platform
import time
import resource

from sim.scenario.config import load_scenario
from sim.paths import REPO_ROOT
from sim.cluster.runner import run_scenario

CASES = {
    "infermax-default (B=1024 offline, vllm)": ("examples/infermax-default.yaml", []),
    "infermax-default (B=1024 offline, sarathi)": ("examples/infermax-default.yaml", ["policy.name=sarathi"]),
    "poisson-10k (sarathi)": ("examples/poisson-10k.yaml", []),
    "poisson-10k (vllm)": ("examples/poisson-10k.yaml", ["policy.name=vllm"]),
}


def measure(path, overrides):
    scn = load_scenario(REPO_ROOT / path, overrides)
    t0 = time.perf_counter()
    res = run_scenario(scn)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # process peak so far (Linux: KiB)
    s = res.summary
    return {"requests": s["requests"], "iterations": s["iterations"], "wall_s": wall,
            "requests_per_wall_s": s["requests"] / wall, "iterations_per_wall_s": s["iterations"] / wall,
            "simulated_s": s["makespan_s"], "process_peak_rss_mib": peak_kib / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default="out/bench/core_bench.json")
    args = ap.parse_args()
    results = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
               "cases": {}}
    print(f"{'case':<45} {'reqs':>6} {'iters':>7} {'wall s':>8} {'req/s':>9} {'iter/s':>9}")
    for name, (path, ov) in CASES.items():
        r = measure(path, ov)
        results["cases"][name] = r
        print(f"{name:<45} {r['requests']:>6} {r['iterations']:>7} {r['wall_s']:>8.2f} "
              f"{r['requests_per_wall_s']:>9.0f} {r['iterations_per_wall_s']:>9.0f}")
    from pathlib import Path
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
