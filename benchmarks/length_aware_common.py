"""Shared pieces of the EconoServe / ALISE benchmarks: run one scenario dict, score it, find sustainable rates."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np

from policies.length_aware import jct_slo_s
from sim.config import scenario_from_dict
from sim.request import RUNNING
from sim.runner import build_simulation

OUT_DIR = Path(__file__).resolve().parent / "results"


def run(raw: dict) -> dict:
    """One simulation; returns the metrics both papers report."""
    t0 = time.perf_counter()
    sim = build_simulation(scenario_from_dict(copy.deepcopy(raw)))
    written, allocated = [], []
    orig = sim.policy.schedule

    def schedule(view):                       # sample written vs allocated KV as the paper's utilisation
        b = orig(view)
        if view.iteration % 10 == 0:
            written.append(sum(r.cached for r in view.running if r.state == RUNNING))
            allocated.append(sim.memory.used_tokens)
        return b
    sim.policy.schedule = schedule
    res = sim.run()
    req, s = res.requests, res.summary
    done = req[req.status == "done"]
    slo = np.array([jct_slo_s(sim.costmodel, p, o) for p, o in zip(done.prompt_tokens, done.output_tokens)])
    failed = [bool(getattr(r.meta, "failed", False)) or r.evictions > 0 or r.swaps > 0 for r in sim.requests]
    it = res.iterations
    out = {
        "completed": int(s["completed"]), "requests": int(s["requests"]),
        "normalized_latency_s": s["normalized_latency_mean"], "jct_mean_s": s["e2e_mean"], "jct_p99_s": s["e2e_p99"],
        "ttft_mean_s": s["ttft_mean"], "throughput_rps": s["request_throughput"], "tps": s["tps"],
        "ssr": float(np.mean(done.e2e_s.to_numpy() <= slo)) if len(done) else float("nan"),
        "alloc_failure_pct": 100.0 * float(np.mean(failed)),
        "kv_allocated_util": float(np.mean(allocated) / res.capacity_tokens) if allocated else float("nan"),
        "kv_written_util": float(np.mean(written) / res.capacity_tokens) if written else float("nan"),
        "forward_size_mean": float((it.prefill_tokens + it.decode_tokens).mean()),
        "evictions": int(s["evictions"]), "swaps": int(s["swaps"]), "wall_s": time.perf_counter() - t0,
    }
    allocs = [(r.output_tokens, r.meta.first_alloc) for r in sim.requests
              if getattr(r.meta, "first_alloc", None) is not None]
    if allocs:                                # EconoServe's Fig 4c / 5a metrics on the GT allocations it made
        from policies.predictors import provisioning_report
        t, a = zip(*allocs)
        out["provisioning"] = provisioning_report(t, a)
    if hasattr(sim.policy, "stats"):
        out["policy_stats"] = {k: v for k, v in sim.policy.stats.items() if not isinstance(v, list)}
        sizes = sim.policy.stats.get("group_sizes")
        if sizes:
            out["policy_stats"]["group_size_mean"] = float(np.mean(sizes))
    return out


def sustainable_rate(rates, latencies, threshold):
    """Largest rate whose normalized latency stays ≤ threshold (linear interpolation across the crossing)."""
    best = 0.0
    for i, (r, l) in enumerate(zip(rates, latencies)):
        if l <= threshold:
            best = r
            continue
        if i > 0 and latencies[i - 1] <= threshold:
            r0, l0 = rates[i - 1], latencies[i - 1]
            best = r0 + (r - r0) * (threshold - l0) / (l - l0)
        break
    return best


def write(name: str, payload: dict) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    p = OUT_DIR / f"{name}.json"
    p.write_text(json.dumps(payload, indent=1, default=float))
    return p
