"""Solve time and MIP gap against the number of requests (2 … 32), per backend, under a fixed time limit.

Offline workload, prompts uniform in [16, 64], outputs uniform in [2, 8] (seeded), M = half the requests' total
peak KV (so memory is contended and evictions are on the table). Prints a table and writes
benchmarks/results/solver_scaling.json. Usage:
    PYTHONPATH=. python benchmarks/solver_scaling.py [--time-limit 20] [--n 2,4,8,16,32]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from costmodels.errors import UserError
from costmodels.linear import LinearCostModel, default_profile_path
from solver.backends import gurobi_importable
from solver.instance import SolverInstance, SolverOptions
from solver.solve import run_presets, solve


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def instance(n, seed, cm, backend, time_limit):
    rng = np.random.default_rng(seed)
    prompt = [int(v) for v in rng.integers(16, 65, n)]
    output = [int(v) for v in rng.integers(2, 9, n)]
    M = max(max(p + o - 1 for p, o in zip(prompt, output)), sum(p + o - 1 for p, o in zip(prompt, output)) // 2)
    opt = SolverOptions(backend=backend, time_limit_s=time_limit)
    return SolverInstance(prompt, output, [0.0] * n, M, opt, cm)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--n", default="2,4,8,16,32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default="",
                    help="comma-separated (default: highs, plus gurobi and cpsat where importable)")
    ap.add_argument("--out", default="benchmarks/results/solver_scaling.json")
    a = ap.parse_args(argv)
    cm = LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"), features="paper")
    backends = a.backends.split(",") if a.backends else (["highs"] + (["gurobi"] if gurobi_importable() else [])
                                                         + (["cpsat"] if _importable("ortools") else []))
    rows = []
    print(f"{'backend':<8} {'n':>3} {'J':>4} {'vars':>7} {'rows':>7} {'status':<11} {'solve s':>8} {'best ms':>9} "
          f"{'bound ms':>9} {'gap':>7} {'best preset ms':>14}")
    for backend in backends:
        for n in [int(x) for x in a.n.split(",")]:
            inst = instance(n, a.seed, cm, backend, a.time_limit)
            t0 = time.perf_counter()
            presets = run_presets(inst, inst.options.presets)
            try:
                r = solve(inst, presets)
            except UserError as e:
                rows.append({"backend": backend, "n": n, "status": "not run", "reason": str(e)})
                print(f"{backend:<8} {n:>3} not run: {e}", flush=True)
                continue
            wall = time.perf_counter() - t0
            best = min(p.value_s for p in presets if p.value_s == p.value_s)
            row = {"backend": r.backend, "n": n, "horizon": r.horizon, **r.model_size, "status": r.status,
                   "solve_s": r.solve_time_s, "wall_s": wall, "incumbent_s": r.incumbent_s, "bound_s": r.bound_s,
                   "gap": r.gap, "best_preset_s": best, "evictions": r.evictions, "replay_rel_err": r.replay_rel_err}
            rows.append(row)
            print(f"{r.backend:<8} {n:>3} {r.horizon:>4} {r.model_size['variables']:>7} "
                  f"{r.model_size['constraints']:>7} {r.status:<11} {r.solve_time_s:>8.2f} "
                  f"{1e3 * r.incumbent_s:>9.3f} {1e3 * r.bound_s:>9.3f} {100 * r.gap:>6.2f}% {1e3 * best:>14.3f}",
                  flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"time_limit_s": a.time_limit, "threads": 1, "machine": platform.processor() or
                               platform.machine(), "rows": rows}, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
