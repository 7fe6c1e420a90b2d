"""Cluster benchmark: what the cluster layer costs at N = 1, and a 100-replica fleet replaying 1M requests.

Cases (each in its own process, so peak RSS and wall time are clean):
  n1       the Azure 2023 conv trace (or, without the shared data, 10,000 Poisson requests) on one A100 under
           Sarathi and vLLM v1: a plain scenario vs the same scenario as a one-replica cluster (best of 3)
  fleet    1,000,000 Poisson requests with conv-like log-normal lengths at 3 req/s per replica over 100 A100
           replicas behind least-outstanding-tokens (the path every load-aware router takes), no iteration tables;
           --report-interval S: the router learns of completions from load reports every S seconds
  fleet_rr the same behind round-robin: every replica runs on its own, the floor any router's run can reach;
           with more than one CPU, in worker processes (cluster.workers: auto; --workers N sets it)
  idle     40 requests on 20,000 replicas behind least_requests (--idle-replicas): what idle replicas cost

  PYTHONPATH=. python benchmarks/cluster_bench.py [--cases n1,idle,fleet_rr,fleet] [--requests 1000000]
      [--replicas 100] [--idle-replicas 20000] [--workers auto|N] [--report-interval S] [--baseline DIR]

--baseline DIR runs each case also from another checkout (DIR, e.g. `git archive <commit> | tar -x -C DIR`), just
before this one, and reports the ratios: on a shared machine only a ratio measured in one command means much.
Each record has the child's CPU seconds (user + system) beside its wall time.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent
CONV_CSV = "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


def n1_case(repeats: int = 3) -> dict:
    from sim.cluster.runner import run_scenario
    from sim.paths import shared_data_dir
    from sim.scenario.config import load_scenario
    root = shared_data_dir()
    azure = root is not None and (root / CONV_CSV).exists()
    path = "examples/azure-conv.yaml" if azure else "examples/poisson-10k.yaml"
    out = {"workload": "azure conv trace" if azure else "poisson 10k"}
    for pol in ("sarathi", "vllm-v1"):
        best = {}
        for _ in range(repeats):
            for mode in ("single", "cluster"):
                sets = [f"policy.name={pol}", "sim.record_iterations=false"]
                if pol == "sarathi":
                    sets.append("policy.R_max=128")
                if mode == "cluster":
                    sets.append("cluster.replicas=1")
                scn = load_scenario(REPO / path, sets)
                t0 = time.perf_counter()
                run_scenario(scn)
                best[mode] = min(best.get(mode, float("inf")), time.perf_counter() - t0)
        out[pol] = {"single_s": round(best["single"], 3), "cluster_n1_s": round(best["cluster"], 3),
                    "overhead_pct": round(100 * (best["cluster"] / best["single"] - 1), 1)}
    return out


def fleet_case(n_requests: int, replicas: int, router: str, workers=None, report_interval: float = 0.0) -> dict:
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    raw = {"name": "fleet", "seed": 0, "policy": {"name": "sarathi"}, "hardware": {"gpu": "a100-80gb"},
           "costmodel": {"kind": "linear"}, "sim": {"record_iterations": False},
           "workload": {"kind": "poisson", "num_requests": n_requests, "rate": 3.0 * replicas,
                        "prompt": {"dist": "lognormal", "mu": 6.633, "sigma": 0.985, "min": 2, "max": 4000},
                        "output": {"dist": "lognormal", "mu": 5.019, "sigma": 0.859, "min": 7, "max": 1000}},
           "cluster": {"replicas": replicas, "router": router if not report_interval else
                       {"name": router, "report_interval_s": report_interval}}}
    if workers is not None:
        raw["cluster"]["workers"] = workers
    t0 = time.perf_counter()
    res = run_scenario(scenario_from_dict(raw))
    wall = time.perf_counter() - t0
    s = res.summary
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2
    return {"requests": n_requests, "replicas": replicas, "router": router,
            **({"report_interval_s": report_interval} if report_interval else {}), "wall_s": round(wall, 1),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, 2),
            # worker processes (cluster.workers): the largest one's peak, counting the pages it shares with the
            # run's process (forked from it) as its own
            **({"workers": workers, "worker_peak_rss_gib": round(worker_peak, 2)} if worker_peak else {}),
            "completed": int(s["completed"]), "infeasible": int(s["infeasible"]),
            "ttft_p99_s": round(float(s["ttft_p99"]), 4), "load_imbalance": round(float(s["load_imbalance"]), 4)}


def idle_case(replicas: int) -> dict:
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    raw = {"name": "idle", "seed": 0, "policy": {"name": "vllm-v1"}, "costmodel": {"kind": "linear"},
           "workload": {"kind": "poisson", "num_requests": 40, "rate": 10,
                        "prompt": {"dist": "uniform", "low": 16, "high": 512},
                        "output": {"dist": "uniform", "low": 8, "high": 200}},
           "cluster": {"replicas": replicas, "router": "least_requests"}}
    t0 = time.perf_counter()
    res = run_scenario(scenario_from_dict(raw))
    return {"requests": 40, "replicas": replicas, "router": "least_requests",
            "wall_s": round(time.perf_counter() - t0, 2),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, 3),
            "replicas_used": int((res.tables["replicas"]["routed"] > 0).sum()), "completed": int(res.summary["completed"])}


def _run_one(root: Path, case: str, args):
    """One case in its own process from checkout `root`: its record plus process wall and CPU seconds."""
    import os
    cmd = [sys.executable, str(root / "benchmarks" / "cluster_bench.py"), "--one", case, "--requests",
           str(args.requests), "--replicas", str(args.replicas), "--router", args.router, "--idle-replicas",
           str(args.idle_replicas)]
    if args.report_interval:                            # (a checkout from before the option refuses it)
        cmd += ["--report-interval", str(args.report_interval)]
    if args.workers is not None and root == REPO:      # (a baseline from before cluster.workers runs in one)
        cmd += ["--workers", args.workers]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_s"] = round(wall, 1)
    rec["cpu_s"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)
    rec["load_avg_1m"] = round(os.getloadavg()[0], 1)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="n1,idle,fleet_rr,fleet")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--router", default="least_tokens")
    ap.add_argument("--idle-replicas", type=int, default=20000)
    ap.add_argument("--report-interval", type=float, default=0.0,
                    help="the fleet case's least-loaded router learns of completions from load reports this often "
                         "(router.report_interval_s; 0: at once)")
    ap.add_argument("--workers", help="cluster.workers for the fleet cases (default: the scenario's, auto)")
    ap.add_argument("--baseline", help="another checkout to time the same cases from, in this command")
    ap.add_argument("--one", help=argparse.SUPPRESS)        # run one case in this process, print JSON
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cluster.json"))
    args = ap.parse_args(argv)
    if args.one:
        rec = (n1_case() if args.one == "n1" else idle_case(args.idle_replicas) if args.one == "idle" else
               fleet_case(args.requests, args.replicas, "round_robin" if args.one == "fleet_rr" else args.router,
                          None if args.workers is None else
                          args.workers if args.workers == "auto" else int(args.workers),
                          0.0 if args.one == "fleet_rr" else args.report_interval))
        print(json.dumps(rec))
        return 0
    out = Path(args.out)        # the cases not run this time keep their earlier records
    results = {k: v for k, v in json.loads(out.read_text()).items() if k != "machine"} if out.exists() else {}
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        rec = None
        for root in ([Path(args.baseline).resolve()] if args.baseline else []) + [REPO]:
            one = _run_one(root, case, args)
            if one is None:
                return 1
            if root != REPO:
                base = one
                continue
            rec = one
            if args.baseline:
                rec["baseline"] = base
                rec["speedup_wall"] = round(base["process_s"] / rec["process_s"], 2)
                rec["speedup_cpu"] = round(base["cpu_s"] / rec["cpu_s"], 2)
        results[case] = rec
        print(case, json.dumps(rec))
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
