"""Fleet-scale paths give the tables the plain paths give: streamed requests and retired rows, the ledger book's
least-loaded pick, the inline decode step time, and cohort steps applied from a lookahead's walk."""
import math

import numpy as np
import pandas as pd
import pytest

from sim.cluster import cluster as cluster_mod
from sim.cluster.book import LedgerBook
from sim.cluster.cluster import Cluster
from sim.cluster.results import cluster_result
from sim.engine.request import Request
from sim.engine.steptime import DecodeStepTime
from sim.metrics import request_table
from sim.metrics.rowstore import RequestRows
from sim.scenario.build import requests_from_table
from sim.scenario.config import scenario_from_dict
from traces import build_workload

WORKLOAD = {"kind": "poisson", "num_requests": 600, "rate": 40, "prompt": {"dist": "lognormal", "mu": 5.5,
            "sigma": 1.0, "min": 2, "max": 3000}, "output": {"dist": "lognormal", "mu": 4.0, "sigma": 0.9,
                                                               "min": 1, "max": 600}}


def _raw(policy="sarathi", router="least_tokens", replicas=6, M=30000, fast=True, record=True, **sim):
    return {"name": "s", "seed": 5, "memory": {"M": M}, "policy": {"name": policy}, "workload": WORKLOAD,
            "sim": {"fast_forward": fast, "record_iterations": record, **sim},
            "cluster": {"replicas": replicas, "router": router}}


def _tables(raw, requests=None):
    """A cluster run's tables; given `requests` (a list) the cluster neither streams nor retires rows."""
    scn = scenario_from_dict(raw)
    c = Cluster(scn, requests)
    run = c.run()
    res = cluster_result(scn, run, 0.0)
    return c, run, res


def _listed(raw):
    scn = scenario_from_dict(raw)
    return requests_from_table(build_workload(scn.workload, np.random.default_rng(scn.seed)))


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    pd.testing.assert_frame_equal(a.tables["replicas"], b.tables["replicas"], check_exact=True)
    for k, v in a.summary.items():
        if k != "wall_s":
            w = b.summary[k]
            assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), k


@pytest.mark.parametrize("policy,fast,record,router", [
    ("sarathi", True, True, "least_tokens"),       # decode cohort: rows retired at its flushes
    ("sarathi", True, False, "least_requests"),
    ("sarathi", False, True, "least_tokens"),      # plain loop: rows retired one by one at completion
    ("orca", True, True, "power_of_two"),          # no cohort; closed-form stretches retire as they complete
    ("sarathi", True, True, "round_robin"),        # every replica on its own, after routing
])
def test_streamed_requests_and_retired_rows_give_the_listed_run_tables(policy, fast, record, router, monkeypatch):
    monkeypatch.setattr(cluster_mod, "FLUSH", 32)          # flush (and retire) often in a small run
    monkeypatch.setattr(cluster_mod, "MIN_FLUSH", 8)
    raw = _raw(policy, router, fast=fast, record=record)
    scn = scenario_from_dict(raw)
    c = Cluster(scn)
    run = c.run()
    assert c.stream
    streamed = cluster_result(scn, run, 0.0)
    assert all(h.sim.rows is None for h in run.replicas if h.built)   # let go once in the table
    retired = sum(h.sim.rows_retired for h in run.replicas if h.built)
    done = int(streamed.summary["completed"])
    assert retired > done // 2, (retired, done)           # the mechanism fired: most rows left as columns
    # what is still held as objects: at most a flush's worth per replica (nothing is kept for every request)
    held = sum(r is not None for h in run.replicas if h.built for r in h.sim.requests)
    assert held <= done - retired + 1
    c2, _, listed = _tables(raw, _listed(raw))
    assert not c2.stream
    _same(streamed, listed)


def test_a_cut_short_run_keeps_its_unfinished_requests_in_the_table(monkeypatch):
    monkeypatch.setattr(cluster_mod, "FLUSH", 32)
    monkeypatch.setattr(cluster_mod, "MIN_FLUSH", 8)
    raw = _raw(max_iterations=400)
    _, _, streamed = _tables(raw)
    _, _, listed = _tables(raw, _listed(raw))
    assert streamed.summary["truncated"] and (streamed.requests["status"] != "done").sum() > 0
    _same(streamed, listed)


@pytest.mark.parametrize("spill", [256, 2, 1])
def test_retired_rows_are_the_request_objects_rows(monkeypatch, spill):
    """Rows retired to columns (in batches of `spill`: some in the columns, some still waiting) make the table the
    Request objects make: every value, None times and a missing TBT as NaN, the reason "" for none."""
    from sim.metrics import rowstore
    monkeypatch.setattr(rowstore, "SPILL", spill)
    reqs = []
    for i, (out, tbt, reason) in enumerate([(5, (0.01, 0.02, 0.03), None), (1, None, None),
                                            (9, (0.5, 0.25, 1.0), "why"), (3, (1e-9, 2e-9, 3e-9), "")]):
        r = Request(10 - i, 0.1 * i, 40 + i, out, cls="gold" if i % 2 else "default", predicted_output_tokens=out + 1)
        r.state, r.generated, r.tbt, r.reason = "done", out, tbt, reason
        r.first_scheduled_s, r.first_token_s, r.completion_s = 0.2 * i + 0.01, 0.2 * i + 0.05, 0.2 * i + 0.5
        r.evictions, r.swaps, r.evicted_tokens, r.hit_tokens = i, 2 * i, 3 * i, i - 1
        if i == 1:                                # never scheduled: no times
            r.state, r.first_scheduled_s, r.first_token_s, r.completion_s = "infeasible", None, None, None
        reqs.append(r)
    rows = RequestRows()
    for r in reqs[:3]:
        rows.append(r)
    assert len(rows) == 3
    pd.testing.assert_frame_equal(request_table(reqs[3:], rows=rows), request_table(reqs), check_exact=True)


def test_the_book_picks_what_the_router_scan_picks(monkeypatch):
    picks = []
    least = LedgerBook.least

    def checked(self, now):
        i = least(self, now)
        attr = "outstanding_tokens" if self.key == "tokens" else "outstanding_requests"
        loads = [getattr(h, attr) for h in self.handles]
        picks.append(i)
        assert i == loads.index(min(loads)), (i, loads)
        return i

    monkeypatch.setattr(LedgerBook, "least", checked)
    orig = Cluster.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        if self.book is not None:
            self.book.handles = self.front
    monkeypatch.setattr(Cluster, "__init__", init)
    for router in ("least_tokens", "least_requests"):
        for M in (6000, 30000):                          # with and without evictions
            _tables(_raw(router=router, M=M, replicas=5))
    assert len(picks) == 4 * WORKLOAD["num_requests"]


def _linear():
    from sim.scenario.build import build_simulation
    return build_simulation(scenario_from_dict({"name": "x", "costmodel": {"kind": "linear"}}), []).costmodel


@pytest.mark.parametrize("overheads", [None, "vllm"])
def test_the_inline_decode_step_time_is_the_cost_models_float(overheads):
    cm = _linear()
    cm.set_overheads(overheads)
    assert (cm.cpu_time(3) > 0) == (overheads is not None)
    step = DecodeStepTime(cm)
    assert step.inline
    rng = np.random.default_rng(0)
    for n, kv in zip(rng.integers(1, 600, 400).tolist(), rng.integers(1, 3_000_000, 400).tolist()):
        assert step(n, kv) == cm.time_from_sums(n, 0, 0, 0, 0, n, kv)


def test_a_subclass_that_changes_the_sums_is_called_not_inlined():
    cm = _linear()

    class Slower(type(cm)):
        def time_from_sums(self, *a):
            return 2 * super().time_from_sums(*a)
    cm.__class__ = Slower
    step = DecodeStepTime(cm)
    assert not step.inline and step(8, 1000) == cm.time_from_sums(8, 0, 0, 0, 0, 8, 1000)


def test_walked_cohort_steps_are_the_plain_loops(monkeypatch):
    raw = _raw(replicas=4)
    c, run, fast = _tables(raw)
    walked = sum(h.sim.walked_iterations for h in run.replicas if h.built)
    total = sum(h.sim.view.iteration for h in run.replicas if h.built)
    assert walked > total // 4, (walked, total)          # most steady steps come from a walk
    assert c.late_wakes > 0                              # woken by a request at the end of the step it falls in
    _, _, plain = _tables(_raw(replicas=4, fast=False))
    _same(fast, plain)


@pytest.mark.parametrize("router,costmodel", [("least_tokens", "linear"), ("least_tokens", None),
                                               ("round_robin", "linear")])
def test_compacted_end_times_give_the_plain_loops_tables(router, costmodel, monkeypatch):
    """A cohort that never empties drops the end times of steps no live member needs (else one float per step of
    the whole run): with a tiny first array it compacts often, and the tables stay the plain loop's (the linear
    model's step time is inlined, the default's called)."""
    import sim.engine.cohort as cohort_mod
    monkeypatch.setattr(cohort_mod, "ENDS", 4)

    def raw(fast):
        r = _raw(replicas=3, router=router, fast=fast)
        return {**r, "costmodel": {"kind": costmodel}} if costmodel else r
    c, run, fast = _tables(raw(True))
    assert sum(h.sim.cohort.compactions for h in run.replicas if h.built and h.sim.cohort) > 0
    _, _, plain = _tables(raw(False))
    _same(fast, plain)



@pytest.mark.parametrize("M,record", [(4000, False), (4000, True), (30000, False)])
def test_sleeps_on_the_closed_form_bound_give_the_plain_loops_tables(M, record):
    """Under the linear model a sleeping replica wakes at a closed-form bound on its next completion instead of
    walking its steps: the plain loop's tables bit for bit, with KV tight enough for shortfalls and with or
    without the iteration table."""
    def raw(fast):
        return {**_raw(replicas=3, fast=fast, M=M, record=record), "costmodel": {"kind": "linear"}}
    c, run, fast = _tables(raw(True))
    sims = [h.sim for h in run.replicas if h.built]
    assert sum(s.bound_sleeps for s in sims) > 0 and sum(s.walked_iterations for s in sims) == 0
    _, _, plain = _tables(raw(False))
    _same(fast, plain)


@pytest.mark.parametrize("M", [4000, 30000])
def test_the_wake_bound_is_the_walks_end_less_a_hair(M, monkeypatch):
    """The closed-form bound is never after the end the step-by-step walk finds (the next completion, or the start
    of a step short of KV), and where KV is not what stops the walk it is within a microsecond of it."""
    from sim.engine.loop import Simulation
    bound = Simulation._cohort_wake_bound
    seen = []

    def both(self, t, stop, max_steps=4096):
        b = bound(self, t, stop, max_steps)
        cohort = self.cohort
        most = max(cohort.taking) + 2 * sum(cohort.first_block.values())
        done = min(cohort.done_at) - cohort.steps if cohort.done_at else max_steps
        kv_free = not most or self.memory.free_blocks // most >= done
        walk = Simulation._cohort_lookahead(self, t, stop, max_steps)
        self._lookahead = None
        seen.append((b, walk, kv_free and done <= max_steps))
        return b
    monkeypatch.setattr(Simulation, "_cohort_wake_bound", both)
    _tables({**_raw(replicas=3, M=M), "costmodel": {"kind": "linear"}})
    assert len(seen) > 50
    assert all(b <= w for b, w, _ in seen)
    tight = [w - b for b, w, exact in seen if exact and b > 0]
    assert tight and max(tight) < 1e-6


def _frame(rng, n, replica, t_choices):
    """A replica's request table in miniature: the dtypes request_table makes (ints, floats, strings), arrival
    times drawn from a few values so that (arrival_s, id) ties occur across replicas."""
    ids = rng.integers(0, 40, n)
    df = pd.DataFrame({"id": ids, "cls": rng.choice(["a", "bb", "default"], n), "arrival_s": rng.choice(t_choices, n),
                       "e2e_s": np.where(rng.random(n) < 0.2, np.nan, rng.random(n)),
                       "reason": rng.choice(["", "too long"], n)}, copy=False)
    df["replica"] = np.full(n, replica, dtype=np.int64)
    return df


@pytest.mark.parametrize("seed", range(6))
def test_merged_tables_are_the_stable_sort_of_their_concatenation(seed):
    """merge_tables (column by column, pieces let go as it goes) gives what the earlier concat + stable sort by
    (arrival_s, id) gave, ties in replica order included, every dtype kept; the pieces are emptied."""
    from sim.cluster.results import merge_tables
    rng = np.random.default_rng(seed)
    t_choices = rng.random(5)
    parts = [_frame(rng, int(rng.integers(1, 60)), k, t_choices) for k in range(int(rng.integers(1, 7)))]
    want = pd.concat([p.copy() for p in parts], ignore_index=True)
    want = want.sort_values(["arrival_s", "id"], kind="stable").reset_index(drop=True)
    got = merge_tables(parts)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)
    assert parts == []


def test_summary_reads_completed_rows_through_a_mask():
    """summarize's completed-row statistics (makespan, latency percentiles) are those of the completed rows' frame."""
    from sim.metrics.tables import summarize
    _, _, res = _tables(_raw(replicas=3, M=2000))
    req = res.requests
    assert (req["status"] != "done").any() and (req["status"] == "done").any()   # both kinds of rows
    s = summarize(req, pd.DataFrame(), 1000)
    done = req[req["status"] == "done"]
    assert s["makespan_s"] == done["completion_s"].max() - req["arrival_s"].min()
    for col in ("ttft_s", "e2e_s", "tbt_p99_s"):
        v = done[col].dropna().to_numpy()
        assert s[f"{col[:-2]}_p99"] == float(np.percentile(v, 99))
        assert s[f"{col[:-2]}_mean"] == float(v.mean())
