"""Per-iteration optimality of Apt-Serve's greedy knapsack: replay knapsacks recorded in a loaded run and solve
each exactly (DP, solver/aptserve_knapsack.py). Prints the gap distribution and writes
benchmarks/results/aptserve_greedy_gap.json.  Usage: PYTHONPATH=. python benchmarks/aptserve_greedy_gap.py"""
import argparse
import json
from pathlib import Path

from study.findings.aptbros import greedy_gap


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--samples", type=int, default=150)
    args = ap.parse_args()
    out = greedy_gap(args.rate, args.requests, args.samples)
    print(json.dumps(out, indent=1))
    path = Path("benchmarks/results/aptserve_greedy_gap.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
