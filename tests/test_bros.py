"""BROS: bidirectional blocks by hand, run invariants with shared blocks, and the paper's directions."""
import pytest

from sim.kv.bidirectional import BidirectionalKVManager
from sim.metrics.classes import rt_be_summary
from sim.scenario.config import load_scenario
from sim.engine.request import Request
from sim.scenario.build import build_simulation

EX = "examples/bros-rt-be.yaml"


def _req(i, cls):
    return Request(i, 0.0, 4, 4, cls=cls)


def test_rt_fills_left_be_right_and_overwrites_lazily():
    mem = BidirectionalKVManager(8, block_size=4)          # two blocks of four slots
    be, rt = _req(1, "be"), _req(2, "rt")
    assert mem.reserve(be, 6)                               # BE: block 0 full, block 1 holds 2 (right side)
    assert mem.free_blocks == 0 and mem.be_len == [4, 2]
    assert mem.reserve(rt, 2)                               # RT takes the BE block with most empty slots (block 1)
    assert mem.rt_owner[1] == 2 and mem.rt_len[1] == 2 and mem.shared_blocks() == 1
    assert mem.reserve(rt, 3)                               # no empty slot left: overwrite one BE slot → CPU
    assert mem.be_len[1] == 1 and mem.cpu_slots(be) == 1 and mem.checkpointed_slots == 1
    assert mem.held(be) == 6                                # nothing lost: 5 on GPU, 1 on CPU
    mem.check()
    assert not mem.reserve(be, 7)                           # BE cannot take RT slots; the failed try leaves no trace
    assert mem.cpu_slots(be) == 1 and mem.resident[be.id] == 5
    mem.check()
    mem.free(rt)
    assert mem.reserve(be, 7)                               # running again: 1 slot swapped back + 1 new
    assert mem.cpu_slots(be) == 0 and mem.take_swapped_in() == 1 and mem.held(be) == 7
    mem.check()
    mem.free(be)
    assert mem.free_blocks == 2


def test_without_bidirectional_blocks_have_one_owner():
    mem = BidirectionalKVManager(8, block_size=4, bidirectional=False)
    be, rt = _req(1, "be"), _req(2, "rt")
    assert mem.reserve(be, 6)
    assert not mem.reserve(rt, 1)
    mem.check()


def _run(policy, extra=()):
    scn = load_scenario(EX, [f"policy.name={policy}", "workload.rt_requests=80", *extra])
    sim = build_simulation(scn)
    return sim, sim.run()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["bros", "bros-nobi"])
def test_invariants_with_shared_blocks(policy):
    ov = ["memory.M=6000", "workload.rt_rate=3", "workload.rt_requests=60"]
    sim, res = _run(policy, ov)
    mem = sim.memory
    assert res.summary["completed"] == len(sim.requests)
    assert (res.requests["generated_tokens"] == res.requests["output_tokens"]).all()
    assert mem.free_blocks == mem.total_blocks and not mem.resident and not any(mem.cpu.values())
    mem.check()
    if policy == "bros":
        assert mem.checkpointed_slots > 0 and mem.restored_slots > 0    # the mechanism was exercised
    sim2, res2 = _run(policy, ov)
    assert res.requests[["id", "completion_s"]].equals(res2.requests[["id", "completion_s"]])


def test_invariants_checked_every_iteration():
    scn = load_scenario(EX, ["workload.rt_requests=25", "memory.M=5000", "workload.rt_rate=3"])
    sim = build_simulation(scn)
    commit = sim.policy.on_commit
    shared = []

    def check(view, batch, dt):
        sim.memory.check()
        for r in view.running:
            assert sim.memory.held(r) >= r.cached        # every cached token is on the GPU or on the CPU
        shared.append(sim.memory.shared_blocks())
        commit(view, batch, dt)
    sim.policy.on_commit = check
    res = sim.run()
    assert res.summary["completed"] == len(sim.requests) and max(shared) > 0


def test_rt_latency_much_better_than_vllm_with_small_be_loss():
    out = {}
    for p in ("bros", "vllm"):
        sim, _ = _run(p)
        out[p] = rt_be_summary(sim.all_requests)
    b, v = out["bros"], out["vllm"]
    assert b["rt_ttft_attainment"] > v["rt_ttft_attainment"] + 0.3
    assert b["rt_normalized_latency_mean"] < 0.8 * v["rt_normalized_latency_mean"]
    assert b["rt_token_attainment"] > v["rt_token_attainment"]
    assert b["be_throughput_rps"] > 0.7 * v["be_throughput_rps"]


@pytest.mark.slow
def test_bidirectional_blocks_help_under_memory_pressure():
    """Fig. 13 direction: sharing blocks (and checkpointing only the overwritten BE slots) beats recomputing BE
    requests when RT runs short of blocks."""
    ov = ["memory.M=6000", "workload.rt_rate=3", "workload.rt_requests=150"]
    bi = rt_be_summary(_run("bros", ov)[0].all_requests)
    no = rt_be_summary(_run("bros-nobi", ov)[0].all_requests)
    assert bi["rt_normalized_latency_mean"] < no["rt_normalized_latency_mean"]
    assert bi["rt_ttft_attainment"] >= no["rt_ttft_attainment"]


def _state(mem):
    return (list(mem.rt_owner), list(mem.rt_len), list(mem.be_owner), list(mem.be_len), set(mem.free_set),
            dict(mem.resident), dict(mem.cpu), {k: list(v) for k, v in mem.req_blocks.items()})


def test_random_reserve_free_sequences_keep_every_slot():
    """Property: under any sequence of grows and frees, occupancy stays within blocks, no slot of a live
    request is lost (GPU + CPU = what it holds), and a failed reservation changes nothing."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=150, deadline=None)
    @hyp.given(st.booleans(), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9), st.booleans()),
                                       max_size=60))
    def run(bidirectional, ops):
        mem = BidirectionalKVManager(40, block_size=4, bidirectional=bidirectional)
        reqs = [_req(i, "rt" if i % 2 else "be") for i in range(6)]
        want = {}
        for idx, grow, release in ops:
            r = reqs[idx]
            if release:
                mem.free(r)
                want.pop(r.id, None)
                continue
            target = want.get(r.id, 0) + grow
            before = _state(mem)
            if mem.reserve(r, target):
                want[r.id] = target
                assert mem.cpu_slots(r) == 0 and mem.resident.get(r.id, 0) >= target
            else:
                assert _state(mem) == before
            mem.take_swapped_in()
            mem.check()
            for q in reqs:
                assert mem.held(q) >= want.get(q.id, 0)
    run()


def test_the_cost_tally_prices_a_batch_from_its_running_sums():
    """Algorithm 1's probes price `batch + req` from running sums; after members come and go the price is the cost
    model's for the batch's sums worked out by hand (two prefills, one decode, swap-in slots)."""
    from costmodels import get_gpu, get_model
    from costmodels.linear import LinearCostModel, default_profile_path
    from policies.bros import CostTally
    cm = LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"), model=get_model("llama-2-7b"),
                              gpu=get_gpu("a100-80gb"))
    tally = CostTally(cm)
    p1, p2, d = (None, 100, 20, 0, False), (None, 50, 0, 3, False), (None, 1, 300, 2, True)
    tally.add(p1)
    tally.add(d)
    tally.insert(1, p2)
    assert tally.pop(0) == p1 and tally.members == [p2, d]
    # p2 and d: tokens 50 + 1, one prefill (c² 2500, c·k 0, k 0), one decode reading 301, swap-in 3 + 2
    want = cm.time_from_sums(51, 1, 2500, 0, 0, 1, 301) + cm.swap_time(5)
    assert tally.time() == want
    assert tally.time(p1) == cm.time_from_sums(151, 2, 12500, 2000, 20, 1, 301) + cm.swap_time(5)
    assert tally.sums == [51, 1, 2500, 0, 0, 1, 301, 5]      # a probe leaves the tally as it was
