"""BROS (spec bros.md §10) claims the spec marks simulator-checkable (Sim? = Y or P); BR-n is the spec's R-n.
Setup: examples/bros-rt-be.yaml (OPT-13B over two A100-40GB, TP = 2, as the paper; RT ShareGPT-like Poisson
stream with SLO TTFT 0.4 s / TPOT 0.2 s; BE a backlog, as the paper's closed loop keeps it, and BE throughput is
the rate BE work completes while RT traffic runs), RT rates 1.5 and 3 req/s, memory pressure M = 6000 tokens for
the ablation; the vLLM baseline is vLLM v0. Not registered: R15 (scheduling overhead, a Python measurement)."""
from __future__ import annotations

import numpy as np

from study.findings.aptbros import bros_run
from study.findings.registry import (TIE, Outcome, Scale, attach_why, not_modelled, register_claim, untestable_reason,
                                         within, within_ratio)
from study.findings.runs import memo

RATES = (1.5, 3.0)
HIGH_RATE = 6.0          # R6's "extremely high request rate" on our two-GPU setup
VLLM = "vllm-v0"
PRESSURE_M = 6000


def br(s: Scale, policy: str, rate: float, M: int | None = None, rt_only: bool = False) -> dict:
    """One run; `vllm` is the paper's vLLM baseline, run as vLLM v0 (its own scheduler)."""
    policy = VLLM if policy == "vllm" else policy
    ov = [f"workload.rt_requests={s.bros_rt}", f"workload.rt_rate={rate}"] + ([f"memory.M={M}"] if M else [])
    return memo(("bros", s.bros_rt, policy, rate, M, rt_only),
                lambda: {k: v for k, v in bros_run(policy, ov, rt_only).items() if k != "policy_stats"})


def _per_rate(s, key):
    return {p: [br(s, p, r)[key] for r in RATES] for p in ("vllm", "bros-rr", "bros")}


def pct(v):
    return f"{100 * v:+.1f}%"


def _rates():
    return f" (RT rates {', '.join(f'{r:g}' for r in RATES)} req/s)"


@register_claim("BR-1", "bros", "Abstract", "RT latency reduced by up to 74.20% and fine-grained SLO attainment up "
                "to 36.38x vs vLLM, with negligible BE throughput reduction")
def br1(s):
    nl, att, be = (_per_rate(s, k) for k in ("rt_normalized_latency_mean", "rt_ttft_attainment", "be_capacity_rps"))
    red = max(1 - b / v for b, v in zip(nl["bros"], nl["vllm"]))
    ratio = max(b / max(v, 1e-3) for b, v in zip(att["bros"], att["vllm"]))
    be_ch = min(b / v - 1 for b, v in zip(be["bros"], be["vllm"]))
    return Outcome("−74.20%; 36.38x; BE ≈ unchanged", f"RT normalized latency up to {pct(-red)}; TTFT attainment up to "
                   f"{ratio:.2f}x; BE throughput at worst {pct(be_ch)}" + _rates(), red > 0 and ratio > 1 and
                   be_ch > -0.2, within(red, 0.742) and within_ratio(ratio, 36.38),
                   note="'negligible' read as a BE loss under 20% (the paper's own R3 is −11.29%)")


@register_claim("BR-2", "bros", "7.2 (Fig. 10a–c)", "RT average normalized latency: BROS < RR < vLLM at every rate; "
                "−74.20% vs vLLM and −54.31% vs RR (ShareGPT)")
def br2(s):
    nl = _per_rate(s, "rt_normalized_latency_mean")
    order = all(b < r < v for b, r, v in zip(nl["bros"], nl["bros-rr"], nl["vllm"]))
    best = all(b < min(r, v) for b, r, v in zip(nl["bros"], nl["bros-rr"], nl["vllm"]))
    dv = float(np.mean([b / v - 1 for b, v in zip(nl["bros"], nl["vllm"])]))
    dr = float(np.mean([b / r - 1 for b, r in zip(nl["bros"], nl["bros-rr"])]))
    return Outcome("BROS < RR < vLLM; −74.20% / −54.31%",
                   "ms/token " + "; ".join(f"{p}: " + ", ".join(f"{1e3 * v:.0f}" for v in nl[p]) for p in nl) +
                   f"{_rates()}; BROS {pct(dv)} vs vLLM, {pct(dr)} vs RR (mean over rates); BROS lowest at every "
                   f"rate: {'yes' if best else 'no'}", order, within(-dv, 0.742) and within(-dr, 0.5431))


@register_claim("BR-3", "bros", "7.2 (Fig. 10a–c)", "BE throughput: BROS slightly below both baselines, −11.29% vs "
                "vLLM and −8.80% vs RR (vLLM ≥ RR ≥ BROS)")
def br3(s):
    be = _per_rate(s, "be_capacity_rps")
    dv = float(np.mean([b / v - 1 for b, v in zip(be["bros"], be["vllm"])]))
    dr = float(np.mean([b / r - 1 for b, r in zip(be["bros"], be["bros-rr"])]))
    order = all(v >= r >= b for b, r, v in zip(be["bros"], be["bros-rr"], be["vllm"]))
    return Outcome("vLLM ≥ RR ≥ BROS; −11.29% / −8.80%",
                   "req/s " + "; ".join(f"{p}: " + ", ".join(f"{v:.2f}" for v in be[p]) for p in be) +
                   f"{_rates()}; BROS {pct(dv)} vs vLLM, {pct(dr)} vs RR", order,
                   within(-dv, 0.1129) and within(-dr, 0.088))


for _id, _st in (("BR-4", "LMSYS-Chat-1M RT: average normalized latency −69.61% vs vLLM, −25.77% vs RR"),
                 ("BR-5", "LMSYS-Chat-1M RT: BE throughput −17.67% vs vLLM, −15.18% vs RR"),
                 ("BR-9", "LMSYS-Chat-1M RT: TTFT attainment 21.42x vs vLLM, 14.23x vs RR; TPOT 2.62x / 2.28x")):
    register_claim(_id, "bros", "7.2 (Figs. 10d–f, 11d–f)", _st)(
        lambda s: not_modelled("see statement", "no LMSYS-Chat-1M-like length model is implemented"))


@register_claim("BR-6", "bros", "7.2 (Fig. 10c, f)", "BROS keeps RT latency low even at an extremely high RT rate, "
                "at the cost of BE throughput")
def br6(s):
    lo, hi = br(s, "bros", RATES[0]), br(s, "bros", HIGH_RATE)
    vlo, vhi = br(s, "vllm", RATES[0]), br(s, "vllm", HIGH_RATE)
    g = hi["rt_normalized_latency_mean"] / lo["rt_normalized_latency_mean"]
    gv = vhi["rt_normalized_latency_mean"] / vlo["rt_normalized_latency_mean"]
    be = hi["be_capacity_rps"] / lo["be_capacity_rps"] - 1
    return Outcome("RT latency ≈ flat, BE throughput drops",
                   f"RT rate {RATES[0]:g} → {HIGH_RATE:g} req/s: BROS RT normalized latency {g:.2f}x (vLLM {gv:.2f}x), "
                   f"BROS BE throughput {pct(be)}", g < 2 and g < gv and be < 0)


def _ratio_claim(key, paper_v, paper_r, label):
    def check(s):
        a = _per_rate(s, key)
        rv = float(np.mean([b / max(v, 1e-3) for b, v in zip(a["bros"], a["vllm"])]))
        rr = float(np.mean([b / max(r, 1e-3) for b, r in zip(a["bros"], a["bros-rr"])]))
        return Outcome(f"{paper_v}x vs vLLM, {paper_r}x vs RR",
                       f"{label}: " + "; ".join(f"{p}: " + ", ".join(f"{100 * v:.0f}%" for v in a[p]) for p in a) +
                       f"{_rates()}; BROS {rv:.2f}x vs vLLM, {rr:.2f}x vs RR (mean of per-rate ratios)",
                       rv > 1 and rr > 1, within_ratio(rv, paper_v) and within_ratio(rr, paper_r))
    return check


register_claim("BR-7", "bros", "7.2 (Fig. 11a–c)", "TTFT SLO attainment (0.4 s): 36.38x vs vLLM, 11.75x vs RR "
               "(ShareGPT)")(_ratio_claim("rt_ttft_attainment", 36.38, 11.75, "TTFT attainment"))


@register_claim("BR-8", "bros", "7.2 (Fig. 11a–c)", "TPOT SLO attainment (0.2 s): 1.73x vs vLLM, 1.47x vs RR "
                "(ShareGPT)")
def br8(s):
    out = _ratio_claim("rt_tpot_attainment", 1.73, 1.47, "per-request TPOT attainment")(s)
    tok = _per_rate(s, "rt_token_attainment")
    tok_ok = all(b > max(v, r) for b, v, r in zip(tok["bros"], tok["vllm"], tok["bros-rr"]))
    req_ok = all(b >= max(v, r) for b, v, r in zip(*(_per_rate(s, "rt_tpot_attainment")[p]
                                                     for p in ("bros", "vllm", "bros-rr"))))
    out.ours += "; per-token attainment " + "; ".join(f"{p}: " + ", ".join(f"{100 * v:.1f}%" for v in tok[p])
                                                       for p in tok)
    out.direction = req_ok and tok_ok
    out.note = ("direction: BROS's per-request TPOT attainment ≥ both baselines' and its per-token (fine-grained) "
                "attainment > both, at every rate")
    req = _per_rate(s, "rt_tpot_attainment")
    why = untestable_reason({p: float(np.mean(v)) for p, v in req.items()}, fraction=True)
    return Outcome(out.paper, out.ours, out.direction, out.magnitude, out.note, untestable=why)


@register_claim("BR-10", "bros", "7.2 (Fig. 11)", "vLLM's average TTFT attainment is 1.28% (FCFS with a BE backlog), "
                "RR's 10.55%")
def br10(s):
    a = _per_rate(s, "rt_ttft_attainment")
    v, r, b = (float(np.mean(a[p])) for p in ("vllm", "bros-rr", "bros"))
    return Outcome("vLLM 1.28%, RR 10.55% (BROS higher)", f"vLLM {100 * v:.1f}%, RR {100 * r:.1f}%, BROS "
                   f"{100 * b:.1f}%{_rates()}", v < r < b, within(v, 0.0128) and within(r, 0.1055))


@register_claim("BR-11", "bros", "7.2 (Fig. 11)", "Average TPOT attainment: RR 47.34%, BROS 65.49% (ShareGPT)")
def br11(s):
    a = _per_rate(s, "rt_tpot_attainment")
    r, b = float(np.mean(a["bros-rr"])), float(np.mean(a["bros"]))
    return Outcome("RR 47.34% < BROS 65.49%", f"RR {100 * r:.1f}%, BROS {100 * b:.1f}%{_rates()}", b > r,
                   within(r, 0.4734) and within(b, 0.6549),
                   untestable=untestable_reason({"RR": r, "BROS": b}, fraction=True))


@register_claim("BR-12", "bros", "7.2", "vLLM's RT TPOT suffers because later RT requests must release memory and "
                "wait; BROS avoids it by block sharing and preemption")
def br12(s):
    v, b = br(s, "vllm", RATES[-1], PRESSURE_M), br(s, "bros", RATES[-1], PRESSURE_M)
    return Outcome("vLLM preempts RT requests, BROS does not; BROS TPOT attainment ≥ vLLM's",
                   f"M = {PRESSURE_M}, {RATES[-1]:g} req/s: vLLM RT evictions {v.get('rt_evictions', 0)}, BROS "
                   f"{b.get('rt_evictions', 0)}; RT TPOT attainment vLLM {100 * v['rt_tpot_attainment']:.1f}%, BROS "
                   f"{100 * b['rt_tpot_attainment']:.1f}%; RT TPOT mean {1e3 * v['rt_tpot_mean']:.0f} vs "
                   f"{1e3 * b['rt_tpot_mean']:.0f} ms", v.get("rt_evictions", 0) > b.get("rt_evictions", 0) and
                   b["rt_tpot_attainment"] >= v["rt_tpot_attainment"])


@register_claim("BR-13", "bros", "7.3 (Fig. 12)", "Pure RT (no BE): BROS −29.36% normalized latency and 1.08x "
                "throughput vs vLLM")
def br13(s):
    rows = [(br(s, "bros", r, rt_only=True), br(s, "vllm", r, rt_only=True)) for r in RATES]
    red = float(np.mean([1 - b["rt_normalized_latency_mean"] / v["rt_normalized_latency_mean"] for b, v in rows]))
    thr = float(np.mean([b["rt_throughput_rps"] / v["rt_throughput_rps"] for b, v in rows]))
    return Outcome("−29.36%; 1.08x", f"normalized latency {pct(-red)}, throughput {thr:.3f}x{_rates()}",
                   red > TIE, within(red, 0.2936),
                   note="judged on latency only: at a fixed offered rate below capacity throughput is capped by the "
                        "arrivals, so the throughput half cannot be tested here",
                   untestable=untestable_reason({"BROS": 1 - red, "vLLM": 1.0}))


@register_claim("BR-14", "bros", "7.4 (Fig. 13)", "Bidirectional KV vs recompute on block failure (hybrid workload, "
                "memory-bound): TTFT attainment 1.23x and TPOT attainment 1.63x better")
def br14(s):
    b, n = br(s, "bros", RATES[-1], PRESSURE_M), br(s, "bros-nobi", RATES[-1], PRESSURE_M)
    t1 = b["rt_ttft_attainment"] / max(n["rt_ttft_attainment"], 1e-3)
    t2 = b["rt_tpot_attainment"] / max(n["rt_tpot_attainment"], 1e-3)
    ties = [t for t in (t1, t2) if abs(t - 1) <= TIE]
    return Outcome("1.23x TTFT, 1.63x TPOT", f"{t1:.3f}x TTFT, {t2:.3f}x TPOT (M = {PRESSURE_M}, {RATES[-1]:g} req/s)",
                   min(t1, t2) >= 1 - TIE and max(t1, t2) > 1 + TIE, within_ratio(t1, 1.23) and within_ratio(t2, 1.63),
                   untestable=("both ratios tie within 2% of 1x: bidirectional blocks change nothing measurable "
                               "at this memory pressure") if len(ties) == 2 else "")


WHY = {   # qualitative reasons for disagreements; the figures are in each row's `ours`, from the run itself
    "BR-3": "our BROS-RR alternates RT and BE iterations strictly and recomputes BE work on shortage, so it spends "
            "BE capacity on thin RT iterations and refills; BROS's adaptive BE fill completes more BE work",
    "BR-6": "at the higher RT rates the RT stream alone nears what two GPUs serve in this cost model, so BROS's RT "
            "latency rises and its BE share shrinks with it",
}
attach_why(WHY)
