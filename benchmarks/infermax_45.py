"""InferMax §4.5 grid: O = B = 4, I ∈ {1, 2, 4, …, 1024}, M = max(2I, I+O−1); optimum with and without evictions.

Prints a table and writes benchmarks/results/infermax_45.json. Usage:
    PYTHONPATH=. python benchmarks/infermax_45.py [--time-limit 30] [--I 1,2,4,...] [--backend auto]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solver.section45 import B, O, paper_costmodel, section45_point


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--I", default="1,2,4,8,16,32,64,128,256,512,1024")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", default="benchmarks/results/infermax_45.json")
    a = ap.parse_args(argv)
    cm = paper_costmodel()
    rows = []
    hdr = (f"{'I':>5} {'M':>5} | {'opt(evict) ms':>13} {'bound':>8} {'gap':>8} {'s':>5} {'#ev':>3} | {'opt(ef) ms':>10} "
           f"{'bound':>8} {'gap':>8} {'s':>5} | {'saved':>7} {'ev-preset loss':>14} | closest preset")
    print(hdr)
    t0 = time.perf_counter()
    for I in [int(x) for x in a.I.split(",")]:
        r = section45_point(I, a.time_limit, a.backend, cm)
        rows.append(r)
        ev, ef = r["evict"], r["ef"]
        print(f"{I:>5} {r['M']:>5} | {1e3 * ev['value_s']:>13.3f} {1e3 * ev['bound_s']:>8.3f} {_gap(ev):>8} "
              f"{ev['solve_s']:>5.1f} {ev['evictions']:>3} | {1e3 * ef['value_s']:>10.3f} {1e3 * ef['bound_s']:>8.3f} "
              f"{_gap(ef):>8} {ef['solve_s']:>5.1f} | "
              f"{100 * r['saved_vs_ef_opt']:>6.1f}% {100 * r['evicting_preset_loss_vs_ef_opt']:>13.1f}% | "
              f"{r['closest_preset']} (+{abs(100 * r['closest_preset_gap']):.1f}%)", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"time_limit_s": a.time_limit, "O": O, "B": B, "wall_s": time.perf_counter() - t0,
                               "rows": rows}, indent=1, default=float))
    print(f"wrote {out}")


def _gap(part: dict) -> str:
    """'proven' at the solvers' tolerance, else the relative gap with enough digits to tell 0.001 % from 0."""
    return "proven" if part["status"] == "optimal" else f"{100 * part['gap']:.4f}%"


if __name__ == "__main__":
    main()
