"""ALISE vs vLLM and ORCA at equal normalized-latency constraint on Alpaca- and ShareGPT-like workloads; the
Defer / Recompute ablation; the oracle bound; sensitivity to predictor error; INT8 given to the baseline too.
Prints a table and writes benchmarks/results/alise.json.

    PYTHONPATH=. python benchmarks/alise_bench.py [--quick]
"""
from __future__ import annotations

import sys

from benchmarks.length_aware_common import run, sustainable_rate, write
from study.findings.length_aware import ALISE_BASELINE, ALISE_DATASETS, ALISE_REQUESTS, ALISE_VARIANTS as VARIANTS
from study.findings.length_aware import alise_knee, knee_grid
from study.findings.length_aware import alise_scenario as scenario


def main(quick=False):
    n = {d: k // 2 if quick else k for d, k in ALISE_REQUESTS.items()}
    out = {"baseline_knee_rps": {}, "runs": [], "sustainable": {}, "predictor_sensitivity": []}
    for dataset in ALISE_DATASETS:
        # the same multiples of the baseline's knee on this setup as the findings use
        knee = out["baseline_knee_rps"][dataset] = alise_knee(dataset, n[dataset])
        rates = knee_grid(knee, 2 if quick else 1)
        curves = {}
        for var in VARIANTS:
            nl = []
            for rate in rates:
                m = run(scenario(dataset, var, rate, n[dataset]))
                m.update(dataset=dataset, variant=var, rate=rate)
                out["runs"].append(m)
                nl.append(m["normalized_latency_s"])
                print(f"{dataset:8s} {var:16s} rate {rate:6.1f}  NL {m['normalized_latency_s']*1e3:8.1f} ms/tok  "
                      f"JCT {m['jct_mean_s']:7.2f} s  swaps {m['swaps']:5d}  evictions {m['evictions']:5d}  "
                      f"({m['wall_s']:.1f}s)", flush=True)
            curves[var] = nl
        thr = 4 * curves[ALISE_BASELINE][0]        # latency constraint: 4x vLLM's normalized latency at the lowest rate
        sus = {v: sustainable_rate(rates, nl, thr) for v, nl in curves.items()}
        out["sustainable"][dataset] = {"threshold_s_per_token": thr, "rates": sus,
                                       "alise_vs_vllm": sus["alise"] / max(sus["vllm"], 1e-9),
                                       "alise_vs_vllm_int8": sus["alise"] / max(sus["vllm-int8"], 1e-9),
                                       "alise_vs_orca": sus["alise"] / max(sus["orca"], 1e-9)}
        print(f"{dataset}: sustainable rate at NL <= {thr*1e3:.1f} ms/token: " +
              ", ".join(f"{v} {r:.1f}" for v, r in sus.items()), flush=True)
    # above the baseline's knee on ShareGPT, where the order of the queue matters (below it every predictor ties)
    dataset = "sharegpt"
    rate = out["baseline_knee_rps"][dataset] * 1.5
    for mae in (0.0, 0.034, 0.092, 0.148, 0.3, 0.6, 0.9):
        pred = {"kind": "oracle"} if mae == 0 else {"kind": "noisy", "error": mae}
        m = run(scenario(dataset, "alise", rate, n[dataset], predictor=pred))
        m.update(dataset=dataset, rate=rate, mae=mae)
        out["predictor_sensitivity"].append(m)
        print(f"predictor MAE {mae:.3f}: NL {m['normalized_latency_s']*1e3:.1f} ms/tok  JCT {m['jct_mean_s']:.2f} s  "
              f"overruns {m['policy_stats']['overruns']}", flush=True)
    print("wrote", write("alise", out))


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
