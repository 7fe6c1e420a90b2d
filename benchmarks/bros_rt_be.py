"""BROS §7 on the simulator: RT latency / SLO attainment (per request and per token) and BE throughput for BROS,
vLLM and round-robin co-location on an RT (ShareGPT-like Poisson) + BE (FlexGen-style batches) mix, OPT-13B on one
A100-40GB; then the bidirectional-KV ablation under memory pressure. Prints a table and writes
benchmarks/results/bros_rt_be.json.  Usage: PYTHONPATH=. python benchmarks/bros_rt_be.py [--rt-requests 200]"""
import argparse
import json
from pathlib import Path

from study.findings.aptbros import BROS_EX as EX, BROS_KEYS as KEYS, bros_run as run, bros_vs


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
        rows = {p: run(p, ov) for p in ("vllm-v0", "bros-rr", "bros")}
        rows["vllm"] = rows.pop("vllm-v0")
        for p, d in rows.items():
            show(f"rate {rate} {p}", d)
        rows["bros_vs_vllm"] = bros_vs(rows["bros"], rows["vllm"], rows["bros-rr"])
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
