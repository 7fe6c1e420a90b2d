"""BROS §7 on the simulator: RT latency / SLO attainment (per request and per token) and BE throughput for BROS,
vLLM and round-robin co-location on an RT (ShareGPT-like Poisson) + BE (FlexGen-style batches) mix, OPT-13B on one
A100-40GB; then the bidirectional-KV ablation under memory pressure. Prints a table and writes
benchmarks/results/bros_rt_be.json.  Usage: PYTHONPATH=. python benchmarks/bros_rt_be.py [--rt-requests 200]"""
import argparse
import json
import time
from pathlib import Path

from sim.class_metrics import rt_be_summary
from sim.config import load_scenario
from sim.runner import build_simulation

EX = "examples/bros-rt-be.yaml"
KEYS = ("rt_ttft_mean", "rt_tpot_mean", "rt_normalized_latency_mean", "rt_ttft_attainment", "rt_tpot_attainment",
        "rt_token_attainment", "be_throughput_rps")


def run(policy, overrides):
    scn = load_scenario(EX, [f"policy.name={policy}", *overrides])
    sim = build_simulation(scn)
    t0 = time.perf_counter()
    sim.run()
    out = rt_be_summary(sim.all_requests)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    mem = sim.memory
    if hasattr(mem, "checkpointed_slots"):
        out.update(checkpointed_slots=mem.checkpointed_slots, restored_slots=mem.restored_slots)
    if hasattr(sim.policy, "stats"):
        out["policy_stats"] = dict(sim.policy.stats)
    return out


def show(tag, d):
    print(f"{tag:<34} " + "  ".join(f"{k.replace('rt_', '').replace('_mean', '')}={d.get(k, float('nan')):.3f}"
                                     for k in KEYS), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rt-requests", type=int, default=200)
    ap.add_argument("--rates", type=float, nargs="*", default=[1.5, 3.0])
    ap.add_argument("--pressure-M", type=int, default=6000)
    args = ap.parse_args()
    res = {"scenario": EX, "rt_requests": args.rt_requests, "main": {}, "ablation": {}}
    for rate in args.rates:
        ov = [f"workload.rt_requests={args.rt_requests}", f"workload.rt_rate={rate}"]
        rows = {p: run(p, ov) for p in ("vllm", "bros-rr", "bros")}
        for p, d in rows.items():
            show(f"rate {rate} {p}", d)
        b, v, rr = rows["bros"], rows["vllm"], rows["bros-rr"]
        rows["bros_vs_vllm"] = {
            "normalized_latency_change": b["rt_normalized_latency_mean"] / v["rt_normalized_latency_mean"] - 1,
            "ttft_attainment_ratio": b["rt_ttft_attainment"] / max(v["rt_ttft_attainment"], 1e-9),
            "token_attainment_ratio": b["rt_token_attainment"] / max(v["rt_token_attainment"], 1e-9),
            "be_throughput_change": b["be_throughput_rps"] / v["be_throughput_rps"] - 1,
            "be_throughput_change_vs_rr": b["be_throughput_rps"] / rr["be_throughput_rps"] - 1}
        print(f"rate {rate}: BROS vs vLLM " + ", ".join(f"{k}={x:+.3f}" if 'change' in k else f"{k}={x:.2f}"
                                                    for k, x in rows["bros_vs_vllm"].items()), flush=True)
        res["main"][str(rate)] = rows
    ov = [f"workload.rt_requests={args.rt_requests}", f"workload.rt_rate={max(args.rates)}",
          f"memory.M={args.pressure_M}"]
    for p in ("bros", "bros-nobi"):
        res["ablation"][p] = d = run(p, ov)
        show(f"M={args.pressure_M} {p}", d)
    path = Path("benchmarks/results/bros_rt_be.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
