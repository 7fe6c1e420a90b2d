"""What a lag in a least-loaded router's load reports does to a fleet run's time and balance, side by side.

The fleet case of cluster_bench.py (Poisson requests with conv-like lengths, 3 req/s per A100 replica, Sarathi,
the linear model, no iteration tables) behind least_tokens with completions seen at once and with load reports
every --intervals seconds (router.report_interval_s), and behind round-robin, whose replicas need no decisions to
wait for; each run in its own process, the variants taken in turn --repeat times, best wall time kept. One process
each (cluster.workers: 1) so that the variants compare like for like.

  PYTHONPATH=. python benchmarks/router_reports.py [--requests 100000] [--replicas 100] [--intervals 1.0,0.25]
                                                   [--repeat 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent


def _one(router: str, interval: float, args) -> dict:
    cmd = [sys.executable, str(REPO / "benchmarks" / "cluster_bench.py"), "--one",
           "fleet_rr" if router == "round_robin" else "fleet", "--requests", str(args.requests), "--replicas",
           str(args.replicas), "--router", router, "--workers", "1"]
    if interval:
        cmd += ["--report-interval", str(interval)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode:
        raise SystemExit(f"router_reports: {' '.join(cmd[2:])} failed: {out.stderr.strip().splitlines()[-1:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec["process_s"] = round(time.perf_counter() - t0, 1)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--intervals", default="1.0,0.25", help="report intervals (s) to time besides exact (0)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "router_reports.json"))
    args = ap.parse_args(argv)
    variants = [("least_tokens", 0.0)] + [("least_tokens", float(x)) for x in args.intervals.split(",") if x.strip()]
    variants.append(("round_robin", 0.0))
    best: dict = {}
    for _ in range(args.repeat):
        for router, interval in variants:
            rec = _one(router, interval, args)
            key = f"{router}" + (f" reports every {interval:g} s" if interval else "")
            if key not in best or rec["wall_s"] < best[key]["wall_s"]:
                best[key] = rec
            print(key, json.dumps(rec), flush=True)
    exact = best["least_tokens"]["wall_s"]
    for rec in best.values():
        rec["time_vs_exact"] = round(rec["wall_s"] / exact, 3)
    write_json(args.out, {"requests": args.requests, "replicas": args.replicas, "repeat": args.repeat,
                          "load_avg_1m_at_end": round(os.getloadavg()[0], 1), "runs": best})
    return 0


if __name__ == "__main__":
    sys.exit(main())
