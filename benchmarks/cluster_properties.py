"""Cluster property benchmark: random clusters run on the exact fast paths and on the plain path, compared table by
table, with the invariants every run must keep. Prints the counts and writes JSON.

A case draws 2-8 replicas (or a prefill:decode split), a router (every registered one), prefix caching on or off,
a CPU tier, a policy, a KV budget and a workload (gamma bursts, or shared prefixes when caching is on); on a serve
pool, some cases run closed-loop sessions or multi-LoRA (often with their affinity routers). Checked:
fast == plain (request, iteration and replica tables, bit for bit), exact output tokens, nothing lost or
duplicated, KV <= M on every replica, every router ledger empty at the end, TTFT <= e2e and TPOT >= 0.

  PYTHONPATH=. python benchmarks/cluster_properties.py [--cases 2000] [--seed 0]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import pandas as pd

POLICIES = ("vllm-v1", "vllm", "sarathi", "orca", "vllm-v0", "rank-o", "lightllm")
CACHING_POLICIES = ("vllm-v1", "vllm", "sarathi")       # prefix caching needs the paged KV manager
LORA_POLICIES = ("vllm-v1", "sarathi")                  # those that apply vLLM's max_loras rule
LATER_ROUTERS = ("session_affinity", "lora_affinity")   # drawn apart from the others (random_case)


def random_case(rng: np.random.Generator) -> dict:
    """One random cluster scenario (a raw scenario dict)."""
    from sim.cluster.routers import ROUTERS
    caching = bool(rng.random() < 0.35)
    policy = str(rng.choice(CACHING_POLICIES if caching else POLICIES))
    n = int(rng.integers(30, 90))
    if caching:
        wl = {"kind": "shared_prefix", "num_groups": int(rng.integers(1, 4)), "num_prompts_per_group":
              max(1, n // 3), "system_prompt_len": int(rng.integers(64, 700)), "question_len": int(rng.integers(8, 200)),
              "output_len": int(rng.integers(4, 120)), "stages": [{"rate": float(rng.uniform(4, 40)), "duration": 4}]}
    else:
        wl = {"kind": "gamma", "num_requests": n, "rate": float(rng.uniform(2, 40)), "cv": float(rng.uniform(0.5, 3)),
              "prompt": {"dist": "uniform", "low": 4, "high": int(rng.integers(64, 1500))},
              "output": {"dist": "uniform", "low": 1, "high": int(rng.integers(2, 300))}}
    memory = {"M": int(rng.choice([1500, 3000, 8000, 30000]))}
    if caching:
        memory["prefix_caching"] = True
        if rng.random() < 0.5:
            memory["cpu_offload_gib"] = 0.05
    # the routers drawn from `rng` are those the cases were first drawn with, so a case number keeps its scenario
    # (tests pin some); the affinity routers added since are drawn from a generator of their own, below
    routers = sorted(set(ROUTERS) - set(LATER_ROUTERS))
    router = str(rng.choice(routers))
    if rng.random() < 0.3:
        p = int(rng.integers(1, 4))
        cluster = {"disaggregation": {"prefill": p, "decode": int(rng.integers(1, 9 - p)),
                                      "first_token": str(rng.choice(["decode", "prefill"])),
                                      "decode_router": str(rng.choice(routers))}, "router": router}
    else:
        cluster = {"replicas": int(rng.integers(2, 9)), "router": router}
    raw = {"name": "prop", "seed": int(rng.integers(0, 1000)), "memory": memory, "policy": {"name": policy},
           "workload": wl, "costmodel": {"kind": "linear"}, "cluster": cluster}
    # from a generator of their own (seeded by the case), so the cases above stay what they were: closed-loop
    # sessions or multi-LoRA on a serve pool, and the affinity routers
    sub = np.random.default_rng([raw["seed"], n, 32])
    extra = sub.random()
    if "replicas" in cluster and extra < 0.15:
        raw["workload"] = {"kind": "multi_turn", "closed_loop": True, "conversations": int(sub.integers(5, 25)),
                           "start": {"process": "poisson", "rate": float(sub.uniform(1, 20))},
                           "turns": {"dist": "uniform", "low": 1, "high": 5},
                           "system_prompt_len": int(sub.integers(0, 400)),
                           "user_tokens": int(sub.integers(8, 120)), "output": int(sub.integers(4, 120)),
                           "think": str(sub.choice(["exponential", "constant"])),
                           "think_time_s": float(sub.choice([0.0, 0.05, 1.0])), "max_model_len": 4096}
        if sub.random() < 0.5:
            cluster["router"] = "session_affinity"
    elif "replicas" in cluster and extra < 0.3 and policy in LORA_POLICIES:
        raw["lora"] = {"adapters": int(sub.integers(1, 12)), "max_loras": int(sub.integers(1, 4)),
                       "base_fraction": float(sub.choice([0.0, 0.3]))}
        if sub.random() < 0.5:
            cluster["router"] = "lora_affinity"
    elif sub.random() < 0.1:                    # on any case: an affinity router (it falls back to least_requests)
        cluster["router"] = str(sub.choice(LATER_ROUTERS))
    # a least-loaded router (front or decode side) that learns of completions from load reports, from a generator
    # of its own as well
    stale = np.random.default_rng([raw["seed"], n, 2711])
    for side, where in (("router", cluster), ("decode_router", cluster.get("disaggregation", {}))):
        if where.get(side) in ("least_tokens", "least_requests") and stale.random() < 0.4:
            where[side] = {"name": where[side], "report_interval_s": float(stale.choice([0.05, 0.3, 1.0]))}
    return raw


def _run(raw: dict, fast: bool):
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    return run_scenario(scenario_from_dict({**raw, "sim": {"fast_forward": fast}}))


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    try:
        pd.testing.assert_frame_equal(a, b)
        return True
    except AssertionError:
        return False


def check_case(raw: dict) -> list:
    """The properties a cluster run must keep; returns the names of those that failed (empty: all hold)."""
    fast, plain = _run(raw, True), _run(raw, False)
    bad = []
    for name in ("requests", "iterations"):
        if not _frames_equal(getattr(fast, name), getattr(plain, name)):
            bad.append(f"fast != plain ({name})")
    volatile = ["busy_s", "utilization"]      # equal too, but compare the rest by name for a clearer report
    if not _frames_equal(fast.tables["replicas"].drop(columns=volatile), plain.tables["replicas"].drop(columns=volatile)):
        bad.append("fast != plain (replicas)")
    req = fast.requests
    if not req["id"].is_unique or len(req) != fast.meta.get("requests_offered", len(req)):
        bad.append("lost or duplicated requests")
    if not set(req["status"]) <= {"done", "infeasible"}:
        bad.append("a request neither done nor infeasible")
    done = req[req["status"] == "done"]
    if not (done["generated_tokens"] == done["output_tokens"]).all():
        bad.append("output tokens not exact")
    if not (done["ttft_s"] <= done["e2e_s"] + 1e-12).all():
        bad.append("TTFT > e2e")
    if (done["tpot_s"].dropna() < 0).any():
        bad.append("TPOT < 0")
    per = fast.tables["replicas"]
    cap = dict(zip(per["replica"], per["M"]))
    it = fast.iterations
    if len(it) and (it["kv_alloc_tokens"] > it["replica"].map(cap)).any():
        bad.append("KV > M")
    if (per["outstanding_end"] != 0).any() or (per["outstanding_tokens_end"] != 0).any():
        bad.append("ledger not empty at the end")
    return bad


def _router_name(r) -> str:
    return r if isinstance(r, str) else f"{r['name']} (reports every {r['report_interval_s']} s)"


def describe(raw: dict) -> str:
    c = raw["cluster"]
    shape = (f"P/D {c['disaggregation']['prefill']}:{c['disaggregation']['decode']} "
             f"({_router_name(c['disaggregation']['decode_router'])}, first token {c['disaggregation']['first_token']})"
             if "disaggregation" in c else f"{c['replicas']} replicas")
    return (f"{shape}, router {_router_name(c['router'])}, {raw['policy']['name']}, M {raw['memory']['M']}, "
            f"{'prefix caching' if raw['memory'].get('prefix_caching') else raw['workload']['kind']}"
            f"{', lora' if raw.get('lora') else ''}")


def main(argv=None) -> int:
    from benchmarks.results_io import write_json
    from sim.errors import SimulationStuck
    from costmodels.errors import UserError
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/cluster_properties.json")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    fails, kinds, refused = [], Counter(), Counter()
    t0 = time.perf_counter()
    for i in range(args.cases):
        raw = random_case(rng)
        try:
            bad = check_case(raw)
        except SimulationStuck as e:                   # a livelock is a failure, not a refusal
            bad = [f"stuck: {str(e)[:200]}"]
        except UserError as e:                         # a scenario the tool refuses, with its one line
            refused[str(e).split(":")[0][:60]] += 1
            continue
        for b in bad:
            kinds[b] += 1
        if bad:
            fails.append({"case": i, "scenario": describe(raw), "failed": bad})
            print(f"case {i}: {describe(raw)}: {', '.join(bad)}", flush=True)
        if (i + 1) % 100 == 0:
            print(f"{i + 1} cases, {len(fails)} failing, {time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    print(f"{args.cases} random clusters: {args.cases - len(fails) - sum(refused.values())} keep every property, "
          f"{len(fails)} fail, {sum(refused.values())} refused with one line; {wall:.0f} s")
    for k, v in kinds.most_common():
        print(f"  {k}: {v}")
    write_json(args.out, {"cases": args.cases, "seed": args.seed, "failing": len(fails), "by_property": dict(kinds),
                          "refused": dict(refused), "wall_s": round(wall, 1), "failures": fails[:50]})
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
