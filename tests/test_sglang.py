"""SGLang preset: radix-tree eviction (free slots before cached ones, leaves only), LPM with its FCFS fallback,
retraction order and the new-token ratio, and the engine invariants with it on."""
import pytest

from costmodels.errors import UserError
from policies import build_policy
from sim.engine.request import Request
from sim.kv.prefix_cache import PrefixCachingKVManager
from sim.kv.radix import RadixKVManager
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict


def _finish(mem, r, t):
    """r produced all its tokens at t; the engine frees its KV before it stamps the completion."""
    mem.clock = t
    r.cached = r.prompt_tokens
    r.generated = r.output_tokens
    mem.free(r)
    r.completion_s = t


def _hit_after_pressure(cls, b_tokens=7):
    """A (an 8-token shared prompt) finishes, then B (private: one full block and a partial one by default), then
    C needs one block, then D repeats A's prompt."""
    mem = cls(16, block_size=4)                       # 4 blocks
    a = Request(0, 0.0, 8, 1, prefix=(("s", 8),))
    mem.lookup(a)
    assert mem.admit(a, 8)
    mem.register(a, 8)
    _finish(mem, a, 1.0)
    b = Request(1, 0.0, b_tokens, 1)
    mem.lookup(b)
    assert mem.admit(b, b_tokens)
    _finish(mem, b, 2.0)
    c = Request(2, 0.0, 4, 1)
    mem.lookup(c)
    assert mem.admit(c, 4)
    d = Request(3, 0.0, 9, 1, prefix=(("s", 8),))
    return mem.lookup(d), mem


def test_radix_uses_free_slots_before_evicting_cached_blocks():
    # vLLM's free queue hands out A's cached tail block first (it was freed first); SGLang's pool takes B's partial
    # page (a free slot: cache_finished_req frees what is past the last full page) and evicts nothing, so D still
    # finds both of A's blocks.
    vllm_hit, vllm_mem = _hit_after_pressure(PrefixCachingKVManager)
    radix_hit, radix_mem = _hit_after_pressure(RadixKVManager)
    assert (vllm_hit, vllm_mem.evicted_blocks) == (4, 1)
    assert (radix_hit, radix_mem.evicted_blocks) == (8, 0)


def test_a_finished_sequence_stays_in_the_radix_tree_but_not_in_vllms_cache():
    # SGLang inserts a finished request's whole sequence into the tree (cache_finished_req): B's two full private
    # blocks are leaves released at 2.0, after A's, so C's block evicts A's tail (the least recently released leaf).
    # vLLM's manager queues them blank (nobody can hit them): they take no identity and their reuse is no eviction.
    vllm_hit, vllm_mem = _hit_after_pressure(PrefixCachingKVManager, b_tokens=8)
    radix_hit, radix_mem = _hit_after_pressure(RadixKVManager, b_tokens=8)
    assert (radix_hit, radix_mem.evicted_blocks) == (4, 1)
    assert (vllm_hit, vllm_mem.evicted_blocks) == (4, 1)
    assert len(vllm_mem.ref) == 1 and len(radix_mem.ref) == 3     # A's head; A's head and B's two blocks


def test_radix_evicts_the_least_recently_released_leaf_first():
    mem = RadixKVManager(12, block_size=4)            # 3 blocks
    a = Request(0, 0.0, 8, 1, prefix=(("s", 4), ("x", 4)))   # blocks S, X
    b = Request(1, 0.0, 4, 1, prefix=(("t", 4),))             # block T
    for r, t in ((a, 1.0), (b, 2.0)):
        mem.lookup(r)
        assert mem.admit(r, r.prompt_tokens)
        mem.register(r, r.prompt_tokens)
        _finish(mem, r, t)
    s_id, x_id = a.chain[0][:2]
    t_id = b.chain[0][0]
    c = Request(2, 0.0, 4, 1)                         # one fresh block: a cached one must be evicted
    mem.lookup(c)
    assert mem.admit(c, 4)
    mem._settle()
    # leaves X (released at 1.0) and T (2.0): X goes; S, released with X, is inner until X is gone
    assert x_id not in mem.ref and s_id in mem.ref and t_id in mem.ref
    # then S is a leaf released before T: it goes next
    e = Request(3, 0.0, 4, 1)
    mem.lookup(e)
    assert mem.admit(e, 4)
    mem._settle()
    assert s_id not in mem.ref and t_id in mem.ref and mem.evicted_leaves == 2


def _shared(policy, M=20000, **over):
    raw = {"name": "sg", "seed": 0, "model": {"name": "llama-3.1-8b", "max_model_len": 8192},
           "hardware": {"gpu": "h100-sxm"}, "memory": {"M": M},
           "policy": policy if isinstance(policy, dict) else {"name": policy},
           "workload": {"kind": "shared_prefix", "num_groups": 20, "num_prompts_per_group": 15,
                        "system_prompt_len": 1000, "question_len": 200, "output_len": 200,
                        "stages": [{"rate": 60, "duration": 5}]}}
    raw.update(over)
    return scenario_from_dict(raw)


def test_sglang_keeps_every_invariant_and_its_mechanisms_fire():
    sim = build_simulation(_shared("sglang-lpm"))
    assert isinstance(sim.memory, RadixKVManager)
    victims = []
    pol = sim.policy
    retract = pol._retract

    def spy(view, decodes):
        before = {r.id: r.generated for r in decodes}
        retract(view, decodes)
        gone = [r for r in decodes if r.state != "running"]
        kept = [r for r in decodes if r.state == "running"]
        victims.append((gone, kept, before))
        assert min_ratio <= pol.ratio <= 1.0
    min_ratio = pol.min_ratio
    pol._retract = spy
    commit = pol.on_commit

    def check(view, batch, dt):                       # shared blocks count once: no per-request sum here
        commit(view, batch, dt)
        mem = sim.memory
        assert 0 <= mem.free_blocks <= mem.total_blocks
        assert all(r.blocks * mem.block_size >= r.cached for r in view.running)
    pol.on_commit = check
    res = sim.run()
    req = res.requests
    assert (req["status"] == "done").all() and (req["generated_tokens"] == req["output_tokens"]).all()
    assert res.iterations["kv_alloc_tokens"].max() <= sim.memory.capacity_tokens
    s = res.summary
    assert s["policy_sglang_lpm_sorts"] > 0 and s["policy_sglang_lpm_fallbacks"] > 0
    assert s["policy_sglang_retractions"] > 0 and s["radix_evicted_leaves"] > 0
    assert victims
    for gone, kept, before in victims:                # fewest output tokens first (ties: the longest prompt)
        assert gone
        for g in gone:
            for k in kept:
                assert (before[g.id], -g.prompt_tokens) <= (before[k.id], -k.prompt_tokens)
    # the tree is closed: every cached block's parent is cached (no stranded blocks)
    parent = sim.memory.chains.parent
    assert all(parent[i] < 0 or parent[i] in sim.memory.ref for i in sim.memory.ref)


def test_lpm_finds_more_prefix_hits_than_fcfs_under_memory_pressure():
    fcfs = build_simulation(_shared("sglang")).run().summary
    lpm = build_simulation(_shared("sglang-lpm")).run().summary
    assert lpm["prefix_hit_rate"] > fcfs["prefix_hit_rate"]


def test_lpm_with_its_limit_at_zero_is_fcfs():
    a = build_simulation(_shared("sglang")).run()
    b = build_simulation(_shared({"name": "sglang-lpm", "lpm_queue_limit": 0})).run()
    assert a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
    assert b.summary["policy_sglang_lpm_sorts"] == 0


def test_new_token_ratio_decays_to_its_floor_without_retraction():
    pol = build_policy({"name": "sglang"})
    assert pol.ratio == 0.7 and pol.min_ratio == pytest.approx(0.098)
    assert pol.decay == pytest.approx((0.7 - 0.098) / 600)


def test_sglang_runs_speculative_decoding():
    scn = _shared("sglang", M=200000, speculative={"method": "eagle", "k": 2, "acceptance_rate": 0.8})
    res = build_simulation(scn).run()
    assert res.summary["spec_steps"] > 0
    assert (res.requests["generated_tokens"] == res.requests["output_tokens"]).all()


def test_bad_schedule_policy_is_one_line():
    with pytest.raises(UserError, match=r"policy.schedule_policy: 'lifo' is not allowed; allowed: fcfs, lpm"):
        build_policy({"name": "sglang", "schedule_policy": "lifo"})


def test_chunk_size_by_gpu_memory_follows_sglangs_tiers():
    """_handle_gpu_memory_settings (SGLang's arg_groups/memory_hook.py): 2048 below 20 GiB, 4096 below 60, 8192
    below 160, else 16384; 4096 when the GPU is unknown."""
    from policies.sglang import chunk_default
    G = 1024 ** 3
    assert [chunk_default(g * G) for g in (16, 24, 40, 48, 80, 141, 192)] == [2048, 4096, 4096, 4096, 8192, 8192,
                                                                              16384]
    assert chunk_default(None) == 4096


@pytest.mark.parametrize("policy,memory", [("sglang-lpm", {"M": 20000}), ("sglang", {"M": 12000}),
                                           ("sglang", {"M": 20000, "cpu_offload_gib": 0.2}),
                                           ("vllm-v1", {"M": 12000})])
def test_a_chains_cached_run_by_bisection_is_the_scan(policy, memory):
    """The radix cache finds a chain's cached leading blocks by bisection (a cached block's parent is cached);
    every lookup of a run under eviction gives what the block-by-block scan gives. vLLM's manager keeps the scan
    (see the next test for why)."""
    sim = build_simulation(_shared(policy, memory=memory))
    mem = sim.memory
    closed = type(mem).prefix_closed
    assert closed == isinstance(mem, RadixKVManager)
    calls, differ = [0], [0]

    def both(ids, limit):
        n = 0
        while n < limit and ids[n] in mem.ref:
            n += 1
        type(mem).prefix_closed = True
        try:
            bisected = PrefixCachingKVManager._cached_run(mem, ids, limit)
        finally:
            type(mem).prefix_closed = closed
        calls[0] += 1
        differ[0] += bisected != n
        return n

    mem._cached_run = both
    res = sim.run()
    assert (res.requests["status"] == "done").all()
    assert calls[0] > 100 and mem.stats()["prefix_evicted_blocks"] > 0
    if closed:
        assert differ[0] == 0


def test_vllms_free_queue_can_strand_cached_blocks_so_it_scans():
    """Worked by hand on 16 blocks of 4 tokens. r2 holds the chain A, B, C of a 12-token shared prompt; r1 holds A
    only. Both finish at t = 1, r2 first. Frees queue by (time, request id), so r1's blank block and A come first,
    then r2's blank block, C and B. Taking 13 blocks (11 pristine, r1's blank block, A) evicts A and leaves B and C
    cached with nothing before them. A lookup of the chain must then find 0 blocks. A bisection would probe B and C
    and find 3, which is why only the radix cache, which evicts leaves only, may bisect."""
    mem = PrefixCachingKVManager(64, block_size=4)
    assert not mem.prefix_closed and RadixKVManager.prefix_closed
    r2 = Request(2, 0.0, 13, 1, prefix=(("s", 12),))
    mem.lookup(r2)
    assert mem.admit(r2, 13)
    mem.register(r2, 12)
    r1 = Request(1, 0.0, 5, 1, prefix=(("s", 4),))
    assert mem.lookup(r1) == 4
    assert mem.admit(r1, 5)
    assert mem.free_blocks == 11
    _finish(mem, r2, 1.0)
    _finish(mem, r1, 1.0)
    r3 = Request(3, 0.0, 52, 1)
    mem.lookup(r3)
    assert mem.admit(r3, 52)
    r4 = Request(4, 0.0, 13, 1, prefix=(("s", 12),))
    assert mem.lookup(r4) == 0                          # A is gone: no leading block is cached
    a, b, c = r4.chain[0][:3]
    assert a not in mem.ref and b in mem.ref and c in mem.ref
    PrefixCachingKVManager.prefix_closed = True
    try:
        assert mem._cached_run(r4.chain[0], 3) == 3     # what bisecting would wrongly answer here
    finally:
        PrefixCachingKVManager.prefix_closed = False


def _settle_one_heap(mem) -> None:
    """The radix cache's settle written the plain way: every eviction candidate in one heap on (last access, push
    order); the least valid one evicted first. The manager keeps them in a FIFO and a heap instead."""
    import heapq
    for t, _, blank, keys in mem._pending_in_order():
        if blank:                       # a blank run of its own
            mem._blank -= 1
            mem.runs[mem._blank] = blank
            mem.queue[mem._blank] = None
        for k in keys:
            mem.queue[k] = None
            mem.last_access[k] = t
            mem._pushes += 1
            heapq.heappush(mem.heap, (t, mem._pushes, k))
        mem.queued += blank + len(keys)
    mem.pending.clear()
    mem.pending_cached = False
    debt = mem._owed()
    while debt and mem.runs:
        k = next(iter(mem.runs))
        took = min(debt, mem.runs[k])
        debt -= took
        if took == mem.runs[k]:
            del mem.runs[k], mem.queue[k]
        else:
            mem.runs[k] -= took
    while debt:
        t, _, k = heapq.heappop(mem.heap)
        if mem.ref.get(k, 1) or mem.children.get(k) or mem.last_access.get(k) != t:
            continue
        del mem.queue[k], mem.ref[k]
        mem.evicted_blocks += 1
        mem.evicted_leaves += 1
        debt -= 1
        p = mem.chains.parent[k]
        if p >= 0:
            mem.children[p] -= 1
            if not mem.children[p]:
                del mem.children[p]
                if mem.ref.get(p, 1) == 0:
                    mem._pushes += 1
                    heapq.heappush(mem.heap, (mem.last_access[p], mem._pushes, p))


@pytest.mark.parametrize("policy,memory", [("sglang-lpm", {"M": 20000}), ("sglang", {"M": 9000}),
                                           ("sglang", {"M": 20000, "cpu_offload_gib": 0.2})])
def test_radix_eviction_order_is_one_heaps(policy, memory, monkeypatch):
    """The eviction candidates wait in a FIFO (pushed in time order) and a heap (parents that became leaves, with
    their older last access); the least of the two heads goes first. Runs under eviction (over 1,000 leaves each)
    give the same tables, and evict as many leaves, as the one heap the rule describes."""
    sim = build_simulation(_shared(policy, memory=memory))
    mem = sim.memory
    res = sim.run()
    assert mem.evicted_leaves > 1000
    monkeypatch.setattr(RadixKVManager, "_settle", _settle_one_heap)
    ref_sim = build_simulation(_shared(policy, memory=memory))
    ref = ref_sim.run()
    assert ref_sim.memory.evicted_leaves == mem.evicted_leaves
    assert ref.requests.equals(res.requests) and ref.iterations.equals(res.iterations)

