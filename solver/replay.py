"""Schedules in and out of the simulator: record a preset's batches, and replay a fixed schedule through the engine."""
from __future__ import annotations

from policies.base import Batch, Policy
from sim.engine import Simulation
from sim.kv.paged import KVCacheManager
from sim.engine.request import Request
from solver.schedule import InvalidSchedule, Schedule, Step


def make_requests(inst) -> list:
    return [Request(i, inst.arrival[i], inst.prompt[i], inst.output[i]) for i in range(inst.n)]


def token_memory(inst) -> KVCacheManager:
    """InferMax's token-granular KV (spec A5): block size 1, no watermark, no swap space."""
    return KVCacheManager(inst.M, block_size=1, watermark=0.0, swap_capacity_tokens=0)


class RecordingPolicy(Policy):
    """Wraps any policy and writes down each batch it forms (tokens per request, evictions) as a solver Step."""

    name = "recording"

    def __init__(self, inner, requests):
        super().__init__(config=Policy.Config())
        self.inner = inner
        self.requests = requests
        self.steps = []

    def bind(self, view):
        self.inner.bind(view)

    def infeasible_reason(self, req, capacity_tokens, block_size):
        return self.inner.infeasible_reason(req, capacity_tokens, block_size)

    def schedule(self, view):
        before = [r.evictions for r in self.requests]
        batch = self.inner.schedule(view)
        evicted = [r.id for r, b in zip(self.requests, before) if r.evictions > b]
        if batch.reqs or evicted:
            self.steps.append(Step({r.id: int(c) for r, c in zip(batch.reqs, batch.tokens)}, evicted))
        return batch

    def on_commit(self, view, batch, batch_time_s):
        self.inner.on_commit(view, batch, batch_time_s)


class FixedSchedulePolicy(Policy):
    """Runs batch j of a given schedule at iteration j, only through the engine's actions (preempt/admit/reserve),
    so the engine's own memory accounting and request state machine check the schedule."""

    name = "fixed-schedule"

    def __init__(self, schedule: Schedule, C: int = 0):
        super().__init__(config=Policy.Config())
        self.steps = [s for s in schedule.steps if s.tokens or s.evict]
        self.C = C
        self.next = 0
        self.by_id = {}

    def bind(self, view):
        self.next = 0

    def schedule(self, view):
        batch = Batch()
        if self.next >= len(self.steps):
            return batch
        step = self.steps[self.next]
        known = {r.id: r for r in list(view.waiting) + list(view.running)}
        if any(i not in known for i in list(step.tokens) + list(step.evict)):
            return batch                                   # a member has not arrived: the engine idles until it does
        where = f"replay batch {self.next + 1}"
        for i in step.evict:
            r = known[i]
            if not r.on_gpu:
                raise InvalidSchedule(f"{where}: evicts request {i}, which is not running")
            view.preempt(r, mode="recompute", front=True)
        for i, c in step.tokens.items():
            r = known[i]
            is_prefill = r.cached < r.input_tokens
            if is_prefill and r.cached + c > r.input_tokens:
                raise InvalidSchedule(f"{where}: request {i} prefills past its input ({r.cached}+{c} > {r.input_tokens})")
            if not is_prefill and c != 1:
                raise InvalidSchedule(f"{where}: decode request {i} given {c} tokens")
            ok = view.reserve(r, r.cached + c) if r.on_gpu else view.admit(r, r.cached + c)
            if not ok:
                raise InvalidSchedule(f"{where}: request {i} does not fit in KV memory M={view.memory.capacity_tokens}")
            batch.add(r, c, is_prefill)
        if self.C and batch.num_tokens > self.C:
            raise InvalidSchedule(f"{where}: {batch.num_tokens} tokens exceed C = {self.C}")
        self.next += 1
        return batch


def run_policy(inst, policy, record: bool = False):
    """Simulate `policy` on the instance's requests with its cost model; returns (SimResult, Schedule or None)."""
    reqs = make_requests(inst)
    pol = RecordingPolicy(policy, reqs) if record else policy
    sim = Simulation(reqs, pol, inst.costmodel, token_memory(inst), watchdog_iterations=10_000)
    res = sim.run()
    if sim.infeasible:
        raise InvalidSchedule(f"policy {getattr(policy, 'name', '?')}: request(s) "
                              f"{[r.id for r in sim.infeasible]} rejected ({sim.infeasible[0].reason})")
    return res, (Schedule(pol.steps) if record else None)


def replay(inst, schedule: Schedule):
    """Replay a schedule in the simulator; returns the SimResult (requests and iterations tables, summary)."""
    res, _ = run_policy(inst, FixedSchedulePolicy(schedule, inst.options.C))
    return res
