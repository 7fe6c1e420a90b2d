"""EconoServe: memory invariants with lending, padded exact allocation, synced groups, decoupled PT filling, ordering."""
import numpy as np
import pytest

from sim.scenario.config import scenario_from_dict
from sim.engine.request import Request
from sim.scenario.build import build_simulation
from tests.kv_invariants import instrument


def _sim(policy, workload=None, M=12288, requests=None, **mem):
    raw = {"seed": 0, "memory": {"M": M, "block_size": 32, "swap_space_gib": 8, **mem}, "policy": policy,
           "costmodel": {"kind": "linear"},     # the load levels below were chosen on this model
           "workload": workload or {"kind": "econoserve-sharegpt", "num_requests": 150, "rate": 12.0}}
    return build_simulation(scenario_from_dict(raw), requests)


@pytest.mark.parametrize("policy", [
    {"name": "econoserve"},
    {"name": "econoserve", "padding": 0.0, "reserved_frac": 0.01},          # many under-provisioned GTs
    {"name": "econoserve", "pipe_hosted_count": "text", "pipe_buffer_base": "host", "rl_group_granularity": 128},
    {"name": "econoserve-d"},
])
def test_invariants_hold_with_lending_and_stops(policy):
    sim = _sim(policy)
    seen = instrument(sim)
    res = sim.run()
    assert res.summary["completed"] == 150 and seen["steps"] > 100
    st = sim.policy.stats
    if policy.get("padding") == 0.0:
        assert st["reserve_extensions"] + st["offload_free_stops"] > 0
    assert not sim.policy.ledger.by_borrower                    # every loan settled by the end


def test_pipelining_lends_unwritten_kv_and_hosted_gts_finish():
    sim = _sim({"name": "econoserve", "gt_queue_cap_frac": 0.5})
    instrument(sim)
    sim.run()
    st = sim.policy.stats
    assert st["hosted"] > 0 and st["lent_blocks"] > 0
    assert st["hosted_done"] + st["hosted_preempted"] <= st["hosted"]
    assert st["hosted_done"] > st["hosted_preempted"]           # the buffer b makes most guests finish in time


def test_oracle_with_padding_never_under_provisions():
    wl = {"kind": "econoserve-sharegpt", "num_requests": 150, "rate": 12.0, "predictor": {"kind": "oracle"}}
    sim = _sim({"name": "econoserve-sdo", "padding": 0.1}, wl)
    sim.run()
    st = sim.policy.stats
    assert st["reserve_extensions"] == 0 and st["offload_free_stops"] == 0
    # the reservation made at GT admission covers the request's whole remaining output
    alloc = np.array([r.meta.first_alloc for r in sim.requests])
    out = np.array([r.output_tokens for r in sim.requests])
    assert (alloc >= out).all() and (alloc <= np.ceil(out * 1.1) + 1).all()


def test_synced_admits_gt_groups_only_on_group_completion():
    calls = {}
    for name in ("econoserve-sd", "econoserve-d"):
        sim = _sim({"name": name})
        pol = sim.policy
        orig = pol._admit_groups
        n = {"calls": 0, "early": 0, "groups": [], "credited": set()}

        def admit(view, stamp, orig=orig, n=n):
            n["calls"] += 1
            live = [g for g in n["groups"] if g.live > 0]
            done = [g for g in n["groups"] if g.live == 0 and id(g) not in n["credited"]]
            if live and not done:
                n["early"] += 1                                 # admitted while every earlier group still runs
            n["credited"].update(id(g) for g in done)
            got = orig(view, stamp)
            n["groups"].extend(got)
            return got
        pol._admit_groups = admit
        res = sim.run()
        calls[name] = (n, res.summary["iterations"])
    sd, d = calls["econoserve-sd"], calls["econoserve-d"]
    assert sd[0]["early"] == 0
    assert sd[0]["calls"] < 0.5 * sd[1]
    assert d[0]["early"] > 0 and d[0]["calls"] >= d[1] - 1     # unsynced: every iteration


def test_prompts_fill_up_to_tfs_alongside_running_gts():
    # moderate load: KV is not saturated, so waiting prompts may enter every iteration
    sim = _sim({"name": "econoserve", "tfs_tokens": 256},
               {"kind": "econoserve-sharegpt", "num_requests": 150, "rate": 3.0})
    batches = []
    sched = sim.policy.schedule

    def schedule(view):
        waiting = len(view.waiting)
        b = sched(view)
        batches.append((b.num_prefill_tokens, b.num_tokens - b.num_prefill_tokens, waiting))
        return b
    sim.policy.schedule = schedule
    sim.run()
    pre = np.array(batches)
    assert (pre[:, 0] <= 256).all()
    assert (pre[:, :2].sum(1) <= np.maximum(256, pre[:, 1])).all()   # GTs count toward the forward size
    busy = (pre[:, 1] > 0) & (pre[:, 2] > 0)                         # GTs running and prompts waiting
    assert busy.sum() > 20
    assert (pre[busy, 0] > 0).mean() > 0.5                           # decoupling: PTs join those iterations


def test_ordering_serves_shorter_deadline_first():
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(60):
        out = int(rng.choice([20, 600]))
        reqs.append(Request(i, 0.0, 100, out, predicted_output_tokens=out))
    first = {}
    for name in ("econoserve-sdo", "econoserve-sd"):
        fresh = [Request(r.id, 0.0, r.prompt_tokens, r.output_tokens, predicted_output_tokens=r.output_tokens)
                 for r in reqs]
        sim = _sim({"name": name, "tfs_tokens": 200}, requests=fresh, M=8192)
        sim.run()
        short = np.mean([r.first_scheduled_s for r in fresh if r.output_tokens == 20])
        long = np.mean([r.first_scheduled_s for r in fresh if r.output_tokens == 600])
        first[name] = short - long
    assert first["econoserve-sdo"] < 0
    assert first["econoserve-sdo"] < first["econoserve-sd"]


def test_findings_kv_sample_sees_every_tenth_iteration_of_a_cohort_policy():
    # EconoServe's KV-utilization claims sample written KV every 10 iterations from inside schedule(); vLLM and
    # Sarathi run with the decode cohort on the fast path, which skips scheduler calls, so the sample must come
    # from the plain loop (it once saw a fraction of the iterations and understated vLLM's written KV).
    from study.findings.length_aware import econo_scenario, run
    for policy in ("vllm (swap)", "sarathi"):
        out = run(econo_scenario("sharegpt", policy, 8.0, 150))
        assert out["kv_samples"] >= out["iterations"] // 10 > 10
        assert 0 < out["kv_written_util"] <= out["kv_allocated_util"] <= 1
