"""EconoServe / ALISE experiment setups and metrics, shared by the claim modules (study.findings.econoserve, .alise)
and the benchmark scripts (benchmarks/econoserve_bench.py, alise_bench.py): one scenario dict → the metrics both
papers report, sustainable rate at a normalized-latency constraint, and each paper's setups and variants."""
from __future__ import annotations

import copy
import time

import numpy as np

from policies.length_aware import jct_slo_s
from sim.scenario.config import scenario_from_dict
from sim.engine.request import RUNNING
from sim.scenario.build import build_simulation
from study.findings.verdicts import served_ratio, sustainable_rate as _sustainable_rate


def run(raw: dict) -> dict:
    """One simulation; returns the metrics both papers report."""
    t0 = time.perf_counter()
    raw = copy.deepcopy(raw)
    # The plain loop: the KV sample below needs a scheduler call every iteration and each running request's own
    # progress; the fast paths skip calls in steady stretches and keep the decode cohort in aggregate.
    raw.setdefault("sim", {})["fast_forward"] = False
    sim = build_simulation(scenario_from_dict(raw))
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
    comp = (req.arrival_s + req.e2e_s).where(req.status == "done")
    out = {
        "completed": int(s["completed"]), "requests": int(s["requests"]),
        "served": served_ratio(req.arrival_s.to_numpy(), comp.to_numpy(float)),
        "normalized_latency_s": s["normalized_latency_mean"], "jct_mean_s": s["e2e_mean"], "jct_p99_s": s["e2e_p99"],
        "ttft_mean_s": s["ttft_mean"], "tpot_mean_s": s["tpot_mean"], "throughput_rps": s["request_throughput"],
        "tps": s["tps"],
        "ssr": float(np.mean(done.e2e_s.to_numpy() <= slo)) if len(done) else float("nan"),
        "alloc_failure_pct": 100.0 * float(np.mean(failed)),
        "kv_allocated_util": float(np.mean(allocated) / res.capacity_tokens) if allocated else float("nan"),
        "kv_written_util": float(np.mean(written) / res.capacity_tokens) if written else float("nan"),
        "forward_size_mean": float((it.prefill_tokens + it.decode_tokens).mean()),
        "prefill_forward_mean": float(it.prefill_tokens[it.prefill_tokens > 0].mean()) if len(it) else 0.0,
        "decode_forward_mean": float(it.decode_tokens[it.decode_tokens > 0].mean()) if len(it) else 0.0,
        "busy": float(it.duration_s.sum() / s["makespan_s"]) if len(it) and s["makespan_s"] > 0 else float("nan"),
        "goodput_rps": float(np.sum(done.e2e_s.to_numpy() <= slo) / s["makespan_s"]) if len(done) else 0.0,
        "kv_samples": len(written), "iterations": int(s["iterations"]),
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
            out["policy_stats"]["group_size_ge4"] = float(np.mean(np.asarray(sizes) >= 4))
            out["policy_stats"]["group_size_ge12"] = float(np.mean(np.asarray(sizes) >= 12))
            out["policy_stats"]["group_size_hist"] = group_hist(sizes)
        q = sim.policy.stats.get("queue_group_sizes")
        if q:
            out["policy_stats"]["queue_group_ge4"] = float(np.mean(np.asarray(q) >= 4))
            out["policy_stats"]["queue_group_ge12"] = float(np.mean(np.asarray(q) >= 12))
            out["policy_stats"]["queue_group_mean"] = float(np.mean(q))
    return out


def group_hist(sizes) -> dict:
    """Share of groups by size: 1, 2–3, 4–11, ≥ 12 (the paper's Fig. 2 thresholds)."""
    a = np.asarray(sizes)
    return {"1": float(np.mean(a == 1)), "2-3": float(np.mean((a >= 2) & (a < 4))),
            "4-11": float(np.mean((a >= 4) & (a < 12))), ">=12": float(np.mean(a >= 12))}


def run_cluster(raw: dict) -> dict:
    """One cluster run (sim/cluster): the metrics above that a cluster has, per pool (DistServe's prefill and decode
    GPUs), goodput against EconoServe's JCT SLO, and the KV transfer's share of JCT."""
    from sim.cluster.cluster import Cluster
    from sim.cluster.results import cluster_result
    t0 = time.perf_counter()
    raw = copy.deepcopy(raw)
    scn = scenario_from_dict(raw)
    run_ = Cluster(scn).run()
    res = cluster_result(scn, run_, time.perf_counter() - t0)
    req, s, it = res.requests, res.summary, res.iterations
    done = req[req.status == "done"]
    cm = run_.replicas[0].sim.costmodel
    slo = np.array([jct_slo_s(cm, p, o) for p, o in zip(done.prompt_tokens, done.output_tokens)])
    met = done.e2e_s.to_numpy() <= slo
    out = {"completed": int(s["completed"]), "requests": int(s["requests"]), "gpus": int(s["gpus"]),
           "jct_mean_s": s["e2e_mean"], "throughput_rps": s["request_throughput"], "ssr": float(np.mean(met)),
           "goodput_rps": float(met.sum() / s["makespan_s"]) if len(done) else 0.0,
           "kv_transfer_share": s.get("kv_transfer_share", float("nan")), "wall_s": time.perf_counter() - t0}
    per = res.tables["replicas"]
    for pool, g in per.groupby("pool"):
        sub = it[it.pool == pool]
        m = float(per.loc[per.pool == pool, "M"].mean())
        out[f"{pool}_kv_allocated_util"] = float(sub.kv_alloc_tokens.mean() / m) if len(sub) else float("nan")
        out[f"{pool}_busy"] = float(g.utilization.mean())
        pre, dec = sub.prefill_tokens[sub.prefill_tokens > 0], sub.decode_tokens[sub.decode_tokens > 0]
        out[f"{pool}_prefill_forward_mean"] = float(pre.mean()) if len(pre) else 0.0
        out[f"{pool}_decode_forward_mean"] = float(dec.mean()) if len(dec) else 0.0
    return out


def sustainable_rate(rates, latencies, threshold, served=None):
    """Largest sustained rate (study.findings.verdicts: served ≥ 95% of the offered load and normalized latency ≤
    threshold)."""
    return _sustainable_rate(rates, latencies, threshold, served)


# ---- rates relative to the baseline's knee ---------------------------------------------------------------------
# The papers' absolute rates belong to their hardware and engines; each setup here sweeps the same multiples of
# its own baseline's knee instead: the rate where the baseline's mean normalized latency reaches 4x its low-load
# value (the sustainable-rate constraint the claims use), found by bracketing and bisection on this setup.
KNEE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
KNEE_LOW_RATE = 0.05          # req/s: "low load" for the reference latency


def knee_rate(make_scenario, n: int, tol: float = 0.05) -> float:
    """The baseline's knee for make_scenario(rate, n) (memoised by the caller)."""
    from study.capacity import search_capacity
    base = run(make_scenario(KNEE_LOW_RATE, n))["normalized_latency_s"]
    ok = lambda r: 1.0 if run(make_scenario(r, n))["normalized_latency_s"] <= 4 * base else 0.0   # noqa: E731
    return float(search_capacity(ok, 0.5, 1.0, rate_min=KNEE_LOW_RATE, rate_max=1000.0, rel_tol=tol).capacity_rps)


def knee_grid(knee: float, stride: int = 1) -> list:
    return [round(knee * f, 4) for f in KNEE_FRACTIONS][::stride]


# ---- EconoServe (spec econoserve.md §5) ------------------------------------------------------------------------
# One setup for every experiment, as the paper ran its main model: OPT-13B on one A100-80GB with a 12 GB KV cache
# (15,728 tokens of 0.78 MiB, 32-token blocks) for every dataset; GPU time only (no engine CPU overheads: the
# paper gives none). Baselines as the paper ran them: vLLM v0 (its own scheduler, 256 sequences) preempting by
# swapping, and Sarathi-Serve.
ECONO_BASE = {"model": {"name": "opt-13b"}, "hardware": {"gpu": "a100-80gb"},
              "costmodel": {"kind": "auto", "overheads": "none"}}
ECONO_M = 15728
ECONO_SETUPS = {   # dataset: (padding, reserve, pipe buffer b) — the paper's §5 defaults per dataset
    "sharegpt": (0.15, 0.03, 0.15),
    "alpaca": (0.10, 0.012, 0.15),
}
ECONO_BASELINE = "vllm (swap)"
ECONO_POLICIES = {
    "econoserve": lambda pad, res, b: {"name": "econoserve", "padding": pad, "reserved_frac": res, "pipe_buffer_frac": b},
    "econoserve-sdo (no pipelining)": lambda pad, res, b: {"name": "econoserve-sdo", "padding": pad, "reserved_frac": res},
    "econoserve-sd (SyncDecoupled)": lambda pad, res, b: {"name": "econoserve-sd", "padding": pad, "reserved_frac": res},
    "econoserve-d": lambda pad, res, b: {"name": "econoserve-d", "padding": pad, "reserved_frac": res},
    "econoserve-unsynced (no synced admission)": lambda pad, res, b: {"name": "econoserve-unsynced", "padding": pad,
                                                                     "reserved_frac": res, "pipe_buffer_frac": b},
    "econoserve-wide-deadlines": lambda pad, res, b: {"name": "econoserve-wide-deadlines", "padding": pad,
                                                      "reserved_frac": res, "pipe_buffer_frac": b},
    "econoserve-oracle": lambda pad, res, b: {"name": "econoserve", "padding": pad, "reserved_frac": res,
                                              "pipe_buffer_frac": b},
    "vllm (swap)": lambda pad, res, b: {"name": "vllm-v0", "preemption_mode": "swap"},
    "sarathi": lambda pad, res, b: {"name": "sarathi"},
}
ECONO_REQUESTS = 600              # per run (the benchmark's full setting)
ECONO_PADDINGS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30, 0.50)


def econo_scenario(dataset, policy, rate, n, padding=None, seed=0):
    pad, res, b = ECONO_SETUPS[dataset]
    wl = {"kind": f"econoserve-{dataset}", "num_requests": n, "rate": rate}
    if policy == "econoserve-oracle":
        wl["predictor"] = {"kind": "oracle"}
    return {"name": f"econoserve-{dataset}", "seed": seed, **copy.deepcopy(ECONO_BASE),
            "memory": {"M": ECONO_M, "block_size": 32, "swap_space_gib": 16},
            "policy": ECONO_POLICIES[policy](pad if padding is None else padding, res, b), "workload": wl}


def econo_knee(dataset: str, n: int) -> float:
    from study.findings.runs import memo
    return memo(("econo-knee", dataset, n), lambda: {"rate": knee_rate(
        lambda r, k: econo_scenario(dataset, ECONO_BASELINE, r, k), n)})["rate"]


# ---- ALISE (spec alise.md §5) -------------------------------------------------------------------------------
# One setup for both datasets, as the paper ran it: OPT-13B on one V100 (32 GB) with the KV cache vLLM would size
# there (costmodels.memory: 3.42 GiB, 4,485 FP16 tokens; INT8 KV holds twice as many), the same for every system
# and dataset; GPU time only. Baselines as the paper ran them: vLLM v0 and ORCA (which reserves the 2,048-token
# context per request).
ALISE_BASE = {"model": {"name": "opt-13b"}, "hardware": {"gpu": "v100"},
              "costmodel": {"kind": "auto", "overheads": "none"}}
ALISE_M = 4485                # FP16 tokens
ALISE_DATASETS = ("alpaca", "sharegpt")
ALISE_REQUESTS = {"alpaca": 2000, "sharegpt": 600}
INT8 = {"kv_quant_bits": 8}
ALISE_BASELINE = "vllm"
ALISE_VARIANTS = {   # name: (policy, memory extras, predictor override)
    "alise": ({"name": "alise"}, INT8, None),
    "alise-oracle": ({"name": "alise"}, INT8, {"kind": "oracle"}),
    "alise-defer": ({"name": "alise-defer"}, INT8, None),
    "alise-recompute": ({"name": "alise-recompute"}, INT8, None),
    "alise-fp16": ({"name": "alise"}, {}, None),
    "vllm": ({"name": "vllm-v0"}, {}, None),
    "vllm-int8": ({"name": "vllm-v0"}, INT8, None),
    "orca": ({"name": "orca", "max_model_len": 2048}, {}, None),
}


def alise_scenario(dataset, variant, rate, n, predictor=None, seed=0):
    pol, mem, pred = ALISE_VARIANTS[variant]
    wl = {"kind": f"alise-{dataset}", "num_requests": n, "rate": rate}
    if predictor or pred:
        wl["predictor"] = predictor or pred
    return {"name": f"alise-{dataset}", "seed": seed, **copy.deepcopy(ALISE_BASE), "policy": dict(pol), "workload": wl,
            "memory": {"M": ALISE_M, "block_size": 16, "swap_space_gib": 64, **mem}}


def alise_knee(dataset: str, n: int) -> float:
    from study.findings.runs import memo
    return memo(("alise-knee", dataset, n), lambda: {"rate": knee_rate(
        lambda r, k: alise_scenario(dataset, ALISE_BASELINE, r, k), n)})["rate"]
