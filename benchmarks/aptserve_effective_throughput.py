"""Apt-Serve §6 on the simulator: effective throughput (rate at 90% / 60% SLO attainment) per policy, OPT-13B on
one A100-40GB, ShareGPT-like lengths, SLO TTFT 1 s / P99 TBT 1 s; plus the burstiness sweep (Gamma CV 1 → 5).
Prints a table and writes benchmarks/results/aptserve_effective_throughput.json.

The OPT-13B/A100-40GB cost model is profiles/a100-40gb/opt-13b-linear.yaml: the Vidur-fitted Llama-2-7B/A100
coefficients scaled by weight FLOPs, hidden size and HBM bandwidth (no OPT kernel profile is available).
Usage: PYTHONPATH=. python benchmarks/aptserve_effective_throughput.py [--requests 500] [--cv-rate 4]"""
import argparse
import json
import time
from pathlib import Path

from study.capacity_search import attainment_at, effective_throughput
from study.findings.aptbros import APT_POLICIES as POLICIES

EX = "examples/aptserve-sharegpt.yaml"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--cv-rate", type=float, default=4.0)
    ap.add_argument("--policies", nargs="*", default=list(POLICIES))
    args = ap.parse_args()
    base = [f"workload.num_requests={args.requests}"]
    out = {"scenario": EX, "requests": args.requests, "effective_throughput": {}, "cv_sweep": {}}
    t0 = time.time()
    for p in args.policies:
        cache = {}
        ov = base + [f"policy.name={p}"]
        e90 = effective_throughput(EX, 0.9, ov, lo=0.5, cache=cache)
        e60 = effective_throughput(EX, 0.6, ov, lo=0.5, cache=cache)
        out["effective_throughput"][p] = {"rate_at_90": round(e90, 3), "rate_at_60": round(e60, 3),
                                          "runs": {str(k): v for k, v in sorted(cache.items())}}
        print(f"{p:<18} 90%: {e90:6.2f} req/s   60%: {e60:6.2f} req/s   ({time.time() - t0:.0f}s)", flush=True)
    v = out["effective_throughput"].get("vllm")
    if v:
        for p, d in out["effective_throughput"].items():
            d["vs_vllm_90"] = round(d["rate_at_90"] / v["rate_at_90"], 2) if v["rate_at_90"] else None
            d["vs_vllm_60"] = round(d["rate_at_60"] / v["rate_at_60"], 2) if v["rate_at_60"] else None
    for p in ("vllm", "sarathi", "aptserve", "aptserve-kv"):
        if p not in args.policies:
            continue
        row = {}
        for cv in (1.0, 5.0):
            row[str(cv)] = attainment_at(EX, args.cv_rate, base + [f"policy.name={p}", f"workload.cv={cv}"])
        out["cv_sweep"][p] = row
        print(f"CV sweep @ {args.cv_rate} req/s  {p:<12} CV1: {row['1.0']:.3f}  CV5: {row['5.0']:.3f}", flush=True)
    path = Path("benchmarks/results/aptserve_effective_throughput.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
