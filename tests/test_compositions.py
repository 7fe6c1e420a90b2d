"""Hand-worked batch compositions for the presets on tiny workloads (unit batch time, token-granular KV)."""
from tests.helpers import run_recorded

THREE = [(4, 3), (4, 3), (4, 3)]


def test_vllm_prefill_first_no_hybrid():
    res, batches = run_recorded({"name": "vllm", "C": 8, "P": 8}, THREE, M=100)
    assert batches == [[(0, 4), (1, 4)], [(2, 4)], [(0, 1), (1, 1), (2, 1)], [(0, 1), (1, 1), (2, 1)]]
    assert res.summary["makespan_s"] == 4.0


def test_sarathi_decode_first_chunked_hybrid():
    res, batches = run_recorded({"name": "sarathi", "C": 8, "P": 4}, THREE, M=100)
    assert batches == [[(0, 4)], [(0, 1), (1, 3)], [(0, 1), (1, 1), (2, 2)], [(1, 1), (2, 2)],
                       [(1, 1), (2, 1)], [(2, 1)]]
    # R1's first token comes when its last chunk completes (iteration 3), not when the first chunk ran
    assert res.requests.set_index("id").loc[1, "ttft_s"] == 3.0


def test_sarathi_nohy_behaves_like_static_batching():
    _, batches = run_recorded({"name": "sarathi-nohy", "C": 8, "P": 8}, THREE, M=100)
    assert batches == [[(0, 4), (1, 4)], [(0, 1), (1, 1)], [(0, 1), (1, 1)], [(2, 4)], [(2, 1)], [(2, 1)]]


def test_orca_reserves_max_model_len_and_never_preempts():
    res, batches = run_recorded({"name": "orca", "max_model_len": 10}, THREE, M=25)
    assert batches == [[(0, 4), (1, 4)], [(0, 1), (1, 1)], [(0, 1), (1, 1)], [(2, 4)], [(2, 1)], [(2, 1)]]
    assert res.summary["evictions"] == 0
    assert res.iterations["kv_alloc_tokens"].max() == 20   # two requests × max_model_len


def test_vllm_v1_preempts_tail_and_skips_admission_on_that_step():
    res, batches = run_recorded({"name": "vllm-v1", "C": 8, "P": 8}, [(4, 4), (4, 4), (4, 4)], M=12)
    assert batches == [[(0, 4), (1, 4)], [(0, 1), (1, 1)], [(0, 1), (1, 1)],
                       [(0, 1)],                 # R0 needs a slot: R1 (tail) is preempted; no admission this step
                       [(1, 7), (2, 1)],         # R1 refills I0 + 3 generated = 7 tokens, its refill emits token 4
                       [(2, 3)], [(2, 1)], [(2, 1)], [(2, 1)]]
    r = res.requests.set_index("id")
    assert r.loc[1, "evictions"] == 1 and r.loc[1, "evicted_tokens"] == 6
    assert (r["generated_tokens"] == 4).all()


def test_prefill_phase_eviction_keeps_input_size():
    """Evicting a partially chunked prompt loses its progress but not its input size (spec A8)."""
    from sim.engine import ReplicaView
    from sim.kv.paged import KVCacheManager
    from sim.engine.request import Request
    v = ReplicaView(KVCacheManager(100, 1), None)
    r = Request(0, 0.0, 10, 5)
    v.waiting.append(r)
    assert v.admit(r, 10)
    r.cached = 6
    v.kv_cached_tokens = 6
    v.preempt(r)
    assert (r.input_tokens, r.cached, r.blocks, r.evicted_tokens) == (10, 0, 0, 6)
    assert v.waiting[0] is r and v.memory.free_blocks == 100


def test_decode_phase_eviction_appends_generated_tokens():
    from sim.engine import ReplicaView
    from sim.kv.paged import KVCacheManager
    from sim.engine.request import Request
    v = ReplicaView(KVCacheManager(100, 1), None)
    r = Request(0, 0.0, 10, 5)
    v.waiting.append(r)
    v.admit(r, 10)
    r.cached, r.generated = 12, 3     # prompt + 2 decoded tokens cached, 3 tokens generated
    v.preempt(r, front=False)
    assert r.input_tokens == 13 == r.prompt_tokens + r.generated
    assert r.state == "waiting" and r.evictions == 1
