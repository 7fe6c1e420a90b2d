"""Apt-Serve: hybrid-cache sizes and costs, the greedy knapsack against the exact optimum, invariants, claims."""
import numpy as np
import pytest

from costmodels import build_costmodel, get_gpu, get_model
from costmodels.base import BatchShape
from policies import build_policy
from policies.aptserve import Candidate
from sim.scenario.config import load_scenario
from sim.kv.hidden_cache import HybridCacheManager
from sim.engine.request import Request
from sim.cluster.runner import run_scenario
from solver.aptserve_knapsack import exact_knapsack, knapsack_value

EX = "examples/aptserve-sharegpt.yaml"


def test_hidden_cache_is_half_only_for_mha():
    assert get_model("opt-13b").hidden_to_kv_ratio() == 0.5
    assert get_model("llama-3-8b").hidden_to_kv_ratio() == 2.0          # GQA: hidden cache is larger
    mem = HybridCacheManager(16 * 100, 16, hidden_ratio=2.0)
    assert not mem.hidden_allowed
    mem = HybridCacheManager(16 * 100, 16, hidden_ratio=0.5)
    r = Request(0, 0.0, 100, 10)
    mem.set_type(r, True)
    assert mem.reserve(r, 100) and r.blocks == 4                        # ⌈⌈100/16⌉ · ½⌉ = ⌈7/2⌉
    with pytest.raises(RuntimeError):
        mem.set_type(r, False)                                          # no in-place switch
    mem.free(r)
    assert mem.free_blocks == 100 and not mem.is_hidden(r)


def test_hidden_recompute_is_charged_by_flops():
    m, g = get_model("opt-13b"), get_gpu("a100-40gb")
    cm = build_costmodel({"kind": "linear"}, m, g)
    base = BatchShape(decode_context=[1001] * 4)
    extra = BatchShape(decode_context=[1001] * 4, hidden_recompute_tokens=4000)
    want = 4 * 5120 * 5120 * 40 * 4000 / (312e12 * 0.64)              # 2·2·d·d_kv·L FLOPs per token
    assert cm.batch_time(extra) - cm.batch_time(base) == pytest.approx(want, rel=1e-9)
    assert want == pytest.approx(0.084, rel=0.01)                        # ≈ 21 µs per context token (spec §2.3)


def _cands(rng, n, N_violated=0.2):
    out = []
    for i in range(n):
        m = int(rng.integers(1, 40))
        r = Request(i, 0.0, m * 16, 10)
        out.append(Candidate(r, float(rng.uniform(0, 3)), m, -(-m // 2) if m > 1 else m,
                             bool(rng.random() < N_violated), False))
    return out


def test_greedy_matches_hand_worked_example():
    pol = build_policy({"name": "aptserve"})
    pol.rho = 0.01
    # Two requests, budget 10 blocks, N = 2. A: p=2, m=8 (hidden 4, penalty 2·0.01·8 = 0.16);
    # B: p=1, m=6 (hidden 3, penalty 0.12). KV for both needs 14 > 10; hidden A (1.84) + hidden B (0.88) = 7 blocks,
    # then A's upgrade (+4 → 11) does not fit, so the greedy stops with both hidden: value 2.72. The optimum is
    # hidden A + KV B (10 blocks, 2.84): a real, bounded greedy gap.
    a, b = Request(0, 0.0, 128, 5), Request(1, 0.0, 96, 5)
    cands = [Candidate(a, 2.0, 8, 4, False, False), Candidate(b, 1.0, 6, 3, False, False)]
    chosen = pol.knapsack(cands, 10, 2)
    assert chosen == {a: "hidden", b: "hidden"}
    assert knapsack_value(chosen, cands, 2, 0.01) == pytest.approx(2.72)
    opt, best = exact_knapsack(cands, 10, 2, 0.01)
    assert opt == pytest.approx(2.84) and best == {a: "hidden", b: "kv"}


@pytest.mark.parametrize("budget_range", [(10, 200), (2, 40)])     # the second often has items heavier than it
def test_greedy_is_a_two_approximation_and_usually_near_optimal(budget_range):
    rng = np.random.default_rng(1)
    pol = build_policy({"name": "aptserve"})
    ratios = []
    for _ in range(300):
        cands = _cands(rng, int(rng.integers(2, 25)))
        budget, N = int(rng.integers(*budget_range)), len(cands)
        pol.rho = float(rng.uniform(0, 0.02))
        chosen = pol.knapsack(cands, budget, N)
        used = sum(c.h if chosen[c.req] == "hidden" else c.m for c in cands if c.req in chosen)
        assert used <= budget
        greedy = knapsack_value(chosen, cands, N, pol.rho)
        opt, _ = exact_knapsack(cands, budget, N, pol.rho)
        assert greedy <= opt + 1e-9
        assert 2 * greedy >= opt - 1e-9
        ratios.append(opt / greedy if greedy > 0 else 1.0)
    assert np.median(ratios) < 1.1


def test_greedy_skips_an_option_heavier_than_the_budget():
    """The densest request's KV (30 blocks, θ 0.3) exceeds the budget (20) and its hidden option has negative value
    (Nρm = 18 > p = 9): it must not end the scan with an empty prefix. The two small requests behind it both fit."""
    pol = build_policy({"name": "aptserve"})
    pol.rho = 0.2
    big, s1, s2 = Request(0, 0.0, 480, 5), Request(1, 0.0, 160, 5), Request(2, 0.0, 160, 5)
    cands = [Candidate(big, 9.0, 30, 15, False, False), Candidate(s1, 2.5, 10, 5, False, False),
             Candidate(s2, 2.5, 10, 5, False, False)]
    chosen = pol.knapsack(cands, 20, 3)
    assert chosen == {s1: "kv", s2: "kv"}
    opt, _ = exact_knapsack(cands, 20, 3, 0.2)
    assert knapsack_value(chosen, cands, 3, 0.2) == pytest.approx(opt) == pytest.approx(5.0)


def _run(policy, rate, n=200, extra=()):
    scn = load_scenario(EX, [f"policy.name={policy}", f"workload.rate={rate}", f"workload.num_requests={n}", *extra])
    return run_scenario(scn)


@pytest.mark.parametrize("policy", ["aptserve", "aptserve-fcfs", "aptserve-s", "aptserve-decay"])
def test_invariants_under_memory_pressure(policy):
    from sim.scenario.build import build_simulation
    scn = load_scenario(EX, [f"policy.name={policy}", "workload.rate=8", "workload.num_requests=100",
                             "memory.M=3000"])
    sims = []
    for _ in range(2 if policy == "aptserve" else 1):
        sim = build_simulation(scn)
        mem = sim.memory
        seen_hidden = []
        commit = sim.policy.on_commit

        def check(view, batch, dt, mem=mem, seen=seen_hidden):
            assert mem.free_blocks + sum(r.blocks for r in view.running) == mem.total_blocks
            for r in view.running:
                assert r.blocks == mem.blocks_needed(max(r.cached, 1), mem.is_hidden(r)) or r.blocks >= \
                    mem.blocks_needed(r.cached, mem.is_hidden(r))
            seen.append(sum(mem.is_hidden(r) for r in view.running))
            commit(view, batch, dt)
        sim.policy.on_commit = check
        res = sim.run()
        assert res.summary["completed"] == 100
        assert (res.requests["generated_tokens"] == res.requests["output_tokens"]).all()
        assert mem.free_blocks == mem.total_blocks and not mem.hidden
        if policy != "aptserve-decay":
            assert max(seen_hidden) > 0, "memory pressure should make some requests use the hidden cache"
        sims.append(res.requests[["id", "first_token_s", "completion_s"]])
    assert sims[0].equals(sims[-1])


def test_adaptive_beats_fcfs_and_vllm_under_load():
    """Past vLLM's knee (about 1.6 req/s on this setup) the adaptive scheduler keeps most requests within SLO
    while vLLM v0 and FCFS order lose a large share (paper: Table 5, Fig. 8)."""
    att = {p: _run(p, 2.5).summary["slo_attainment"] for p in ("aptserve", "aptserve-fcfs", "vllm-v0")}
    assert att["aptserve"] >= 0.75
    assert att["aptserve"] > att["vllm-v0"] + 0.2
    assert att["aptserve"] > att["aptserve-fcfs"] + 0.2


def test_hidden_requests_are_retyped_by_default_and_the_sticky_variant_keeps_them():
    """The default re-decides every running request's cache type at each decode iteration (the paper, spec §2.4,
    §2.9): hidden requests return to KV (or are dropped) instead of decoding as hidden. The sticky variant keeps
    the type: its hidden requests rebuild K/V at every decode step."""
    from sim.scenario.build import build_simulation
    stats = {}
    for pol in ("aptserve", "aptserve-sticky"):
        sim = build_simulation(load_scenario(EX, [f"policy.name={pol}", "workload.rate=3", "workload.num_requests=200"]))
        stats[pol] = sim.run().summary
    assert stats["aptserve"]["policy_hidden_admissions"] > 0
    assert stats["aptserve"]["policy_hidden_decode_steps"] < stats["aptserve-sticky"]["policy_hidden_decode_steps"] / 10
    assert stats["aptserve"]["policy_type_switches"] + stats["aptserve"]["policy_decode_drops"] > 0
    s = stats["aptserve-sticky"]
    assert s["policy_hidden_decode_steps"] > 0 and s["policy_type_switches"] == 0
    assert s["policy_hidden_recompute_tokens"] > s["policy_hidden_decode_steps"]


def test_aptserve_keeps_up_at_vllms_knee():
    """The defect verdicts2 fixed: with sticky cache types, Apt-Serve's hidden requests rebuilt K/V for their whole
    decode (131 s of 469 s busy at 1.625 req/s) and it completed 80% of the steady-state load where vLLM
    completed 98%. Re-deciding the type each decode (the paper) keeps up with the load."""
    from study.findings.verdicts import served_ratio
    served = {}
    for pol in ("aptserve", "aptserve-sticky", "vllm-v0"):
        req = _run(pol, 1.625, n=500).requests
        served[pol] = served_ratio(req.arrival_s.to_numpy(float), req.completion_s.to_numpy(float))
    assert served["aptserve"] >= 0.95 and served["vllm-v0"] >= 0.95
    assert served["aptserve"] > served["aptserve-sticky"] + 0.05


def test_hidden_cache_is_not_used_for_gqa_models():
    scn = load_scenario(EX, ["model.name=llama-3-8b", "hardware.gpu=a100-80gb", "memory.M=4000",
                             "workload.num_requests=60", "workload.rate=6",
                             "costmodel.kind=linear", "costmodel.path=profiles/a100-80gb/llama-2-7b-linear.yaml"])
    from sim.scenario.build import build_simulation
    sim = build_simulation(scn)
    assert not sim.memory.hidden_allowed
    res = sim.run()
    assert res.summary["completed"] == 60 and sim.policy.stats["hidden_admissions"] == 0


def test_hybrid_cache_helps_over_kv_only_at_high_rate():
    """Table 4 direction: with adaptive scheduling, the hybrid cache is at least as good as KV only, more so
    under load. The runs differ only by the cache option (same seed, same arrivals)."""
    hyb = _run("aptserve", 8.0)
    kv = _run("aptserve-kv", 8.0)
    assert hyb.summary["slo_attainment"] > kv.summary["slo_attainment"]
