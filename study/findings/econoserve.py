"""EconoServe (spec econoserve.md §6–8) claims tagged SIM, each a check of direction and magnitude. Setup: the
benchmark's (benchmarks/econoserve_bench.py, from study.findings.length_aware): ShareGPT-like (M = 24K tokens) and
Alpaca-like (M = 4K) workloads with the paper's padding / reserve / buffer per dataset, Poisson rates; sustainable
rate = largest rate whose mean normalized latency stays ≤ 4x vLLM's at the lowest rate. DistServe (F17, O6, Fig. 12)
runs on the cluster layer: sim/cluster's `distserve` preset, one prefill and one decode GPU per pair with the same
KV budget each, KV over 100 Gb/s Ethernet. Not registered: REAL claims (scheduling-time shares, preemption time,
overhead). Ratio magnitudes ("N x better") use
registry.within_ratio: the excess over 1x for N ≤ 2."""
from __future__ import annotations

import numpy as np

from study.findings.length_aware import (ECONO_PADDINGS, ECONO_REQUESTS, econo_knee, econo_scenario, knee_grid,
                                      run, run_cluster, sustainable_rate)
from study.findings.registry import Outcome, Scale, attach_why, not_modelled, register_claim, within, within_ratio
from study.findings.runs import memo
from study.findings.verdicts import SEEDS, fmt_effect, ratio_outcome, seed_effect
from study.findings.registry import register_setup

FULL_NAME = "econoserve"
VLLM, SARATHI, ORACLE = "vllm (swap)", "sarathi", "econoserve-oracle"
ABLATIONS = {"econoserve-d": "D (unsynced, FCFS, no pipe)", "econoserve-sd (SyncDecoupled)": "SD (FCFS, no pipe)",
             "econoserve-sdo (no pipelining)": "SDO (no pipe)",
             "econoserve-unsynced (no synced admission)": "no synced admission (alone)",
             "econoserve-wide-deadlines": "deadline ranges to 128 s (variant)"}
DATASETS = ("sharegpt", "alpaca")


def sweep_rate(s: Scale) -> float:
    """The single-rate experiments run at vLLM's ShareGPT knee on this setup."""
    return round(econo_knee("sharegpt", n_req(s)), 4)


def n_req(s: Scale) -> int:
    return max(50, int(ECONO_REQUESTS * s.la_fraction))


def rates(s: Scale, dataset: str) -> list:
    """Multiples of vLLM's knee on this setup (length_aware.KNEE_FRACTIONS)."""
    return knee_grid(econo_knee(dataset, n_req(s)), s.rate_stride)


def es(s: Scale, dataset: str, policy: str, rate: float, padding: float | None = None, seed: int = 0) -> dict:
    n = n_req(s)
    return memo(("econoserve", dataset, policy, rate, n, padding, seed),
                lambda: run(econo_scenario(dataset, policy, rate, n, padding, seed)))


def curve(s, dataset, policy, key="normalized_latency_s", seed=0):
    return [es(s, dataset, policy, r, seed=seed)[key] for r in rates(s, dataset)]


THRESHOLD = 4.0          # sustainable-rate latency rule: ≤ 4x vLLM's normalized latency at the lowest rate (ours:
THRESHOLDS = (2.0, 3.0, 4.0)   # the paper states none), swept in ES-1


def sustainable(s, dataset, policy, seed=0, factor=THRESHOLD) -> float:
    """Largest sustained rate (verdicts.sustainable_rate: served ≥ 95% and normalized latency ≤ factor x vLLM's
    at the lowest rate); a system sustaining none of the grid gets half the lowest rate (a bound)."""
    thr = factor * curve(s, dataset, VLLM, seed=seed)[0]
    r = sustainable_rate(rates(s, dataset), curve(s, dataset, policy, seed=seed), thr,
                         curve(s, dataset, policy, "served", seed=seed))
    return r or rates(s, dataset)[0] / 2


def gains(s, dataset, policy, base, factor=THRESHOLD) -> list:
    return [sustainable(s, dataset, policy, k, factor) / sustainable(s, dataset, base, k, factor) for k in SEEDS]


def mean_over(s, policy, key, datasets=DATASETS, seed=0) -> float:
    return float(np.mean([v for d in datasets for v in curve(s, d, policy, key, seed)]))


def per_seed(s, policy, key, datasets=DATASETS) -> list:
    return [mean_over(s, policy, key, datasets, k) for k in SEEDS]


def x(v):
    return f"{v:.2f}x"


def pct(v):
    return f"{100 * v:+.0f}%"


def groups_note(s) -> str:
    """Mechanism counters at the headline scenario (ShareGPT at vLLM's knee, seed 0): the admitted groups' size
    distribution beside the same-RL groups in the whole queue (the paper's Fig. 2 measure), lent KV, hosted GTs."""
    st = es(s, "sharegpt", FULL_NAME, sweep_rate(s))["policy_stats"]
    h = st.get("group_size_hist", {})
    return (f"Mechanism (ShareGPT, {sweep_rate(s):g} req/s, seed 0): {st.get('groups', 0)} groups admitted, mean size "
            f"{st.get('group_size_mean', 0):.2f} (" + ", ".join(f"{k}: {100 * v:.0f}%" for k, v in h.items()) +
            f"); same-RL groups in the whole queue ≥ 4: {100 * st.get('queue_group_ge4', 0):.0f}%, ≥ 12: "
            f"{100 * st.get('queue_group_ge12', 0):.0f}% (paper Fig. 2: 59%, 23%); lent blocks "
            f"{st.get('lent_blocks', 0)}, hosted GTs {st.get('hosted', 0)}, reserve extensions "
            f"{st.get('reserve_extensions', 0)}, offload-free stops {st.get('offload_free_stops', 0)}. " + kv_note(s))


def kv_breakdown(s) -> dict:
    """Where EconoServe's KV goes at the headline scenario (ShareGPT at vLLM's knee, seed 0), sampled every 10th
    iteration: written by admitted GTs, reserved for them but not yet written, prompt KV of GTs queued for group
    admission, free; and the mean decode batch beside vLLM's."""
    def compute():
        import copy
        from sim.scenario.build import build_simulation
        from sim.scenario.config import scenario_from_dict
        raw = copy.deepcopy(econo_scenario("sharegpt", FULL_NAME, sweep_rate(s), n_req(s)))
        raw.setdefault("sim", {})["fast_forward"] = False
        sim = build_simulation(scenario_from_dict(raw))
        pol, samples = sim.policy, []
        orig = pol.schedule

        def schedule(view):
            b = orig(view)
            if view.iteration % 10 == 0:
                B = view.memory.block_size
                samples.append((sum(r.cached for r in pol.active), sum(r.blocks * B for r in pol.active),
                                sum(r.blocks * B for r in pol.q_g), view.memory.free_blocks * B))
            return b
        pol.schedule = schedule
        sim.run()
        a = np.asarray(samples, float).mean(0) / (sim.memory.total_blocks * sim.memory.block_size)
        return {"written": a[0], "reserved_unwritten": a[1] - a[0], "queued_prompt": a[2], "free": a[3]}
    out = dict(memo(("econo-kv-breakdown", n_req(s), sweep_rate(s)), compute))
    out["decode_econo"] = es(s, "sharegpt", FULL_NAME, sweep_rate(s))["decode_forward_mean"]
    out["decode_vllm"] = es(s, "sharegpt", VLLM, sweep_rate(s))["decode_forward_mean"]
    return out


def decode_kv(s, dataset: str, policy: str, rate: float | None = None) -> dict:
    """KV per decoding request at `dataset`'s vLLM knee (seed 0), sampled every 10th iteration: decoding requests
    per iteration, KV blocks they hold (tokens) and tokens they have written, per request; the share of the cache
    held by requests not decoding (EconoServe: GTs queued for a group, partial prompts); and the GPU time spent
    moving swapped KV (vLLM's preemption cost here, beside the paper's 20% of JCT in Fig. 1e). `rate` overrides the
    knee (tests)."""
    if rate is None:
        rate = sweep_rate(s) if dataset == "sharegpt" else round(econo_knee(dataset, n_req(s)), 4)

    def compute():
        import copy
        from sim.scenario.build import build_simulation
        from sim.scenario.config import scenario_from_dict
        raw = copy.deepcopy(econo_scenario(dataset, policy, rate, n_req(s)))
        raw.setdefault("sim", {})["fast_forward"] = False
        sim = build_simulation(scenario_from_dict(raw))
        pol, samples = sim.policy, []
        orig = pol.schedule

        def schedule(view):
            b = orig(view)
            if view.iteration % 10 == 0:
                dec = [r for r in b.reqs if r.cached >= r.input_tokens]
                if dec:
                    ids = {id(r) for r in dec}
                    B, total = view.memory.block_size, view.memory.total_blocks
                    samples.append((len(dec), sum(r.blocks for r in dec) * B / len(dec),
                                    sum(r.cached for r in dec) / len(dec),
                                    sum(r.blocks for r in view.running if id(r) not in ids) / total))
            return b
        pol.schedule = schedule
        res = sim.run()
        it, cm = res.iterations, sim.costmodel
        swap = cm.swap_time(int(it.swap_in_tokens.sum())) + cm.swap_time(int(it.swap_out_tokens.sum()))
        a = np.asarray(samples, float).mean(0)
        st = getattr(pol, "stats", {})
        return {"decoding": a[0], "kv_per_decode": a[1], "written_per_decode": a[2], "held_not_decoding": a[3],
                "swap_share": swap / float(it.duration_s.sum()), "rate": rate,
                "pipe_slots": st.get("pipe_slots", 0), "pipe_no_candidate": st.get("pipe_no_candidate", 0)}
    return memo(("econo-decode-kv", dataset, policy, n_req(s), rate), compute)


CAP_SWEEP = (0.03, 0.08, 0.15, 0.25, 0.35)   # gt_queue_cap_frac: the one knob not from the paper (ambiguity 10)
READINGS = {"grouping by exact predicted RL": {"rl_group_granularity": 1},
            "grouping in 128-token buckets": {"rl_group_granularity": 128},
            "static deadlines (SLO length)": {"deadline_mode": "static"}}   # the spec's other readings (§2.1, §2.7)


def variant(s, knobs: dict) -> dict:
    """Request throughput and mean admitted group size at ShareGPT's knee (seed 0) with `knobs` changed."""
    def one():
        raw = econo_scenario("sharegpt", FULL_NAME, sweep_rate(s), n_req(s))
        raw["policy"].update(knobs)
        r = run(raw)
        return {"thr": r["throughput_rps"], "group": r["policy_stats"].get("group_size_mean", 0.0)}
    return memo(("econo-variant", tuple(sorted(knobs.items())), n_req(s), sweep_rate(s)), one)


def cap_sweep(s) -> dict:
    """variant() as the backlog cap on queued GTs' prompt KV moves from the paper's reserve (3%) to 35% of the
    cache: the one rule of ours the paper lacks."""
    return {c: variant(s, {"gt_queue_cap_frac": c}) for c in CAP_SWEEP}


def fidelity_note(s) -> str:
    """Measured: exact allocation's KV per decoding GT beside vLLM's (both datasets), vLLM's swap cost, KV
    pipelining's unmet slots and the backlog-cap sweep."""
    parts = []
    for d in DATASETS:
        e, v = decode_kv(s, d, FULL_NAME), decode_kv(s, d, VLLM)
        parts.append(f"{d} ({e['rate']:g} req/s): EconoServe holds {e['kv_per_decode']:.0f} KV tokens per decoding "
                     f"GT ({e['written_per_decode']:.0f} written) vs vLLM's {v['kv_per_decode']:.0f} "
                     f"({v['written_per_decode']:.0f} written), {e['kv_per_decode'] / v['kv_per_decode']:.2f}x; "
                     f"{100 * e['held_not_decoding']:.0f}% of its KV held by requests not decoding; decoding GTs "
                     f"{e['decoding']:.1f} vs {v['decoding']:.1f}; vLLM's swap transfers take "
                     f"{100 * v['swap_share']:.1f}% of its GPU time")
    st = es(s, "sharegpt", FULL_NAME, sweep_rate(s))["policy_stats"]
    cs = cap_sweep(s)
    vt = es(s, "sharegpt", VLLM, sweep_rate(s))["throughput_rps"]
    return ("Fidelity checks (seed 0): " + "; ".join(parts) + f". KV pipelining: {st.get('pipe_slots', 0)} regions "
            f"offered, {st.get('pipe_no_candidate', 0)} found no queued GT short enough (the short GTs fit the freed "
            f"KV and were admitted as group members first). Backlog cap on queued prompts (ours; the paper's "
            f"reserve is 3%) swept " + ", ".join(f"{100 * c:g}%: {v['thr']:.2f} req/s (groups {v['group']:.2f})"
                                                 for c, v in cs.items()) +
            "; the spec's other readings: " + ", ".join(f"{k}: {variant(s, kn)['thr']:.2f} req/s (groups "
                                                       f"{variant(s, kn)['group']:.2f})" for k, kn in READINGS.items()) +
            f"; vLLM {vt:.2f} req/s (ShareGPT).")


def kv_note(s) -> str:
    k = kv_breakdown(s)
    return (f"KV use (same run, mean of samples): written by admitted GTs {100 * k['written']:.0f}%, reserved for them "
            f"but unwritten {100 * k['reserved_unwritten']:.0f}%, prompt KV of GTs queued for group admission "
            f"{100 * k['queued_prompt']:.0f}%, free {100 * k['free']:.0f}%; mean decode batch {k['decode_econo']:.1f} "
            f"GTs vs vLLM's {k['decode_vllm']:.1f}.")


def _header(s) -> str:
    k = {d: econo_knee(d, n_req(s)) for d in DATASETS}
    return ("Operating points: Figs. 9–11 report sustainable-rate ratios and means over a rate sweep; we sweep "
            "multiples of our vLLM's knee (the ratio is the quantity the paper fixed) and read sustained rates by the "
            "one capacity rule. The paper states no latency threshold for 'sustainable': ours is 4x vLLM's "
            "normalized latency at the lowest rate, and ES-1 sweeps 2x/3x/4x. The single-rate experiments (padding "
            "sweep, DistServe) run at vLLM's ShareGPT knee; the paper gives no rate for them. The paper reports no "
            "vLLM capacity to compare ours with, only its Table 2 arrival rates (it sets them so that requests queue); "
            "our vLLM's knee against them: " + ", ".join(
                f"{d} {v:.2f} req/s ({v / PAPER_RATES[d]:.2f}x the paper's {PAPER_RATES[d]:g})" for d, v in k.items())
            + f". Seeds {list(SEEDS)}.")


PAPER_RATES = {"sharegpt": 28.0, "alpaca": 36.0}     # Table 2's arrival rates (spec §5), set to overload on purpose


register_setup("econoserve", [
    ("model / GPU", "OPT-13B (and others) on A100-80GB", "OPT-13B on one A100-80GB, GPU time only"),
    ("KV cache", "12 GB", "15,728 tokens (12 GB at 0.78 MiB/token), 32-token blocks"),
    ("length predictor", "fine-tuned OPT-13B", "log-normal noise calibrated to Fig. 5a's over/under-provisioning"),
    ("deadline ordering", "JCT-SLO deadline ranges", "remaining time to the deadline (deadline − now), bucketed "
                                                     "0.2/0.5/2 s"),
    ("grouping", "'same predicted RL'", "padded predicted RL rounded up to 32 tokens"),
    ("sustainable rate", "not stated", "served ≥ 95% AND normalized latency ≤ 4x vLLM's lowest-rate value"),
    ("seeds", "one run", f"{len(SEEDS)} seeds, 95% CI"),
], _header)


@register_claim("ES-1", "econoserve", "1, 5 (Fig. 9)", "Up to 4x the sustainable request rate of vLLM at similar "
                "normalized latency (ShareGPT 2.5–4x, Alpaca 1.13–2.14x)")
def es1(s):
    out = ratio_outcome("up to 4x (ShareGPT 2.5–4x, Alpaca 1.13–2.14x)",
                        {d: gains(s, d, FULL_NAME, VLLM) for d in DATASETS}, {"sharegpt": 3.25, "alpaca": 1.64})
    sweep = "; ".join(f"{f:g}x: " + ", ".join(f"{d} {np.mean(gains(s, d, FULL_NAME, VLLM, f)):.2f}x"
                                               for d in DATASETS) for f in THRESHOLDS)
    out.ours += f"; threshold sweep (x vLLM's low-load latency) {sweep}"
    out.note = ("judged at the 4x threshold; magnitude against each range's middle; vLLM with swap preemption. " +
                groups_note(s) + " " + fidelity_note(s) + (" " + out.note if out.note else "")).strip()
    return out


@register_claim("ES-2", "econoserve", "5 (Fig. 9)", "Sustainable rate vs Sarathi-Serve: ShareGPT 1.25–2.25x, Alpaca "
                "1.2–1.24x")
def es2(s):
    return ratio_outcome("ShareGPT 1.25–2.25x, Alpaca 1.2–1.24x", {d: gains(s, d, FULL_NAME, SARATHI) for d in DATASETS},
                         {"sharegpt": 1.75, "alpaca": 1.22}, note="magnitude against the middle of each range")


@register_claim("ES-3", "econoserve", "5 (Fig. 9)", "The advantage over vLLM is smallest on Alpaca: short sequences "
                "let many requests batch anyway")
def es3(s):
    a, g = gains(s, "alpaca", FULL_NAME, VLLM), gains(s, "sharegpt", FULL_NAME, VLLM)
    return ratio_outcome("Alpaca gain < ShareGPT gain", {"ShareGPT gain / Alpaca gain": [y / z for z, y in zip(a, g)]},
                         note="per seed: the gain over vLLM on ShareGPT over the gain on Alpaca. " + kv_ratio_text(s))


def kv_ratio_text(s) -> str:
    """EconoServe's KV per decoding GT over vLLM's per decoding request, per dataset (decode_kv, seed 0)."""
    return "Mechanism (seed 0, each dataset's vLLM knee): KV held per decoding request, EconoServe over vLLM: " + \
        ", ".join(f"{d} {decode_kv(s, d, FULL_NAME)['kv_per_decode'] / decode_kv(s, d, VLLM)['kv_per_decode']:.2f}x"
                  f" (decoding {decode_kv(s, d, FULL_NAME)['decoding']:.1f} vs {decode_kv(s, d, VLLM)['decoding']:.1f})"
                  for d in DATASETS) + "; request throughput at the top of the rate grid (" + \
        ", ".join(f"{d} {rates(s, d)[-1]:g} req/s: EconoServe {es(s, d, FULL_NAME, rates(s, d)[-1])['throughput_rps']:.2f}"
                  f" vs vLLM {es(s, d, VLLM, rates(s, d)[-1])['throughput_rps']:.2f}" for d in DATASETS) + ")."


@register_claim("ES-4", "econoserve", "1", "Up to 91% lower JCT than vLLM")
def es4(s):
    red = [max(max(1 - a / b for a, b in zip(curve(s, d, FULL_NAME, "jct_mean_s", k), curve(s, d, VLLM, "jct_mean_s", k)))
               for d in DATASETS) for k in SEEDS]
    e = seed_effect(red)
    uns = "econoserve-unsynced (no synced admission)"
    alone = {d: float(np.mean([1 - a / b for a, b in zip(curve(s, d, uns, "jct_mean_s"),
                                                         curve(s, d, FULL_NAME, "jct_mean_s"))])) for d in DATASETS}
    return Outcome("up to −91%", f"best JCT reduction over rates and datasets {fmt_effect(e, 'rel')} "
                   f"({len(SEEDS)} seeds)", e.verdict != "opposite", within(e.mean, 0.91),
                   note="synced GT admission alone changes mean JCT by " +
                        ", ".join(f"{d} {pct(-v)}" for d, v in alone.items()) +
                        " (EconoServe without it against EconoServe, mean over rates, seed 0)",
                   untestable=e.reason if e.verdict == "untestable" else "")


@register_claim("ES-5", "econoserve", "5 (Fig. 10)", "SSR (JCT-SLO satisfaction) higher than vLLM (+83%) and "
                "Sarathi-Serve (+42%), averaged over datasets")
def es5(s):
    e = per_seed(s, FULL_NAME, "ssr")
    r = {"vs vLLM": [a / b for a, b in zip(e, per_seed(s, VLLM, "ssr"))],
         "vs Sarathi": [a / b for a, b in zip(e, per_seed(s, SARATHI, "ssr"))]}
    out = ratio_outcome("+83% vs vLLM, +42% vs Sarathi", r, {"vs vLLM": 1.83, "vs Sarathi": 1.42},
                        note="SSR ratio, mean over datasets and rates")
    out.ours = f"EconoServe SSR {100 * np.mean(e):.0f}%; " + out.ours
    return out


@register_claim("ES-6", "econoserve", "5 (Fig. 10)", "EconoServe's SSR is only 2–4% below the Oracle's (true lengths)")
def es6(s):
    gap = [1 - a / b for a, b in zip(per_seed(s, FULL_NAME, "ssr"), per_seed(s, ORACLE, "ssr"))]
    e = seed_effect(gap)
    return Outcome("2–4% below Oracle", f"EconoServe's SSR {fmt_effect(e, 'rel')} below the Oracle's "
                   f"({len(SEEDS)} seeds)", e.verdict != "opposite", within(e.mean, 0.03),
                   note="the direction (Oracle ≥ EconoServe) is read by the CI rule; a gap inside the 2% tie is "
                        "untestable", untestable=e.reason if e.verdict == "untestable" else "")


@register_claim("ES-7", "econoserve", "5 (Fig. 11)", "Higher KV-cache utilization on ShareGPT than vLLM (+27%) and "
                "Sarathi-Serve (+18%)")
def es7(s):
    key, d = "kv_written_util", ("sharegpt",)
    e = per_seed(s, FULL_NAME, key, d)
    r = {"vs vLLM": [a / b for a, b in zip(e, per_seed(s, VLLM, key, d))],
         "vs Sarathi": [a / b for a, b in zip(e, per_seed(s, SARATHI, key, d))]}
    out = ratio_outcome("+27% vs vLLM, +18% vs Sarathi", r, {"vs vLLM": 1.27, "vs Sarathi": 1.18},
                        note="utilization = KV actually written, sampled every 10 iterations, mean over rates. " +
                        kv_ratio_text(s))
    out.ours = f"written KV / capacity {100 * np.mean(e):.0f}%; " + out.ours
    return out


@register_claim("ES-8", "econoserve", "5.6", "GT queueing does not greatly increase TBT (EconoServe mean 0.141 s)")
def es8(s):
    d = ("sharegpt",)
    e, v = per_seed(s, FULL_NAME, "tpot_mean_s", d), per_seed(s, VLLM, "tpot_mean_s", d)
    eff = seed_effect([1.25 - a / b for a, b in zip(e, v)])
    return Outcome("mean TBT 0.141 s, not much above the baselines'", f"mean TPOT {1e3 * np.mean(e):.0f} ms vs vLLM "
                   f"{1e3 * np.mean(v):.0f} ms; margin under 1.25x vLLM's {eff.mean:+.2f} [95% CI {eff.lo:+.2f}, "
                   f"{eff.hi:+.2f}] ({len(SEEDS)} seeds)", eff.verdict != "opposite", within(np.mean(e), 0.141),
                   note="'not greatly' read as ≤ 1.25x vLLM's; the absolute value depends on model and GPU",
                   untestable=eff.reason if eff.verdict == "untestable" else "")


@register_claim("ES-9", "econoserve", "2 (Fig. 1d)", "KV allocation failures: vLLM 74% of requests, Sarathi-Serve 67%; "
                "exact allocation avoids them")
def es9(s):
    f = {p: per_seed(s, p, "alloc_failure_pct") for p in (VLLM, SARATHI, FULL_NAME)}
    r = {"vLLM / Sarathi": [a / max(b, 1e-9) for a, b in zip(f[VLLM], f[SARATHI])],
         "Sarathi / EconoServe": [a / max(b, 1e-9) for a, b in zip(f[SARATHI], f[FULL_NAME])]}
    out = ratio_outcome("vLLM 74% > Sarathi 67% > exact allocation", r,
                        note="failure = a request that was preempted (evicted or swapped) or failed an allocation")
    out.ours = ", ".join(f"{p}: {np.mean(v):.0f}%" for p, v in f.items()) + "; " + out.ours
    out.magnitude = within(np.mean(f[VLLM]) / 100, 0.74) and within(np.mean(f[SARATHI]) / 100, 0.67)
    return out


@register_claim("ES-10", "econoserve", "2 (Fig. 1)", "vLLM vs Sarathi-Serve: +20% KV utilization, −41% throughput, "
                "−27% forward size, +29% JCT")
def es10(s):
    keys = {"kv_written_util": 0.20, "throughput_rps": -0.41, "forward_size_mean": -0.27, "jct_mean_s": 0.29}
    ch = {k: [float(np.mean([es(s, d, VLLM, rates(s, d)[-1], seed=j)[k] /
                             es(s, d, SARATHI, rates(s, d)[-1], seed=j)[k] - 1 for d in DATASETS])) for j in SEEDS]
          for k in keys}
    eff = {k: seed_effect([np.sign(p) * c for c in ch[k]]) for k, p in keys.items()}
    from study.findings.verdicts import combine
    direction, why = combine(eff.values())
    return Outcome("+20% / −41% / −27% / +29%", ", ".join(f"{k}: {fmt_effect(seed_effect(ch[k]), 'rel')}"
                                                          for k in keys) +
                   f" (at each dataset's highest rate, averaged; {len(SEEDS)} seeds)", direction,
                   all(within(float(np.mean(ch[k])), p) for k, p in keys.items()), untestable=why)


for _id, _sec, _st, _why in (
        ("ES-11", "2 (Fig. 1)", "SRTF, ORCA and FastServe fall below vLLM on throughput, KV utilization, forward size "
         "and JCT (max-length allocation limits the batch)", "SRTF and FastServe baselines are not implemented"),
        ("ES-12", "2 (Fig. 1)", "MultiRes (exact allocation): no allocation failures, +10% throughput and JCT 42.63% "
         "lower than vLLM", "the MultiRes baseline is not implemented"),
        ("ES-13", "2 (Figs. 2–3)", "SyncDecoupled vs SyncCoupled: 1.31x throughput, −35% JCT; Synced-Decoupled has "
         "low scheduling time and high utilization", "no SyncCoupled variant; scheduling time is not charged"),
        ("ES-14", "2 (Fig. 1)", "BookCorpus: lower throughput, higher KV utilization, more allocation failures",
         "the benchmark has no BookCorpus setup (M, rates) yet; the workload exists"),
        ("ES-15", "2 (Figs. 1f, 6)", "GT domination: few requests complete per iteration, so few PTs join; preempted "
         "GTs hold more KV than new GTs", "the per-iteration completion and per-queue KV traces are not collected")):
    register_claim(_id, "econoserve", _sec, _st)(lambda s, _w=_why: not_modelled("see statement", _w))


def u_shape(jct, under):
    """ES-16's judgement on per-seed curves (rows: seeds; columns: padding ratios): the seed-mean JCT curve's
    minimum must lie inside the sweep and the lower end must sit above it on the seeds (relative margin, CI rule);
    the under-provisioned share (percent) must fall from the first padding to the last (CI rule).
    Returns (index of the minimum, margin effect, fall effect, direction, untestable reason)."""
    from study.findings.verdicts import combine
    jct, under = np.asarray(jct, float), np.asarray(under, float)
    k_min = int(np.argmin(jct.mean(axis=0)))
    u_margin = seed_effect([min(j[0], j[-1]) / j[k_min] - 1 for j in jct])
    falls = seed_effect([(u[0] - u[-1]) / 100 for u in under])
    if not 0 < k_min < jct.shape[1] - 1:
        return k_min, u_margin, falls, False, ""          # a minimum at an end of the sweep is no U
    ok, why = combine([u_margin, falls])
    return k_min, u_margin, falls, ok, why


@register_claim("ES-16", "econoserve", "2 (Figs. 4–5)", "Padding sweep (SyncDecoupled): JCT is U-shaped in the padding "
                "ratio, the share of under-provisioned requests falls; ShareGPT sweet spot 15%")
def es16(s):
    """Per seed: the JCT curve over the padding ratios. U-shaped means the minimum of the seed-mean curve is inside
    the sweep and, on every seed, below both ends (the margin over the lower end is judged by the CI rule); the
    under-provisioned share must fall with the padding on every seed (its first-to-last drop, by the CI rule)."""
    pol = "econoserve-sd (SyncDecoupled)"
    rows = {k: [es(s, "sharegpt", pol, sweep_rate(s), p, seed=k) for p in ECONO_PADDINGS] for k in SEEDS}
    jct = np.array([[r["jct_mean_s"] for r in rows[k]] for k in SEEDS])
    under = np.array([[r["provisioning"]["under_provisioned_requests_pct"] for r in rows[k]] for k in SEEDS])
    mean_jct = jct.mean(axis=0)
    k_min, u_margin, falls, ok, why = u_shape(jct, under)
    argmins = [ECONO_PADDINGS[int(np.argmin(j))] for j in jct]
    return Outcome("U-shaped JCT, minimum at 15%", f"mean JCT over padding {ECONO_PADDINGS}: " +
                   ", ".join(f"{v:.2f}" for v in mean_jct) + f" s (minimum at {ECONO_PADDINGS[k_min]:.0%}; per seed "
                   + ", ".join(f"{a_:.0%}" for a_ in argmins) + f"); lower end over the minimum {fmt_effect(u_margin)}"
                   "; under-provisioned requests " + ", ".join(f"{v:.0f}%" for v in under.mean(axis=0)) +
                   f" ({len(SEEDS)} seeds)", ok, within(ECONO_PADDINGS[k_min], 0.15),
                   note=f"ShareGPT, {sweep_rate(s):g} req/s (vLLM's knee). Mechanism per padding (SyncDecoupled, mean of "
                        f"{len(SEEDS)} seeds): reserve extensions / offload-free stops / groups admitted " + ", ".join(
                            f"{ECONO_PADDINGS[i]:.0%}: {_stm(rows, i, 'reserve_extensions')}/"
                            f"{_stm(rows, i, 'offload_free_stops')}/{_stm(rows, i, 'groups')}"
                            for i in range(len(ECONO_PADDINGS))) + ".", untestable=why)


def _st(run_, key):
    return run_.get("policy_stats", {}).get(key, 0)


def _stm(rows, i, key) -> str:
    """A policy counter at padding index i, mean over the seeds in rows (seed → runs per padding)."""
    return f"{np.mean([_st(r[i], key) for r in rows.values()]):.0f}"


@register_claim("ES-17", "econoserve", "2 (Fig. 5a)", "At the ShareGPT sweet spot (15% padding) over-provisioning is "
                "5.62% and under-provisioning 13.42% of allocated KV")
def es17(s):
    runs_ = {k: [es(s, "sharegpt", "econoserve-sd (SyncDecoupled)", sweep_rate(s), 0.15, seed=k)] for k in SEEDS}
    o = seed_effect([r[0]["provisioning"]["over_provision_pct"] / 100 for r in runs_.values()], tie=0)
    u = seed_effect([r[0]["provisioning"]["under_provision_pct"] / 100 for r in runs_.values()], tie=0)
    from study.findings.verdicts import combine
    ok, why = combine([o, u])
    return Outcome("5.62% over, 13.42% under", f"{fmt_effect(o, 'rel').lstrip('+')} over, "
                   f"{fmt_effect(u, 'rel').lstrip('+')} under ({len(SEEDS)} seeds)", ok,
                   within(o.mean, 0.0562) and within(u.mean, 0.1342),
                   note="a calibration check: the lognormal predictor is fitted to these two numbers. Mechanism (same "
                        f"runs, mean of {len(SEEDS)} seeds): under-provisioned GTs extended from the reserve "
                        f"{_stm(runs_, 0, 'reserve_extensions')} times and stopped offload-free "
                        f"{_stm(runs_, 0, 'offload_free_stops')} times; {_stm(runs_, 0, 'groups')} groups admitted.",
                   untestable=why)


@register_claim("ES-18", "econoserve", "5 (Fig. 13)", "Ablation: EconoServe-D, -SD and -SDO all do worse than "
                "EconoServe; KV pipelining and decoupling are the largest contributors")
def es18(s):
    paper = list(ABLATIONS)[:3]                     # the paper's D, SD, SDO; the other two are ours, shown only
    r = {ABLATIONS[v]: [sustainable(s, d, FULL_NAME, k) / sustainable(s, d, v, k) for k in SEEDS for d in DATASETS]
         for v in ABLATIONS}
    out = ratio_outcome("all below EconoServe (JCT +7–29%, SSR −16–21%)",
                        {ABLATIONS[v]: r[ABLATIONS[v]] for v in paper},
                        note="EconoServe's sustainable rate over each ablation's (per seed and dataset); the paper's "
                             "per-component numbers are internally inconsistent (spec §9): direction only. Ours, "
                             "shown only: " + ", ".join(f"{ABLATIONS[v]} {np.mean(r[ABLATIONS[v]]):.2f}x"
                                                        for v in list(ABLATIONS)[3:]))
    return out


@register_claim("ES-19", "econoserve", "2 (Fig. 2)", "Same-length GT groups exist: 59% (ShareGPT) / 61% (Alpaca) of "
                "groups have ≥ 4 requests, 23% / 20% have ≥ 12")
def es19(s):
    """Fig. 2 was measured at Table 2's arrival rates (spec §7: 'Table 2 traces and rates'), set so that requests
    queue; the queue's same-RL groups are read there, on every seed. The grid's mean is shown beside it."""
    paper = {"sharegpt": (0.59, 0.23), "alpaca": (0.61, 0.20)}

    def at_paper(d, key, k):
        return es(s, d, FULL_NAME, PAPER_RATES[d], seed=k)["policy_stats"].get(key, 0)

    def grid(d, key, k):
        return float(np.mean([es(s, d, FULL_NAME, r, seed=k)["policy_stats"].get(key, 0) for r in rates(s, d)]))
    q = {d: ([at_paper(d, "queue_group_ge4", k) for k in SEEDS], [at_paper(d, "queue_group_ge12", k) for k in SEEDS])
         for d in DATASETS}
    adm = {d: ([at_paper(d, "group_size_ge4", k) for k in SEEDS], [at_paper(d, "group_size_mean", k) for k in SEEDS])
           for d in DATASETS}
    served = {d: float(np.mean([es(s, d, FULL_NAME, PAPER_RATES[d], seed=k)["served"] for k in SEEDS]))
              for d in DATASETS}
    eff = {d: seed_effect(q[d][0]) for d in DATASETS}
    from study.findings.verdicts import combine
    direction, why = combine(eff.values())
    return Outcome("≥ 4: 59% / 61%; ≥ 12: 23% / 20%",
                   "same-RL groups in the queue (Fig. 2's measure) at Table 2's rates: " +
                   "; ".join(f"{d} at {PAPER_RATES[d]:g} req/s: ≥ 4 {fmt_effect(eff[d], 'rel').lstrip('+')}, ≥ 12 "
                             f"{100 * np.mean(b):.0f}%" for d, (a, b) in q.items())
                   + ". Groups EconoServe admitted there: " +
                   "; ".join(f"{d}: ≥ 4 {100 * np.mean(a):.0f}%, mean size {np.mean(b):.2f}" for d, (a, b) in adm.items())
                   + f" ({len(SEEDS)} seeds). Over our rate grid (mean): " +
                   "; ".join(f"{d}: ≥ 4 {100 * np.mean([grid(d, 'queue_group_ge4', k) for k in SEEDS]):.0f}%"
                             for d in DATASETS), direction,
                   all(within(np.mean(q[d][0]), paper[d][0]) and within(np.mean(q[d][1]), paper[d][1])
                       for d in DATASETS),
                   note="Fig. 2 measures SyncCoupled groups: every waiting request grouped by predicted RL (here: "
                        "padded predicted RL rounded to 32 tokens, counted at each group admission), at Table 2's "
                        "arrival rates. Served share of the offered load there: " +
                        ", ".join(f"{d} {100 * v:.0f}%" for d, v in served.items()) + " (the paper set the rates so "
                        "that requests queue). The groups EconoServe admits are smaller: a completing group frees "
                        "only its own KV, and only that much can be admitted next. " + groups_note(s),
                   untestable=why)


WHY = {   # qualitative reasons for disagreements; the figures are in each row's `ours`, from the run itself
    "ES-1": "in the paper's setup as we model it, the vLLM baseline (swapping) already keeps its batches full at these "
            "lengths, while synced generation-task admission holds finished prompts until their group completes; "
            "the queueing this adds outweighs the KV EconoServe saves, so its sustainable rate is lower",
    "ES-2": "the same synced admission that lowers the sustainable rate also lengthens job completion",
    "ES-3": "with no gain on either dataset the comparison of gains has no direction to test; the Alpaca loss is "
            "the smaller one",
    "ES-5": "requests wait in synced groups and meet their deadlines less often than under vLLM's and Sarathi's "
            "continuous admission",
    "ES-7": "EconoServe reserves padded predicted lengths and holds groups' KV until they complete, so less of what "
            "it allocates is written at any time",
    "ES-8": "synced groups and deadline ordering hold decode batches smaller than vLLM's at the same load",
    "ES-9": "our vLLM and Sarathi baselines preempt far less than the paper reports at these lengths and this KV "
            "size, so the over-allocation gap it describes is small here",
    "ES-10": "vLLM and Sarathi reach similar KV use in our runs; the paper's difference is not reproduced",
    "ES-18": "removing synced admission alone raises the sustainable rate in our runs, so the "
             "unsynced variant beats the full system; the other ablations order as the paper says",
    "ES-F17": "our DistServe preset gives the decode replicas enough GPUs for this load, while EconoServe on the "
              "same GPU count queues behind synced admission",
    "ES-O6": "in our disaggregated runs the decode replicas run busy and the prefill replicas idle, but EconoServe's "
             "own utilization is not higher, for the same synced-admission queueing",
}


# -- DistServe (cluster layer) -----------------------------------------------------------------------------------
SD = "econoserve-sd (SyncDecoupled)"
PAIRS_FIG12 = 4                 # DistServe pairs in the GPU-count experiment (8 GPUs)


def distserve(s: Scale, dataset: str, rate: float, pairs: int = 1, seed: int = 0) -> dict:
    n = n_req(s) * pairs
    raw = econo_scenario(dataset, VLLM, rate, n, None, seed)
    raw["cluster"] = {"disaggregation": {"preset": "distserve", "prefill": pairs, "decode": pairs},
                      "router": "least_requests"}
    return memo(("distserve", dataset, rate, n, pairs) + ((seed,) if seed else ()), lambda: run_cluster(raw))


def econo_replicas(s: Scale, dataset: str, policy: str, rate: float, replicas: int, n: int, seed: int = 0) -> dict:
    raw = econo_scenario(dataset, policy, rate, n, None, seed)
    raw["cluster"] = {"replicas": replicas, "router": "least_requests"}
    return memo(("econo-replicas", dataset, policy, rate, replicas, n) + ((seed,) if seed else ()),
                lambda: run_cluster(raw))


@register_claim("ES-F17", "econoserve", "2 (F17)", "vs DistServe (2 GPUs, 100 Gb/s): SyncDecoupled on one GPU has 9% "
                "lower JCT and 7% higher throughput; KV transfer is 7% of DistServe's JCT")
def es_f17(s):
    """Per seed: SyncDecoupled's JCT reduction against DistServe's and DistServe's KV-transfer share of its JCT,
    each judged by the CI rule (the transfer share's tie is zero: any transfer time counts)."""
    d = {k: distserve(s, "sharegpt", sweep_rate(s), seed=k) for k in SEEDS}
    e = {k: es(s, "sharegpt", SD, sweep_rate(s), seed=k) for k in SEEDS}
    jct = seed_effect([1 - e[k]["jct_mean_s"] / d[k]["jct_mean_s"] for k in SEEDS])
    thr = float(np.mean([e[k]["throughput_rps"] / d[k]["throughput_rps"] - 1 for k in SEEDS]))
    share = seed_effect([d[k]["kv_transfer_share"] for k in SEEDS], tie=0)
    from study.findings.verdicts import combine
    ok, why = combine([jct, share])
    return Outcome("JCT −9%, throughput +7%, KV transfer 7% of JCT",
                   f"JCT reduction {fmt_effect(jct, 'rel')}, throughput {pct(thr)}, KV transfer "
                   f"{fmt_effect(share, 'rel').lstrip('+')} of DistServe's JCT ({len(SEEDS)} seeds)",
                   ok, within(jct.mean, 0.09) and within(share.mean, 0.07),
                   note=f"ShareGPT, {sweep_rate(s):g} req/s (vLLM's knee); DistServe on 2 GPUs against SyncDecoupled on 1; throughput "
                        "is arrival-bound at this rate, so only JCT and the transfer share are judged", untestable=why)


@register_claim("ES-O6", "econoserve", "2 (O6, F17)", "Disaggregation leaves the decode GPU under-used and the "
                "prefill GPU's KV cache nearly empty; DistServe's KV utilization is 8% lower, its prefill forward "
                "size 12% and decode forward size 82% smaller")
def es_o6(s):
    """Per seed: the prefill GPU's KV below the decode GPU's, the decode GPU idle part of the time, and DistServe's
    decode forward size below SyncDecoupled's, each by the CI rule; the magnitudes compare the seed means (each
    quoted with its 95% CI over the seeds)."""
    d = {k: distserve(s, "sharegpt", sweep_rate(s), seed=k) for k in SEEDS}
    e = {k: es(s, "sharegpt", SD, sweep_rate(s), seed=k) for k in SEEDS}

    def per(f):
        return [f(d[k], e[k]) for k in SEEDS]
    kv_vals = per(lambda d_, e_: 1 - (d_["prefill_kv_allocated_util"] + d_["decode_kv_allocated_util"]) / 2
                  / e_["kv_allocated_util"])
    pf_vals = per(lambda d_, e_: 1 - d_["prefill_prefill_forward_mean"] / e_["prefill_forward_mean"])
    df_vals = per(lambda d_, e_: 1 - d_["decode_decode_forward_mean"] / e_["decode_forward_mean"])
    kv, pf, df = (float(np.mean(v)) for v in (kv_vals, pf_vals, df_vals))
    gap = seed_effect(per(lambda d_, e_: d_["decode_kv_allocated_util"] - d_["prefill_kv_allocated_util"]))
    idle = seed_effect(per(lambda d_, e_: 1 - d_["decode_busy"]))
    smaller = seed_effect(df_vals)
    from study.findings.verdicts import combine
    ok, why = combine([gap, idle, smaller])
    m = {key: 100 * float(np.mean([d[k][key] for k in SEEDS])) for key in
         ("prefill_kv_allocated_util", "decode_kv_allocated_util", "prefill_busy", "decode_busy")}

    def neg(v):
        return fmt_effect(seed_effect([-x for x in v]), 'rel')
    return Outcome("prefill KV nearly empty, decode GPU under-used; KV util −8%, prefill forward −12%, decode "
                   "forward −82%",
                   f"KV allocated: prefill GPU {m['prefill_kv_allocated_util']:.0f}%, decode GPU "
                   f"{m['decode_kv_allocated_util']:.0f}%, SD "
                   f"{100 * float(np.mean([e[k]['kv_allocated_util'] for k in SEEDS])):.0f}%; decode − prefill KV "
                   f"{fmt_effect(gap, 'rel')}; decode GPU idle {fmt_effect(idle, 'rel')} (busy: prefill "
                   f"{m['prefill_busy']:.0f}%, decode {m['decode_busy']:.0f}%); DistServe vs SD: average KV "
                   f"{neg(kv_vals)}, prefill forward size {neg(pf_vals)}, decode forward size {neg(df_vals)} "
                   f"({len(SEEDS)} seeds)",
                   ok, within(kv, 0.08) and within(pf, 0.12) and within(df, 0.82),
                   note=f"ShareGPT, {sweep_rate(s):g} req/s (vLLM's knee); forward sizes are tokens per iteration with any prefill "
                        "(prefill) or any decode (decode); KV gap and idle share are in points of utilization",
                   untestable=why)


@register_claim("ES-F12", "econoserve", "5.4 (Fig. 12)", "EconoServe needs 73% fewer GPUs than DistServe for the "
                "same goodput (homogeneous A100s, Ethernet)")
def es_f12(s):
    """Per seed: the fewest EconoServe GPUs (replicas) whose goodput reaches DistServe's on 2·PAIRS GPUs; the share
    of GPUs saved is judged by the CI rule (a seed that never reaches it within 2·PAIRS GPUs saves none)."""
    rate = sweep_rate(s) * PAIRS_FIG12
    rows = []
    for k in SEEDS:
        d = distserve(s, "sharegpt", rate, PAIRS_FIG12, seed=k)
        need = next((n for n in range(1, 2 * PAIRS_FIG12 + 1)
                     if econo_replicas(s, "sharegpt", FULL_NAME, rate, n, n_req(s) * PAIRS_FIG12, seed=k)["goodput_rps"]
                     >= d["goodput_rps"]), None)
        rows.append((d["gpus"], need, d["goodput_rps"]))
    fewer = seed_effect([0.0 if need is None else 1 - need / gpus for gpus, need, _ in rows])
    per = ", ".join(f"{'>' + str(g) if n is None else n} of {g} (DistServe goodput {gp:.2f} req/s)" for g, n, gp in rows)
    return Outcome("73% fewer GPUs", f"EconoServe GPUs matching DistServe's goodput per seed: {per}; GPUs saved "
                   f"{fmt_effect(fewer, 'rel')} ({len(SEEDS)} seeds)", fewer.verdict != "opposite",
                   within(fewer.mean, 0.73),
                   note=f"ShareGPT at {rate} req/s; DistServe {PAIRS_FIG12} prefill + {PAIRS_FIG12} decode GPUs, "
                        "EconoServe replicas behind least-outstanding-requests (the paper's shortest queue); "
                        "goodput = requests meeting EconoServe's JCT SLO per second", untestable=fewer.reason)


attach_why(WHY)   # after every claim of this module is registered (the DistServe ones come last)
