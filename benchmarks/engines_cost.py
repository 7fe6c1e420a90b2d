"""What each 2026-engine feature costs to simulate: the same example with the feature on and off, side by side.

Cases (each an example file, its feature turned off by one override):
  speculative       examples/speculative.yaml            off: speculative=null
  sglang-radix      examples/sglang-radix.yaml (sglang)  off: the same scheduler, prefix caching off
  multi-lora        examples/multi-lora.yaml             off: lora=null
  disk-tier         examples/sglang-radix.yaml on vLLM v1 with CPU and disk tiers   off: no disk tier
  sessions          examples/agentic-sessions.yaml       off: closed_loop false (the same turns, open loop)
Best of --repeat runs each, in this process, the runs with and without the feature taken in turn; the ratio on/off
is what issue #32 bounds (<= 1.3). Features that turn the exact fast paths off (speculation, LoRA, sessions) are
also timed against the off run without them (sim.fast_forward false), which isolates the feature's own work.

Wall clock on a shared 2-core host drifts by a third between runs of the same code; --instructions counts instead
what a run executes (valgrind's callgrind, which must be installed): a process loading and running the example
three times less one running it once, halved, so imports and set-up cancel; hash seed and BLAS threads fixed (an
idle OpenBLAS thread's spinning made counts vary by tens of millions), so the counts repeat to the instruction.
--set adds overrides to both variants (e.g. a heavier load: --set workload.rate=16).

  PYTHONPATH=. python benchmarks/engines_cost.py [--repeat 3] [--cases speculative,...] [--set K=V ...]
                                                 [--instructions] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
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


# run in a child under callgrind: load and run the example `runs` times
_CHILD = """import sys
sys.path.insert(0, sys.argv[1])
from sim.cluster.runner import run_scenario
from sim.scenario.config import load_scenario
for _ in range(int(sys.argv[3])):
    run_scenario(load_scenario(sys.argv[2], sys.argv[4:]))
"""


def _instructions(path, overrides, runs):
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", _CHILD,
           str(REPO), str(path), str(runs), *overrides]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        said = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("==")]
        raise SystemExit(f"engines_cost: callgrind run of {path.name} {' '.join(overrides)} failed: "
                         f"{said[-1] if said else f'exit status {out.returncode}'}")
    return int(found.group(1))


def counted(name, variants):
    """Instructions per run of each variant: (three runs - one run) / 2 in one process each."""
    path = REPO / "examples" / name
    return [(_instructions(path, v, 3) - _instructions(path, v, 1)) // 2 for v in variants]


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
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for both variants")
    ap.add_argument("--instructions", action="store_true", help="count instructions with callgrind instead")
    ap.add_argument("--out", default=None,
                    help="JSON out (default benchmarks/results/engines_cost.json, or engines_cost_instructions.json)")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    bad = [kv for kv in args.set if "=" not in kv]
    if bad:
        ap.error(f"--set: {bad[0]!r} is not KEY=VALUE")
    results = REPO / "benchmarks" / "results"
    if args.instructions:
        if shutil.which("valgrind") is None:
            ap.error("--instructions needs valgrind (callgrind) on PATH; it is not installed here")
        rows = {}
        for case in cases:
            name, on, off, _ = CASES[case]
            n_on, n_off = counted(name, [on + args.set, off + args.set])
            rows[case] = {"on_instructions": n_on, "off_instructions": n_off, "ratio": round(n_on / n_off, 3)}
            print(f"{case:<13} on {n_on / 1e6:,.0f}M, off {n_off / 1e6:,.0f}M instructions: {rows[case]['ratio']}x")
        write_json(args.out or results / "engines_cost_instructions.json", {"cases": rows, "set": args.set})
        return 0
    rows = {}
    for case in cases:
        name, on, off, slow_paths = CASES[case]
        on, off = on + args.set, off + args.set
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
    write_json(args.out or results / "engines_cost.json", {"cases": rows, "set": args.set})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
