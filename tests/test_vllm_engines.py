"""vLLM v0 (`vllm-v0`, `vllm-v0-chunked`) and v1 (`vllm-v1`) rules, worked by hand on tiny workloads: prefill-only
steps, waiting never preempts, the tail victim, watermark admission, swapped before waiting; v1's running-first
chunking, its budgets per GPU class and the long-prefill cap. Batch time is 1 s per step (tests/helpers.TokenCost)."""
import pytest

from costmodels import get_gpu
from policies import build_policy
from sim.engine import Simulation
from sim.kv.paged import KVCacheManager
from tests.helpers import TokenCost, make_requests, run_recorded


def test_v0_a_step_with_a_prefill_runs_no_decodes():
    # A (4 prompt, 4 out) at t=0; B (4, 2) arrives at 0.5, during A's prefill step [0, 1]
    res, batches = run_recorded({"name": "vllm-v0"}, [(4, 4, 0.0), (4, 2, 0.5)], M=64)
    assert batches[0] == [(0, 4)]
    assert batches[1] == [(1, 4)]                       # B's prefill alone: A's decode waits (generation stall)
    assert batches[2] == [(0, 1), (1, 1)]
    assert res.summary["evictions"] == 0


def test_v0_waiting_never_preempts_and_admission_stops_at_the_first_misfit():
    # M = 12 tokens, block 1, watermark 0: A holds 8 after its prefill; B (6) cannot be admitted, C (2) behind it
    # would fit but FCFS admission stops at B; nobody is preempted for a waiting request.
    res, batches = run_recorded({"name": "vllm-v0", "watermark": 0.0}, [(8, 3, 0.0), (6, 1, 0.5), (2, 1, 0.5)],
                                M=12)
    assert batches[0] == [(0, 8)]
    assert batches[1] == [(0, 1)] and batches[2] == [(0, 1)]     # A decodes; B and C wait
    assert batches[3] == [(1, 6), (2, 2)]               # A finished: both admitted together, B first
    assert res.summary["evictions"] == 0


def test_v0_decode_short_of_a_block_preempts_the_tail_to_the_front_of_waiting():
    # block 4, M = 16 (4 blocks): A and B take 2 blocks each at admission (8-token prompts); the next decode of A
    # needs a 3rd block: the tail (B, admitted last) is preempted by recompute and goes back to the front.
    res, batches = run_recorded({"name": "vllm-v0", "watermark": 0.0}, [(8, 3, 0.0), (8, 3, 0.0)], M=16,
                                block_size=4)
    assert batches[0] == [(0, 8), (1, 8)]
    assert batches[1] == [(0, 1)]                      # B was the tail victim
    r = res.requests.set_index("id")
    assert r.loc[1, "evictions"] == 1 and r.loc[0, "evictions"] == 0
    # B refills its prompt plus the token it had generated (9 tokens) once A is done
    assert [(1, 9)] in batches


def test_v0_watermark_blocks_admission_but_not_growth():
    # 100 blocks of 1 token, watermark 1% = 1 block: a 97-token prompt leaves 3 free blocks: admitted, and its
    # decodes may use the last block; a 100-token prompt fits M but could never be admitted: refused up front.
    pol = build_policy({"name": "vllm-v0"})
    sim = Simulation(make_requests([(97, 3), (100, 1)]), pol, TokenCost(), KVCacheManager(100, 1, watermark=0.01))
    res = sim.run().requests.set_index("id")
    assert res.loc[0, "status"] == "done"
    assert res.loc[1, "status"] == "infeasible" and "watermark" in res.loc[1, "reason"]


def test_v0_swapped_requests_come_back_before_waiting_ones():
    # swap mode: B is swapped out when A grows; C arrives later; when A finishes, B is swapped in and decodes
    # before C's prefill is admitted (no prefill while anything is swapped out).
    pol = {"name": "vllm-v0", "watermark": 0.0, "preemption_mode": "swap"}
    res, batches = run_recorded(pol, [(8, 3, 0.0), (8, 3, 0.0), (4, 1, 1.5)], M=16, block_size=4,
                                swap_capacity_tokens=64)
    r = res.requests.set_index("id")
    assert r.loc[1, "swaps"] == 1 and r.loc[1, "evictions"] == 0
    flat = [ids for ids in batches]
    back = next(i for i, b in enumerate(flat) if (1, 1) in b)           # B's first decode after swap-in
    c_in = next(i for i, b in enumerate(flat) if (2, 4) in b)           # C's prefill
    assert back < c_in


def test_v0_defaults_follow_the_engine():
    p = build_policy({"name": "vllm-v0"})
    assert p.budget == 4096 and p.config.max_num_seqs == 256 and p.watermark_default() == 0.01
    assert build_policy({"name": "vllm-v0-chunked"}).budget == 512


def test_v0_chunked_runs_decodes_first_then_new_prompts_in_the_remaining_budget():
    # budget 8: A decodes (1 token) and B's 10-token prompt takes the remaining 7, then 3
    res, batches = run_recorded({"name": "vllm-v0-chunked", "max_num_batched_tokens": 8, "watermark": 0.0},
                                [(4, 4, 0.0), (10, 1, 0.5)], M=64)
    assert batches[0] == [(0, 4)]
    assert batches[1] == [(0, 1), (1, 7)]
    assert batches[2] == [(0, 1), (1, 3)]


def test_v1_budgets_by_gpu_class_and_long_prefill_cap():
    class CM:
        gpu = get_gpu("h100-sxm")
    p = build_policy({"name": "vllm-v1"})
    p.prepare(CM())
    assert (p.C, p.R_max) == (8192, 1024)
    CM.gpu = get_gpu("a100-80gb")
    p = build_policy({"name": "vllm-v1"})
    p.prepare(CM())
    assert (p.C, p.R_max) == (2048, 256)               # A100 keeps the small defaults (vLLM PR 17885)
    # an explicit budget and a long-prefill threshold of 3: a 10-token prompt goes 3, 3, 3, 1
    res, batches = run_recorded({"name": "vllm-v1", "C": 8, "P": 8, "long_prefill_token_threshold": 3},
                                [(10, 2, 0.0)], M=64)
    assert [b[0][1] for b in batches[:4]] == [3, 3, 3, 1]


def test_v1_preemption_goes_to_the_front_and_waiting_keeps_fcfs():
    # block 4, M = 16: A and B (8-token prompts) fill it; A's decode preempts B (the tail) to the front of the
    # waiting queue. C (2 tokens, arrives at 1.5) would fit A's leftover block, but waiting is FCFS: it stays
    # behind B, whose refill (8 prompt + 1 generated = 9 tokens) fits only when A is done.
    res, batches = run_recorded({"name": "vllm-v1", "C": 64, "P": 64, "prefix_caching": False},
                                [(8, 3, 0.0), (8, 3, 0.0), (2, 1, 1.5)], M=16, block_size=4)
    assert batches[0] == [(0, 8), (1, 8)]
    assert batches[1] == [(0, 1)]                      # B preempted on this step: nobody admitted
    assert batches[2] == [(0, 1)]                      # C blocked behind B
    assert batches[3] == [(1, 9), (2, 2)]
