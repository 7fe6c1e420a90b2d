"""Wall time of the InferMax Figure 9 example sweep (220 runs) with local worker processes; prints and writes JSON."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from study.sweep import load_sweep, run_sweep  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, nargs="+", default=[2], help="worker counts to time (default 2)")
    ap.add_argument("--sweep", default=str(REPO / "examples/sweeps/infermax-fig9.yaml"))
    ap.add_argument("--json", default=str(REPO / "out/bench/sweep_fig9.json"), help="where to write the figures")
    args = ap.parse_args(argv)
    spec = load_sweep(args.sweep)
    results = []
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as out:          # a fresh store: every point really runs
            t0 = time.perf_counter()
            res = run_sweep(spec, out, jobs=jobs, progress=False)
            wall = time.perf_counter() - t0
        df = res.table
        ok = df[df["status"] == "ok"]
        entry = {"jobs": jobs, "points": len(df), "ran": res.ran, "errors": int((df["status"] == "error").sum()),
                 "points_with_infeasible_requests": int((ok["infeasible"] > 0).sum()),
                 "wall_s": round(wall, 2), "sum_run_wall_s": round(float(df["wall_s"].sum()), 2),
                 "runs_per_s": round(len(df) / wall, 2)}
        results.append(entry)
        print(f"infermax-fig9 sweep: {entry['points']} runs, --jobs {jobs}: {entry['wall_s']:.1f} s wall "
              f"({entry['sum_run_wall_s']:.1f} s of runs, {entry['runs_per_s']:.2f} runs/s, "
              f"{entry['errors']} errors, {entry['points_with_infeasible_requests']} points with infeasible requests)")
    doc = {"benchmark": "sweep_fig9", "sweep": os.path.relpath(args.sweep, REPO), "results": results,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                       "load_avg_1m": os.getloadavg()[0]}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
