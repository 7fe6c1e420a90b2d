"""Speculative decoding benchmark: the speedup against acceptance rate and load, and what the feature costs to simulate.

examples/speculative.yaml (vLLM v1, Llama-3.1-8B on one H100 SXM, EAGLE-style head, k = 3) at three Poisson rates,
each without speculation and at acceptance rates 0 ... 0.9: mean TPOT, TTFT and output tokens/s, and TPOT's ratio
to the same load without speculation (above 1: speculation helps). Then the simulator's own cost: wall time of the
run with speculation on against off, best of --repeat, in this process (the fast paths are off with speculation, so
off is also timed with sim.fast_forward false), with the iteration counts (speculation changes how many there are).

  PYTHONPATH=. python benchmarks/speculative_bench.py [--rates 4,16,40] [--repeat 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent
RATES = (0.0, 0.3, 0.5, 0.7, 0.9)


def run(overrides, repeat=1):
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import load_scenario
    best, res = float("inf"), None
    for _ in range(repeat):
        scn = load_scenario(REPO / "examples" / "speculative.yaml", overrides)
        t0 = time.perf_counter()
        res = run_scenario(scn)
        best = min(best, time.perf_counter() - t0)
    return res.summary, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="4,16,40")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "speculative.json"))
    args = ap.parse_args(argv)
    rows = []
    print(f"{'rate':>5} {'accept':>7} {'tpot_ms':>8} {'ttft_s':>7} {'tok/s':>7} {'tok/step':>8} {'TPOT gain':>9}")
    for rate in [float(x) for x in args.rates.split(",")]:
        base, _ = run([f"workload.rate={rate}", "speculative=null"])
        for a in (None,) + RATES:
            s = base if a is None else run([f"workload.rate={rate}", f"speculative.acceptance_rate={a}"])[0]
            gain = base["tpot_mean"] / s["tpot_mean"]
            row = {"rate": rate, "acceptance": a, "tpot_mean_s": s["tpot_mean"], "ttft_mean_s": s["ttft_mean"],
                   "tps": s["tps"], "tokens_per_step": s.get("spec_tokens_per_step", 1.0), "tpot_gain": gain,
                   "evictions": s["evictions"]}
            rows.append(row)
            print(f"{rate:>5g} {'off' if a is None else a:>7} {1e3 * s['tpot_mean']:>8.2f} {s['ttft_mean']:>7.3f} "
                  f"{s['tps']:>7.0f} {row['tokens_per_step']:>8.2f} {gain:>8.2f}x")
    speed = {}
    for label, over in (("on", []), ("off", ["speculative=null"]),
                        ("off_plain_loop", ["speculative=null", "sim.fast_forward=false"])):
        s, wall = run(over + ["workload.rate=16"], args.repeat)
        speed[label] = {"wall_s": round(wall, 4), "iterations": int(s["iterations"]),
                        "us_per_iteration": round(1e6 * wall / s["iterations"], 2)}
    on, off, plain = speed["on"], speed["off"], speed["off_plain_loop"]
    speed["ratio_on_off"] = round(on["wall_s"] / off["wall_s"], 3)
    speed["ratio_on_off_plain_loop"] = round(on["wall_s"] / plain["wall_s"], 3)
    speed["ratio_per_iteration_plain_loop"] = round(on["us_per_iteration"] / plain["us_per_iteration"], 3)
    print(f"simulator cost at rate 16 (best of {args.repeat}): on {on['wall_s']} s ({on['iterations']} iterations), "
          f"off {off['wall_s']} s with the fast paths, {plain['wall_s']} s without ({plain['iterations']} "
          f"iterations); on/off {speed['ratio_on_off']}x, on/off-plain {speed['ratio_on_off_plain_loop']}x, "
          f"per iteration {speed['ratio_per_iteration_plain_loop']}x")
    write_json(args.out, {"example": "examples/speculative.yaml", "rows": rows, "speed": speed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
