"""Simulation-speed benchmark: requests and iterations per wall-second and peak memory, printed and written as JSON.

Cases (each runs in its own process so peak RSS and whole-process time are clean):
  azure    the Azure LLM 2023 conv trace (19,366 requests, real arrival times), Llama-2-7B on one A100
  poisson  10,000 Poisson requests (examples/poisson-10k.yaml: rate 8/s, prompts 64-1024, outputs 16-512)
  million  1,000,000 Poisson requests with conv-like log-normal lengths, per-iteration records off
  offline  (opt-in) 1,024 requests at t=0, 128 prompt / 1,024 output tokens, M = 1.2M: a decode-heavy run

  cli      the whole `servesim run examples/azure-conv.yaml --out DIR` process (imports, run, CSV tables),
           repeated; the median and range are printed

Figures are this host's only; no ratio to another tool is printed (that needs the other tool timed side by side).

  PYTHONPATH=. python benchmarks/speed.py                       # azure + poisson × vllm, sarathi, vllm-v1; million × sarathi
  PYTHONPATH=. python benchmarks/speed.py --cases azure --presets sarathi --compare   # also the plain loop
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONV_CSV = "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
# Log-normal fit of the conv trace's lengths (mean/std of ln tokens): prompts 6.633/0.985, outputs 5.019/0.859.
CONV_LOGNORMAL = {"prompt": (6.633, 0.985, 2, 14050), "output": (5.019, 0.859, 7, 1000)}
MILLION_RATE = 4.0   # requests/s: below the A100's sustained rate for conv-like lengths, so the queue stays bounded


# -- workloads ------------------------------------------------------------------------------------------------
def read_azure_csv(path):
    """Tiny local reader (TIMESTAMP → seconds from the first row, ContextTokens, GeneratedTokens)."""
    import pandas as pd
    df = pd.read_csv(path)
    t = pd.to_datetime(df["TIMESTAMP"])
    return pd.DataFrame({"arrival_s": (t - t.iloc[0]).dt.total_seconds().to_numpy(),
                         "prompt_tokens": df["ContextTokens"].to_numpy(),
                         "output_tokens": df["GeneratedTokens"].to_numpy()})


def conv_like(n, rate, seed=0):
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(seed)
    cols = {"arrival_s": np.cumsum(rng.exponential(1.0 / rate, size=n))}
    for name, (mu, sigma, lo, hi) in CONV_LOGNORMAL.items():
        cols[f"{name}_tokens"] = np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(np.int64)
    return pd.DataFrame(cols)


def case_scenario(case: dict) -> tuple[dict, object]:
    """The scenario dict and request table (None = the scenario's own workload) for one case."""
    import yaml
    policy = {"name": case["preset"]}
    if case["preset"] == "sarathi":
        policy["R_max"] = 128          # the issue's Sarathi setting: chunk 512, batch cap 128
    sim = {"fast_forward": case["fast_forward"], "record_iterations": case["record_iterations"]}
    if case["workload"] == "offline":
        # A decode-heavy offline batch with room for all of it in KV: where fast-forward skips most iterations.
        raw = yaml.safe_load((REPO / "examples" / "infermax-default.yaml").read_text())
        raw["workload"]["output"] = 1024
        raw["memory"]["M"] = 1_200_000
        raw.update(policy=policy, sim=sim)
        return raw, None
    if case["workload"] == "poisson":
        raw = yaml.safe_load((REPO / "examples" / "poisson-10k.yaml").read_text())
        raw.update(policy=policy, sim=sim)
        return raw, None
    raw = {"name": case["workload"], "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
           "memory": {"block_size": 16}, "policy": policy, "sim": sim}
    if case["workload"] == "azure":
        from sim.paths import shared_data_dir
        data = shared_data_dir()
        if data is None or not (data / CONV_CSV).exists():
            raise SystemExit(f"skip: {CONV_CSV} not found under the shared data folder")
        return raw, read_azure_csv(data / CONV_CSV)
    return raw, conv_like(case["n"], MILLION_RATE)


# -- one case, in a child process -------------------------------------------------------------------------------
def run_case(case: dict) -> dict:
    t_proc = time.perf_counter()
    from sim.scenario.config import scenario_from_dict
    from sim.scenario.build import build_simulation, requests_from_table
    raw, table = case_scenario(case)
    scn = scenario_from_dict(raw)
    t_build = time.perf_counter()
    sim = build_simulation(scn, None if table is None else requests_from_table(table))
    build_s = time.perf_counter() - t_build
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    res = sim.run()
    sim_s = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    iters = sim.view.iteration
    s = res.summary
    return {**case, "requests": s["requests"], "completed": s["completed"], "makespan_s": s["makespan_s"],
            "iterations": iters, "fast_forwarded_iterations": sim.fast_forward_iterations,
            "build_s": round(build_s, 3), "sim_s": round(sim_s, 3), "sim_cpu_s": round(cpu_s, 3),
            "requests_per_s": round(s["requests"] / sim_s, 1), "iterations_per_s": round(iters / sim_s, 1),
            "in_process_s": round(time.perf_counter() - t_proc, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def spawn(case: dict, timeout_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True,
                           text=True, env=env, timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout_s:.0f} s"}
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or ["?"]
        return {**case, "error": tail[0]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = round(wall, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="azure,poisson,million,cli",
                    help="comma list of azure, poisson, million, offline, cli")
    ap.add_argument("--cli-repeats", type=int, default=7, help="runs of the whole CLI process (case cli)")
    ap.add_argument("--presets", default="vllm,sarathi,vllm-v1", help="presets for azure and poisson")
    ap.add_argument("--million-preset", default="sarathi")
    ap.add_argument("--million-n", type=int, default=1_000_000)
    ap.add_argument("--compare", action="store_true", help="also run each case with sim.fast_forward=false")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per case")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "speed.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_case(json.loads(args.child))))
        return 0
    cases = []
    wanted = args.cases.split(",")
    for wl in ("azure", "poisson", "offline"):
        if wl in wanted:
            for preset in args.presets.split(","):
                for ff in ((True, False) if args.compare else (True,)):
                    cases.append(dict(workload=wl, preset=preset, n=None, fast_forward=ff, record_iterations=True))
    if "million" in wanted:
        cases.append(dict(workload="million", preset=args.million_preset, n=args.million_n, fast_forward=True,
                          record_iterations=False))
    results = []
    print(f"{'workload':<8} {'preset':<8} {'ff':<3} {'requests':>9} {'iters':>9} {'ff_iters':>9} {'sim_s':>7} "
          f"{'cpu_s':>7} {'proc_s':>7} {'req/s':>9} {'iter/s':>9} {'RSS_MB':>7}")
    for case in cases:
        r = spawn(case, args.timeout)
        results.append(r)
        if "error" in r:
            print(f"{case['workload']:<8} {case['preset']:<8} {str(case['fast_forward'])[0]:<3} error: {r['error']}")
            continue
        print(f"{r['workload']:<8} {r['preset']:<8} {str(r['fast_forward'])[0]:<3} {r['requests']:>9} "
              f"{r['iterations']:>9} {r['fast_forwarded_iterations']:>9} {r['sim_s']:>7.2f} {r['sim_cpu_s']:>7.2f} "
              f"{r['process_s']:>7.2f} "
              f"{r['requests_per_s']:>9.0f} {r['iterations_per_s']:>9.0f} {r['peak_rss_mb']:>7.0f}", flush=True)
    cli = cli_process_times(args.cli_repeats) if "cli" in wanted else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    out.write_text(json.dumps({"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                           "loadavg_at_end": load},
                               "results": results, "cli": cli}, indent=1))
    print(f"wrote {out}")
    return 0


def cli_process_times(repeats: int) -> dict:
    """Wall time of the whole `servesim run examples/azure-conv.yaml --out DIR` process, `repeats` times."""
    import statistics
    import tempfile
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sim.cli", "run", "examples/azure-conv.yaml", "--out", tmp],
                           cwd=REPO, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
    out = {"command": "servesim run examples/azure-conv.yaml --out DIR", "repeats": repeats, "times_s": times,
           "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
    print(f"cli      whole process: median {out['median_s']:.2f} s (min {out['min_s']:.2f}, max {out['max_s']:.2f}) "
          f"over {repeats} runs", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
