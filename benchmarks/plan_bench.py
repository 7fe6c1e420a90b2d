"""Times `servesim plan` over GPU kinds x TP 1/2/4 x co-located/P:D on one hour of the Azure conversation trace
(examples/fleet-azure-conv.yaml), with local worker processes and optionally on a local Dask cluster; prints the
answer, the runs it took and the wall time, and writes benchmarks/results/plan_bench.json.

    .venv/bin/python benchmarks/plan_bench.py [--rate 20] [--jobs 2] [--dask] [--seeds 0,1]"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from sim.paths import shared_data_dir  # noqa: E402


def plan_once(args, out: Path, dask: bool) -> dict:
    from sim.cli import main
    argv = ["plan", str(ROOT / "examples" / "fleet-azure-conv.yaml"), "--rate", str(args.rate),
            "--gpus", args.gpus, "--tp", args.tp, "--pd", args.pd, "--seeds", args.seeds,
            "--jobs", str(args.jobs), "--out", str(out)]
    if dask:
        argv += ["--dask", "local"]
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    wall = time.perf_counter() - t0
    print(buf.getvalue())
    ans = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else {}
    ev = pd.read_csv(out / "evaluations.csv") if (out / "evaluations.csv").exists() else pd.DataFrame()
    # the machine is shared: CPU seconds of the cluster runs say what the plan costs whatever the load
    cpu = float(ev["cpu_s"].sum()) if "cpu_s" in ev else float("nan")
    by_mode = ev.groupby("mode")["cpu_s"].agg(["count", "sum"]).round(1).to_dict("index") if len(ev) else {}
    return {"rc": rc, "wall_s": wall, "cluster_runs_cpu_s": cpu,
            "capacity_bounds_cpu_s": ans.get("cpu_s", {}).get("capacity_bounds"), "cpu_by_mode": by_mode,
            "load_average_after": os.getloadavg(), "answer": ans, "argv": argv[1:]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--gpus", default="a100-80gb,h100-sxm,l40s")
    p.add_argument("--tp", default="1,2,4")
    p.add_argument("--pd", default="colocated,1:2")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--dask", action="store_true", help="also time the same plan on a local Dask cluster")
    args = p.parse_args()
    if shared_data_dir() is None:
        print("plan_bench: skipped, ../shared/data (the Azure trace) is absent")
        return 0
    out = ROOT / "out" / "plan-bench"
    res = {"processes": plan_once(args, out / "processes", False)}
    if args.dask:
        res["dask"] = plan_once(args, out / "dask", True)
        res["dask_speedup"] = res["processes"]["wall_s"] / res["dask"]["wall_s"]
    for k, r in res.items():
        if isinstance(r, dict):
            a = r["answer"]
            print(f"{k}: {r['wall_s']:.1f} s wall ({r['capacity_bounds_cpu_s']:.0f} CPU-s in capacity bounds, "
                  f"{r['cluster_runs_cpu_s']:.0f} CPU-s in cluster runs, load "
                  f"{r['load_average_after'][0]:.1f}), {a.get('evaluations')} runs, {a.get('configurations')} configurations "
                  f"searched, pruned {len(a.get('pruned', []))}; answer {a.get('config')} {a.get('layout')} "
                  f"${a.get('usd_per_hour', float('nan')):.2f}/h, attainment {a.get('attainment', float('nan')):.3f} "
                  f"[{a.get('attainment_lo', float('nan')):.3f}, {a.get('attainment_hi', float('nan')):.3f}]")
    path = ROOT / "benchmarks" / "results" / "plan_bench.json"
    path.write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
