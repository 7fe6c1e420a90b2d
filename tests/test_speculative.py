"""Speculative decoding: hand-worked token times and KV, exact output counts, KV <= M, determinism, acceptance law."""
import math

import numpy as np
import pytest

from costmodels.errors import UserError
from policies import build_policy
from sim.engine import Simulation
from sim.engine.speculative import Speculation, SpeculativeConfig, expected_tokens_per_step, speculative_config
from sim.kv.paged import KVCacheManager
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict
from tests.helpers import TokenCost, make_requests
from tests.kv_invariants import instrument

# A verify pass of c tokens is priced as a c-token chunk: 1 + 0.25 c; a plain decode step costs 1 + 0.5.
COST = dict(per_prefill_token=0.25, decode_step=0.5, per_batch=1.0)


class SumsTokenCost(TokenCost):
    """TokenCost priced from a batch's sums as well (accepts_decode_sums), so steady verify steps skip the
    scheduler (sim/engine/specstretch.py): the same floats as batch_time, operation for operation."""

    def accepts_decode_sums(self):
        return True

    def time_from_sums(self, n_tokens, n_prefill, sum_c2, sum_ck, sum_k_prefill, n_decode, kv_read):
        if n_tokens <= 0:
            return 0.0
        return (self.per_batch + self.per_prefill_token * (n_tokens - n_decode)
                + (self.decode_step if n_decode else 0.0)) + 0.0


def _run(specs, spec_cfg=None, policy="vllm-v1", M=100, block_size=1, fast_forward=False, keep=True, cost=TokenCost):
    cm = cost(**COST)
    spec = None if spec_cfg is None else Speculation(SpeculativeConfig(**spec_cfg), cm, seed=0)
    sim = Simulation(make_requests(specs), build_policy({"name": policy}), cm, KVCacheManager(M, block_size),
                     fast_forward=fast_forward, keep_token_times=keep, speculation=spec)
    seen = instrument(sim)            # KV accounting checked after every schedule and commit
    res = sim.run()
    assert seen["steps"] > 0
    return sim, res


def _times(sim, rid=0):
    return [r for r in sim.all_requests if r.id == rid][0].token_times


# The hand-worked cases hold on both loops: the plain one (TokenCost) and, with a sums-priced cost model and the
# fast paths on, steady verify steps taken without the scheduler (the first verify step is scheduled, the rest
# of the request's steps are steady).
BOTH = pytest.mark.parametrize("fast", [False, True], ids=["plain", "steady-steps"])


def _loop(fast):
    return dict(fast_forward=True, cost=SumsTokenCost) if fast else {}


@BOTH
def test_acceptance_one_gives_k_plus_one_tokens_per_step(fast):
    sim, res = _run([(8, 9)], dict(method="ngram", k=3, acceptance_rate=1.0), **_loop(fast))
    # both verify passes skip the scheduler (the first starts right after the prefill step admitted the prompt);
    # the first, with 8 tokens left, is a uniform step (every request verifies all k drafts: sim/engine/specwalk.py)
    assert sim.fast_forward_iterations == (2 if fast else 0)
    assert sim.spec_walked_iterations == (1 if fast else 0)
    # prefill 8 tokens: 1 + 2 = 3 s (token 1); two verify passes of 1 + 3 tokens: 2 s each, 4 tokens each
    assert _times(sim) == [3.0] + [5.0] * 4 + [7.0] * 4
    row = res.requests.iloc[0]
    assert row["generated_tokens"] == 9 and row["completion_s"] == 7.0
    assert row["tpot_s"] == pytest.approx((7.0 - 3.0) / 8)
    s = res.summary
    assert (s["spec_steps"], s["spec_drafts_proposed"], s["spec_drafts_accepted"]) == (2, 6, 6)
    assert s["spec_tokens_per_step"] == 4.0 and s["spec_freed_blocks"] == 0


@BOTH
def test_acceptance_zero_gives_one_token_per_step_at_a_higher_cost(fast):
    sim, res = _run([(8, 9)], dict(method="ngram", k=3, acceptance_rate=0.0), **_loop(fast))
    assert sim.fast_forward_iterations == (8 if fast else 0)    # 8 decode steps, none scheduled
    assert sim.spec_walked_iterations == (4 if fast else 0)     # remaining 8..5: 1 + 3 tokens, uniform
    # remaining 8..4: 1 + 3 drafts (2 s); remaining 3: 1 + 2 (1.75 s); 2: 1 + 1 (1.5 s); 1: a plain decode (1.5 s)
    expected = [3.0]
    for dt in (2.0, 2.0, 2.0, 2.0, 2.0, 1.75, 1.5, 1.5):
        expected.append(expected[-1] + dt)
    assert _times(sim) == expected
    plain_sim, plain = _run([(8, 9)])
    assert _times(plain_sim) == [3.0 + 1.5 * i for i in range(9)]       # without speculation: 15 s
    assert res.requests["completion_s"][0] > plain.requests["completion_s"][0]
    s = res.summary
    assert s["spec_steps"] == 7 and s["spec_drafts_accepted"] == 0 and s["spec_tokens_per_step"] == 1.0
    assert s["spec_freed_blocks"] == 3 * 5 + 2 + 1       # block size 1: every rejected draft's slot goes back


@BOTH
def test_known_acceptance_sequence_gives_exact_times_and_kv(fast):
    cfg = dict(method="ngram", k=3, acceptance_rate=0.5, accepted={0: [2, 0, 3]})
    cm = (SumsTokenCost if fast else TokenCost)(**COST)
    req = make_requests([(8, 9)])
    mem = KVCacheManager(100, 1)
    sim = Simulation(req, build_policy({"name": "vllm-v1"}), cm, mem, fast_forward=fast, keep_token_times=True,
                     speculation=Speculation(SpeculativeConfig(**cfg), cm, seed=0))
    held = []

    class Rows(list):                              # each step's row is appended after its commit, on both loops
        def append(self, row):
            held.append((req[0].cached, req[0].blocks, mem.free_blocks))
            super().append(row)
    sim.iter_rows = Rows()
    res = sim.run()
    if fast:
        assert sim.fast_forward_iterations == 3    # steps 2-4: the verify passes after the prefill step
        assert sim.spec_walked_iterations == 0     # the list's entries are not drawn by uniform steps
    # step 2: 4 slots reserved (12), 2 accepted + 1 -> 11 kept; step 3: 15 reserved, 0 accepted -> 12; step 4: done
    assert held[:3] == [(8, 8, 92), (11, 11, 89), (12, 12, 88)]
    assert held[3][2] == 100                       # completion frees everything
    assert req[0].token_times == [3.0, 5.0, 5.0, 5.0, 7.0, 9.0, 9.0, 9.0, 9.0]
    s = res.summary
    assert (s["spec_steps"], s["spec_drafts_proposed"], s["spec_drafts_accepted"], s["spec_freed_blocks"]) == \
        (3, 9, 5, 1 + 3)


@BOTH
def test_uniform_steps_in_a_window_give_the_hand_worked_times_and_kv(fast):
    """Block size 16: the uniform steps (8 tokens left or more: every pass verifies all 3 drafts) are worked out a
    window at a time (sim/engine/specwalk.py); the times, KV and counters are the step-by-step ones."""
    cfg = dict(method="ngram", k=3, acceptance_rate=1.0)
    sim, res = _run([(8, 41)], cfg, block_size=16, **_loop(fast))
    # prefill 8 tokens: 3 s (token 1); then 10 verify passes of 1 + 3 tokens, 2 s each, 4 tokens each
    assert _times(sim) == [3.0] + [t for i in range(1, 11) for t in [3.0 + 2.0 * i] * 4]
    if fast:
        assert sim.fast_forward_iterations == 10             # every verify pass skips the scheduler
        # 40..8 tokens left: uniform steps; 4 left: its last pass, which completes it, ends the window (a lone
        # replica with nothing queued)
        assert sim.spec_window_iterations == sim.spec_walked_iterations == 10
    s = res.summary
    assert (s["spec_steps"], s["spec_drafts_proposed"], s["spec_drafts_accepted"]) == (10, 30, 30)
    assert s["spec_freed_blocks"] == 0                       # every draft kept: nothing reserved goes back


def test_a_window_trims_rejected_drafts_at_block_boundaries_as_the_plain_loop():
    """Acceptance 0: each pass reserves 4 slots and keeps 1, so near every block boundary the block past it is
    reserved and given back step after step until the kept tokens cross it; the window finds those steps by
    bisection. KV per step (after each commit), each trim (its clock, request, tokens kept, blocks held: a prefix
    cache stamps the freed blocks with the clock) and the freed-block count equal the plain loop's."""
    cfg = dict(method="ngram", k=3, acceptance_rate=0.0)
    seen = []
    for fast in (False, True):
        cm = (SumsTokenCost if fast else TokenCost)(**COST)
        req = make_requests([(8, 60), (30, 45)])
        mem = KVCacheManager(200, 16)
        trims, inner, inner_many = [], mem.trim, mem.release_tails

        def trim(r, tokens, mem=mem, trims=trims, inner=inner):
            trims.append((mem.clock, r.id, tokens, r.blocks))
            return inner(r, tokens)

        def release_tails(freed, tails, trims=trims, inner=inner_many):     # a window's trims, given at once
            listed = tails()
            trims.extend((when, r.id, tokens, held) for when, r, held, tokens in listed)
            assert freed == sum(held + (-tokens // 16) for _, _, held, tokens in listed)
            return inner(freed, tails)
        mem.trim, mem.release_tails = trim, release_tails
        sim = Simulation(req, build_policy({"name": "vllm-v1"}), cm, mem, fast_forward=fast, keep_token_times=True,
                         speculation=Speculation(SpeculativeConfig(**cfg), cm, seed=0))
        res = sim.run()
        seen.append((res.iterations[["start_s", "kv_alloc_tokens"]].values.tolist(), res.summary["spec_freed_blocks"],
                     [r.token_times for r in sim.all_requests], [t for t in trims if t[3] > -(-t[2] // 16)]))
        if fast:
            assert sim.spec_window_iterations > 20
    assert seen[0] == seen[1]
    assert seen[1][1] > 0


def test_a_window_runs_on_to_a_completion_and_takes_the_step_that_delivers_an_arrival():
    """A lone replica with nothing queued: a window takes the short request's last verify pass (2 tokens left: one
    draft, priced from the step's sums) and its completion, then the long one's steps up to the one during which
    the third request arrives; token times, iterations and counters are the plain loop's."""
    cfg = dict(method="ngram", k=3, acceptance_rate=1.0)
    runs = []
    for fast in (False, True):
        cm = (SumsTokenCost if fast else TokenCost)(**COST)
        sim = Simulation(make_requests([(8, 11, 0.0), (8, 41, 0.0), (8, 5, 20.0)]), build_policy({"name": "vllm-v1"}),
                         cm, KVCacheManager(400, 16), fast_forward=fast, keep_token_times=True,
                         speculation=Speculation(SpeculativeConfig(**cfg), cm, seed=0))
        runs.append((sim, sim.run()))
    (plain, a), (fast, b) = runs
    assert a.iterations.equals(b.iterations) and a.requests.equals(b.requests) and a.summary == b.summary
    assert [r.token_times for r in plain.all_requests] == [r.token_times for r in fast.all_requests]
    # prefill 5 s; 2 x 4-token passes at 3 s; the last: 4 + 2 tokens, 2.5 s (request 0 done); then 2 s each
    assert _times(fast)[-1] == 13.5
    starts = b.iterations["start_s"].tolist()
    assert starts[:9] == [0.0, 5.0, 8.0, 11.0, 13.5, 15.5, 17.5, 19.5, 21.5]     # 19.5 - 21.5: request 2 arrives
    assert fast.spec_window_iterations >= 7          # 5.0 - 13.5 and 13.5 - 21.5: two windows


def test_deferred_token_times_are_written_out_in_order():
    """A window leaves a request's token times as runs (Request.spans: at, step ends, tokens per step) placed before
    token_times[at]; finalizing writes them out among the times appended one by one, then the tail, with the TBT
    statistics of the written-out list."""
    from sim.engine.request import Request
    from sim.metrics import finalize_many, finalize_request, settle_spans
    want = [1.0, 3.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.5, 6.0, 7.0, 8.0, 8.0]

    def spanned(i):
        r = Request(i, 0.0, 1, 13)
        r.token_times = [1.0, 5.5, 6.0]
        # two runs before 5.5 (the second window's counts run past its one step), one after 6.0
        r.spans = [(1, [3.0, 4.0], [2, 1]), (1, [5.0], [3, 4]), (3, [7.0, 8.0], [1, 2])]
        return r
    r = spanned(0)
    settle_spans([r])
    assert r.token_times == want and r.spans is None
    plain = Request(1, 0.0, 1, 13)
    plain.token_times = want[:5]
    finalize_request(plain, True, np.array(want[5:] + [9.0]))
    one = spanned(2)
    finalize_request(one, True, np.array([9.0]))
    assert one.token_times == want + [9.0] and one.tbt == plain.tbt
    # batched: spanned requests among plain ones, equal token counts reduced together
    items = [(spanned(3), np.array([9.0])), (Request(4, 0.0, 1, 13), np.array(want + [9.0])), (spanned(5), ())]
    finalize_many(items, True)
    assert [r.token_times for r, _ in items] == [want + [9.0], want + [9.0], want]
    assert items[0][0].tbt == items[1][0].tbt == plain.tbt and items[2][0].spans is None


def test_a_run_cut_short_keeps_the_token_times_windows_deferred():
    """max_iterations stops a run with requests mid-decode: their token times, part of them deferred by windows,
    are the plain loop's (written out when the result is built)."""
    cfg = dict(method="ngram", k=3, acceptance_rate=0.7)
    runs = []
    for fast in (False, True):
        cm = (SumsTokenCost if fast else TokenCost)(**COST)
        sim = Simulation(make_requests([(8, 300), (20, 400)]), build_policy({"name": "vllm-v1"}), cm,
                         KVCacheManager(2000, 16), fast_forward=fast, max_iterations=60,
                         speculation=Speculation(SpeculativeConfig(**cfg), cm, seed=0))
        res = sim.run()
        runs.append(([r.token_times for r in sim.all_requests], res.requests))
        if fast:
            assert sim.spec_window_iterations > 30 and not any(r.completion_s for r in sim.all_requests)
    assert runs[0][0] == runs[1][0] and len(runs[0][0][0]) > 60
    assert runs[0][1].equals(runs[1][1])


def test_more_draws_keeps_the_generators_stream():
    """Draws read ahead by a window (a block put behind those left) come in the order refill() gives them."""
    cm = TokenCost(**COST)
    a = Speculation(SpeculativeConfig(method="ngram", k=3, acceptance_rate=0.6), cm, seed=5)
    b = Speculation(SpeculativeConfig(method="ngram", k=3, acceptance_rate=0.6), cm, seed=5)
    first = [a.draw(0, 100) for _ in range(4000)]
    assert [b.draw(0, 100) for _ in range(4000)] == first
    b.more_draws()                                     # 96 left + a block behind them
    b.more_draws()
    assert [a.draw(0, 100) for _ in range(9000)] == [b.draw(0, 100) for _ in range(9000)]


def test_next_order_is_the_running_order_only_when_the_next_schedule_is_known():
    from sim.engine.specstretch import next_order
    reqs = make_requests([(8, 20), (8, 3), (8, 9)])
    for r in reqs:                                          # after their prefill step: its token made
        r.cached, r.generated = 9, 1
    view = type("V", (), {})()
    view.running, view.waiting, view.swapped, view.cohort = list(reqs), [], [], None
    pol = build_policy({"name": "vllm-v1"})
    assert next_order(pol, view, 3) == reqs
    view.waiting = [make_requests([(5, 5)])[0]]
    assert next_order(pol, view, 3) is None                # a queued request may be admitted
    view.waiting = []
    reqs[1].generated = 0                                   # no token yet (a P/D decode side): no drafts to verify
    assert next_order(pol, view, 3) is None
    reqs[1].generated = 1
    pol.C = 4 + 2 + 4 - 1                                   # the verify passes no longer fit the budget
    assert next_order(pol, view, 3) is None
    assert next_order(build_policy({"name": "vllm-v0"}), view, 3) is None    # vLLM v0: not known here


def test_head_draft_cost_is_its_fraction_of_the_target_passes():
    cfg = dict(method="eagle", k=2, acceptance_rate=1.0, draft_fraction=0.1)
    sim, res = _run([(8, 7)], cfg)
    # every pass of the head costs 0.1 of the target's GPU time for the same shape (TokenCost has no CPU part):
    # prefill step: head over the 8-token chunk 0.1 * 3.0; verify steps: head over the decode (1.5) twice
    t1 = 3.0 + 0.1 * 3.0
    t2 = t1 + 1.75 + 0.1 * (1.5 + 1.5)
    t3 = t2 + 1.75 + 0.1 * (1.5 + 1.5)
    assert _times(sim) == pytest.approx([t1] + [t2] * 3 + [t3] * 3)
    assert res.summary["spec_draft_time_s"] == pytest.approx(0.1 * 3.0 + 2 * 0.1 * 3.0)


def _scenario(**over):
    raw = {"name": "spec", "seed": 3, "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
           "costmodel": {"kind": "roofline"}, "memory": {"M": 6000, "block_size": 16},
           "policy": {"name": "vllm-v1"},
           "workload": {"kind": "poisson", "num_requests": 60, "rate": 20, "prompt": {"dist": "uniform", "low": 50,
                                                                                      "high": 400},
                        "output": {"dist": "uniform", "low": 2, "high": 300}},
           "speculative": {"method": "eagle", "k": 4, "acceptance_rate": 0.6}}
    for k, v in over.items():
        raw[k] = v
    return scenario_from_dict(raw)


@pytest.mark.parametrize("policy", ["vllm-v1", "sarathi"])
def test_exact_outputs_kv_within_m_nothing_lost(policy):
    scn = _scenario(policy={"name": policy})
    sim = build_simulation(scn)
    instrument(sim)
    res = sim.run()
    req = res.requests
    assert (req["status"] == "done").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert res.iterations["kv_alloc_tokens"].max() <= sim.memory.capacity_tokens
    assert res.summary["spec_steps"] > 0 and res.summary["spec_drafts_accepted"] > 0
    assert res.summary["evictions"] > 0           # M is tight: drafts' KV takes part in preemption


def test_same_seed_same_tables_and_both_loops_agree():
    a = build_simulation(_scenario()).run()
    b = build_simulation(_scenario()).run()
    assert a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
    scn = _scenario(sim={"fast_forward": False})                 # the SimPy loop
    c = build_simulation(scn).run()
    assert a.requests.equals(c.requests) and a.iterations.equals(c.iterations)
    d = build_simulation(_scenario(seed=4)).run()
    assert not a.requests["completion_s"].equals(d.requests["completion_s"])


def test_mean_tokens_per_full_step_follows_the_geometric_law():
    a, k = 0.6, 4
    scn = _scenario(memory={"M": 200000}, workload={"kind": "offline", "num_requests": 200, "prompt": 64,
                                                    "output": 200},
                    speculative={"method": "ngram", "k": k, "acceptance_rate": a})
    res = build_simulation(scn).run()
    n = res.summary["spec_full_steps"]
    p = [a ** i * (1 - a) for i in range(k)] + [a ** k]           # P(tokens = i + 1)
    mean = sum((i + 1) * q for i, q in enumerate(p))
    var = sum((i + 1 - mean) ** 2 * q for i, q in enumerate(p))
    assert mean == pytest.approx(expected_tokens_per_step(a, k))
    assert n > 5000
    assert abs(res.summary["spec_full_tokens_per_step"] - mean) < 4 * math.sqrt(var / n)


def test_speculation_off_leaves_a_run_unchanged():
    base = _scenario(speculative={})
    a = build_simulation(base).run()
    assert "spec_steps" not in a.summary
    assert base.to_dict().get("speculative") is None               # sweep identities as before


@pytest.mark.parametrize("section, fragment", [
    ({"k": 3, "acceptance_rate": 1.5}, "acceptance_rate: must be in [0, 1]"),
    ({"k": 0, "acceptance_rate": 0.5}, "k: must be an integer >= 1"),
    ({"k": 2}, "acceptance_rate: required"),
    ({"method": "medusa", "k": 2, "acceptance_rate": 0.5}, "method: 'medusa' is not allowed"),
    ({"method": "draft_model", "k": 2, "acceptance_rate": 0.5}, "draft_model: method draft_model needs"),
    ({"k": 2, "acceptance_rate": 0.5, "accepted": {0: [3]}}, "accepted.0: must be a list of integers in [0, k = 2]"),
    ({"k": 2, "acceptance_rate": 0.5, "rate": 1}, "unknown key(s) rate"),
])
def test_bad_speculative_sections_are_one_clear_line(section, fragment):
    with pytest.raises(UserError) as e:
        speculative_config(section)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_policy_that_does_not_schedule_drafts_is_refused():
    with pytest.raises(UserError, match="does not schedule draft tokens; allowed: .*vllm-v1"):
        build_simulation(_scenario(policy={"name": "vllm-v0"}))


def test_draft_model_is_priced_from_the_catalog():
    scn = _scenario(memory={"M": 200000}, speculative={"method": "draft_model", "draft_model": "tiny-llama", "k": 3,
                                                       "acceptance_rate": 0.8})
    res = build_simulation(scn).run()
    assert res.summary["spec_draft_time_s"] > 0
    assert np.isfinite(res.summary["makespan_s"])


def test_a_derived_m_leaves_room_for_the_drafter():
    from costmodels import get_model
    raw = {"name": "m", "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "h100-sxm"},
           "policy": {"name": "vllm-v1"}, "workload": {"kind": "offline", "num_requests": 1, "prompt": 8, "output": 2}}
    plain = build_simulation(scenario_from_dict(raw)).memory_breakdown
    head = build_simulation(scenario_from_dict({**raw, "speculative": {"k": 2, "acceptance_rate": 0.5}}))
    draft = build_simulation(scenario_from_dict({**raw, "speculative": {
        "method": "draft_model", "draft_model": "tiny-llama", "k": 2, "acceptance_rate": 0.5}}))
    target = get_model("llama-3.1-8b")
    # EAGLE head: one decoder layer's weights out of the KV space, one layer's KV in each token's slot
    h = head.memory_breakdown
    assert h.kv_bytes_per_token == pytest.approx(plain.kv_bytes_per_token * (1 + 1 / target.layers))
    assert h.kv_tokens == int((plain.kv_bytes - target.weight_bytes() / target.layers) // h.kv_bytes_per_token)
    tiny = get_model("tiny-llama")
    d = draft.memory_breakdown
    assert d.kv_tokens == int((plain.kv_bytes - tiny.weight_bytes()) // (plain.kv_bytes_per_token
                                                                         + tiny.kv_bytes_per_token()))
    assert d.kv_tokens < plain.kv_tokens and h.kv_tokens < plain.kv_tokens
    ngram = build_simulation(scenario_from_dict({**raw, "speculative": {"method": "ngram", "k": 2,
                                                                         "acceptance_rate": 0.5}}))
    assert ngram.memory_breakdown.kv_tokens == plain.kv_tokens


def test_a_cluster_speculates_on_every_replica_and_sums_the_counters():
    from sim.cluster.runner import run_scenario
    scn = _scenario(memory={"M": 200000}, cluster={"replicas": 2, "router": "round_robin"})
    res = run_scenario(scn)
    req = res.requests
    assert (req["status"] == "done").all() and (req["generated_tokens"] == req["output_tokens"]).all()
    s = res.summary
    assert s["spec_steps"] > 0 and s["spec_acceptance"] == s["spec_drafts_accepted"] / s["spec_drafts_proposed"]
    again = run_scenario(_scenario(memory={"M": 200000}, cluster={"replicas": 2, "router": "round_robin"}))
    assert again.requests.equals(res.requests)


def test_an_acceptance_file_gives_the_per_request_lists(tmp_path):
    f = tmp_path / "acc.csv"
    f.write_text("request_id,accepted\n0,2\n0,0\n0,3\n")
    cfg = speculative_config({"method": "ngram", "k": 3, "acceptance_rate": 0.5, "accepted_file": str(f)})
    assert cfg.accepted == {0: [2, 0, 3]}
    f.write_text("request_id,accepted\n0,2\n0,x\n")
    with pytest.raises(UserError, match=r"acc.csv: row 3: expected integer columns request_id and accepted"):
        speculative_config({"k": 3, "acceptance_rate": 0.5, "accepted_file": str(f)})
    f.write_text("request_id,accepted\n0,5\n")
    with pytest.raises(UserError, match=r"accepted.0: must be a list of integers in \[0, k = 3\]"):
        speculative_config({"k": 3, "acceptance_rate": 0.5, "accepted_file": str(f)})
    with pytest.raises(UserError, match="cannot read"):
        speculative_config({"k": 3, "acceptance_rate": 0.5, "accepted_file": str(tmp_path / "none.csv")})


@pytest.mark.parametrize("router", ["round_robin", "least_tokens", "power_of_two"])
def test_a_cluster_takes_steady_verify_steps_with_the_plain_tables(router, monkeypatch):
    """Cluster replicas take steady verify steps too (yielding to the router as the plain loop does): the tables
    of the SimPy-free loop with steady steps equal those of every step scheduled."""
    from sim.cluster.runner import run_scenario
    from sim.engine import specstretch
    steady, inner = [0], specstretch.steady_steps

    def counted(sim, *args):
        before = sim.view.iteration
        now = yield from inner(sim, *args)
        steady[0] += sim.view.iteration - before
        return now
    monkeypatch.setattr(specstretch, "steady_steps", counted)
    runs = [run_scenario(_scenario(memory={"M": 6000, "block_size": 16}, cluster={"replicas": 2, "router": router},
                                   sim={"fast_forward": fast})) for fast in (False, True)]
    assert runs[0].requests.equals(runs[1].requests) and runs[0].iterations.equals(runs[1].iterations)
    assert runs[1].summary["spec_steps"] == runs[0].summary["spec_steps"] > 0
    assert steady[0] > 0.5 * len(runs[1].iterations)       # most steps were steady ones


@pytest.mark.parametrize("n,k", [(1, 1), (8, 3), (64, 4)])
def test_window_prices_are_the_step_by_step_floats(n, k):
    """specwalk's uniform-step prices (a roofline target and drafter worked out a block of Σ contexts at once with
    numpy) equal, float for float, what a step-by-step verify step costs: time_from_sums of n chunks of k + 1
    tokens, plus the drafter's k one-token passes (time_from_sums less its CPU time) summed in order and scaled.
    A change to the roofline's formula that the inlined copy misses fails here."""
    from costmodels import build_costmodel, get_gpu, get_model
    from sim.engine.specwalk import step_price
    cm = build_costmodel({"kind": "roofline", "overheads": {"step_s": 1e-3}}, get_model("llama-3.1-8b"),
                         get_gpu("h100-sxm"))
    scale, k1 = 0.07, k + 1
    price, many = step_price(cm, cm, n, k, scale, {})
    pks = [0, 1, 511, 512, 4096, 123457]
    for pk in pks:
        d = None
        for i in range(1, k1):
            x = cm.time_from_sums(n, 0, 0, 0, 0, n, pk + i * n) - cm.cpu_time(n)
            d = x if d is None else d + x
        d *= scale
        assert price(pk) == (cm.time_from_sums(n * k1, n, n * k1 * k1, k1 * pk, pk, 0, 0) + d, d)
    assert many(pks) == ([price(p)[0] for p in pks], [price(p)[1] for p in pks])
