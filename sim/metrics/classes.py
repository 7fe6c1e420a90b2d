"""Per-class metrics for RT/BE co-serving (BROS §7.1): RT TTFT/TPOT, per-token SLO attainment, BE throughput."""
from __future__ import annotations

import numpy as np


def token_attainment(req, ttft_s: float, tpot_s: float) -> float:
    """Fraction of a request's tokens delivered on time: the first within TTFT of arrival, each later one within
    TPOT of the previous (the fine-grained reading (a) of spec bros §8). Needs sim.keep_token_times."""
    t = np.asarray(req.token_times, dtype=float)
    if len(t) != req.generated or len(t) == 0:
        raise ValueError(f"request {req.id}: token times were not kept; set sim.keep_token_times: true")
    ok = int(t[0] - req.arrival_s <= ttft_s) + int(np.sum(np.diff(t) <= tpot_s))
    return ok / len(t)


def rt_be_summary(requests, ttft_s: float = 0.4, tpot_s: float = 0.2) -> dict:
    """RT latency and SLO attainment (per-request and per-token) and BE throughput in requests/s: over the whole run
    (be_throughput_rps) and while the RT stream lasts (be_capacity_rps, the measure under a BE backlog)."""
    rt = [r for r in requests if r.cls == "rt" and r.completion_s is not None]
    be = [r for r in requests if r.cls != "rt"]
    out = {"rt_requests": len(rt), "be_requests": len(be)}
    if rt:
        ttft = np.array([r.first_token_s - r.arrival_s for r in rt])
        tpot = np.array([(r.completion_s - r.first_token_s) / (r.output_tokens - 1) for r in rt if r.output_tokens > 1])
        norm = np.array([(r.completion_s - r.arrival_s) / r.output_tokens for r in rt])
        out.update(rt_ttft_mean=float(ttft.mean()), rt_ttft_p99=float(np.percentile(ttft, 99)),
                   rt_tpot_mean=float(tpot.mean()) if len(tpot) else float("nan"),
                   rt_normalized_latency_mean=float(norm.mean()),
                   rt_ttft_attainment=float(np.mean(ttft <= ttft_s)),
                   rt_tpot_attainment=float(np.mean(tpot <= tpot_s)) if len(tpot) else float("nan"),
                   rt_token_attainment=float(np.mean([token_attainment(r, ttft_s, tpot_s) for r in rt])))
    done = [r for r in be if r.completion_s is not None]
    if rt and done:                    # BE capacity: BE completions while the RT stream lasts (a backlogged BE)
        t0 = min(r.arrival_s for r in rt)
        t1 = max(r.arrival_s for r in rt)
        if t1 > t0:
            out["be_capacity_rps"] = sum(t0 <= r.completion_s <= t1 for r in done) / (t1 - t0)
    if done:
        span = max(r.completion_s for r in done) - min(r.arrival_s for r in be)
        out["be_completed"] = len(done)
        out["be_throughput_rps"] = len(done) / span if span > 0 else float("nan")
        out["be_token_throughput"] = sum(r.generated for r in done) / span if span > 0 else float("nan")
    return out
