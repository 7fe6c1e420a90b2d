"""SGLang against vLLM on a published benchmark: the `sglang` preset beside `vllm-v1` (and `vllm-v0` multi-step).

Published (SGLang repository, benchmark/benchmark_vllm_060/README.md, the SGLang v0.3.0 release comparison; see
SOURCE): Llama-3.1-8B-Instruct on one A100 80G, ShareGPT prompts through sglang.bench_serving, SGLang 0.3.0
(--enable-torch-compile --disable-radix-cache, mem_frac 0.88) against vLLM 0.6.0 (--num-scheduler-steps 10,
gpu_memory_utilization 0.9, max_model_len 4096). Offline (5000 prompts, all sent at once): 22.03 against 21.27
requests/s, 4281.51 against 4132.37 output tokens/s (ratio 1.036). Online (Poisson 4 and 8 requests/s, 1200 and
2400 prompts): median end-to-end latency, TTFT and TPOT per engine (the table's ITL is left out: with multi-step
vLLM streams ten tokens at a time, and the simulator reports per-token times, not stream chunks).

That vLLM is 0.6.0, the V0 engine. `vllm-v1` is today's engine (chunked prefill always on, no multi-step), so the
published SGLang/vLLM ratio is not what `sglang`/`vllm-v1` should reproduce; `vllm-v0` with num_scheduler_steps 10
is the configuration the table measured and is run as a third column.

Here: the same model, GPU and memory fractions, max_model_len 4096 for every engine, SGLang's radix cache off as
published. Both engines run on one cost model, `auto` (no fitted profile for this pair, so the roofline with the
repository's efficiencies and vLLM's overheads): only scheduling and KV memory differ between the columns, not
kernels (FlashInfer, torch.compile, CUDA graphs). Nothing here is fitted to the published throughputs.

Workload (`sglang-bench-sharegpt`, registered below): ShareGPT-like lengths, independent lognormals with the
log-spreads of the ShareGPT fit in traces/aptbros.py and means set to the ShareGPT token counts that
sglang.bench_serving printed with the Llama-3.1 tokenizer in a public issue (LENGTH_SOURCE: 453,502 input and
376,493 output tokens over 2,000 prompts, i.e. 226.8 and 188.2 per request), drawn again until they pass the
benchmark's filter (both >= 4 tokens, prompt <= 1024, prompt + output <= 2048). The published offline row itself
implies 194.3 output tokens per request (output over request throughput), a check on that choice, not an input.
`--lengths aptbros` swaps in the untruncated means of the ShareGPT fit in traces/aptbros.py (Llama-2 tokens),
to show which results hang on the length assumption.

Printed: per engine, mean over seeds with a 95% t-interval, published beside simulated, and the SGLang/vLLM ratios.

  PYTHONPATH=. python benchmarks/sglang_vs_vllm_published.py [--seeds 5] [--offline-requests 5000]
      [--lengths issue1639|aptbros] [--out FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.results_io import write_json
from traces.aptbros import SHAREGPT_OUTPUT, SHAREGPT_PROMPT
from traces.registry import register_workload

REPO = Path(__file__).resolve().parent.parent
SOURCE = "https://github.com/sgl-project/sglang/blob/main/benchmark/benchmark_vllm_060/README.md"
LENGTH_SOURCE = "https://github.com/sgl-project/sglang/issues/1639"
VERSIONS = {"sglang": "0.3.0", "vllm": "0.6.0 (V0 engine, --num-scheduler-steps 10)"}
MODEL, GPU, MAX_MODEL_LEN = "llama-3.1-8b", "a100-80gb", 4096
MEAN_PROMPT, MEAN_OUTPUT = 453502 / 2000, 376493 / 2000
# Mean (prompt, output) tokens per request: the default from LENGTH_SOURCE; `aptbros` (a sensitivity check) uses
# the untruncated means of the ShareGPT fit in traces/aptbros.py (vLLM's benchmark sampling, Llama-2 tokens).
LENGTHS = {"issue1639": (MEAN_PROMPT, MEAN_OUTPUT),
           "aptbros": tuple(float(np.exp(m + s * s / 2)) for m, s in (SHAREGPT_PROMPT, SHAREGPT_OUTPUT))}

# Figures as published; latencies in milliseconds.
PUBLISHED = {
    "offline": {"num_prompts": 5000,
                "sglang": {"request_throughput": 22.03, "output_tps": 4281.51},
                "vllm": {"request_throughput": 21.27, "output_tps": 4132.37}},
    "online": {4: {"num_prompts": 1200,
                   "sglang": {"e2e_p50_ms": 1564.17, "ttft_p50_ms": 31.98, "tpot_p50_ms": 13.17},
                   "vllm": {"e2e_p50_ms": 1691.97, "ttft_p50_ms": 100.48, "tpot_p50_ms": 14.14}},
               8: {"num_prompts": 2400,
                   "sglang": {"e2e_p50_ms": 2175.02, "ttft_p50_ms": 35.68, "tpot_p50_ms": 17.85},
                   "vllm": {"e2e_p50_ms": 2137.16, "ttft_p50_ms": 120.39, "tpot_p50_ms": 17.09}}},
}

# Engine columns: preset name, policy knobs, memory fraction of the published launch.
ENGINES = {
    "sglang": ({"name": "sglang", "prefix_caching": False}, 0.88),
    "vllm-v1": ({"name": "vllm-v1"}, 0.9),
    "vllm-v0-ms10": ({"name": "vllm-v0", "num_scheduler_steps": 10}, 0.9),
}


def _mu(mean: float, sigma: float) -> float:
    """Log-mean of a lognormal with this mean and log-spread (before the benchmark's filter truncates it)."""
    return float(np.log(mean) - sigma ** 2 / 2)


def bench_sharegpt_lengths(n: int, rng: np.random.Generator, means=(MEAN_PROMPT, MEAN_OUTPUT)):
    """(prompt, output) token counts passing sglang.bench_serving's ShareGPT filter; rejected pairs are redrawn."""
    sp, so = SHAREGPT_PROMPT[1], SHAREGPT_OUTPUT[1]
    p = np.empty(n, np.int64)
    o = np.empty(n, np.int64)
    todo = np.arange(n)
    while len(todo):
        pp = np.rint(rng.lognormal(_mu(means[0], sp), sp, len(todo))).astype(np.int64)
        oo = np.rint(rng.lognormal(_mu(means[1], so), so, len(todo))).astype(np.int64)
        ok = (pp >= 4) & (oo >= 4) & (pp <= 1024) & (pp + oo <= 2048)
        p[todo[ok]], o[todo[ok]] = pp[ok], oo[ok]
        todo = todo[~ok]
    return p, o


@register_workload("sglang-bench-sharegpt", replace=True)
def _workload(spec, rng, where):
    """ShareGPT-like requests as sglang.bench_serving sends them: all at t = 0 (rate 'inf') or Poisson at `rate`."""
    n = int(spec["num_requests"])
    rate = spec.get("rate")
    p, o = bench_sharegpt_lengths(n, rng, LENGTHS[spec.get("lengths", "issue1639")])
    arrivals = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1.0 / float(rate), n))
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": p, "output_tokens": o})


def scenario(engine: str, n: int, seed: int, rate: float | None = None, lengths: str = "issue1639") -> dict:
    policy, mem = ENGINES[engine]
    wl = {"kind": "sglang-bench-sharegpt", "num_requests": n, "lengths": lengths}
    if rate is not None:
        wl["rate"] = rate
    return {"name": f"sglang-vs-vllm-{engine}", "seed": seed,
            "model": {"name": MODEL, "max_model_len": MAX_MODEL_LEN},
            "hardware": {"gpu": GPU, "gpu_memory_utilization": mem}, "policy": dict(policy), "workload": wl}


def run(engine: str, n: int, seed: int, rate: float | None = None, lengths: str = "issue1639") -> dict:
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    res = run_scenario(scenario_from_dict(scenario(engine, n, seed, rate, lengths)))
    s, req = res.summary, res.requests
    if s["completed"] != n:
        raise RuntimeError(f"{engine}: {s['completed']} of {n} requests completed")
    # bench_serving: throughput over the time to the last completion; TPOT excludes the first token.
    return {"request_throughput": float(s["request_throughput"]), "output_tps": float(s["tps"]),
            "e2e_p50_ms": 1e3 * float(req["e2e_s"].median()), "ttft_p50_ms": 1e3 * float(req["ttft_s"].median()),
            "tpot_p50_ms": 1e3 * float(req.loc[req["output_tokens"] > 1, "tpot_s"].median()),
            "mean_prompt": float(req["prompt_tokens"].mean()), "mean_output": float(req["output_tokens"].mean())}


def interval(xs) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval over seeds (0 for one seed)."""
    from scipy import stats
    xs = np.asarray(xs, float)
    if len(xs) < 2:
        return float(xs.mean()), 0.0
    return float(xs.mean()), float(stats.t.ppf(0.975, len(xs) - 1) * xs.std(ddof=1) / np.sqrt(len(xs)))


def collect(seeds, n_offline: int, online_scale: float = 1.0, lengths: str = "issue1639") -> dict:
    """Every engine on the offline and the two online settings, per seed; ratios are taken within a seed."""
    out = {"offline": {}, "online": {}}
    for e in ENGINES:
        out["offline"][e] = [run(e, n_offline, s, None, lengths) for s in seeds]
    for rate, pub in PUBLISHED["online"].items():
        n = max(1, int(round(pub["num_prompts"] * online_scale)))
        out["online"][rate] = {e: [run(e, n, s, float(rate), lengths) for s in seeds] for e in ENGINES}
    return out


def summarise(raw: dict) -> dict:
    def stat(rows, key):
        m, h = interval([r[key] for r in rows])
        return {"mean": m, "ci95": h}

    def ratio(a, b, key):
        m, h = interval([x[key] / y[key] for x, y in zip(a, b)])
        return {"mean": m, "ci95": h}

    off = raw["offline"]
    summ = {"offline": {e: {k: stat(off[e], k) for k in ("request_throughput", "output_tps", "mean_prompt",
                                                          "mean_output")} for e in ENGINES},
            "offline_ratio": {v: ratio(off["sglang"], off[v], "output_tps") for v in ("vllm-v1", "vllm-v0-ms10")},
            "online": {}}
    for rate, per in raw["online"].items():
        summ["online"][rate] = {e: {k: stat(per[e], k) for k in ("e2e_p50_ms", "ttft_p50_ms", "tpot_p50_ms")}
                                for e in ENGINES}
        summ["online"][rate]["ttft_ratio"] = {v: ratio(per[v], per["sglang"], "ttft_p50_ms")
                                              for v in ("vllm-v1", "vllm-v0-ms10")}
    return summ


def _fmt(s: dict) -> str:
    return f"{s['mean']:.2f} ± {s['ci95']:.2f}"


def report(summ: dict, lengths: str = "issue1639") -> None:
    print(f"source: {SOURCE}  (SGLang {VERSIONS['sglang']} vs vLLM {VERSIONS['vllm']})")
    print(f"{MODEL} on one {GPU}, ShareGPT-like lengths, means {LENGTHS[lengths][0]:.1f} / {LENGTHS[lengths][1]:.1f} "
          f"({LENGTH_SOURCE if lengths == 'issue1639' else 'traces/aptbros.py'}, before the filter)")
    pub = PUBLISHED["offline"]
    print("\noffline (all requests at t = 0):")
    print(f"{'engine':14s} {'req/s sim':>16s} {'req/s pub':>10s} {'out tok/s sim':>20s} {'out tok/s pub':>14s}")
    for e in ENGINES:
        p = pub["sglang" if e == "sglang" else "vllm"]
        s = summ["offline"][e]
        print(f"{e:14s} {_fmt(s['request_throughput']):>16s} {p['request_throughput']:>10.2f} "
              f"{_fmt(s['output_tps']):>20s} {p['output_tps']:>14.2f}")
    pub_ratio = pub["sglang"]["output_tps"] / pub["vllm"]["output_tps"]
    for v, r in summ["offline_ratio"].items():
        print(f"SGLang/vLLM output throughput: simulated sglang/{v} {_fmt(r)}, published {pub_ratio:.3f}")
    m = summ["offline"]["sglang"]
    print(f"(simulated mean lengths: prompt {m['mean_prompt']['mean']:.1f}, output {m['mean_output']['mean']:.1f}; "
          f"the published row implies output {pub['sglang']['output_tps'] / pub['sglang']['request_throughput']:.1f})")
    for rate, per in summ["online"].items():
        p = PUBLISHED["online"][rate]
        print(f"\nonline, Poisson {rate} req/s (medians, ms; published SGLang / vLLM):")
        for k in ("e2e_p50_ms", "ttft_p50_ms", "tpot_p50_ms"):
            sims = "  ".join(f"{e} {_fmt(per[e][k])}" for e in ENGINES)
            print(f"  {k:12s} {sims}   | pub {p['sglang'][k]:.2f} / {p['vllm'][k]:.2f}")
        pr = p["vllm"]["ttft_p50_ms"] / p["sglang"]["ttft_p50_ms"]
        sims = ", ".join(f"{v}/sglang {_fmt(r)}" for v, r in per["ttft_ratio"].items())
        print(f"  TTFT vLLM/SGLang: simulated {sims}; published {pr:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--offline-requests", type=int, default=PUBLISHED["offline"]["num_prompts"])
    ap.add_argument("--online-scale", type=float, default=1.0, help="fraction of the published prompt counts")
    ap.add_argument("--lengths", choices=sorted(LENGTHS), default="issue1639",
                    help="mean lengths: issue1639 (Llama-3.1 tokens, default) or aptbros (sensitivity check)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "sglang_vs_vllm_published.json"))
    args = ap.parse_args(argv)
    seeds = list(range(1, args.seeds + 1))
    raw = collect(seeds, args.offline_requests, args.online_scale, args.lengths)
    summ = summarise(raw)
    report(summ, args.lengths)
    write_json(args.out, {"source": SOURCE, "length_source": LENGTH_SOURCE, "versions": VERSIONS,
                          "published": PUBLISHED, "engines": {e: {"policy": p, "gpu_memory_utilization": m}
                                                              for e, (p, m) in ENGINES.items()},
                          "seeds": seeds, "offline_requests": args.offline_requests,
                          "online_scale": args.online_scale, "lengths": args.lengths,
                          "mean_lengths": LENGTHS[args.lengths], "summary": summ})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
