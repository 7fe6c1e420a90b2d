"""Exact fast-forward: advance k decode-only iterations at once, recording what the plain loop would record."""
from __future__ import annotations

import math

import numpy as np

from sim.metrics import finalize_request
from sim.request import DONE, RUNNING

# Longest stretch planned at once: bounds the per-stretch arrays; a longer steady stretch is simply several.
MAX_STRETCH = 1 << 14


class StretchPlan:
    """The k iterations to skip: their start/end times and durations, and the state they start from."""
    __slots__ = ("k", "starts", "ends", "dts", "cached0", "blocks0", "slack", "extra_total", "waiting_before")

    def delay_from(self, now: float) -> float:
        """The largest delay d with now + d <= ends[-1]: the clock lands on or just below the stretch's end.

        One addition cannot always land exactly (ties round to even), so the engine then waits the remainder
        end - (now + d), which is exact because the two values are within a factor of two (Sterbenz)."""
        end = float(self.ends[-1])
        d = end - now
        while now + d < end:
            d = math.nextafter(d, math.inf)
        while now + d > end:
            d = math.nextafter(d, -math.inf)
        return d


class FastForward:
    """Finds and applies steady decode stretches for one Simulation (see `plan` for when one is steady)."""

    def __init__(self, sim):
        self.sim = sim

    def plan(self, now: float, after_full_decode: bool, arrived_at_schedule: int):
        """The longest exact stretch starting at `now`, or None.

        A stretch is steady when the policy vouches (Policy.steady_decode) that every schedule() would run
        the whole running set one decode token each; it ends before the first iteration that would begin at
        or after the next arrival, at the first completion (included), before the first KV block shortfall
        (which the plain loop turns into an eviction), and at sim.max_iterations."""
        sim = self.sim
        view, mem = sim.view, sim.memory
        running = view.running
        if not running or sim.arrived != arrived_at_schedule:
            return None
        if not sim.policy.steady_decode(view, after_full_decode):
            return None
        n = len(running)
        cached = np.fromiter((r.cached for r in running), np.int64, n)
        rem = np.fromiter((r.output_tokens - r.generated for r in running), np.int64, n)
        blocks = np.fromiter((r.blocks for r in running), np.int64, n)
        kmax = min(int(rem.min()), MAX_STRETCH)
        if sim.max_iterations:
            kmax = min(kmax, sim.max_iterations - view.iteration)
        # KV blocks: step j holds cached+j tokens; request i needs a new block once j passes its slack.
        bs = mem.block_size
        slack = blocks * bs - cached
        kmax = min(kmax, _last_fitting_step(slack, bs, mem.free_blocks, kmax))
        if kmax < 1:
            return None
        dts = sim.costmodel.decode_stretch_times(cached, kmax)
        bounds = np.empty(kmax + 1)
        bounds[0] = now
        bounds[1:] = dts
        bounds = np.cumsum(bounds)             # sequential adds: the same clock values SimPy would reach
        starts = bounds[:-1]
        if sim.arrived < len(sim.requests):
            # An iteration sees every arrival at or before its start: stop before the first one that would.
            k = int(np.searchsorted(starts, sim.requests[sim.arrived].arrival_s, side="left"))
            if k < 1:
                return None
            kmax = min(kmax, k)
        p = StretchPlan()
        p.k = kmax
        p.starts, p.ends, p.dts = starts[:kmax], bounds[1:kmax + 1], dts[:kmax]
        p.cached0, p.blocks0, p.slack = cached, blocks, slack
        p.extra_total = _extra_blocks(slack, bs, kmax)
        p.waiting_before = len(view.waiting) + len(view.swapped)
        return p

    def apply(self, p: StretchPlan) -> bool:
        """Commit the stretch's tokens, completions, memory and records, as k plain iterations would.

        Returns whether any request completed (in the stretch's last iteration)."""
        sim = self.sim
        view, mem = sim.view, sim.memory
        running = view.running
        k, n = p.k, len(running)
        bs = mem.block_size
        ends = p.ends.tolist()
        end = ends[-1]
        stamp = view.iteration + k
        new_blocks = np.maximum(p.blocks0, -(-(p.cached0 + k) // bs))
        used_blocks0 = mem.total_blocks - mem.free_blocks
        mem.free_blocks -= int(p.extra_total[-1])
        kv_cached0 = view.kv_cached_tokens
        view.kv_cached_tokens += n * k
        finished = []
        for r, nb in zip(running, new_blocks.tolist()):
            r.cached += k
            r.generated += k
            r.blocks = nb
            r.sched_stamp = stamp
            if r.first_token_s is None:
                r.first_token_s = ends[0]
            r.token_times.extend(ends)
            if r.generated >= r.output_tokens:
                finished.append(r)
        keep = sim.keep_token_times
        for r in finished:
            r.completion_s = end
            r.state = DONE
            view.kv_cached_tokens -= r.cached
            mem.free(r)
            sim.completed += 1
            finalize_request(r, keep)
        if finished:
            running[:] = [r for r in running if r.state == RUNNING]
        sim.tokens_generated += n * k
        view.iteration = stamp
        view.now = float(p.starts[-1])
        view.step_preemptions = view.step_swap_in = view.step_swap_out = 0
        if sim.record_iterations:
            self._record(p, n, kv_cached0, used_blocks0)
        else:
            self._tally(p, n, used_blocks0)
        return bool(finished)

    def _tally(self, p, n, used_blocks0):
        sim = self.sim
        bs, k = sim.memory.block_size, p.k
        if k > 1:
            alloc = (used_blocks0 + p.extra_total[:-1]) * bs
            t = sim.tally
            t.iterations += k - 1
            t.batch_size += n * (k - 1)
            t.running += n * (k - 1)
            t.kv_alloc_tokens += int(alloc.sum())
            t.kv_alloc_max = max(t.kv_alloc_max, int(alloc.max()))
        sim.tally.add(n, len(sim.view.running), sim.memory.used_tokens)

    def _record(self, p, n, kv_cached0, used_blocks0):
        sim = self.sim
        it, view, mem = sim.iters, sim.view, sim.memory
        k = p.k
        it["start_s"].extend(p.starts.tolist())
        it["duration_s"].extend(p.dts.tolist())
        it["batch_size"].extend([n] * k)
        it["prefill_tokens"].extend([0] * k)
        it["decode_tokens"].extend([n] * k)
        running = [n] * k
        running[-1] = len(view.running)
        it["running"].extend(running)
        # Arrivals due in the last iteration land before its record is written, exactly as in the plain loop.
        waiting = [p.waiting_before] * k
        waiting[-1] = len(view.waiting) + len(view.swapped)
        it["waiting"].extend(waiting)
        alloc = ((used_blocks0 + p.extra_total) * mem.block_size).tolist()
        alloc[-1] = mem.used_tokens
        it["kv_alloc_tokens"].extend(alloc)
        cached = (kv_cached0 + n * np.arange(1, k + 1)).tolist()
        cached[-1] = view.kv_cached_tokens
        it["kv_cached_tokens"].extend(cached)
        zeros = [0] * k
        it["preemptions"].extend(zeros)
        it["swap_in_tokens"].extend(zeros)
        it["swap_out_tokens"].extend(zeros)


def _extra_blocks(slack: np.ndarray, bs: int, k: int) -> np.ndarray:
    """Total new blocks the running set has taken by the end of each step 1..k.

    Request i takes a block at steps slack_i+1, slack_i+1+bs, ...; the events are at most the free blocks."""
    s = slack[slack < k]
    cnt = -(-(k - s) // bs)
    total = int(cnt.sum())
    first = np.repeat(s + 1, cnt)
    offset = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    per_step = np.bincount(first + offset * bs, minlength=k + 1)
    return np.cumsum(per_step)[1:k + 1]


def _last_fitting_step(slack: np.ndarray, bs: int, free_blocks: int, kmax: int) -> int:
    """The largest j ≤ kmax whose cumulative block need fits in the free blocks (need grows with j)."""
    def need(j):
        over = j - slack
        return int((-(-over[over > 0] // bs)).sum())
    if need(kmax) <= free_blocks:
        return kmax
    lo, hi = 0, kmax                     # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= free_blocks:
            lo = mid
        else:
            hi = mid
    return lo
