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
from study.findings.verdicts import SEEDS, fmt_effect, ratio_outcome, seed_effect
from study.findings.registry import register_setup

RATES = (1.5, 3.0)
HIGH_RATE = 6.0          # R6's "extremely high request rate" on our two-GPU setup
VLLM = "vllm-v0"
PRESSURE_M = 6000
REGIME_M = PRESSURE_M    # the paper's regime: RT requests wait for KV the BE backlog holds (see _header)


def br(s: Scale, policy: str, rate: float, M: int | None = None, rt_only: bool = False, seed: int = 0,
       overheads: str | None = None) -> dict:
    """One run; `vllm` is the paper's vLLM baseline, run as vLLM v0 (its own scheduler). M defaults to the paper's
    regime (REGIME_M: the BE backlog holds the KV cache); M = 0 runs the example's full-size cache. `overheads`
    names a CPU-overhead preset (profiles/overheads.yaml) for the TPOT probe; none by default (GPU time only)."""
    policy = VLLM if policy == "vllm" else policy
    M = REGIME_M if M is None else M
    ov = [f"workload.rt_requests={s.bros_rt}", f"workload.rt_rate={rate}", f"seed={seed}"] + \
        ([f"memory.M={M}"] if M else []) + ([f"costmodel.overheads={overheads}"] if overheads else [])

    def compute():
        out = bros_run(policy, ov, rt_only)
        out["policy_stats"] = {k: v for k, v in out.get("policy_stats", {}).items() if isinstance(v, (int, float))}
        return out
    key = ("bros", s.bros_rt, policy, rate, M, rt_only, seed) + ((overheads,) if overheads else ())
    return memo(key, compute)


def _per_rate(s, key, seed=0, M=None, policies=("vllm", "bros-rr", "bros")):
    return {p: [br(s, p, r, M=M, seed=seed)[key] for r in RATES] for p in policies}


# BROS-vs-vLLM claims (BR-1, BR-6) run with the cache the paper used, the full size the engine profiles (M = 0 here):
# there our vLLM already meets the TTFT target as rarely as the paper's (header); only RR's regime needs REGIME_M.
PAPER_M = 0


def _effect(s, fn):
    """fn(per-rate table of one seed) -> the claim's effect on that seed; judged over SEEDS by the CI rule."""
    return seed_effect([fn(k) for k in SEEDS])


def counters(s, M=None, rates=RATES) -> str:
    """BROS's mechanism counters in the headline runs (seed 0): time-bound iterations, replacements, swap-outs."""
    M = REGIME_M if M is None else M
    parts = []
    for r in rates:
        st = br(s, "bros", r, M=M)["policy_stats"]
        parts.append(f"{r:g} req/s: time-bound iterations {st.get('time_bound_iters', 0)}, replacements "
                     f"{st.get('replacements', 0)}, extreme swap-outs {st.get('extreme_swapouts', 0)}, swapped-in "
                     f"slots {st.get('swap_in_slots', 0)}")
    return "Mechanism (BROS, " + (f"M = {M}" if M else "full-size cache") + ", seed 0): " + "; ".join(parts) + "."


def regime_be_note(s) -> str:
    """BE throughput BROS vs vLLM at REGIME_M (seed 0) and why it collapses there: BE requests whose slots RT
    took (lazy checkpointing) stay started with KV fragments resident, so few BE prompts can be admitted."""
    parts = []
    for r in RATES:
        b, v = br(s, "bros", r), br(s, "vllm", r)
        parts.append(f"{r:g} req/s: BE {b['be_capacity_rps']:.2f} vs vLLM {v['be_capacity_rps']:.2f} req/s")
    return (f"At M = {REGIME_M} (RR's regime, seed 0): " + "; ".join(parts) + ". There the BE backlog and RT share "
            f"{REGIME_M} slots: RT requests take BE slots (lazy checkpointing and extreme swap-outs), the BE requests "
            f"they hit stay started with KV fragments resident, and new BE prompts find no room. " + counters(s))


PROBE_RATE = 10.0        # the paper's ablation RT rate (Fig. 13), for the TPOT probe


def tpot_probe(s) -> str:
    """What makes RT TPOT miss here (seed 0, M = REGIME_M): at the headline rates every system keeps each RT
    token gap under 0.2 s; at the paper's ablation rate BROS's extreme swap-outs stall the swapped RT requests.
    Also whether the replacement path (Alg. 1 lines 25–31) can fire: with the batch-size limit binding (B = 8)."""
    parts = []
    for p in ("vllm", "bros-rr", "bros"):
        o = br(s, p, PROBE_RATE)
        parts.append(f"{p} per-request {100 * o['rt_tpot_attainment']:.0f}%, per-token "
                     f"{100 * o['rt_token_attainment']:.1f}%")
    st = br(s, "bros", PROBE_RATE)["policy_stats"]
    ov = [f"workload.rt_requests={s.bros_rt}", f"workload.rt_rate={RATES[-1]}", f"memory.M={REGIME_M}",
          "policy.b_base=8", "policy.b_max=8"]
    rep = memo(("bros-replace-probe", s.bros_rt, RATES[-1], REGIME_M),
               lambda: {k: v for k, v in bros_run("bros", ov).get("policy_stats", {}).items()
                        if isinstance(v, (int, float))})
    return (f"TPOT probe at RT {PROBE_RATE:g} req/s (M = {REGIME_M}, seed 0): " + "; ".join(parts) +
            f"; BROS time-bound iterations {st.get('time_bound_iters', 0)}, replacements {st.get('replacements', 0)}, "
            f"extreme swap-outs {st.get('extreme_swapouts', 0)}. Replacement path with the batch-size limit binding "
            f"(B = 8, {RATES[-1]:g} req/s): {rep.get('replacements', 0)} replacements, so it can fire; at the "
            f"default B (128, doubling) the batch-size limit never binds here and one RT decode's time is too small "
            f"to make room for a BE prefill under the time budget. ")


EAGER = "vllm-0.5-eager"    # an eager-mode engine's per-sequence CPU cost (1.63 ms/sequence, OPT-13B anchor)
TPOT_RATE = RATES[-1]      # the TPOT regime's RT rate (the headline's higher one)


def eager(s, policy: str, seed: int = 0) -> dict:
    """The TPOT regime: the paper's engine (an eager PyTorch/Ray prototype without CUDA graphs, so every sequence
    in a batch adds CPU time: the EAGER preset) with the full-size KV cache it profiled, where batches are large
    and RT token gaps pass 0.2 s. With GPU time only our gaps stay far under it and every system meets TPOT."""
    return br(s, policy, TPOT_RATE, M=0, seed=seed, overheads=EAGER)


def eager_table(s, key: str) -> dict:
    """policy → [value per seed] in the TPOT regime."""
    return {p: [eager(s, p, k)[key] for k in SEEDS] for p in ("vllm", "bros-rr", "bros")}


def eager_note(s) -> str:
    """The TPOT regime's other figures (means over the seeds) and BROS's counters there."""
    def m(key, p, scale=100.0):
        return scale * float(np.mean(eager_table(s, key)[p]))
    tb = [eager(s, "bros", k)["policy_stats"] for k in SEEDS]
    return (f"TPOT regime (overheads preset {EAGER}, full-size cache, RT {TPOT_RATE:g} req/s, mean of {len(SEEDS)} "
            "seeds): per-request TPOT attainment " + ", ".join(f"{p} {m('rt_tpot_attainment', p):.0f}%" for p in
                                                             ("vllm", "bros-rr", "bros")) +
            "; TTFT attainment " + ", ".join(f"{p} {m('rt_ttft_attainment', p):.1f}%" for p in
                                              ("vllm", "bros-rr", "bros")) +
            " (paper: vLLM 1.28%, RR 10.55%); BE throughput " + ", ".join(
                f"{p} {m('be_capacity_rps', p, 1.0):.2f}" for p in ("vllm", "bros-rr", "bros")) +
            f" req/s; BROS time-bound iterations {np.mean([t.get('time_bound_iters', 0) for t in tb]):.0f}, "
            f"replacements {np.mean([t.get('replacements', 0) for t in tb]):.1f} per run. ")


def _header(s) -> str:
    d = {p: float(np.mean([np.mean(_per_rate(s, "rt_ttft_attainment", k)[p]) for k in SEEDS]))
         for p in ("vllm", "bros-rr", "bros")}
    full = {p: float(np.mean([br(s, p, r, M=0)["rt_ttft_attainment"] for r in RATES])) for p in ("vllm", "bros-rr")}
    return (f"Regime: the paper's RR baseline misses the 0.4 s TTFT target 89% of the time (10.55% attainment) and "
            f"vLLM 98.7% (1.28%): RT requests wait for KV held by the BE backlog. With the example's full-size KV "
            f"cache our RR meets TTFT {100 * full['bros-rr']:.1f}% of the time and vLLM {100 * full['vllm']:.1f}% "
            f"(no memory contention). The full-size cache is the paper's, and with it our vLLM is in the paper's regime, so "
            f"the claims comparing BROS with vLLM alone (BR-1, BR-6) run there; the claims with RR run with the KV "
            f"cache at M = {REGIME_M} tokens, where the BE backlog fills it: attainment vLLM {100 * d['vllm']:.1f}%, RR {100 * d['bros-rr']:.1f}%, BROS "
            f"{100 * d['bros']:.1f}% (mean over RT rates {', '.join(f'{r:g}' for r in RATES)} req/s and "
            f"{len(SEEDS)} seeds). Rates are absolute, as the paper's. TPOT claims (BR-8, BR-11) need RT token gaps "
            f"over 0.2 s, which our GPU-time-only iterations never reach (every system meets TPOT there); they run in "
            f"the TPOT regime: the paper's engine is an eager PyTorch/Ray prototype, so each batched sequence adds CPU "
            f"time (overheads preset {EAGER}), with the full-size cache it profiled, at RT {TPOT_RATE:g} req/s. " +
            counters(s))


register_setup("bros", [
    ("model / GPUs", "OPT-13B over two A100-40GB (TP 2)", "same, roofline cost model, GPU time only"),
    ("KV cache", "what the engine sizes, filled by a closed-loop BE backlog",
     f"the full size (BR-1, BR-6: BROS vs vLLM); {REGIME_M} tokens for claims with RR, so the BE backlog "
     f"(32-request batches every 2 s) holds it and RR misses TTFT as in the paper"),
    ("RT workload", "ShareGPT (and LMSYS) traces", "ShareGPT-like lengths, Poisson; LMSYS not modelled"),
    ("BE workload", "closed loop of batch jobs", "32 requests every 2 s, prompt U(512,1024), output U(32,128)"),
    ("SLOs", "TTFT 0.4 s, TPOT 0.2 s", "same"),
    ("engine overheads", "eager PyTorch + Ray prototype (CPU time per iteration)",
     f"GPU time only; TPOT claims add {EAGER}'s per-sequence CPU time on the full-size cache"),
    ("RR baseline", "alternates RT/BE iterations", "same, 256 sequences / 4096 tokens per iteration, recompute"),
    ("seeds", "one run", f"{len(SEEDS)} seeds, 95% CI"),
], _header)


def pct(v):
    return f"{100 * v:+.1f}%"


def _rates():
    return f" (RT rates {', '.join(f'{r:g}' for r in RATES)} req/s)"


def _mean_ratio(t, key_a, key_b, f=lambda a, b: a / max(b, 1e-3)):
    return float(np.mean([f(a, b) for a, b in zip(t[key_a], t[key_b])]))


@register_claim("BR-1", "bros", "Abstract", "RT latency reduced by up to 74.20% and fine-grained SLO attainment up "
                "to 36.38x vs vLLM, with negligible BE throughput reduction")
def br1(s):
    def pr(key, k):
        return _per_rate(s, key, k, M=PAPER_M, policies=("vllm", "bros"))
    red = _effect(s, lambda k: max(1 - b / v for b, v in zip(*(pr("rt_normalized_latency_mean", k)[p]
                                                               for p in ("bros", "vllm")))))
    ratio = [max(b / max(v, 1e-3) for b, v in zip(*(pr("rt_ttft_attainment", k)[p] for p in ("bros", "vllm"))))
             for k in SEEDS]
    be = _effect(s, lambda k: 0.2 + min(b / v - 1 for b, v in zip(*(pr("be_capacity_rps", k)[p]
                                                                    for p in ("bros", "vllm")))))
    att_v = float(np.mean([np.mean(pr("rt_ttft_attainment", k)["vllm"]) for k in SEEDS]))
    # direction of the attainment gain in points (BROS − vLLM): the ratio is ill-conditioned when vLLM's
    # attainment is near zero (as the paper's 1.28%), so it is kept for the magnitude only
    att = _effect(s, lambda k: max(b - v for b, v in zip(*(pr("rt_ttft_attainment", k)[p] for p in ("bros", "vllm")))))
    from study.findings.verdicts import combine
    d, why = combine([red, att, be])
    return Outcome("−74.20%; 36.38x; BE ≈ unchanged", f"RT normalized latency up to {fmt_effect(seed_effect([-v for v in red.values]), 'rel')}; "
                   f"TTFT attainment up to {np.mean(ratio):.2f}x; BE throughput at worst {pct(be.mean - 0.2)}" + _rates()
                   + f", full-size cache (vLLM's TTFT attainment {100 * att_v:.1f}%, paper 1.28%)",
                   d, within(red.mean, 0.742) and within_ratio(float(np.mean(ratio)), 36.38),
                   note="'negligible' read as a BE loss under 20% (the paper's own R3 is −11.29%). The cache is the "
                   "paper's (the full size the engine profiles): the claim compares BROS with vLLM only, and there "
                   "vLLM's FCFS already misses the TTFT target as the paper's does. " + counters(s, PAPER_M) + " " +
                   regime_be_note(s),
                   untestable=why)


@register_claim("BR-2", "bros", "7.2 (Fig. 10a–c)", "RT average normalized latency: BROS < RR < vLLM at every rate; "
                "−74.20% vs vLLM and −54.31% vs RR (ShareGPT)")
def br2(s):
    key = "rt_normalized_latency_mean"
    nl = _per_rate(s, key)
    r = {"vLLM / BROS": [_mean_ratio(_per_rate(s, key, k), "vllm", "bros") for k in SEEDS],
         "RR / BROS": [_mean_ratio(_per_rate(s, key, k), "bros-rr", "bros") for k in SEEDS],
         "vLLM / RR": [_mean_ratio(_per_rate(s, key, k), "vllm", "bros-rr") for k in SEEDS]}
    out = ratio_outcome("BROS < RR < vLLM; −74.20% / −54.31%", r)
    dv = 1 - 1 / np.mean(r["vLLM / BROS"])
    dr = 1 - 1 / np.mean(r["RR / BROS"])
    out.ours = ("ms/token (seed 0) " + "; ".join(f"{p}: " + ", ".join(f"{1e3 * v:.0f}" for v in nl[p]) for p in nl) +
                f"{_rates()}; latency ratios " + out.ours)
    out.magnitude = within(dv, 0.742) and within(dr, 0.5431)
    return out


@register_claim("BR-3", "bros", "7.2 (Fig. 10a–c)", "BE throughput: BROS slightly below both baselines, −11.29% vs "
                "vLLM and −8.80% vs RR (vLLM ≥ RR ≥ BROS)")
def br3(s):
    key = "be_capacity_rps"
    be = _per_rate(s, key)
    r = {"vLLM / RR": [_mean_ratio(_per_rate(s, key, k), "vllm", "bros-rr") for k in SEEDS],
         "RR / BROS": [_mean_ratio(_per_rate(s, key, k), "bros-rr", "bros") for k in SEEDS],
         "vLLM / BROS": [_mean_ratio(_per_rate(s, key, k), "vllm", "bros") for k in SEEDS]}
    out = ratio_outcome("vLLM ≥ RR ≥ BROS; −11.29% / −8.80%", r)
    out.ours = ("req/s (seed 0) " + "; ".join(f"{p}: " + ", ".join(f"{v:.2f}" for v in be[p]) for p in be) +
                f"{_rates()}; BE throughput ratios " + out.ours)
    out.magnitude = within(1 - 1 / np.mean(r["vLLM / BROS"]), 0.1129) and within(1 - 1 / np.mean(r["RR / BROS"]), 0.088)
    return out


for _id, _st in (("BR-4", "LMSYS-Chat-1M RT: average normalized latency −69.61% vs vLLM, −25.77% vs RR"),
                 ("BR-5", "LMSYS-Chat-1M RT: BE throughput −17.67% vs vLLM, −15.18% vs RR"),
                 ("BR-9", "LMSYS-Chat-1M RT: TTFT attainment 21.42x vs vLLM, 14.23x vs RR; TPOT 2.62x / 2.28x")):
    register_claim(_id, "bros", "7.2 (Figs. 10d–f, 11d–f)", _st)(
        lambda s: not_modelled("see statement", "no LMSYS-Chat-1M-like length model is implemented"))


@register_claim("BR-6", "bros", "7.2 (Fig. 10c, f)", "BROS keeps RT latency low even at an extremely high RT rate, "
                "at the cost of BE throughput")
def br6(s):
    M = PAPER_M                               # BROS vs vLLM only: the paper's (full-size) cache, as BR-1

    def g(p, k):
        return (br(s, p, HIGH_RATE, M=M, seed=k)["rt_normalized_latency_mean"] /
                br(s, p, RATES[0], M=M, seed=k)["rt_normalized_latency_mean"])
    grow = {"vLLM growth / BROS growth": [g("vllm", k) / g("bros", k) for k in SEEDS]}
    # "keeps RT latency low": below vLLM's at the extreme rate (CI rule), and BROS's own growth under 2x
    low = seed_effect([br(s, "vllm", HIGH_RATE, M=M, seed=k)["rt_normalized_latency_mean"] /
                       br(s, "bros", HIGH_RATE, M=M, seed=k)["rt_normalized_latency_mean"] - 1 for k in SEEDS])
    be = seed_effect([1 - br(s, "bros", HIGH_RATE, M=M, seed=k)["be_capacity_rps"] /
                      br(s, "bros", RATES[0], M=M, seed=k)["be_capacity_rps"] for k in SEEDS])
    out = ratio_outcome("RT latency ≈ flat, BE throughput drops", grow)
    from study.findings.verdicts import combine
    gb = float(np.mean([g("bros", k) for k in SEEDS]))
    out.ours = (f"RT rate {RATES[0]:g} → {HIGH_RATE:g} req/s: BROS RT normalized latency {gb:.2f}x, vLLM "
                f"{np.mean([g('vllm', k) for k in SEEDS]):.2f}x; ratio of growths " + out.ours +
                f"; at {HIGH_RATE:g} req/s vLLM / BROS RT normalized latency {fmt_effect(low)}"
                f"; BROS BE throughput change {fmt_effect(seed_effect([-v for v in be.values]), 'rel')}; full-size cache")
    d, why = combine([low, be])
    out.direction, out.untestable = d and gb < 2, why
    out.note = ("direction: BROS's RT latency at the extreme rate below vLLM's there (CI rule), its own growth under "
                "2x, and its BE throughput falling (CI rule); the ratio of growths is shown only (vLLM's RT latency "
                "falls with the RT rate: it is set by the BE backlog's share of its FCFS queue). The paper's "
                "(full-size) cache, as BR-1. " + counters(s, M, (RATES[0], HIGH_RATE)) +
                (f" Untestable: {why}" if why else ""))
    return out


def _ratio_claim(key, paper_v, paper_r, label):
    def check(s):
        a = _per_rate(s, key)
        r = {"vs vLLM": [_mean_ratio(_per_rate(s, key, k), "bros", "vllm") for k in SEEDS],
             "vs RR": [_mean_ratio(_per_rate(s, key, k), "bros", "bros-rr") for k in SEEDS]}
        sat = untestable_reason({p: float(np.mean(v)) for p, v in a.items()}, fraction=True)
        out = ratio_outcome(f"{paper_v}x vs vLLM, {paper_r}x vs RR", r, {"vs vLLM": paper_v, "vs RR": paper_r},
                            saturated=sat if sat and "saturated" in sat else "")
        out.ours = (f"{label} (seed 0): " + "; ".join(f"{p}: " + ", ".join(f"{100 * v:.0f}%" for v in a[p]) for p in a)
                    + f"{_rates()}; BROS " + out.ours)
        return out
    return check


register_claim("BR-7", "bros", "7.2 (Fig. 11a–c)", "TTFT SLO attainment (0.4 s): 36.38x vs vLLM, 11.75x vs RR "
               "(ShareGPT)")(_ratio_claim("rt_ttft_attainment", 36.38, 11.75, "TTFT attainment"))


@register_claim("BR-8", "bros", "7.2 (Fig. 11a–c)", "TPOT SLO attainment (0.2 s): 1.73x vs vLLM, 1.47x vs RR "
                "(ShareGPT)")
def br8(s):
    """Judged in the TPOT regime (eager()), per token (spec reading (a): the fine-grained attainment); the
    GPU-time-only headline runs, where every system meets TPOT, are shown in the note."""
    tok = eager_table(s, "rt_token_attainment")
    r = {"vs vLLM": [b / max(v, 1e-3) for b, v in zip(tok["bros"], tok["vllm"])],
         "vs RR": [b / max(v, 1e-3) for b, v in zip(tok["bros"], tok["bros-rr"])]}
    out = ratio_outcome("1.73x vs vLLM, 1.47x vs RR", r, {"vs vLLM": 1.73, "vs RR": 1.47})
    out.ours = ("per-token TPOT attainment in the TPOT regime: " + ", ".join(
        f"{p} {100 * np.mean(v):.1f}%" for p, v in tok.items()) + "; BROS " + out.ours)
    head = _per_rate(s, "rt_token_attainment")
    out.note = (eager_note(s) + "Headline runs (GPU time only, M = " + f"{REGIME_M}, seed 0) per-token: " + "; ".join(
        f"{p}: " + ", ".join(f"{100 * v:.1f}%" for v in head[p]) for p in head) + _rates() + ". " + tpot_probe(s) +
        counters(s)).strip()
    return out


@register_claim("BR-10", "bros", "7.2 (Fig. 11)", "vLLM's average TTFT attainment is 1.28% (FCFS with a BE backlog), "
                "RR's 10.55%")
def br10(s):
    key = "rt_ttft_attainment"
    m = {p: [float(np.mean(_per_rate(s, key, k)[p])) for k in SEEDS] for p in ("vllm", "bros-rr", "bros")}
    eff = [seed_effect([r - v for v, r in zip(m["vllm"], m["bros-rr"])]),
           seed_effect([b - r for r, b in zip(m["bros-rr"], m["bros"])])]
    from study.findings.verdicts import combine
    d, why = combine(eff)
    v, r, b = (float(np.mean(m[p])) for p in ("vllm", "bros-rr", "bros"))
    return Outcome("vLLM 1.28%, RR 10.55% (BROS higher)", f"vLLM {100 * v:.1f}%, RR {100 * r:.1f}%, BROS "
                   f"{100 * b:.1f}%{_rates()}; RR − vLLM {fmt_effect(eff[0], 'rel')} points, BROS − RR "
                   f"{fmt_effect(eff[1], 'rel')} points ({len(SEEDS)} seeds)", d,
                   within(v, 0.0128) and within(r, 0.1055), untestable=why)


@register_claim("BR-11", "bros", "7.2 (Fig. 11)", "Average TPOT attainment: RR 47.34%, BROS 65.49% (ShareGPT)")
def br11(s):
    """Judged in the TPOT regime (eager()), per token, as BR-8."""
    tok = eager_table(s, "rt_token_attainment")
    r, b = float(np.mean(tok["bros-rr"])), float(np.mean(tok["bros"]))
    e = seed_effect([y / max(x_, 1e-3) - 1 for x_, y in zip(tok["bros-rr"], tok["bros"])])
    head = {p: float(np.mean([np.mean(_per_rate(s, "rt_token_attainment", k)[p]) for k in SEEDS]))
            for p in ("bros-rr", "bros")}
    return Outcome("RR 47.34% < BROS 65.49%", f"TPOT regime, per token: RR {100 * r:.1f}%, BROS {100 * b:.1f}%; "
                   f"BROS/RR {fmt_effect(e)}", e.verdict != "opposite", within(r, 0.4734) and within(b, 0.6549),
                   note=eager_note(s) + f"Headline runs (GPU time only, M = {REGIME_M}, mean of {len(SEEDS)} seeds) per "
                        f"token: RR {100 * head['bros-rr']:.1f}%, BROS {100 * head['bros']:.1f}%{_rates()}. " +
                        counters(s), untestable=e.reason if e.verdict == "untestable" else "")


@register_claim("BR-12", "bros", "7.2", "vLLM's RT TPOT suffers because later RT requests must release memory and "
                "wait; BROS avoids it by block sharing and preemption")
def br12(s):
    ev = {p: [br(s, p, RATES[-1], seed=k).get("rt_evictions", 0) for k in SEEDS] for p in ("vllm", "bros")}
    tp = {p: [br(s, p, RATES[-1], seed=k)["rt_tpot_attainment"] for k in SEEDS] for p in ("vllm", "bros")}
    e1 = seed_effect([v - b for v, b in zip(ev["vllm"], ev["bros"])], tie=0.5)
    e2 = seed_effect([b - v for v, b in zip(tp["vllm"], tp["bros"])],
                     saturated="TPOT attainment ≥ 98% for both" if min(map(np.mean, tp.values())) >= 0.98 else "")
    d = e1.verdict == "holds" and e2.verdict != "opposite"
    return Outcome("vLLM preempts RT requests, BROS does not; BROS TPOT attainment ≥ vLLM's",
                   f"M = {PRESSURE_M}, {RATES[-1]:g} req/s: RT evictions vLLM {np.mean(ev['vllm']):.1f}, BROS "
                   f"{np.mean(ev['bros']):.1f} (mean of {len(SEEDS)} seeds; difference {e1.mean:+.1f} [95% CI "
                   f"{e1.lo:+.1f}, {e1.hi:+.1f}]); RT TPOT attainment vLLM {100 * np.mean(tp['vllm']):.1f}%, BROS "
                   f"{100 * np.mean(tp['bros']):.1f}%", d,
                   untestable=e1.reason if e1.verdict == "untestable" else "")


@register_claim("BR-13", "bros", "7.3 (Fig. 12)", "Pure RT (no BE): BROS −29.36% normalized latency and 1.08x "
                "throughput vs vLLM")
def br13(s):
    red = [float(np.mean([1 - br(s, "bros", r, rt_only=True, seed=k)["rt_normalized_latency_mean"] /
                          br(s, "vllm", r, rt_only=True, seed=k)["rt_normalized_latency_mean"] for r in RATES]))
           for k in SEEDS]
    thr = seed_effect([float(np.mean([br(s, "bros", r, rt_only=True, seed=k)["rt_throughput_rps"] /
                                      br(s, "vllm", r, rt_only=True, seed=k)["rt_throughput_rps"] for r in RATES])) - 1
                       for k in SEEDS])
    e = seed_effect(red)
    return Outcome("−29.36%; 1.08x", f"normalized latency {fmt_effect(seed_effect([-v for v in red]), 'rel')}, "
                   f"throughput {1 + thr.mean:.3f}x [95% CI {1 + thr.lo:.3f}, {1 + thr.hi:.3f}] ({thr.verdict}"
                   f"{': ' + thr.reason if thr.reason else ''}; {len(SEEDS)} seeds){_rates()}",
                   e.verdict != "opposite", within(e.mean, 0.2936),
                   note="judged on latency only: at a fixed offered rate below capacity throughput is capped by the "
                        "arrivals, so the throughput half cannot be tested here",
                   untestable=e.reason if e.verdict == "untestable" else "")


@register_claim("BR-14", "bros", "7.4 (Fig. 13)", "Bidirectional KV vs recompute on block failure (hybrid workload, "
                "memory-bound): TTFT attainment 1.23x and TPOT attainment 1.63x better")
def br14(s):
    r = {k2: [br(s, "bros", RATES[-1], PRESSURE_M, seed=k)[key] / max(br(s, "bros-nobi", RATES[-1], PRESSURE_M,
                                                                        seed=k)[key], 1e-3) for k in SEEDS]
         for k2, key in (("TTFT", "rt_ttft_attainment"), ("TPOT", "rt_tpot_attainment"))}
    eff = {k: seed_effect([v - 1 for v in r[k]]) for k in r}
    held = [k for k, e in eff.items() if e.verdict == "holds"]
    bad = [k for k, e in eff.items() if e.verdict == "opposite"]
    return Outcome("1.23x TTFT, 1.63x TPOT", "; ".join(f"{k} {fmt_effect(e)}" for k, e in eff.items()) +
                   f" (M = {PRESSURE_M}, {RATES[-1]:g} req/s)", not bad,
                   within_ratio(1 + eff["TTFT"].mean, 1.23) and within_ratio(1 + eff["TPOT"].mean, 1.63),
                   note="direction: at least one ratio above 1 by the CI rule and none below",
                   untestable="" if held or bad else "neither ratio clears the CI rule: " +
                   "; ".join(f"{k} {e.reason}" for k, e in eff.items()))


WHY = {   # qualitative reasons for disagreements; the figures are in each row's `ours`, from the run itself
    "BR-3": "our BROS-RR alternates RT and BE iterations strictly and recomputes BE work on shortage, so it spends "
            "BE capacity on thin RT iterations and refills; BROS's adaptive BE fill completes more BE work",
    "BR-6": "at the higher RT rates the RT stream alone nears what two GPUs serve in this cost model, so BROS's RT "
            "latency rises and its BE share shrinks with it",
}
attach_why(WHY)
