"""The replica loop, schedule → cost → clock → commit: under SimPy (plain), or SimPy-free on the exact fast paths."""
from __future__ import annotations

import bisect
import gc
import math
from contextlib import contextmanager

import numpy as np
import simpy

from costmodels.base import BatchShape
from costmodels.errors import UserError
from sim.engine.arrivals import ArrivalClock, SessionClock
from sim.engine.cohort import FLUSH, DecodeCohort, quiet_steps
from sim.errors import SimulationStuck
from sim.engine.fastforward import FastForward
from sim.engine.itertally import IterationTally
from sim.kv.layouts import build_layout
from sim.kv.paged import KVCacheManager
from sim.metrics import SimResult, finalize_many, finalize_request, settle_spans
from sim.engine.request import DONE, INFEASIBLE, RUNNING
from sim.engine import chunkstep, specstretch, specwalk
from sim.engine.speculative import verify_pass
from sim.engine.steptime import DecodeStepTime
from sim.engine.view import ReplicaView

QUIET_ALL = 1 << 62  # no bound on a run of steady cohort steps but the others
WAIT = None          # what a cluster replica yields when it has nothing to do until the router sends a request


def _used(mem, free_blocks: int) -> int:
    """A memory manager's used_tokens with its free block count at `free_blocks` (one that redefines it)."""
    mem.free_blocks = free_blocks
    return mem.used_tokens


class Until(float):
    """What a cluster replica yields to sleep in a steady decode until this time unless the router sends it a
    request first: nothing its router reads changes before then (sim/cluster/cluster.py wakes it early)."""
    __slots__ = ()


# The per-iteration table's columns; the engine keeps a row tuple per iteration (cheaper than 12 appends).
ITER_COLUMNS = ("start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens", "running", "waiting",
                "kv_alloc_tokens", "kv_cached_tokens", "preemptions", "swap_in_tokens", "swap_out_tokens")


@contextmanager
def _quiet_gc(young: int = 20_000):
    """Garbage collection tuned for the replica loop, which allocates many short-lived objects that form no
    cycles: what exists before the run (requests, modules) is frozen out of full collections, which would
    otherwise walk it again and again for nothing (~10% of a run), and the young generation is collected
    less often. Cycles made during the run are still collected; results do not depend on any of this."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(young, threshold[0]), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Simulation:
    """One replica serving a request stream under one policy and one cost model."""

    def __init__(self, requests, policy, costmodel, memory: KVCacheManager, *, max_iterations: int = 0,
                 watchdog_iterations: int = 200_000, keep_token_times: bool = False, record_iterations: bool = True,
                 fast_forward: bool = True, max_model_len: int = 0, speculation=None, lora=None):
        self.policy = policy
        self.costmodel = costmodel
        policy.prepare(costmodel)
        memory = build_layout(memory, costmodel, policy.kv_layout(memory, costmodel))   # a policy's own KV layout
        self.memory = memory
        self.view = ReplicaView(memory, costmodel)
        # Speculative decoding (sim/engine/speculative.py): decodes verify k drafts per step; every step draws
        # acceptances, so the decode cohort and closed-form stretches are off; steady verify steps skip the
        # scheduler instead (sim/engine/specstretch.py), and the SimPy-free clock stays.
        self.speculation = speculation
        if speculation is not None:
            self.view.spec_tokens = speculation.k
        # Multi-LoRA (sim/engine/lora.py): on the fast paths a steady step's adapters are the running set's, resident
        # and constant between admissions and completions (see _lora_steady).
        self.lora = lora
        self.lora_skips = 0                    # admissions the last schedule() skipped (max_loras); steady: each step
        if lora is not None:
            self.view.lora = lora
            lora.assign(requests)
        per_step = speculation is not None
        self.max_iterations = max_iterations
        self.watchdog_iterations = watchdog_iterations
        self.keep_token_times = keep_token_times
        self.record_iterations = record_iterations
        self.max_model_len = max_model_len
        self.all_requests = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        self.infeasible = []
        self.requests = [r for r in self.all_requests if self._feasible(r)]
        # Closed-loop sessions (sim/engine/sessions.py): a turn arrives when the one before it completes, plus its
        # think time; only first turns are in the arrival stream (on the fast paths a SessionClock keeps the timers).
        self.sessions = None
        if any(r.after is not None for r in self.all_requests):
            from sim.engine.sessions import Sessions
            self.sessions = Sessions(self)
        if hasattr(memory, "bind_requests"):       # prefix caching: which answers later prompts repeat
            memory.bind_requests(self.requests)
        self.completed = 0
        self.arrived = 0
        self.tokens_generated = 0
        self.truncated = False
        self.iter_rows: list = []         # one tuple per iteration, in ITER_COLUMNS order
        self._held: dict = {}             # multi-step window: request -> tokens produced but not yet released
        self._held_done: list = []        # ... and requests whose last token is among them
        self._holding = False
        self.windows_released = 0         # multi-step windows whose held output was released
        self._idle = None
        self.fast_forward = FastForward(self) if fast_forward and not per_step else None
        self.fast_forward_iterations = 0    # iterations advanced in closed form (diagnostics)
        self.walked_iterations = 0          # ... of them, cohort steps applied from a lookahead's walk (diagnostics)
        self.bound_sleeps = 0               # sleeps until a closed-form bound on the next completion (diagnostics)
        self.chunk_steps = 0                # scheduled steps made by chunkstep, not the policy (diagnostics)
        self.tally = None if record_iterations else IterationTally()   # summary totals without the table
        self.exact_fast_paths = fast_forward    # closed-form stretches and the decode cohort (both exact)
        self.spec_steady = specstretch.applies(self)   # steady speculative steps without the scheduler
        self.spec_walk = specwalk.applies(self)        # ... a window of them at a time (sim/engine/specwalk.py)
        self.spec_walked_iterations = 0                # ... of them, uniform steps (diagnostics)
        self.spec_window_iterations = 0                # ... of those, worked out a window at a time
        self.spec_done: list = []       # steady verify steps' completions whose TBT statistics wait (finalize_many)
        self.cohort = None                      # the steady decode cohort, set up by run() where it applies
        self._lookahead = None                  # (state, time) of the last _cohort_lookahead
        self._bound = None                      # (state, time) of the last _cohort_wake_bound
        self._step_time = DecodeStepTime(costmodel)   # a cohort-only step's time (sim/engine/steptime.py)
        self.arrival_clock = None               # the arrivals without SimPy (fast paths), set up by run()
        self.on_complete = None                 # cluster: called with each request as it completes
        self.on_drop = None                     # cluster: called with each request dropped mid-run as infeasible
        self.rows = None                        # RequestRows: finished requests retired to columns (a cluster)
        self.rows_retired = 0                   # ... how many, once released (release_rows)
        self.flush_at = 0                       # ... and the decode cohort's flush size there (0: its default)
        self.hold_kv = False                    # cluster, disaggregated prefill: completions keep their KV ...
        self.held_kv = 0                        # ... these many blocks, until the transfer ends

    def _feasible(self, r, full_length: int = 0) -> bool:
        """Can `r` ever complete here? If not it is marked infeasible (with the reason) and never runs.
        `full_length`: the whole request's prompt + output where `r` is its prefill alone (a P/D prefill replica
        refuses what the decode side would, as the proxy in front of both does)."""
        policy, memory, max_model_len = self.policy, self.memory, self.max_model_len
        if max_model_len and (full_length or r.prompt_tokens + r.output_tokens) > max_model_len:
            # the serving front end refuses it before the engine sees it (vLLM: HTTP 400)
            why = f"prompt + output tokens exceed max_model_len = {max_model_len} (rejected, as vLLM does)"
        else:
            why = policy.infeasible_reason(r, memory.capacity_tokens, memory.block_size)
        if not why and memory.watermark_blocks and (memory.blocks_for(policy.admission_tokens(r))
                                                     > memory.total_blocks - memory.watermark_blocks):
            why = "its admission needs more KV than capacity minus the admission watermark"
        if why:
            r.state, r.reason = INFEASIBLE, why
            self.infeasible.append(r)
            return False
        return True

    def add_request(self, r, full_length: int = 0) -> bool:
        """A cluster's router sends `r` here (in arrival order); False if it can never run on this replica."""
        if self.rows is None:
            self.all_requests.append(r)
        if not self._feasible(r, full_length):
            return False
        r.seq = len(self.requests)
        self.requests.append(r)
        return True

    def retire_rows(self, rows, flush_at: int = 0) -> None:
        """From now on finished requests leave as rows in `rows` (sim/metrics/rowstore.py): a request's slot in
        `requests` is emptied once its row is final, and the tables join the rows with the requests still here.
        Set before any request is added (add_request then keeps no list of every request). `flush_at`: at most
        this many completed decode-cohort members wait for their TBT statistics (and their rows) at once."""
        if self.all_requests:
            raise RuntimeError("retire_rows: set it before requests arrive")
        self.rows = rows
        self.flush_at = flush_at

    def retire(self, reqs) -> None:
        """These finished requests' rows are final: keep them as columns, drop the objects."""
        rows, slots = self.rows, self.requests
        for r in reqs:
            rows.append(r)
            slots[r.seq] = None

    def release_rows(self) -> None:
        """Let the retired rows go once the tables hold them (a cluster's table is built from every replica's:
        holding the columns twice would double its peak memory); how many there were stays in rows_retired."""
        if self.rows is not None:
            self.rows_retired = len(self.rows)
            self.rows = None

    def live_requests(self) -> list:
        """What all_requests holds when rows are retired: the refused, and those not finished (a cut-short run)."""
        return self.infeasible + [r for r in self.requests if r is not None and r.state != INFEASIBLE]

    # -- processes --------------------------------------------------------------------------------------------
    def _arrivals(self, env):
        reqs = self.requests if self.sessions is None else self.sessions.first_turns
        n, i = len(reqs), 0
        while i < n:
            t = reqs[i].arrival_s
            if t > env.now:
                yield env.timeout(t - env.now)
            while i < n and reqs[i].arrival_s <= t:
                self.view.waiting.append(reqs[i])
                i += 1
            self.arrived = i if self.sessions is None else i + self.sessions.released
            if self._idle is not None and not self._idle.triggered:
                self._idle.succeed()

    def _replica(self, env):
        """The replica loop. Under SimPy (the plain loop) every iteration is a timeout; with the exact fast
        paths `env` is None, the ArrivalClock replays the arrivals process, and the loop never yields. In a
        cluster (sim/cluster) the clock is the cluster's: the loop yields the time it must know the router's
        decisions up to before it commits an iteration ending then, or WAIT when it has nothing to do; the
        cluster resumes it once they are known. `total` grows as the router sends requests."""
        view, policy, clock, memory = self.view, self.policy, self.arrival_clock, self.memory
        cluster = clock is not None and clock.cluster
        chunk_rule = chunkstep.rule(policy, view)
        last_progress = 0
        now = 0 if env is None else env.now
        while True:
            total = len(self.requests)
            if self.completed >= total and (not cluster or clock.final):
                return
            view.now = now
            view.iteration += 1
            view.step_preemptions = view.step_swap_in = view.step_swap_out = 0
            view.step_hidden_recompute = 0
            view.step_disk_s = 0.0
            arrived_at_schedule = self.arrived
            view.step_swap_hidden = 0
            memory.clock = now                          # frees are queued by time (sim/kv/prefix_cache.py)
            if self.lora is not None:
                skipped = self.lora.skipped
                batch = policy.schedule(view)
                self.lora_skips = self.lora.skipped - skipped
            elif chunk_rule is not None and (batch := chunkstep.step(chunk_rule, view)) is not None:
                self.chunk_steps += 1                   # the cohort and a prefill chunk, made without schedule()
            else:
                batch = policy.schedule(view)
            if view.looked_up:
                view.end_schedule()
            if not batch.reqs and not batch.cohort and (self._held or self._held_done):
                self._release(now)                      # a multi-step window ended with nothing left to run
                continue
            if not batch.reqs and not batch.cohort:
                if cluster:                             # idle as a lone replica would be, until the next event
                    moved = view.step_swap_out or view.step_preemptions
                    while not (moved or clock.has_next or clock.releases or clock.final):
                        yield WAIT                      # ... which the router has not placed yet
                    if clock.has_next or clock.releases:
                        t = clock.next_event()
                        while not clock.synced(t):
                            # resumed no later than the router's next decision: an arrival it places here
                            # before t (a disaggregated prefill waiting on a KV release) comes first
                            yield min(t, clock.next_decision)
                            t = clock.next_event()
                        now = clock.wake()
                        self.arrived = clock.arrived
                        continue
                    total = len(self.requests)
                    if self.completed >= total:
                        return
                if self.arrived == total and not (view.step_swap_out or view.step_preemptions):
                    if self._drop_grown_past_admission():
                        continue
                    raise SimulationStuck(self._stuck_message("the policy scheduled nothing and no request is due"))
                if self.arrived < total and clock is not None:
                    now = clock.wake()
                    self.arrived = clock.arrived
                elif self.arrived < total:
                    self._idle = env.event()
                    yield self._idle
                    self._idle = None
                    now = env.now
                continue
            dt, prefill_tokens, n_prefill, n_decode = self._batch_time(batch)
            start, now = now, now + dt                  # the float add SimPy's timeout does
            if clock is None:                           # the plain loop: one timeout per iteration
                yield env.timeout(dt)
            else:
                if cluster and not clock.synced(now):   # the router's decisions up to `now` first
                    yield now
                if clock.time <= now:
                    self._deliver(start, now)
            gen_before = self.tokens_generated
            completed_before = self.completed
            spec_full = (self.spec_steady and not n_prefill and n_decode == len(view.running)
                         and specstretch.full_verify_step(batch, self.speculation.k))
            memory.clock = now
            self._commit(batch, now)
            policy.on_commit(view, batch, dt)
            if self.record_iterations:
                self._record(start, dt, len(batch.reqs) + batch.cohort, prefill_tokens, n_decode)
            else:
                self.tally.add(len(batch.reqs) + batch.cohort, len(view.running), self.memory.used_tokens)
            if self.tokens_generated > gen_before:
                last_progress = view.iteration
            elif view.iteration - last_progress > self.watchdog_iterations:
                raise SimulationStuck(self._stuck_message(
                    f"no token generated in {self.watchdog_iterations} iterations (evict/refill livelock?)"))
            if self.max_iterations and view.iteration >= self.max_iterations:
                self.truncated = True
                return
            order = None
            if (self.spec_steady and self.completed == completed_before and self.arrived == arrived_at_schedule
                    and not (view.step_preemptions or view.step_swap_in or view.step_swap_out
                             or view.step_hidden_recompute or view.step_swap_hidden or view.step_disk_s)):
                if spec_full:
                    if policy.steady_decode(view, True):
                        order, full_tokens = list(batch.reqs), batch.num_tokens
                elif (n_prefill and not (view.waiting or view.swapped) and not batch.hold_output
                      and all(r.cached >= r.input_tokens for r in view.running)
                      and policy.steady_decode(view, False)):
                    # the step admitted the last prefill: the next one is all verify passes, in an order known
                    # without scheduling for some policies (nothing queued, so the token count only matters
                    # within the budget, which next_order checks)
                    order = specstretch.next_order(policy, view, self.speculation.k)
                    full_tokens = -1
            if order:
                before = view.iteration             # steps like the next scheduled one, without the scheduler
                now = yield from specstretch.steady_steps(self, now, order, full_tokens)
                if view.iteration > before:          # every such step generated tokens
                    last_progress = view.iteration
                if self.max_iterations and view.iteration >= self.max_iterations:
                    self.truncated = True
                    return
            if self.fast_forward is not None and (self.cohort is None or not view.loose):
                skip = self._skip_steady if self.cohort is None else self._skip_cohort
                full_decode = (not n_prefill and n_decode == len(view.running) and self.completed == completed_before
                               and not (view.step_preemptions or view.step_swap_in or view.step_swap_out))
                before = view.iteration
                now = yield from skip(now, full_decode, arrived_at_schedule)
                if view.iteration > before:          # every skipped iteration generated tokens
                    last_progress = view.iteration
                if self.max_iterations and view.iteration >= self.max_iterations:
                    self.truncated = True
                    return

    def _batch_time(self, batch):
        """The batch's time from the cost model, its prefill tokens, and its prefill and decode request counts."""
        if self.lora is not None:          # the adapters' loads and GEMMs on top of the step
            t, prefill, n_prefill, n_decode = self._base_batch_time(batch)
            return t + self._lora_time(batch), prefill, n_prefill, n_decode
        return self._base_batch_time(batch)

    def _lora_time(self, batch) -> float:
        """The adapters' share of a step: those of the batch's requests and, when the cohort runs, its members'."""
        active = {r.adapter for r in batch.reqs if r.adapter >= 0}
        tokens = sum(c for r, c in zip(batch.reqs, batch.tokens) if r.adapter >= 0)
        if batch.cohort:
            for r in self.view.running:
                if r.cohort is not None and r.adapter >= 0:
                    active.add(r.adapter)
                    tokens += 1
        return self.lora.charge(active, tokens)

    def _lora_steady(self):
        """(adapters, their time per step) for steady decode steps of the whole running set, or None when one of
        its adapters is not resident (a plain step loads it)."""
        active = set()
        tokens = 0
        for r in self.view.running:
            if r.adapter >= 0:
                active.add(r.adapter)
                tokens += 1
        t = self.lora.resident_time(active, tokens)
        return None if t is None else (active, t)

    def _lora_steps(self, steady, k: int, queued: bool) -> None:
        """k steady steps' adapter counters, and the admissions each would have skipped (as the last schedule did:
        with requests queued a steady step sees the same queue and the same running adapters)."""
        self.lora.charge_steps(steady[0], steady[1], k)
        if queued and self.lora_skips:
            self.lora.skipped += self.lora_skips * k

    def _base_batch_time(self, batch):
        view = self.view
        if self.speculation is not None:
            return self._spec_batch_time(batch)
        if self.cohort is not None and not (view.step_swap_in or view.step_swap_out or view.step_hidden_recompute
                                            or view.step_swap_hidden):
            # No memory action to charge and a sums-only model (accepts_decode_sums): the integers the shape's
            # lists would sum to, passed straight to time_from_sums, give the same float.
            n_dec, kv_read = batch.cohort, batch.cohort_context
            n_pre = pt = c2 = ck = pk = 0
            for r, c in zip(batch.reqs, batch.tokens):
                m = r.cached
                if m >= r.input_tokens:
                    n_dec += 1
                    kv_read += m + 1
                else:
                    n_pre += 1
                    pt += c
                    c2 += c * c
                    ck += c * m
                    pk += m
            dt = self.costmodel.time_from_sums(pt + n_dec, n_pre, c2, ck, pk, n_dec, kv_read)
            if not batch.scheduled:        # a multi-step window's later step: the scheduler did not run
                dt -= self.costmodel.cpu_time(n_pre + n_dec)
            return dt, pt, n_pre, n_dec
        return self._shape_batch_time(batch)

    def _shape_batch_time(self, batch):
        """_batch_time through a BatchShape (memory actions, quantized KV, the cohort given in aggregate)."""
        view = self.view
        shape = BatchShape(swap_in_tokens=view.step_swap_in, swap_out_tokens=view.step_swap_out,
                           hidden_recompute_tokens=view.step_hidden_recompute)
        pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
        for r, c in zip(batch.reqs, batch.tokens):
            m = r.cached
            if m >= r.input_tokens:
                dc.append(m + 1)
            else:
                pt.append(c)
                pc.append(m)
        shape.swap_hidden_tokens = view.step_swap_hidden
        shape.cohort_decodes, shape.cohort_decode_context = batch.cohort, batch.cohort_context
        kv_bits = getattr(self.memory, "kv_bits", 16)
        if kv_bits < 16:                   # quantized KV: every cached token read this step is dequantized
            shape.kv_bits = kv_bits
            shape.dequant_tokens = sum(dc) + sum(pc)
        t = self.costmodel.batch_time(shape)
        if not 0.0 <= t < math.inf:        # an extension's cost model: NaN, inf or negative would corrupt the clock
            raise UserError(f"costmodel: {type(self.costmodel).__name__}.batch_time returned {t!r} seconds for a "
                            f"batch of {sum(pt) + sum(dc) + batch.cohort} tokens; it must be a finite number >= 0")
        if not batch.scheduled:            # a multi-step window's later step: the scheduler did not run
            t -= self.costmodel.cpu_time(len(batch.reqs) + batch.cohort)
        if view.step_disk_s:               # prefix blocks read from the disk tier before their PCIe copy
            t += view.step_disk_s
        return t, sum(pt), len(pt), len(dc) + batch.cohort

    def _spec_batch_time(self, batch):
        """_batch_time with speculation: a decode scheduled with 1 + k tokens is a verify pass, priced as a chunk of
        that many tokens at its context; the drafter's passes are added (sim/engine/speculative.py)."""
        view = self.view
        if self.spec_steady and not (view.step_swap_in or view.step_swap_out or view.step_hidden_recompute
                                     or view.step_swap_hidden):
            return self._spec_sums_time(batch)
        shape = BatchShape(swap_in_tokens=view.step_swap_in, swap_out_tokens=view.step_swap_out,
                           hidden_recompute_tokens=view.step_hidden_recompute)
        pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
        prefill = n_prefill = n_decode = 0
        draft_pt, draft_pc, draft_dc = [], [], []
        for r, c in zip(batch.reqs, batch.tokens):
            m = r.cached
            if m < r.input_tokens:
                pt.append(c)
                pc.append(m)
                prefill += c
                n_prefill += 1
                draft_pt.append(c)
                draft_pc.append(m)
            elif c == 1:
                dc.append(m + 1)
                n_decode += 1
            else:                          # a verify pass: the last token and c - 1 drafts
                pt.append(c)
                pc.append(m)
                n_decode += 1
                draft_dc.append(m + 1)
        shape.swap_hidden_tokens = view.step_swap_hidden
        kv_bits = getattr(self.memory, "kv_bits", 16)
        if kv_bits < 16:                   # quantized KV: every cached token read this step is dequantized
            shape.kv_bits = kv_bits
            shape.dequant_tokens = sum(dc) + sum(pc)
        t = self.costmodel.batch_time(shape) + self.speculation.draft_time(draft_pt, draft_pc, draft_dc)
        return t + view.step_disk_s, prefill, n_prefill, n_decode

    def _spec_sums_time(self, batch):
        """_spec_batch_time from the batch's integer sums (fast paths, sums-only target and drafter, no memory
        action): the same floats, as accepts_decode_sums promises; the steady steps price theirs this way."""
        n_pre = pt = c2 = ck = pk = n_dec = kv_read = prefill = n_prefill = 0
        d_pt = d_c2 = d_ck = d_pk = d_dec = d_kv = 0     # the drafter's: prefill chunks, then speculating decodes
        for r, c in zip(batch.reqs, batch.tokens):
            m = r.cached
            if m < r.input_tokens:
                prefill += c
                n_prefill += 1
                d_pt += c
                d_c2 += c * c
                d_ck += c * m
                d_pk += m
            elif c == 1:
                n_dec += 1
                kv_read += m + 1
                continue
            else:                          # a verify pass: the last token and c - 1 drafts
                d_dec += 1
                d_kv += m + 1
            n_pre += 1
            pt += c
            c2 += c * c
            ck += c * m
            pk += m
        t = self.costmodel.time_from_sums(pt + n_dec, n_pre, c2, ck, pk, n_dec, kv_read) + \
            self.speculation.draft_time_sums(d_pt, n_prefill, d_c2, d_ck, d_pk, d_dec, d_kv)
        return t + self.view.step_disk_s, prefill, n_prefill, n_pre - n_prefill + n_dec

    def _deliver(self, start, end):
        """Queue the arrivals due before the replica resumes at `end` (fast paths: the ArrivalClock)."""
        self.arrival_clock.deliver_until(start, end)
        self.arrived = self.arrival_clock.arrived

    def _skip_steady(self, now, full_decode, arrived_at_schedule):
        """Advance whole steady decode stretches in closed form (sim/engine/fastforward.py) until one is not steady;
        returns the replica's clock after them."""
        ff = self.fast_forward
        while self.completed < len(self.requests):
            plan = ff.plan(now, full_decode, arrived_at_schedule)
            if plan is None:
                return now
            arrived_before = self.arrived
            now = float(plan.ends[-1])
            # Applied first: in a cluster whose router reads only its ledgers the stretch may end past the router's
            # next decision, and the ledgers time-stamp what leaves (sim/cluster/ledger.py); a router reading more
            # gets plans that end before its decision (ArrivalClock.commit_limit).
            finished = ff.apply(plan)
            clock = self.arrival_clock
            if clock.cluster and not clock.synced(now):
                yield now
            self._deliver(float(plan.starts[-1]), now)
            self._patch_last_waiting()
            self.fast_forward_iterations += plan.k
            # The stretch is still evidence of a blocked queue unless a request completed or arrived in it.
            full_decode = not finished and self.arrived == arrived_before
            arrived_at_schedule = self.arrived
        return now

    def _skip_cohort(self, now, full_decode, arrived_at_schedule):
        """Run steady steps of the cohort alone, one cheap step at a time without the scheduler, then deliver the
        arrivals due once. Steady as for fast-forward: the policy vouches (steady_decode) that
        every schedule() would take just the running set, which is all cohort; a stretch stops before a step
        that would start at or after the next arrival, before a KV block shortfall, at max_iterations, and,
        with requests queued, after the first completion (freed KV may admit one). Returns the replica's clock."""
        view, cohort, mem, cm = self.view, self.cohort, self.memory, self.costmodel
        clock = self.arrival_clock
        t = now
        while self.completed < len(self.requests):
            if (view.loose or not cohort.n or self.arrived != arrived_at_schedule
                    or not self.policy.steady_decode(view, full_decode)):
                return t
            queued = bool(view.waiting or view.swapped)
            if clock.runs_ahead and not (clock.has_next or clock.releases):
                # A cluster whose router reads only its ledgers: sleep through the steps before the next one that
                # changes them (a completion) or needs the plain loop (a KV shortfall), unless the router's next
                # decision comes after it; the steps are committed when the replica wakes, exactly as below.
                stop = self.max_iterations or math.inf
                if self._step_time.inline and self.lora is None:
                    wake = self._cohort_wake_bound(t, stop)
                else:
                    wake = self._cohort_lookahead(t, stop)
                if wake > clock.time:
                    yield Until(wake)
                    continue
            # The steps below move no request in or out: their per-step counters are zero (the plain loop
            # resets them every iteration; left alone they would repeat the last scheduled step's swaps).
            view.step_preemptions = view.step_swap_in = view.step_swap_out = 0
            view.step_hidden_recompute = view.step_swap_hidden = 0
            arrival = clock.time                      # the next arrival event's exact time (or inf; in a
                                                      # cluster, a bound: no event for this replica before it)
            limit = clock.commit_limit                # a cluster: steps must end before the router next reads
            stop = self.max_iterations or math.inf
            t0 = t
            t, start, finished = self._cohort_steps(t, arrival, limit, stop, queued)
            if t == t0:
                return t
            arrived_before = self.arrived
            if clock.cluster and not clock.synced(t):
                yield t
            self._deliver(start, t)
            view.now = start
            self._patch_last_waiting()
            full_decode = not finished and self.arrived == arrived_before
            arrived_at_schedule = self.arrived
        return t

    def _cohort_steps(self, t: float, arrival: float, limit: float, stop, queued: bool):
        """_skip_cohort's steps: while the cohort has members, each step starting before `arrival`, ending before
        `limit` and within `stop` iterations, one decode token for every member, until KV is short or (with
        requests queued) a member completes. Returns (clock, start of the last step, whether any completed).

        What DecodeCohort.take and .commit, the step's record (or tally) and the engine's counters do per step is
        done here with the state in locals and written back once per run of steps between completions: the
        same integers and floats, in the same order, as a step at a time (a member completes about every 20
        steps on a busy replica, and these steps are most of a cluster's time)."""
        view, cohort, mem = self.view, self.cohort, self.memory
        step_time = self._step_time
        inline = step_time.inline
        record = self.record_iterations
        tally = self.tally
        rows = self.iter_rows
        bs = cohort.block_size
        first_block, done_at = cohort.first_block, cohort.done_at
        total_blocks = mem.total_blocks
        plain_used = type(mem).used_tokens is KVCacheManager.used_tokens
        # the common case, whose steps cohort.quiet_steps takes: a linear model, no record, paged memory, no adapters
        quiet = inline and not record and plain_used and self.lora is None
        start = t
        finished = False
        it = view.iteration
        while cohort.n and t < arrival and it < stop:
            n, cached, s, free = cohort.n, cohort.cached, cohort.steps, mem.free_blocks
            n_running = len(view.running)
            queue_len = len(view.waiting) + len(view.swapped)
            kv_cached = view.kv_cached_tokens
            offloaded = mem.offloaded_tokens if record else 0
            ends, taking = cohort.ends, cohort.taking      # (both replaced when the cohort empties)
            cap, off = len(ends), cohort.base
            if inline:
                base, sdn, b_d, cpu, a_d = step_time.at(n)
            lt, lora = 0.0, None
            if self.lora is not None:          # the members' adapters: resident, constant in this run of steps
                lora = self._lora_steady()
                if lora is None:
                    break                      # one must be loaded: the plain loop's step does it
                lt = lora[1]
            k = used_sum = 0
            used_max = tally.kv_alloc_max if tally is not None else 0
            done = ()
            walk = self._lookahead
            if walk is not None and walk[0] == (t, s, n, cached, free) and t < arrival:
                # The steps the lookahead walked from this very state: applied at once, as many as start before
                # `arrival`, end before `limit` and fit in `stop` (the same values the loop below would compute)
                w_ends, w_dts, w_frees, w_events, usable = walk[2]
                k = min(usable, 1 + bisect.bisect_left(w_ends, arrival), bisect.bisect_left(w_ends, limit),
                        stop - it if stop < math.inf else usable)
                if k > 0:
                    self._lookahead = None
                    last = s + k
                    for step, res, first in w_events:
                        if step > last:
                            break
                        del first_block[step]
                        taking[res] += first
                    if s - off + k > cap:
                        ends = cohort.room(s, k)
                        cap, off = len(ends), cohort.base
                    ends[s - off:s - off + k] = w_ends[:k]
                    free = w_frees[k - 1]
                    t = w_ends[k - 1]
                    start = w_ends[k - 2] if k > 1 else walk[0][0]
                    if record:
                        starts = [walk[0][0]] + w_ends[:k - 1]
                        kv = kv_cached - offloaded
                        for j in range(k):
                            kv += n
                            rows.append((starts[j], w_dts[j], n, 0, n, n_running, queue_len,
                                         (total_blocks - w_frees[j]) * bs if plain_used else _used(mem, w_frees[j]),
                                         kv, 0, 0, 0))
                    elif plain_used:                  # free blocks only fall over a walk: the last step uses most
                        used_sum += bs * (k * total_blocks - sum(w_frees[:k]))
                        used = (total_blocks - w_frees[k - 1]) * bs
                        if used > used_max:
                            used_max = used
                    else:
                        for f in w_frees[:k]:
                            used = _used(mem, f)
                            used_sum += used
                            if used > used_max:
                                used_max = used
                    it += k
                    s = last
                    self.walked_iterations += k
                    cached += n * k
                    kv_cached += n * k
            if quiet:
                t, start, q, free, free_sum, done = quiet_steps(cohort, t, start, s, cached, free, arrival, limit,
                                                                stop - it if stop < math.inf else QUIET_ALL,
                                                                (base, sdn, b_d, cpu, a_d))
                k += q
                it += q
                s += q
                cached += n * q
                kv_cached += n * q
                counted = q - 1 if done else q          # (the step that completes members is tallied after)
                if counted:
                    used_sum += bs * (counted * total_blocks - free_sum)
                    # free blocks only fall over the run: its last counted step uses the most
                    used = (total_blocks - (free + cohort.taking[s % bs] if done else free)) * bs
                    if used > used_max:
                        used_max = used
            while not quiet and t < arrival and it < stop:
                kv = cached + n
                dt = (base + (a_d * kv + sdn + b_d)) + cpu if inline else step_time(n, kv)
                if lora is not None:
                    dt += lt                           # the plain step's base time + the adapters' GEMMs
                if not t + dt < limit:
                    break                              # the plain loop takes this step, after the router
                s1 = s + 1
                res = s1 % bs
                first = first_block.get(s1, 0)
                due = taking[res] + first
                if due > free:                         # KV short: the plain loop evicts
                    break
                if first:
                    del first_block[s1]
                    taking[res] += first
                free -= due
                it += 1
                start, t = t, t + dt                   # the float add SimPy's timeout would do
                if s - off == cap:
                    ends = cohort.room(s, 1)
                    cap, off = len(ends), cohort.base
                ends[s - off] = t
                s = s1
                cached = kv
                kv_cached += n
                k += 1
                if s1 in done_at:                      # members complete: recorded after they leave, below
                    done = done_at.pop(s1)
                    if done:
                        break
                if record:
                    rows.append((start, dt, n, 0, n, n_running, queue_len,
                                 (total_blocks - free) * bs if plain_used else _used(mem, free),
                                 kv_cached - offloaded, 0, 0, 0))
                else:
                    used = (total_blocks - free) * bs if plain_used else _used(mem, free)
                    used_sum += used
                    if used > used_max:
                        used_max = used
            if not k:
                break
            # write the run back: the cohort's take/commit, the engine's counters
            mem.free_blocks = free
            cohort.cached, cohort.steps = cached, s
            cohort.last_iteration = it
            cohort.tokens += n * k
            view.iteration = it
            view.kv_cached_tokens = kv_cached
            self.tokens_generated += n * k
            self.fast_forward_iterations += k
            if lora is not None:
                self._lora_steps(lora, k, queued)
            mem.clock = t
            counted = k - 1 if done else k
            if tally is not None and counted:
                tally.iterations += counted
                tally.batch_size += n * counted
                tally.running += n_running * counted
                tally.kv_alloc_tokens += used_sum
                tally.kv_alloc_max = used_max
            if not done:
                break                                  # stopped short of a step: the plain loop or a wake takes it
            running = view.running
            for r in done:
                cohort.leave(r)
                self._finish(r, t, finalize=False)     # the cohort finalizes its completions in batches
                running.remove(r)
            finished = True
            if record:
                self._record(start, dt, n, 0, n)
            else:
                tally.add(n, len(running), mem.used_tokens)
            if queued or (self.sessions is not None and any(r.followers for r in done)):
                break                                  # (a session's next turn is an arrival to stop at)
        return t, start, finished

    def _cohort_wake_bound(self, t: float, stop, max_steps: int = 4096) -> float:
        """A time no later than the end of the step at which the steady cohort, left alone from t, first completes
        a member, nor than the start of a step it would be short of KV for, nor than the end of its last step
        within `stop` or max_steps: the linear model's decode step is affine in Σ context, which grows by n a step,
        so the steps' times have a closed-form sum, taken in real numbers less a margin far above the rounding of
        the clock's float adds. The replica sleeps until then instead of walking the steps (_cohort_lookahead):
        waking a little early costs a resume, never a missed decision, and _cohort_steps commits the steps."""
        cohort = self.cohort
        n = cohort.n
        key = (t, cohort.steps, n, cohort.cached, self.memory.free_blocks, self.view.iteration, stop)
        if self._bound is not None and self._bound[0] == key:
            return self._bound[1]               # woken where it slept: the same answer
        m = min(cohort.done_at) - cohort.steps if cohort.done_at else max_steps
        m = min(m, max_steps, stop - self.view.iteration)
        # KV: a step takes its residue's count, which the first blocks still due can only raise, plus a first
        # block of its own: at most max(taking) + 2 Σ first blocks, so this many steps surely fit
        most = max(cohort.taking) + 2 * sum(cohort.first_block.values())
        if most:
            m = min(m, self.memory.free_blocks // most)
        if m <= 0:
            return t
        self.bound_sleeps += 1
        base, sdn, b_d, cpu, a_d = self._step_time.at(n)
        total = m * (base + sdn + b_d + cpu + a_d * cohort.cached) + a_d * n * (m * (m + 1) / 2)
        wake = t + total - (1e-9 + 1e-11 * (abs(t) + abs(total)))
        self._bound = (key, wake)
        return wake

    def _cohort_lookahead(self, t: float, stop, max_steps: int = 4096) -> float:
        """When the steady cohort, left alone from time t, first completes a member (the end of that step) or would
        be short of KV (the start of that step), with the step times _skip_cohort's loop would compute, nothing
        committed; after max_steps steps (or at max_iterations) the end of the last. For step times without a
        closed form (a model that is not inlined, adapters); the linear model sleeps on _cohort_wake_bound."""
        cohort = self.cohort
        n, context = cohort.n, cohort.cached
        key = (t, cohort.steps, n, context, self.memory.free_blocks)
        if self._lookahead is not None and self._lookahead[0] == key:
            return self._lookahead[1]           # woken where it slept: the same answer, not computed again
        # take()'s block rule walked without charging anything, stopping before a step short of KV or after one
        # that completes a member, and the step times summed as _cohort_steps would (the same floats); the walk
        # is kept: when the replica wakes in the same state, _cohort_steps applies its steps at once
        done = min(cohort.done_at) if cohort.done_at else None
        taking, first_block, bs = list(cohort.taking), cohort.first_block, cohort.block_size
        free = self.memory.free_blocks
        s = cohort.steps
        step_time = self._step_time
        inline = step_time.inline
        if inline:
            base, sdn, b_d, cpu, a_d = step_time.at(n)
        lt = None
        if self.lora is not None:               # as in _cohort_steps: resident adapters, or the plain loop now
            lora = self._lora_steady()
            if lora is None:
                return t
            lt = lora[1]
        steps = int(min(max_steps, stop - self.view.iteration))
        wake = t
        ends, dts, frees, events = [], [], [], []
        completes = False
        for _ in range(steps):
            s += 1
            res = s % bs
            first = first_block.get(s, 0)
            due = taking[res] + first
            if due > free:
                break
            if first:
                taking[res] += first
                events.append((s, res, first))
            free -= due
            context += n
            dt = (base + (a_d * context + sdn + b_d)) + cpu if inline else step_time(n, context)
            if lt is not None:
                dt += lt
            wake = wake + dt
            ends.append(wake)
            dts.append(dt)
            frees.append(free)
            if s == done:
                completes = True
                break
        # steps that may be applied at once: not one where members complete (those leave one by one)
        walk = (ends, dts, frees, events, len(ends) - completes)
        self._lookahead = (key, wake, walk)
        return wake

    def _patch_last_waiting(self) -> None:
        """Arrivals during a skipped stretch's last step land before its record, as in the plain loop."""
        if self.record_iterations:
            view = self.view
            row = self.iter_rows[-1]
            self.iter_rows[-1] = row[:6] + (len(view.waiting) + len(view.swapped),) + row[7:]

    def _commit(self, batch, now):
        view, cohort = self.view, self.cohort
        self._holding = hold = batch.hold_output
        if batch.cohort:                   # first: members joining below take part from the next step on
            self._commit_cohort_step(now)
        finished = joined = False
        generated = 0
        view.kv_cached_tokens += batch.num_tokens
        register = self.memory.register if self.view.prefix_caching else None
        spec = self.speculation
        if spec is not None:               # verify passes' counters, summed here and added once (verified_many)
            trim, fresh, tally, freed = self.memory.trim, spec.rate_only(), [0] * 6, 0
        for r, c in zip(batch.reqs, batch.tokens):
            if spec is not None and c > 1 and r.cached >= r.input_tokens:
                # a verify pass: j drafts accepted and one token from the target, never past the output; the
                # rejected positions' KV goes back (a request with no token yet has no drafts: the speculating
                # policies schedule it 1 token, a plain decode below, which stamps its first token)
                gained = verify_pass(spec, r, c - 1, fresh, tally)
                view.kv_cached_tokens -= c - gained
                m = r.cached + gained
                r.cached = m
                freed += trim(r, m)
                r.generated += gained
                generated += gained
                r.token_times.extend([now] * gained)
                if r.generated >= r.output_tokens:
                    self._finish(r, now)
                    finished = True
                continue
            m = r.cached + c
            r.cached = m
            if register is not None and m - c < r.input_tokens:   # a prefill chunk: its full blocks are hittable now
                register(r, min(m, r.input_tokens))
            if m >= r.input_tokens:
                r.generated += 1
                generated += 1
                if hold:                   # multi-step: the client sees it when the window ends
                    self._held[r] = self._held.get(r, 0) + 1
                else:
                    if r.first_token_s is None:
                        r.first_token_s = now
                    r.token_times.append(now)
                if r.generated >= r.output_tokens:
                    self._finish(r, now)
                    finished = True
                elif cohort is not None:   # a running decode: steady from now on, until shown otherwise
                    cohort.join(r)
                    joined = True
        self.tokens_generated += generated
        if spec is not None and tally[0]:
            spec.verified_many(*tally, freed)
        if finished:
            view.running[:] = [r for r in view.running if r.state == RUNNING]
        if joined or finished:
            view.loose[:] = [r for r in view.loose if r.cohort is None and r.state == RUNNING]
        self._holding = False
        if not hold and (self._held or self._held_done):
            self._release(now)

    def _release(self, now) -> None:
        """The end of a multi-step window: the tokens its steps held reach the client now, and the requests that
        produced their last token inside it complete now."""
        for r, k in self._held.items():
            if r.first_token_s is None:
                r.first_token_s = now
            r.token_times.extend([now] * k)
        self._held.clear()
        done, self._held_done = self._held_done, []
        self.windows_released += 1
        for r in done:
            self._complete(r, now, True)

    def _commit_cohort_step(self, now) -> bool:
        """Every member got its token at `now`; those whose last token it was complete. Returns whether any did."""
        cohort = self.cohort
        self.tokens_generated += cohort.n
        done = cohort.commit(now)
        for r in done:
            cohort.leave(r)
            self._finish(r, now, finalize=False)       # the cohort finalizes its completions in batches
            self.view.running.remove(r)
        return bool(done)

    def _finish(self, r, now, finalize=True):
        """A request produced its last token at `now`: free its KV and reduce its token times (inside a multi-step
        window: the KV now, the completion when the window ends)."""
        r.state = DONE
        self.view.kv_cached_tokens -= r.cached
        if self.hold_kv:                   # a disaggregated prefill: the KV stays until it is sent (the cluster frees it)
            self.held_kv += r.blocks
        else:
            self.memory.free(r)
        if self._holding:
            self._held_done.append(r)
            return
        self._complete(r, now, finalize)

    def _complete(self, r, now, finalize):
        r.completion_s = now
        self.completed += 1
        if r.followers and self.sessions is not None:       # the session's next turn: after its think time
            self.sessions.release(r, now)
        if finalize:
            finalize_request(r, self.keep_token_times)
        if self.on_complete is not None:
            self.on_complete(r)
        if finalize and self.rows is not None:
            self.retire((r,))

    def _record(self, start, dt, n, prefill, decode):
        v, mem = self.view, self.memory
        self.iter_rows.append((start, dt, n, prefill, decode, len(v.running), len(v.waiting) + len(v.swapped),
                               mem.used_tokens, v.kv_cached_tokens - mem.offloaded_tokens,   # GPU-resident
                               v.step_preemptions, v.step_swap_in, v.step_swap_out))

    @property
    def iters(self) -> dict:
        """The per-iteration table as columns: the two times float64, the counts int64 (exact below 2**53)."""
        if not self.iter_rows:
            return {k: [] for k in ITER_COLUMNS}
        a = np.array(self.iter_rows, dtype=float)
        return {k: a[:, i] if i < 2 else a[:, i].astype(np.int64) for i, k in enumerate(ITER_COLUMNS)}

    def _drop_grown_past_admission(self) -> bool:
        """With nothing on the GPU, a queued request that can no longer be admitted at all is dropped as
        infeasible (True if any was): recompute after a preemption re-admits prompt + generated tokens, which can
        exceed what capacity minus the admission watermark allows, and vLLM v0 then ignores the sequence rather
        than wait for memory that will never come. Checked only here, where the run would otherwise be stuck."""
        view, memory = self.view, self.memory
        if view.running or self.hold_kv and self.held_kv:
            return False
        room = memory.total_blocks - memory.watermark_blocks
        dropped = []
        for queue, swapped in ((view.waiting, False), (view.swapped, True)):
            for r in list(queue):
                grown = r.input_tokens - r.prompt_tokens          # generated tokens folded into the prompt
                need = memory.blocks_for(r.cached + 1 if swapped else self.policy.admission_tokens(r) + grown)
                if need > room:
                    queue.remove(r)
                    if swapped:
                        memory.drop_swapped(r)
                    r.state = INFEASIBLE
                    r.reason = ("after a preemption it needs more KV to resume than capacity minus the admission "
                                "watermark (dropped mid-run, as vLLM v0 ignores such a sequence)")
                    self.infeasible.append(r)
                    self.completed += 1
                    dropped.append(r)
                    if r.followers and self.sessions is not None:
                        self.sessions.abandon(r)
                    if self.on_drop is not None:
                        self.on_drop(r)
        return bool(dropped)

    def _stuck_message(self, why):
        v = self.view
        if self.cohort is not None:
            self.cohort.materialize()
        head = (v.waiting[0] if v.waiting else v.swapped[0] if v.swapped else v.running[0] if v.running else None)
        policy = getattr(self, "policy_name", None) or self.policy.name
        return (f"simulation stuck at t={v.now:.3f}s, iteration {v.iteration}, policy {policy!r}: {why}; "
                f"{len(v.waiting)} waiting, {len(v.swapped)} swapped, {len(v.running)} running, "
                f"KV {self.memory.used_tokens}/{self.memory.capacity_tokens} tokens; first blocked: {head!r}")

    # -- entry point --------------------------------------------------------------------------------------------
    def _prepare_run(self) -> None:
        self.policy.bind(self.view)
        # The steady decode cohort is an exact fast path too: only with fast_forward, a policy that opts in, a
        # cost model that needs decode sums only, and plain block accounting at full precision.
        if (self.exact_fast_paths and self.speculation is None
                and self.policy.decode_cohort(self.view)
                and self.costmodel.accepts_decode_sums() and self.memory.exact_counts
                and self.view.plain_reserve and getattr(self.memory, "kv_bits", 16) == 16):
            self.cohort = self.view.cohort = DecodeCohort(self.view, self.memory, self.keep_token_times)
            if self.rows is not None:
                self.cohort.on_final = self.retire
                if self.flush_at:
                    self.cohort.flush_at = self.flush_at
            self.view.loose[:] = self.view.running

    def finish_batched(self, r, t: float) -> None:
        """_finish a request a steady verify step completed, its TBT statistics reduced later with others'
        (flush_spec_done: finalize_many, the same floats)."""
        self._finish(r, t, finalize=False)
        done = self.spec_done
        done.append((r, ()))
        if len(done) >= FLUSH:
            self.flush_spec_done()

    def flush_spec_done(self) -> None:
        """Reduce the waiting completions' token times to their TBT statistics together (finalize_request's
        floats, as the decode cohort does)."""
        done = self.spec_done
        if done:
            finalize_many(done, self.keep_token_times)
            if self.rows is not None:
                self.retire([r for r, _ in done])
            done.clear()

    def result(self) -> SimResult:
        self.flush_spec_done()
        if self.cohort is not None:      # the tables need every TBT and (truncated run) members' true state
            self.cohort.flush()
            self.cohort.materialize()
        if self.rows is not None:
            self.all_requests = self.live_requests()
        if self.spec_walk:              # requests cut short (or dropped) with token times a window deferred
            settle_spans(self.all_requests)
        return SimResult.from_simulation(self)

    def run(self):
        self._prepare_run()
        with _quiet_gc():
            if self.exact_fast_paths:            # no SimPy: the clock replays the arrivals process's events
                if self.sessions is not None:
                    self.arrival_clock = self.sessions.clock = SessionClock(self.sessions.first_turns,
                                                                            self.view.waiting, self.sessions)
                else:
                    self.arrival_clock = ArrivalClock(self.requests, self.view.waiting)
                self.arrived = self.arrival_clock.arrived
                for _ in self._replica(None):
                    raise RuntimeError("the fast-path replica loop never waits on SimPy")
            else:
                env = simpy.Environment()
                if self.sessions is not None:
                    self.sessions.env = env
                env.process(self._arrivals(env))
                done = env.process(self._replica(env))
                env.run(until=done)
        return self.result()

    def start_in_cluster(self, clock):
        """The replica loop as a generator driven by a cluster (sim/cluster/cluster.py) through `clock`."""
        self._prepare_run()
        self.arrival_clock = clock
        self.arrived = clock.arrived
        return self._replica(None)
