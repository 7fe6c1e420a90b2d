"""Summary statistics of a request table: count, duration, rate, inter-arrival CV, length percentiles."""
from __future__ import annotations

import numpy as np
import pandas as pd

from traces.arrivals import interarrival_cv, mean_rate

PERCENTILES = (50, 90, 99)


def trace_stats(df: pd.DataFrame) -> dict:
    a = np.sort(df["arrival_s"].to_numpy(float))
    out = {"requests": int(len(df)), "duration_s": float(a[-1] - a[0]) if len(a) else 0.0,
           "rate_rps": mean_rate(a), "interarrival_cv": interarrival_cv(a)}
    for col, short in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        v = df[col].to_numpy(float)
        out[f"{short}_mean"] = float(v.mean())
        for p in PERCENTILES:
            out[f"{short}_p{p}"] = float(np.percentile(v, p))
        out[f"{short}_max"] = float(v.max())
    if len(df) > 1 and df["prompt_tokens"].std() > 0 and df["output_tokens"].std() > 0:
        out["corr_prompt_output"] = float(np.corrcoef(df["prompt_tokens"], df["output_tokens"])[0, 1])
    if "cls" in df:
        for name, n in df["cls"].value_counts().sort_index().items():
            out[f"requests_{name}"] = int(n)
    if "predicted_output_tokens" in df:
        from traces.predictors import mean_relative_error
        out["predicted_mean_relative_error"] = mean_relative_error(df["predicted_output_tokens"],
                                                                   df["output_tokens"])
    return out
