"""Exact fast-forward: advance k decode-only iterations at once, recording what the plain loop would record."""
from __future__ import annotations

import math

import numpy as np

from sim.metrics import finalize_request
from sim.engine.request import DONE, RUNNING
from sim.kv.paged import KVCacheManager

# Longest stretch planned at once: bounds the per-stretch arrays; a longer steady stretch is simply several.
MAX_STRETCH = 1 << 14
MAX_BLOCK_EVENTS = 1 << 21   # beyond this many block allocations in one plan, stop at the first completion


class StretchPlan:
    """The k iterations to skip: their start/end times and durations, and the state they start from."""
    __slots__ = ("k", "starts", "ends", "dts", "cached0", "blocks0", "slack", "rem", "taken", "returned",
                 "waiting_before", "lora")


class FastForward:
    """Finds and applies steady decode stretches for one Simulation (see `plan` for when one is steady)."""

    def __init__(self, sim):
        self.sim = sim

    def plan(self, now: float, after_full_decode: bool, arrived_at_schedule: int):
        """The longest exact stretch starting at `now`, or None.

        A stretch is steady when the policy vouches (Policy.steady_decode) that every schedule() would run
        the whole running set one decode token each; it ends before the first iteration that would begin at
        or after the next arrival, before the first KV block shortfall (which the plain loop turns into an
        eviction), and at sim.max_iterations. With requests queued it ends at the first completion (freed KV
        may admit one); with empty queues it runs on through completions, the running set shrinking."""
        sim = self.sim
        view, mem = sim.view, sim.memory
        running = view.running
        if not running or sim.arrived != arrived_at_schedule:
            return None
        if getattr(mem, "kv_bits", 16) < 16:
            return None     # quantized KV adds a dequantization charge the closed-form stretch does not carry
        if mem.free_blocks * mem.block_size < 2 * len(running):
            return None     # KV nearly full: at most a step or two fit, cheaper to take them the plain way
        if not sim.policy.steady_decode(view, after_full_decode):
            return None
        lora = None
        if sim.lora is not None:           # multi-LoRA: the running set's adapters, all resident, each step
            lora = sim._lora_steady()
            if lora is None:
                return None
            if not lora[0]:
                lora = None
        if view.cohort is not None:
            view.cohort.materialize()     # the stretch is planned and applied on per-request state
        n = len(running)
        cached = np.fromiter((r.cached for r in running), np.int64, n)
        rem = np.fromiter((r.output_tokens - r.generated for r in running), np.int64, n)
        blocks = np.fromiter((r.blocks for r in running), np.int64, n)
        bs = mem.block_size
        slack = blocks * bs - cached          # step j holds cached+j tokens: a new block once j passes slack
        queued = bool(view.waiting or view.swapped)
        # With requests queued, stop at the first completion (freed KV may admit one); with LoRA too (the
        # running set's adapters change) and with closed-loop sessions where the completing turn has a follower.
        kmax = min(int(rem.min() if queued or lora is not None else _first_release(sim, running, rem)), MAX_STRETCH)
        if sim.max_iterations:
            kmax = min(kmax, sim.max_iterations - view.iteration)
        if not queued and int(np.maximum(np.minimum(rem, kmax) - slack, 0).sum()) // bs > MAX_BLOCK_EVENTS:
            kmax = min(kmax, int(rem.min()))  # keep the block-event arrays small
        if kmax < 1:
            return None
        last = np.minimum(rem, kmax)          # the last step each request takes part in
        events = _block_events(slack, last, bs, kmax)
        done = rem <= kmax
        final_blocks = blocks[done] + -(-np.maximum(rem[done] - slack[done], 0) // bs)
        if type(mem).blocks_returned_on_free is not KVCacheManager.blocks_returned_on_free:
            # Shared (prefix-cached) blocks return only with their last holder: count a request's own blocks, an
            # underestimate when two holders finish in one stretch, which only shortens the stretch.
            own = np.fromiter((mem.blocks_returned_on_free(r) for r in running), np.int64, n)
            final_blocks -= (blocks - own)[done]
        freed = np.bincount(rem[done], weights=final_blocks, minlength=kmax + 1)[1:].astype(np.int64)
        # Step j's reserves fit iff blocks taken so far ≤ free blocks + blocks freed by earlier completions.
        taken, returned = np.cumsum(events), np.cumsum(freed)
        short = np.flatnonzero(taken > mem.free_blocks + np.concatenate(([0], returned[:-1])))
        if len(short):
            kmax = int(short[0])
            if kmax < 1:
                return None
        dts = sim.costmodel.decode_stretch_times(cached, kmax, last_step=np.minimum(rem, kmax))
        if lora is not None:
            dts = dts + lora[1]                # each step's time plus its adapters' GEMMs, the plain loop's float add
        if not (np.all(dts >= 0) and np.all(np.isfinite(dts))):   # an extension's cost model (see loop._batch_time)
            from costmodels.errors import UserError
            raise UserError(f"costmodel: {type(sim.costmodel).__name__}.decode_stretch_times returned a step time "
                            f"that is not a finite number >= 0 ({dts[~(np.isfinite(dts) & (dts >= 0))][0]!r})")
        bounds = np.empty(kmax + 1)
        bounds[0] = now
        bounds[1:] = dts
        bounds = np.cumsum(bounds)             # sequential adds: the same clock values SimPy would reach
        starts = bounds[:-1]
        clock = sim.arrival_clock
        if clock.time < math.inf:    # (a cluster replica: a bound on its next arrival)
            # Stop before the first iteration that starts at or after the next arrival event (its exact time).
            k = int(np.searchsorted(starts, clock.time, side="left"))
            if k < 1:
                return None
            kmax = min(kmax, k)
        if clock.commit_limit < math.inf:     # a cluster: only iterations that end before the router next reads
            k = int(np.searchsorted(bounds[1:], clock.commit_limit, side="left"))
            if k < 1:
                return None
            kmax = min(kmax, k)
        p = StretchPlan()
        p.k = kmax
        p.starts, p.ends, p.dts = starts[:kmax], bounds[1:kmax + 1], dts[:kmax]
        p.cached0, p.blocks0, p.slack, p.rem = cached, blocks, slack, rem
        p.taken, p.returned = taken[:kmax], returned[:kmax]
        p.waiting_before = len(view.waiting) + len(view.swapped)
        p.lora = lora
        return p

    def apply(self, p: StretchPlan) -> bool:
        """Commit the stretch's tokens, completions, memory and records, as k plain iterations would.

        Returns whether any request completed."""
        sim = self.sim
        view, mem = sim.view, sim.memory
        running = view.running
        k, n = p.k, len(running)
        bs = mem.block_size
        ends = p.ends.tolist()
        it0 = view.iteration
        steps = np.minimum(p.rem, k)
        new_blocks = np.maximum(p.blocks0, -(-(p.cached0 + steps) // bs))
        used_blocks0 = mem.total_blocks - mem.free_blocks
        kv_cached0 = view.kv_cached_tokens
        mem.free_blocks -= int(p.taken[-1])
        generated = int(steps.sum())
        view.kv_cached_tokens += generated
        keep = sim.keep_token_times
        done = []
        for r, nb, t in zip(running, new_blocks.tolist(), steps.tolist()):
            r.cached += t
            r.generated += t
            r.blocks = nb
            r.sched_stamp = it0 + t
            if r.first_token_s is None:
                r.first_token_s = ends[0]
            r.token_times.extend(ends if t == k else ends[:t])
            if r.generated >= r.output_tokens:
                done.append((t, r))
        # Completions free their KV step by step, as the plain loop would: a block shared by two requests returns
        # with the later one (prefix caching), so the blocks each step returns are measured, not assumed.
        returned = np.zeros(k, dtype=np.int64)
        done.sort(key=lambda d: d[0])
        for t, r in done:
            r.completion_s = ends[t - 1]
            r.state = DONE
            view.kv_cached_tokens -= r.cached
            mem.clock = r.completion_s
            before = mem.free_blocks
            mem.free(r)
            returned[t - 1] += mem.free_blocks - before
            sim.completed += 1
            if r.followers and sim.sessions is not None:      # the session's next turn, after its think time
                sim.sessions.release(r, r.completion_s)
            finalize_request(r, keep)
            if sim.on_complete is not None:
                sim.on_complete(r)
            if sim.rows is not None:
                sim.retire((r,))
        finished = bool(done)
        if finished:
            running[:] = [r for r in running if r.state == RUNNING]
            if view.cohort is not None:
                view.loose[:] = running
        sim.tokens_generated += generated
        if p.lora is not None:
            sim._lora_steps(p.lora, k, p.waiting_before > 0)
        view.iteration = it0 + k
        view.now = float(p.starts[-1])
        view.step_preemptions = view.step_swap_in = view.step_swap_out = 0
        # Per-step columns: requests in each step, and the running set / KV after each step's commit.
        active = np.bincount(steps, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        after = np.append(active[1:], len(running))
        alloc = (used_blocks0 + p.taken - np.cumsum(returned)) * bs
        left = p.rem <= k
        freed_cached = np.bincount(p.rem[left], weights=(p.cached0 + p.rem)[left], minlength=k + 1)[1:]
        kv_cached = kv_cached0 + np.cumsum(active) - np.cumsum(freed_cached).astype(np.int64)
        if sim.record_iterations:
            self._record(p, active, after, alloc, kv_cached)
        else:
            t = sim.tally
            t.iterations += k
            t.batch_size += int(active.sum())
            t.running += int(after.sum())
            t.kv_alloc_tokens += int(alloc.sum())
            t.kv_alloc_max = max(t.kv_alloc_max, int(alloc.max()))
        return finished

    def _record(self, p, active, after, alloc, kv_cached):
        sim = self.sim
        k = p.k
        active = active.tolist()
        # Arrivals due in the last iteration land before its record: the loop rewrites that row after delivering.
        waiting = [p.waiting_before] * k
        zeros = [0] * k
        sim.iter_rows.extend(zip(p.starts.tolist(), p.dts.tolist(), active, zeros, active, after.tolist(), waiting,
                                 alloc.tolist(), kv_cached.tolist(), zeros, zeros, zeros))


def _first_release(sim, running, rem) -> int:
    """The longest stretch with empty queues: to the last completion, or, with closed-loop sessions, to the first
    completion of a turn that has a next turn (its release is an arrival the stretch must not run past)."""
    if sim.sessions is not None:
        last = [t for r, t in zip(running, rem.tolist()) if r.followers]
        if last:
            return min(min(last), int(rem.max()))
    return int(rem.max())


def _block_events(slack: np.ndarray, last: np.ndarray, bs: int, k: int) -> np.ndarray:
    """New KV blocks the running set takes in each step 1..k.

    Request i takes a block at steps slack_i+1, slack_i+1+bs, ... up to its last step `last_i`."""
    take = last > slack
    s = slack[take]
    cnt = -(-(last[take] - s) // bs)
    total = int(cnt.sum())
    first = np.repeat(s + 1, cnt)
    offset = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return np.bincount(first + offset * bs, minlength=k + 1)[1:k + 1]
