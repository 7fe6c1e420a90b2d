"""Automatic prefix caching (sim/kv/prefix_cache.py): hand-worked hits, the last-token cap, LRU eviction order,
KV ≤ M with cached blocks counted, preempted requests re-hitting their own blocks, the CPU tier, and properties
over random prefix-sharing workloads × every policy (exact tokens, nothing lost, KV ≤ M, fast path == plain)."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from costmodels import get_gpu, get_model
from costmodels.errors import UserError
from costmodels.linear import LinearCostModel, default_profile_path
from policies import POLICIES, build_policy
from sim.engine import Simulation
from sim.engine.request import Request
from sim.kv.paged import KVCacheManager
from sim.kv.prefix_cache import BlockChains, PrefixCachingKVManager
from tests.helpers import TokenCost

_CM = LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"), model=get_model("llama-2-7b"),
                           gpu=get_gpu("a100-80gb"))


def req(i, prompt, out, arrival=0.0, prefix=None):
    return Request(i, arrival, prompt, out, prefix=prefix)


def run(reqs, M=4096, block=16, policy="vllm-v1", fast=True, cost=None, cpu_blocks=0, **knobs):
    mem = PrefixCachingKVManager(M, block, cpu_cache_blocks=cpu_blocks)
    sim = Simulation(reqs, build_policy({"name": policy, **knobs}), cost or TokenCost(per_prefill_token=1e-3),
                     mem, fast_forward=fast)
    return sim, sim.run()


def test_block_identity_depends_on_content_not_on_how_it_was_walked():
    chains = BlockChains(16)
    a = req(0, 100, 1, prefix=((("s", 1), 40), (("q", 7), 60)))
    b = req(1, 100, 1, prefix=((("s", 1), 40), (("q", 7), 60)))
    c = req(2, 100, 1, prefix=((("s", 1), 40), (("q", 8), 60)))
    ids_a = list(chains.chain(a, 6))
    chains.chain(b, 2)                       # walked in two pieces
    ids_b = list(chains.chain(b, 6))
    ids_c = list(chains.chain(c, 6))
    assert ids_a == ids_b
    assert ids_a[:2] == ids_c[:2] and ids_a[2] != ids_c[2]     # block 2 (tokens 32..48) mixes s and q


def test_a_hit_skips_exactly_the_cached_full_blocks():
    shared = ((("sys", 0), 100),)
    first = req(0, 150, 2, 0.0, prefix=shared)
    second = req(1, 180, 2, 10.0, prefix=shared)       # arrives after the first has finished
    sim, res = run([first, second])
    # 100 shared tokens = 6 full blocks of 16 (96 tokens); the 7th block mixes shared and own tokens
    assert res.requests.prefix_hit_tokens.tolist() == [0, 96]
    prefill = res.iterations.prefill_tokens.to_numpy()
    assert prefill[prefill > 0].tolist() == [150, 180 - 96]
    assert res.summary["prefix_hit_rate"] == pytest.approx(6 / ((150 - 1) // 16 + (180 - 1) // 16))


def test_a_fully_cached_prompt_still_computes_its_last_block():
    same = ((("p", 0), 64),)
    a, b = req(0, 64, 1, 0.0, prefix=same), req(1, 64, 1, 5.0, prefix=same)
    _, res = run([a, b])
    # vLLM caps a hit at prompt - 1 tokens, in whole blocks: (64 - 1) // 16 = 3 blocks
    assert res.requests.prefix_hit_tokens.tolist() == [0, 48]


@pytest.mark.parametrize("fast", [True, False])
def test_a_later_turn_hits_the_previous_answer_and_private_blocks_stay_unnamed(fast):
    """Turn 2 repeats turn 1's prompt and answer (("g", 0) names request 0's generated tokens): it hits the blocks
    turn 1 decoded. A finished request's own (private) blocks are never named, since nobody can hit them, on every
    engine path (the plain loop frees a request's KV before it stamps its completion)."""
    sys_ = (("sys", 0), 64)
    turn1 = req(0, 64, 40, 0.0, prefix=(sys_,))
    turn2 = req(1, 64 + 40 + 30, 5, 50.0, prefix=(sys_, (("g", 0), 40)))
    other = req(2, 200, 40, 100.0)                          # no prefix identity at all
    sim, res = run([turn1, turn2, other], fast=fast)
    # turn 1 holds KV for 64 + 39 tokens (its last token has none): 6 full blocks, the system prompt's 4 and two of
    # its answer; turn 2 (134 tokens, same first 104) hits exactly those 6 = 96 tokens
    assert res.requests.prefix_hit_tokens.tolist() == [0, 96, 0]
    mem = sim.memory
    assert mem.generation_refs == {0}
    named_by_2 = len(mem.chains.chain(other, 0))            # nothing was ever named for request 2's content
    assert named_by_2 == 0 and other.chain[3] == 0


def test_requests_without_prefix_identity_never_hit_each_other():
    _, res = run([req(0, 200, 3, 0.0), req(1, 200, 3, 5.0)])
    assert res.requests.prefix_hit_tokens.tolist() == [0, 0]


def test_lru_evicts_the_oldest_freed_first_and_a_requests_tail_before_its_head():
    mem = PrefixCachingKVManager(8 * 4, 4)             # 8 blocks of 4 tokens
    a, b = req(0, 12, 1, prefix=((("a",), 12),)), req(1, 12, 1, prefix=((("b",), 12),))
    for r in (a, b):
        r.state = "waiting"
        assert mem.lookup(r) == 0 and mem.admit(r, 12)
        r.cached = 12
        mem.register(r, 12)
    mem.clock = 1.0
    mem.free(a)                                        # a's blocks queue first: a2, a1, a0
    mem.clock = 2.0
    mem.free(b)                                        # then b2, b1, b0
    c = req(2, 12, 1)                                  # 2 blank blocks + 1 evicted block
    c.state = "waiting"
    assert mem.lookup(c) == 0 and mem.admit(c, 12)
    # 16-token prompts repeating a's and b's 12 tokens could hit (16 - 1) // 4 = 3 blocks
    a2, b2 = req(3, 16, 1, prefix=((("a",), 12),)), req(4, 16, 1, prefix=((("b",), 12),))
    a2.state = b2.state = "waiting"
    assert mem.lookup(a2) == 8          # a's last block went first (the two pristine blocks before it)
    assert mem.lookup(b2) == 12
    assert mem.evicted_blocks == 1


def test_kv_never_exceeds_M_with_cached_blocks_counted():
    rng = np.random.default_rng(3)
    reqs = [req(i, int(rng.integers(20, 200)), int(rng.integers(1, 40)), float(i) * 0.01,
                prefix=((("sys", i % 3), 64),)) for i in range(120)]
    sim, res = run(reqs, M=1024, cost=_CM)
    mem = sim.memory
    assert (res.iterations.kv_alloc_tokens <= res.capacity_tokens).all()
    assert len(mem.ref) <= mem.total_blocks           # every cached identity occupies a block of the pool
    in_use = sum(1 for v in mem.ref.values() if v > 0)
    assert mem.total_blocks - mem.free_blocks >= in_use
    assert res.summary["prefix_hit_rate"] > 0.2


def test_a_preempted_request_rehits_its_own_blocks():
    specs = [(300, 200)] * 6                           # unique prompts: only a request's own blocks can hit
    sim, res = run([req(i, p, o) for i, (p, o) in enumerate(specs)], M=1600, cost=_CM)
    assert res.summary["evictions"] > 0
    assert sim.memory.hit_blocks > 0                   # resumed after recompute preemption, they hit
    without = Simulation([req(i, p, o) for i, (p, o) in enumerate(specs)], build_policy({"name": "vllm-v1"}), _CM,
                         KVCacheManager(1600, 16)).run()
    assert without.summary["evictions"] > 0
    assert res.iterations.prefill_tokens.sum() < without.iterations.prefill_tokens.sum()


def test_cpu_tier_loads_evicted_blocks_back_and_charges_the_transfer():
    shared = ((("doc", 0), 256),)
    first = req(0, 300, 1, 0.0, prefix=shared)
    fillers = [req(1 + i, 300, 1, 1.0 + i) for i in range(3)]    # push the document out of a small GPU pool
    again = req(9, 300, 1, 10.0, prefix=shared)
    sim, res = run([first, *fillers, again], M=320, cpu_blocks=128, cost=_CM)
    mem = sim.memory
    assert mem.evicted_blocks > 0 and mem.cpu_hit_blocks > 0
    assert res.requests.set_index("id").prefix_hit_tokens[9] == 256
    assert res.iterations.swap_in_tokens.sum() == mem.cpu_hit_blocks * 16


def test_scenario_switches_and_bad_input():
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    wl = {"kind": "shared_prefix", "num_groups": 2, "num_prompts_per_group": 3, "system_prompt_len": 64,
          "question_len": 40, "output_len": 8, "stages": [{"rate": 5, "duration": 10}]}
    base = {"policy": {"name": "vllm-v1"}, "memory": {"M": 20000}, "workload": wl}
    on = run_scenario(scenario_from_dict(base))                         # vLLM v1's default: on
    off = run_scenario(scenario_from_dict(base, ["memory.prefix_caching=false"]))
    assert on.summary["prefix_hit_rate"] > 0.8 and "prefix_hit_rate" not in off.summary
    assert off.iterations.prefill_tokens.sum() > 3 * on.iterations.prefill_tokens.sum()
    with pytest.raises(UserError, match="runs on its own KV layout"):
        run_scenario(scenario_from_dict(base, ["policy.name=bros", "memory.prefix_caching=true"]))
    with pytest.raises(UserError, match="host_memory_gib"):
        scenario_from_dict(base, ["memory.cpu_offload_gib=600", "hardware.host_memory_gib=256"])
    with pytest.raises(UserError, match="CPU tier sits behind the prefix cache"):
        run_scenario(scenario_from_dict(base, ["memory.cpu_offload_gib=1", "memory.prefix_caching=false"]))


# -- properties ----------------------------------------------------------------------------------------------
prefix_workloads = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 120), st.integers(1, 200), st.integers(1, 40),
                                      st.floats(0, 3.0)), min_size=1, max_size=20)
PAGED = [n for n in sorted(POLICIES) if build_policy({"name": n}).kv_layout(None, None) is None]


def _simulate(name, specs, M, fast):
    reqs = [req(i, shared + own, out, a, prefix=((("sys", g), shared),) if shared else None)
            for i, (g, shared, own, out, a) in enumerate(specs)]
    sim = Simulation(reqs, build_policy({"name": name}), _CM,
                     PrefixCachingKVManager(M, 16, swap_capacity_tokens=10 * M, cpu_cache_blocks=8),
                     fast_forward=fast)
    return sim.run()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=prefix_workloads, M=st.sampled_from([400, 800, 4000]))
def test_invariants_and_fast_equals_plain_every_paged_policy(specs, M):
    for name in PAGED:
        res = _simulate(name, specs, M, True)
        req_t, it = res.requests, res.iterations
        done = req_t[req_t.status == "done"]
        assert len(req_t) == len(specs)
        assert set(req_t.status) <= {"done", "infeasible"}, name
        assert (done.generated_tokens == done.output_tokens).all(), name
        assert (it.kv_alloc_tokens <= res.capacity_tokens).all(), name
        plain = _simulate(name, specs, M, False)
        pd.testing.assert_frame_equal(res.requests, plain.requests, obj=name)
        pd.testing.assert_frame_equal(res.iterations, plain.iterations, obj=name)
        stats = [k for k in res.summary if k.startswith("prefix_")]     # evictions too: however lazily counted
        assert stats and all(res.summary[k] == plain.summary[k] or res.summary[k] != res.summary[k] for k in stats)


def _queue_pending_one_run_each(mem) -> None:
    """The free queue's catch-up written the plain way: every pending free sorted by (time, request) and queued as
    its own blank run, then its identities; nothing merged, nothing skipped."""
    for _, _, blank, keys in mem._pending_in_order():
        if blank:
            mem._blank -= 1
            mem.runs[mem._blank] = blank
            mem.queue[mem._blank] = None
        for k in keys:
            mem.queue[k] = None
        mem.queued += blank + len(keys)
    mem.pending.clear()
    mem.pending_cached = False


def test_merged_blank_runs_evict_as_one_run_per_free(monkeypatch):
    """The queue keeps adjacent blank blocks as one run and, while no identity is pending, adds the pending blank
    frees (rejected drafts' trims, finished requests' private tails) unsorted. Under eviction, with shared
    prompts whose cached blocks are freed between the trims, the tables, hit rate and evictions equal those of a
    queue that sorts every free and keeps each as its own run; both paths of the catch-up are taken."""
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import load_scenario
    sets = ["policy.name=vllm-v1", "memory.M=9000", "speculative.method=eagle", "speculative.k=3",
            "speculative.acceptance_rate=0.6"]
    path = "examples/sglang-radix.yaml"
    taken = {"mixed": 0, "blank": 0}
    inner = PrefixCachingKVManager._queue_pending

    def counting(mem):
        taken["mixed" if mem.pending_cached else "blank"] += 1
        inner(mem)
    monkeypatch.setattr(PrefixCachingKVManager, "_queue_pending", counting)
    res = run_scenario(load_scenario(path, sets))
    assert taken["mixed"] > 50 and taken["blank"] > 50
    assert res.summary["prefix_evicted_blocks"] > 1000 and res.summary["spec_freed_blocks"] > 1000
    monkeypatch.setattr(PrefixCachingKVManager, "_queue_pending", _queue_pending_one_run_each)
    ref = run_scenario(load_scenario(path, sets))
    assert ref.requests.equals(res.requests) and ref.iterations.equals(res.iterations)
    drop = {"wall_s"}
    assert {k: v for k, v in ref.summary.items() if k not in drop} == {k: v for k, v in res.summary.items()
                                                                       if k not in drop}
