"""Apt-Serve (spec aptserve.md §6–7) claims the spec marks simulator-checkable (🟢, 🟡), each a check of direction
and magnitude. Setup: examples/aptserve-sharegpt.yaml (OPT-13B on one A100-40GB, the KV cache vLLM would size,
roofline v2 with vLLM 0.5's eager overhead at the paper's 120 ms anchor, ShareGPT-like lengths, SLO TTFT 1 s / P99
TBT 1 s); baseline vLLM v0 (256 sequences); effective throughput = highest Poisson rate meeting 90% / 60% SLO
attainment; the paper's absolute rates are scaled by our vLLM knee over its 2.6 req/s. Not registered: Table 6
(scheduler wall-clock, 🔴)."""
from __future__ import annotations

import numpy as np

from study.capacity import search_capacity
from sim.scenario.config import load_scenario
from study.findings.aptbros import APT_EX, greedy_gap
from study.findings.registry import Outcome, Scale, attach_why, not_modelled, register_claim, within, within_ratio
from study.findings.runs import memo
from study.findings.verdicts import SEEDS, combine, fmt_effect, ratio_outcome, seed_effect, sustained
from study.findings.registry import register_setup
from sim.cluster.runner import run_scenario

TIE_ = 0.02
PAPER_KNEE = 2.6               # §3: vLLM's 90% knee, req/s
VLLM = "vllm-v0"               # the paper's baseline: vLLM 0.5 (v0 scheduler, 256 sequences)
RATES, CVS = (3.0, 6.0), (1.0, 5.0, 10.0)   # Tables 4–5 (ShareGPT)
TABLE4 = {(3, 1): (99.5, 99.5), (3, 5): (94.7, 95.9), (3, 10): (75.1, 78.2),       # (KV only, hybrid), %
          (6, 1): (65.7, 67.3), (6, 5): (66.7, 67.7), (6, 10): (57.1, 58.4)}
TABLE5 = {(3, 1): 26.4, (3, 5): 59.7, (3, 10): 11.9, (6, 1): 20.0, (6, 5): 18.1, (6, 10): 9.9}   # FCFS, %


def _summ(res) -> dict:
    req, it = res.requests, res.iterations
    viol = req[req.slo_attained == 0]
    ttft = req.ttft_s.fillna(np.inf).to_numpy()
    bound = ((it.kv_alloc_tokens >= 0.9 * res.capacity_tokens) & (it.waiting > 0)) | (it.running >= 256)
    from study.findings.verdicts import served_ratio
    return {"att": float(res.summary["slo_attainment"]),
            "served": served_ratio(req.arrival_s.to_numpy(float), req.completion_s.to_numpy(float)),
            **{k: v for k, v in res.summary.items() if k.startswith("policy_") and isinstance(v, (int, float))},
            "ttft_viol_share": float((viol.ttft_s.fillna(np.inf) > 1.0).mean()) if len(viol) else 0.0,
            "tbt_att": float((req.tbt_p99_s.fillna(0) <= 1.0).mean()),
            "ttft_p99": float(np.percentile(ttft, 99)), "starved": float(np.mean(ttft > 5.0)),
            "limit_share": float(it.duration_s[bound].sum() / max(it.duration_s.sum(), 1e-12)),
            "evictions": int(req.evictions.sum()), "mean_running": float(it.running.mean()),
            "busy_s": float(it.duration_s.sum())}


def apt(s: Scale, policy: str, rate: float, cv: float = 1.0, seed: int = 0) -> dict:
    """One run of the Apt-Serve scenario (memoised): attainment and the few per-request statistics the claims use."""
    ov = [f"policy.name={policy}", f"workload.num_requests={s.slo_requests}", f"workload.rate={rate}",
          f"workload.cv={cv}", f"seed={seed}"]
    return memo(("aptserve", s.slo_requests, policy, round(rate, 6), cv, seed),
                lambda: _summ(run_scenario(load_scenario(APT_EX, ov))))


def eff(s: Scale, policy: str, target: float, seed: int = 0, served_rule: bool = True) -> float:
    """Effective throughput: highest rate (within s.capacity_tol) that is sustained by the one capacity rule
    (verdicts.sustained: served ≥ 95% of the offered load in steady state) and meets the attainment target."""
    def att(r):
        a = apt(s, policy, r, seed=seed)
        return a["att"] if sustained(a["served"]) or not served_rule else 0.0

    def compute():
        return {"rate": search_capacity(att, target, 0.5, rate_min=0.5, rate_max=64.0,
                                        rel_tol=s.capacity_tol).capacity_rps}
    return memo(("aptserve-eff", s.slo_requests, s.capacity_tol, policy, target, seed, served_rule), compute)["rate"]


def eff_ratios(s, a, b, target) -> list:
    return [eff(s, a, target, k) / max(eff(s, b, target, k), 1e-9) for k in SEEDS]


def served_note(s) -> str:
    """Served fraction of the offered load (steady state, seed 0) at vLLM's 90% knee, per system."""
    k = eff(s, VLLM, 0.9)
    return (f"Served at vLLM's 90% knee ({k:g} req/s, seed 0): " +
            ", ".join(f"{p} {100 * apt(s, p, k)['served']:.0f}%" for p in ("aptserve", "aptserve-sticky", "aptserve-kv", VLLM, "sarathi",
                                                                          "deepspeed-fastgen")) + ". ")


def counters(s, rate=None) -> str:
    r = rate or paper_rate(s, 6.0)
    st = apt(s, "aptserve", r)
    return (f"Mechanism (Apt-Serve at {r:g} req/s, seed 0): hidden admissions {st.get('policy_hidden_admissions', 0)}, "
            f"hidden decode steps {st.get('policy_hidden_decode_steps', 0)}, type switches "
            f"{st.get('policy_type_switches', 0)}, decode-knapsack drops {st.get('policy_decode_drops', 0)}, "
            f"evictions {st.get('evictions', 0)}, knapsack calls {st.get('policy_knapsack_calls', 0)}.")


def vllm_counters(s, rates) -> str:
    """vLLM's own mechanism at the AS-1/AS-2 rates: recompute preemptions and the mean running batch."""
    return "Mechanism (vLLM, seed 0): " + "; ".join(
        f"{r:.2f} req/s: {apt(s, VLLM, r)['evictions']} recompute preemptions, {apt(s, VLLM, r)['mean_running']:.0f} "
        f"running on average" for r in rates) + "."


def x(v):
    return f"{v:.2f}x"


def _calibration(s, k) -> dict:
    """vLLM's Fig. 2 calibration on seed k: its own 90% knee and the paper's 3 req/s as 1.15x that knee."""
    knee = eff(s, VLLM, 0.9, k)
    hi = knee * 3.0 / PAPER_KNEE                  # the paper's 3 req/s, at the same load relative to the knee
    return {"knee": knee, "hi": hi, "a": apt(s, VLLM, knee, seed=k), "b": apt(s, VLLM, hi, seed=k)}


def _pp(e) -> str:
    """A change of a fraction, per seed, in percentage points with its 95% CI."""
    return f"{100 * e.mean:+.1f} pp [95% CI {100 * e.lo:+.1f}, {100 * e.hi:+.1f}]"


def _ci(e, scale=100.0, unit="%") -> str:
    return f"{scale * e.mean:.0f}{unit} [95% CI {scale * e.lo:.0f}, {scale * e.hi:.0f}]"


@register_claim("AS-1", "aptserve", "3 (Fig. 2)", "Calibration, vLLM: 90% SLO attainment up to ≈2.6 req/s, ≈70% at "
                "3 req/s; violations are mostly TTFT; TBT attainment stays roughly flat with rate")
def as1(s):
    """Per seed: the share of violators that miss TTFT above one half, and TBT attainment at both rates at least
    90%, each judged by the CI rule (as margins over those bounds); magnitudes compare the seed means."""
    c = {k: _calibration(s, k) for k in SEEDS}
    ttft = seed_effect([c[k]["b"]["ttft_viol_share"] - 0.5 for k in SEEDS])
    tbt = seed_effect([min(c[k]["a"]["tbt_att"], c[k]["b"]["tbt_att"]) - 0.9 for k in SEEDS])
    d, why = combine([ttft, tbt])
    knee = seed_effect([c[k]["knee"] for k in SEEDS], tie=0)
    att = seed_effect([c[k]["b"]["att"] for k in SEEDS], tie=0)
    hi = float(np.mean([c[k]["hi"] for k in SEEDS]))
    m = {key: seed_effect([c[k][ab]["tbt_att"] for k in SEEDS], tie=0) for key, ab in (("a", "a"), ("b", "b"))}
    return Outcome("knee 2.6 req/s; 70% at 3; TTFT violations dominate",
                   f"knee {knee.mean:.2f} req/s [95% CI {knee.lo:.2f}, {knee.hi:.2f}]; attainment {_ci(att)} at "
                   f"1.15x each seed's knee (mean {hi:.2f} req/s = 3 × knee / 2.6); violators missing TTFT "
                   f"{_ci(seed_effect([v + 0.5 for v in ttft.values], tie=0))}; TBT attainment {_ci(m['a'])} → "
                   f"{_ci(m['b'])} ({len(SEEDS)} seeds)", d,
                   within(knee.mean, PAPER_KNEE) and within(att.mean, 0.7),
                   note="roofline v2 for OPT-13B with vLLM 0.5's eager per-sequence overhead set to the paper's "
                        "120 ms anchor (a 50-request decode step); direction: violators missing TTFT above 50% and "
                        "TBT attainment at least 90% at both rates, each by the CI rule. " +
                        vllm_counters(s, (c[0]["knee"], c[0]["hi"])), untestable=why)


@register_claim("AS-2", "aptserve", "3 (Fig. 2)", "vLLM spends ≈60% of the serving time at its batch limit at the "
                "90% knee and > 80% at 3 req/s")
def as2(s):
    """Per seed: the time share at the limit grows from the knee to 1.15x it, and exceeds one half there, each
    judged by the CI rule; magnitudes compare the seed means."""
    c = {k: _calibration(s, k) for k in SEEDS}
    a = seed_effect([c[k]["a"]["limit_share"] for k in SEEDS], tie=0)
    b = seed_effect([c[k]["b"]["limit_share"] for k in SEEDS], tie=0)
    grow = seed_effect([c[k]["b"]["limit_share"] - c[k]["a"]["limit_share"] for k in SEEDS])
    over = seed_effect([c[k]["b"]["limit_share"] - 0.5 for k in SEEDS])
    d, why = combine([grow, over])
    knee, hi = (float(np.mean([c[k][x_] for k in SEEDS])) for x_ in ("knee", "hi"))
    return Outcome("≈60% at the knee, > 80% above it",
                   f"{_ci(a)} at the knee (mean {knee:.2f} req/s), {_ci(b)} at 1.15x it (mean {hi:.2f} req/s); "
                   f"growth {_pp(grow)} ({len(SEEDS)} seeds)", d,
                   within(a.mean, 0.6) and within(b.mean, 0.8),
                   note="'at the limit' = 256 sequences running, or KV ≥ 90% allocated with requests waiting, "
                        "time-weighted; direction: the share grows above the knee and exceeds 50% there, each by "
                        "the CI rule (a change under 2 points is a tie). " +
                        vllm_counters(s, (c[0]["knee"], c[0]["hi"])), untestable=why)


@register_claim("AS-3", "aptserve", "3 (Fig. 4)", "Random scheduling beats FCFS at every rate; FCFS TTFT violations "
                "come in clusters")
def as3(s):
    return not_modelled("random ≥ FCFS at every rate", "no random-order variant of the vLLM baseline is implemented")


@register_claim("AS-4", "aptserve", "6.2 (Fig. 8)", "Effective throughput vs vLLM: 2.3x at 90% attainment, 4.9x at "
                "60% (averages); the advantage at 60% is much larger than at 90% (baselines collapse)")
def as4(s):
    r90, r60 = eff_ratios(s, "aptserve", VLLM, 0.9), eff_ratios(s, "aptserve", VLLM, 0.6)
    e90, e60 = (seed_effect([v - 1 for v in r], tie=max(TIE_, s.capacity_tol)) for r in (r90, r60))
    grow = seed_effect([b - a for a, b in zip(r90, r60)], tie=max(TIE_, s.capacity_tol))
    d, why = combine([e90, e60, grow])
    return Outcome("2.3x (90%), 4.9x (60%)", f"{fmt_effect(e90)} (90%), {fmt_effect(e60)} (60%) ({len(SEEDS)} seeds)",
                   d, within_ratio(1 + e90.mean, 2.3) and within_ratio(1 + e60.mean, 4.9),
                   note="ShareGPT-like workload, OPT-13B only; a ratio within the capacity search's tolerance "
                        f"({100 * s.capacity_tol:g}%) is a tie. " + served_note(s) + attainment_only_note(s) +
                        counters(s), untestable=why)


def attainment_only_note(s) -> str:
    """Effective throughput read on SLO attainment alone (no served rule), as the paper's Fig. 8 reads it (seed 0)."""
    parts = []
    for t in (0.9, 0.6):
        a, v = eff(s, "aptserve", t, served_rule=False), eff(s, VLLM, t, served_rule=False)
        parts.append(f"{int(100 * t)}%: {a:g} vs {v:g} req/s ({a / max(v, 1e-9):.2f}x)")
    return "On attainment alone (no served rule, seed 0), Apt-Serve vs vLLM: " + "; ".join(parts) + ". "


@register_claim("AS-5", "aptserve", "6.2 (Fig. 8)", "Effective throughput vs Sarathi-Serve 1.9x / 4.4x and vs "
                "DeepSpeed-FastGen 1.8x / 4.3x at 90% / 60% attainment")
def as5(s):
    paper = {("sarathi", 0.9): 1.9, ("sarathi", 0.6): 4.4, ("deepspeed-fastgen", 0.9): 1.8,
             ("deepspeed-fastgen", 0.6): 4.3}
    r = {f"{b} {int(100 * t)}%": eff_ratios(s, "aptserve", b, t) for b, t in paper}
    eff_ = {k: seed_effect([v - 1 for v in r[k]], tie=max(TIE_, s.capacity_tol)) for k in r}
    d, why = combine(eff_.values())
    return Outcome("1.9x / 4.4x (Sarathi), 1.8x / 4.3x (FastGen)", "; ".join(f"{k}: {fmt_effect(e)}"
                                                                            for k, e in eff_.items()), d,
                   all(within_ratio(1 + eff_[f"{b} {int(100 * t)}%"].mean, v) for (b, t), v in paper.items()),
                   note=served_note(s), untestable=why)


@register_claim("AS-6", "aptserve", "6.2 (Fig. 8)", "Gains at 60% attainment order by dataset: ShareGPT ≳ LongBench "
                "> HumanEval")
def as6(s):
    return not_modelled("ShareGPT ≳ LongBench > HumanEval", "only the ShareGPT-like workload is implemented "
                        "(no HumanEval or LongBench length model)")


@register_claim("AS-7", "aptserve", "6.2 (Fig. 8)", "Sarathi-Serve and FastGen close much of the gap on HumanEval "
                "(short outputs) but not on ShareGPT")
def as7(s):
    return not_modelled("gap small on HumanEval, large on ShareGPT", "no HumanEval-like workload is implemented")


def paper_rate(s: Scale, rate: float) -> float:
    """The paper's absolute rate at the same load relative to vLLM's 90% knee (its 2.6 req/s) on this setup."""
    return round(rate * eff(s, VLLM, 0.9) / PAPER_KNEE, 4)


def table_rates(s: Scale) -> dict:
    """Tables 4–5 fix two rates at which the paper's Apt-Serve (hybrid, adaptive) attains 99.5% and ≈66% at CV 1;
    we reproduce those attainment levels (rates where ours attains 99% and 66%), not a multiple of vLLM's knee.
    These are operating points, not capacities: attainment alone fixes them, as the tables report it."""
    return {3.0: round(eff(s, "aptserve", 0.99, served_rule=False), 4),
            6.0: round(eff(s, "aptserve", 0.66, served_rule=False), 4)}


def fig9_rate(s: Scale) -> float:
    """Fig. 9 runs at a rate where Poisson arrivals leave Apt-Serve and Sarathi-Serve both near the SLO (their
    curves start together at CV 1): Sarathi's 90% effective throughput on this setup."""
    return round(eff(s, "sarathi", 0.9), 4)


def _grid(s, policy, seed=0):
    tr = table_rates(s)
    return {(r, cv): apt(s, policy, tr[r], cv, seed)["att"] for r in RATES for cv in CVS}


@register_claim("AS-8", "aptserve", "7 (Table 5)", "Adaptive scheduling vs FCFS (both hybrid cache): FCFS "
                "significantly degrades attainment at every rate and CV (ShareGPT: 26.4% vs 99.5% at 3 req/s, CV 1)")
def as8(s):
    ratios, wins = [], []
    for k in SEEDS:
        ad, fc = _grid(s, "aptserve", k), _grid(s, "aptserve-fcfs", k)
        ratios.append(float(np.mean([ad[q] / max(fc[q], 1e-3) for q in ad])))
        wins.append(sum(ad[q] > fc[q] for q in ad))
    paper = float(np.mean([TABLE4[k][1] / TABLE5[k] for k in TABLE5]))
    ad0, fc0 = _grid(s, "aptserve"), _grid(s, "aptserve-fcfs")
    out = ratio_outcome(f"adaptive > FCFS everywhere, mean ratio {x(paper)}", {"adaptive / FCFS": ratios},
                        {"adaptive / FCFS": paper},
                        note=f"rates where our Apt-Serve attains 99% / 66% at CV 1 (the paper's 3 / 6 req/s): "
                             f"{table_rates(s)[3.0]:g} / {table_rates(s)[6.0]:g} req/s")
    out.ours += (f"; adaptive > FCFS at {np.mean(wins):.1f}/{len(CVS) * len(RATES)} points on average; at the "
                 f"'3 req/s' point, CV 1 (seed 0): {100 * fc0[3.0, 1.0]:.0f}% vs {100 * ad0[3.0, 1.0]:.0f}%")
    return out


@register_claim("AS-9", "aptserve", "7 (Table 4)", "Hybrid cache vs KV only (both adaptive): hybrid is always at least "
                "as good; the gain (0–3 pp on ShareGPT) grows with rate and burstiness")
def as9(s):
    gains = []
    for k in SEEDS:
        hy, kv = _grid(s, "aptserve", k), _grid(s, "aptserve-kv", k)
        gains.append({q: 100 * (hy[q] - kv[q]) for q in hy})
    mean = seed_effect([float(np.mean(list(g.values()))) for g in gains], tie=1.0)
    grows = seed_effect([float(np.mean([g[6.0, c] for c in CVS]) - np.mean([g[3.0, c] for c in CVS]))
                         for g in gains], tie=1.0)
    paper = float(np.mean([b - a for a, b in TABLE4.values()]))
    d, why = combine([mean, grows])
    per = {q: float(np.mean([g[q] for g in gains])) for q in gains[0]}
    return Outcome(f"≥ 0 everywhere, mean +{paper:.1f} pp, growing with rate",
                   f"mean gain {fmt_effect(mean, 'pp')}; growth from the '3' to the '6 req/s' rate "
                   f"{fmt_effect(grows, 'pp')}; per point (mean of seeds) " +
                   ", ".join(f"{r:g}/{c:g}: {g:+.1f}" for (r, c), g in per.items()) + " (rate/CV)",
                   d, within(mean.mean, paper),
                   note=f"rates where our Apt-Serve attains 99% / 66% at CV 1: {table_rates(s)[3.0]:g} / "
                        f"{table_rates(s)[6.0]:g} req/s; a gain under 1 pp is a tie. " + counters(s, table_rates(s)[6.0]),
                   untestable=why)


@register_claim("AS-10", "aptserve", "6.3 (Fig. 9)", "Attainment falls with burstiness (Gamma CV) for every system and "
                "Apt-Serve's lead over vLLM widens with CV: up to 7.5x higher attainment")
def as10(s):
    pols, rate = (VLLM, "sarathi", "aptserve"), fig9_rate(s)
    att = {k: {p: [apt(s, p, rate, cv, k)["att"] for cv in CVS] for p in pols} for k in SEEDS}
    lead = {k: [a / max(v, 1e-3) for a, v in zip(att[k]["aptserve"], att[k][VLLM])] for k in SEEDS}
    widen = seed_effect([lead[k][-1] - lead[k][0] for k in SEEDS])
    fall = seed_effect([float(np.mean([v[0] - v[-1] for v in att[k].values()])) for k in SEEDS])
    d, why = combine([widen, fall])
    m = {p: [float(np.mean([att[k][p][i] for k in SEEDS])) for i in range(len(CVS))] for p in pols}
    ml = [float(np.mean([lead[k][i] for k in SEEDS])) for i in range(len(CVS))]
    return Outcome("falls with CV; lead widens, up to 7.5x",
                   "; ".join(f"{p}: " + " → ".join(f"{100 * v:.0f}%" for v in m[p]) for p in pols) +
                   f" (CV {CVS}, {rate:g} req/s, mean of {len(SEEDS)} seeds); Apt-Serve/vLLM " +
                   " → ".join(x(v) for v in ml) + f"; lead growth CV 1→10 {widen.mean:+.2f} [95% CI {widen.lo:+.2f}, "
                   f"{widen.hi:+.2f}]; attainment fall CV 1→10 (mean over systems) {_pp(fall)}", d, within_ratio(max(ml), 7.5),
                   note="rate: Sarathi's 90% effective throughput, where Poisson arrivals leave Apt-Serve and "
                        "Sarathi both near the SLO, as Fig. 9 starts", untestable=why)


@register_claim("AS-11", "aptserve", "6.6 (Fig. 10)", "ShareGPT at 6 req/s: Apt-Serve > 90% attainment, FCFS < 30%; "
                "about 10% of requests starve under the near-zero fallback; decay 0.4 cuts the tail and still beats "
                "FCFS")
def as11(s):
    rate = table_rates(s)[6.0]
    runs = {k: [apt(s, p, rate, 1.0, k) for p in ("aptserve", "aptserve-fcfs", "aptserve-decay")] for k in SEEDS}
    e1 = seed_effect([a["att"] - f["att"] for a, f, _ in runs.values()])
    e2 = seed_effect([d["att"] - f["att"] for _, f, d in runs.values()])
    e3 = seed_effect([1 - d["ttft_p99"] / a["ttft_p99"] for a, _, d in runs.values()])
    d_, why = combine([e1, e2, e3])
    a, f, dd = (float(np.mean([r[i]["att"] for r in runs.values()])) for i in range(3))
    st = float(np.mean([r[0]["starved"] for r in runs.values()]))
    return Outcome("> 90% vs < 30%; ≈10% starve; decay cuts the tail",
                   f"attainment Apt-Serve {100 * a:.0f}%, FCFS {100 * f:.0f}%, decay {100 * dd:.0f}%; starved "
                   f"(TTFT > 5 s) {100 * st:.1f}%; decay's TTFT p99 change {fmt_effect(seed_effect([-v for v in e3.values]), 'rel')} "
                   f"({len(SEEDS)} seeds, {rate:g} req/s)", d_,
                   a > 0.9 and f < 0.3 and within(st, 0.10),
                   note="rate where our Apt-Serve attains 66% at CV 1 (the paper's 6 req/s point of Tables 4–5)",
                   untestable=why)


@register_claim("AS-12", "aptserve", "6.7 (Fig. 11)", "Apt-Serve-S (on Sarathi) beats Apt-Serve, which beats "
                "Sarathi-Serve")
def as12(s):
    r = {f"{a} / {b} {int(100 * t)}%": eff_ratios(s, a, b, t) for a, b in (("aptserve-s", "aptserve"),
                                                                           ("aptserve", "sarathi")) for t in (0.9, 0.6)}
    eff_ = {k: seed_effect([v - 1 for v in r[k]], tie=max(TIE_, s.capacity_tol)) for k in r}
    d, why = combine(eff_.values())
    return Outcome("Apt-Serve-S > Apt-Serve > Sarathi", "; ".join(f"{k}: {fmt_effect(e)}" for k, e in eff_.items()),
                   d, note=served_note(s), untestable=why)


def _header(s) -> str:
    k = eff(s, VLLM, 0.9)
    tr = table_rates(s)
    return (f"Operating points: Fig. 8 and Fig. 11 report effective-throughput ratios (searched per seed by the one "
            f"capacity rule: served ≥ 95% and attainment ≥ target); Tables 4–5 fix rates where the paper's Apt-Serve "
            f"attains 99.5% / ≈66% at CV 1, reproduced as attainment levels ({tr[3.0]:g} / {tr[6.0]:g} req/s here); "
            f"Fig. 9 runs at Sarathi's 90% point ({fig9_rate(s):g} req/s); Fig. 10 states the same 6 req/s as "
            f"Table 5 and runs at its 66% point. Fig. 2 fixes absolute rates for vLLM's calibration: its knee "
            f"({PAPER_KNEE} req/s) and 3 req/s, 1.15x that knee; we run 1.15x our knee ({paper_rate(s, 3.0):g} req/s), "
            f"since the absolute 3 req/s would be {3.0 / k:.2f}x ours. Our vLLM's 90% knee: {k:.2f} req/s, "
            f"{k / PAPER_KNEE:.2f}x the paper's {PAPER_KNEE} req/s. Seeds {list(SEEDS)}.")


register_setup("aptserve", [
    ("model / GPU", "OPT-13B on one A100-40GB (and larger models)", "OPT-13B only; roofline with vLLM 0.5's eager "
                                                                     "overhead anchored at the paper's 120 ms"),
    ("workloads", "ShareGPT, HumanEval, LongBench", "ShareGPT-like lengths only"),
    ("SLO", "TTFT 1 s, P99 TBT 1 s", "same"),
    ("effective throughput", "highest rate meeting 90% / 60% attainment", "same AND served ≥ 95% of the offered "
                                                                          f"load; searched to the scale's tolerance"),
    ("seeds", "one run", f"{len(SEEDS)} seeds, 95% CI"),
], _header)


@register_claim("AS-13", "aptserve", "5, App. A", "The greedy knapsack is a 2-approximation per iteration and near "
                "optimal in practice", requires=("solver.aptserve_knapsack",))
def as13(s):
    n = 150 if s.name == "full" else 40         # sampled knapsacks per run
    rate = paper_rate(s, 6.0)
    runs = [memo(("aptserve-gap", k, n, rate), lambda k=k: greedy_gap(rate, k, n)) for k in (150, 200, 300)]
    mean = float(np.mean([g["opt_over_greedy_mean"] for g in runs]))
    worst = max(g["opt_over_greedy_max"] for g in runs)
    exact = float(np.mean([g["exactly_optimal_fraction"] for g in runs]))
    return Outcome("optimum / greedy ≤ 2, ≈ 1", f"optimum / greedy: mean {mean:.3f}, max {worst:.2f} (per run: "
                   + ", ".join(f"{g['opt_over_greedy_max']:.2f}" for g in runs) + f"); exactly optimal in "
                   f"{100 * exact:.0f}% of {sum(g['sampled'] for g in runs)} memory-bound steps", worst <= 2 and mean < 1.1,
                   note=f"runs of 150, 200 and 300 requests at {rate:g} req/s (the paper's 6 scaled by vLLM's knee) "
                        "of the paper's knapsack (aptserve-code: every request offered in either cache type); exact "
                        "solution by DP over the block budget")


WHY = {   # qualitative reasons for disagreements; the figures are in each row's `ours`, from the run itself
    "AS-4": "at the stricter target both systems are limited by the same prefill throughput on this cost model, and "
            "memory binds only above that knee, so the hybrid cache's extra batch room shows only at the looser "
            "target",
    "AS-5": "as for the vLLM comparison: the gain appears only once memory binds, above the stricter target's knee; "
            "our Sarathi and FastGen models share vLLM's memory limit there",
    "AS-9": "hidden requests pay the paper's recompute penalty when they switch type; with the switch-cost-aware rule the "
            "knapsack keeps few of them, and the KV they save does not buy enough batch room at these rates to "
            "offset the recomputed prefixes",
    "AS-10": "bursty arrivals overload every system alike in our runs; Apt-Serve's lead is largest at Poisson "
             "arrivals, where its scheduling alone separates it, and narrows as queueing dominates",
    "AS-12": "our Apt-Serve-S runs the knapsack on a chunked Sarathi base, whose smaller mixed batches cost more per "
             "token in this cost model than the decode-only batches Apt-Serve forms",
}
attach_why(WHY)
