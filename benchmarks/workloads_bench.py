"""Workload benchmark: trace-loading speed and the accuracy of arrival processes, time-scaling and predictors.

Prints a table and writes JSON (default benchmarks/results/workloads.json).
Run: PYTHONPATH=. python benchmarks/workloads_bench.py [--rows 1000000] [--out FILE]"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sim.paths import shared_data_dir
from traces.arrivals import draw_arrivals, interarrival_cv, mean_rate, scale_to_rate
from traces.loaders import load_trace
from traces.predictors import bucket_accuracy, mean_relative_error, predict_lengths, PRESETS


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def azure_2024_like(path: Path, rows: int, rng) -> None:
    """A synthetic file in the Azure 2024 layout, mixing whole-second and fractional timestamps as the real one does."""
    t = np.cumsum(rng.exponential(0.05, rows))
    whole = rng.random(rows) < 0.3
    t[whole] = np.floor(t[whole])
    t.sort()
    base = pd.Timestamp("2024-05-10", tz="UTC")
    when = base + pd.to_timedelta(t, unit="s")
    stamps = np.where(t == np.floor(t), when.strftime("%Y-%m-%d %H:%M:%S+00:00"),
                      when.strftime("%Y-%m-%d %H:%M:%S.%f+00:00"))
    order = np.arange(rows)
    pd.DataFrame({"TIMESTAMP": stamps[order], "ContextTokens": rng.integers(1, 8000, rows),
                  "GeneratedTokens": rng.integers(1, 1000, rows)}).to_csv(path, index=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the synthetic Azure-2024-format file")
    ap.add_argument("--draws", type=int, default=100_000, help="draws per arrival/predictor accuracy check")
    ap.add_argument("--out", default="benchmarks/results/workloads.json")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    res = {"loading": {}, "arrivals": [], "time_scaling": [], "predictors": []}

    data = shared_data_dir()
    if data is not None:
        for name in ("code", "conv"):
            path = data / f"traces/azure-llm-2023/AzureLLMInferenceTrace_{name}.csv"
            df, sec = timed(lambda: load_trace(path, format="azure"))
            res["loading"][f"azure-2023-{name}"] = {"rows": len(df), "seconds": sec, "rows_per_s": len(df) / sec}
            a = df["arrival_s"].to_numpy()
            for target in (1.0, 10.0, 50.0):
                s = scale_to_rate(a, target)
                res["time_scaling"].append({"trace": name, "target_rps": target, "achieved_rps": mean_rate(s),
                                            "cv_before": interarrival_cv(a), "cv_after": interarrival_cv(s)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure2024like.csv"
        azure_2024_like(path, args.rows, rng)
        df, sec = timed(lambda: load_trace(path, format="azure"), repeat=1)
        res["loading"]["azure-2024-format-synthetic"] = {"rows": len(df), "seconds": sec,
                                                         "rows_per_s": len(df) / sec}

    for spec in ({"process": "poisson", "rate": 5.0}, *({"process": "gamma", "rate": 5.0, "cv": cv}
                                                       for cv in (0.5, 1, 2, 5, 10))):
        a = draw_arrivals(spec, args.draws, np.random.default_rng(1), "bench")
        gaps = np.diff(np.concatenate(([0.0], a)))
        want_cv = spec.get("cv", 1.0)
        res["arrivals"].append({**spec, "draws": args.draws, "mean_gap_s": gaps.mean(), "target_gap_s": 0.2,
                                "cv": gaps.std() / gaps.mean(), "target_cv": want_cv})

    true = pd.DataFrame({"arrival_s": np.zeros(args.draws), "prompt_tokens": 1,
                         "output_tokens": np.random.default_rng(2).integers(32, 1025, args.draws)})
    for name, spec in PRESETS.items():
        pred = predict_lengths({"preset": name, "padding": 0.0}, true, np.random.default_rng(3))
        row = {"preset": name, "mean_relative_error": mean_relative_error(pred, true["output_tokens"]),
               "bucket_accuracy_128": bucket_accuracy(pred, true["output_tokens"], 128)}
        row["stated"] = spec.get("error", spec.get("accuracy", 0.0))
        res["predictors"].append(row)

    print("loading:")
    for k, v in res["loading"].items():
        print(f"  {k:<30} {v['rows']:>9} rows  {v['seconds']:.3f} s  {v['rows_per_s']:,.0f} rows/s")
    print("arrivals (mean gap, CV vs target):")
    for r in res["arrivals"]:
        print(f"  {r['process']:<8} cv={r['target_cv']:<4} gap {r['mean_gap_s']:.4f}/{r['target_gap_s']}  "
              f"cv {r['cv']:.3f}/{r['target_cv']}")
    print("time scaling (achieved vs target rate, CV before/after):")
    for r in res["time_scaling"]:
        print(f"  {r['trace']:<5} {r['target_rps']:>5} -> {r['achieved_rps']:.4f} req/s  "
              f"cv {r['cv_before']:.3f} -> {r['cv_after']:.3f}")
    print("predictors (stated vs measured; error = mean |pred-true|/true, accuracy = same 128-token bucket):")
    for r in res["predictors"]:
        print(f"  {r['preset']:<24} stated {r['stated']:.3f}  error {r['mean_relative_error']:.4f}  "
              f"accuracy {r['bucket_accuracy_128']:.4f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
