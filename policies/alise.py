"""ALISE (spec alise): speculative shortest-estimated-remaining-time scheduling from predicted lengths, with
aging, overrun doubling and demotion, and EWT-ordered KV swapping overlapped with compute (or Defer/Recompute)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodels.base import BatchShape
from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy
from policies.length_aware import RUNNING, SWAPPED, WAITING

MEMORY_POLICIES = ("swap", "defer", "recompute")


class Job:
    """ALISE's job profile for one request (kept in req.meta)."""
    __slots__ = ("n_hat", "min_level", "boosted", "last_run_s", "ready_iter", "overruns", "prio", "moved_iter")

    def __init__(self, n_hat, now):
        self.n_hat = max(1, int(n_hat))   # predicted output length; doubled on every overrun
        self.min_level = 0                # sticky demotion floor
        self.boosted = False              # promoted to the top queue by aging
        self.last_run_s = now
        self.ready_iter = 0               # iteration from which an uploaded KV may be used
        self.overruns = 0
        self.prio = None
        self.moved_iter = -(1 << 30)      # iteration it was last offloaded or uploaded (swap hysteresis)


def fit_estimator(costmodel, max_prompt: int = 2048):
    """Eq. 3–5 coefficients fitted by least squares on the cost model at batch size 1:
    T_pre(s) ≈ s·T0 and one decode step ≈ α·s + β (the scheduler's estimator, not the ground truth)."""
    s = np.arange(16, max_prompt + 1, 16, dtype=float)
    pre = np.array([costmodel.batch_time(BatchShape(prefill_tokens=[int(x)], prefill_context=[0])) for x in s])
    t0 = float(s @ pre / (s @ s))
    dec = np.array([costmodel.batch_time(BatchShape(decode_context=[int(x) + 1])) for x in s])
    alpha, beta = np.linalg.lstsq(np.c_[s, np.ones_like(s)], dec, rcond=None)[0]
    return t0, float(alpha), float(beta)


class Alise(Policy):
    """Each iteration: update priorities (overrun, aging) → batch in priority order, preempting lower-priority
    jobs' KV when memory is short → proactive EWT-ordered swap-out/upload in the background."""

    name = "alise"

    @dataclass
    class Config:
        memory_policy: str = "swap"         # swap (ALISE) | defer | recompute (the paper's strawmen)
        queues: int = 8                     # h priority levels, geometric in estimated remaining time
        q0_steps: int = 32                  # top-queue threshold: this many decode steps of a short prompt
        queue_ratio: float = 2.0            # each level holds this many times the remaining time of the one above
        aging_s: float = 10.0               # K: a job waiting this long is promoted to the top queue (0 = off)
        overrun_mult: float = 2.0           # predicted length multiplier when a job runs past it
        max_batch: int = 256                # requests per iteration ("as large as memory allows")
        max_batch_tokens: int = 4096        # tokens per iteration (prefills chunked to fit)
        swap_overlap: bool = True           # swaps run on PCIe concurrently with compute (paper); charge the excess
        gpu_set_frac: float = 0.95          # share of M the EWT walk may plan to keep resident
        swap_cooldown_iters: int = 8        # iterations before a job offloaded (or uploaded) may move back
        context_aware: bool = False         # estimator uses α·(s+g)+β per step instead of the paper's α·s+β

        def validate(self, where="policy"):
            if self.memory_policy not in MEMORY_POLICIES:
                raise UserError(f"{where}.memory_policy: {self.memory_policy!r}; allowed: {', '.join(MEMORY_POLICIES)}")
            if self.queues < 1 or self.q0_steps < 1 or self.queue_ratio <= 1:
                raise UserError(f"{where}: queues and q0_steps must be >= 1 and queue_ratio > 1")
            if self.overrun_mult <= 1:
                raise UserError(f"{where}.overrun_mult: must be > 1, got {self.overrun_mult}")

    def bind(self, view):
        self.t0, self.alpha, self.beta = fit_estimator(view.costmodel)
        self.q0 = self.config.q0_steps * (self.alpha * 64 + self.beta)
        self.mem = view.memory
        self.stats = dict(overruns=0, promotions=0, offloads=0, uploads=0, urgent_swaps=0, recomputes=0,
                          deferred_steps=0)

    # -- the speculative scheduler ------------------------------------------------------------------------------
    def remaining_time(self, r) -> float:
        """R̂(J): estimated remaining execution time from the predicted length (Eq. 3–5)."""
        j = r.meta
        steps = max(0, j.n_hat - r.generated)
        s = r.prompt_tokens + (r.generated if self.config.context_aware else 0)
        pre = (r.input_tokens - r.cached) * self.t0 if r.cached < r.input_tokens else 0.0
        return pre + steps * (self.alpha * s + self.beta)

    def level(self, r, rem) -> int:
        j = r.meta
        if j.boosted:
            return 0
        lvl = 0 if rem <= self.q0 else min(self.config.queues - 1, math.ceil(math.log(rem / self.q0,
                                                                                         self.config.queue_ratio)))
        return max(lvl, j.min_level)

    def _refresh(self, view, jobs):
        c = self.config
        now = view.now
        for r in jobs:
            j = r.meta
            if j is None:
                j = r.meta = Job(r.predicted_output_tokens, r.arrival_s)
            if r.generated >= j.n_hat:                     # ran past its prediction: double it and demote
                rem = self.remaining_time(r)
                j.min_level = min(c.queues - 1, self.level(r, rem) + 1)
                j.n_hat = max(j.n_hat + 1, int(math.ceil(j.n_hat * c.overrun_mult)))
                j.boosted = False
                j.overruns += 1
                self.stats["overruns"] += 1
            elif c.aging_s and not j.boosted and now - j.last_run_s >= c.aging_s:
                j.boosted = True                           # virtual aging: promote a starving job
                self.stats["promotions"] += 1
            rem = self.remaining_time(r)
            # a promoted job goes ahead of the whole top queue; otherwise SRTF within the queue
            j.prio = (self.level(r, rem), not j.boosted, rem, r.arrival_s, r.id)

    def schedule(self, view) -> Batch:
        c = self.config
        stamp = view.iteration
        jobs = list(view.running) + list(view.swapped) + list(view.waiting)
        self._refresh(view, jobs)
        jobs.sort(key=lambda r: r.meta.prio)
        # Algorithm 2 runs in the background between iterations: before this batch is formed, resident jobs far
        # down the EWT order are offloaded to make room for the queued higher-priority ones (the copies overlap
        # this iteration), and swapped jobs back within the budget are uploaded for the next.
        uploaded = self._dynamic_swapping(view, jobs, stamp) if c.memory_policy == "swap" else []
        batch = Batch()
        deferring = False
        for r in jobs:
            if len(batch) >= c.max_batch or batch.num_tokens >= c.max_batch_tokens:
                break
            if r.sched_stamp == stamp or r.state == SWAPPED or r.meta.ready_iter > stamp:
                continue
            if r.state == WAITING and deferring:
                continue
            prefill = r.cached < r.input_tokens
            tokens = min(r.input_tokens - r.cached, c.max_batch_tokens - batch.num_tokens) if prefill else 1
            if self._place(view, r, tokens, stamp):
                r.sched_stamp = stamp
                r.meta.boosted = r.meta.boosted and r.generated < r.meta.n_hat
                r.meta.last_run_s = view.now
                batch.add(r, tokens, prefill)
            elif r.state == WAITING and c.memory_policy == "defer":
                deferring = True                           # Defer: no new job enters while memory is full
                self.stats["deferred_steps"] += 1
        if uploaded:
            if not batch.reqs:                         # nothing to hide the copies behind: wait for them, then run
                view.step_swap_in += view.step_swap_hidden
                view.step_swap_hidden = 0
                for r in uploaded:
                    if len(batch) >= c.max_batch or batch.num_tokens >= c.max_batch_tokens:
                        break
                    prefill = r.cached < r.input_tokens
                    tokens = min(r.input_tokens - r.cached, c.max_batch_tokens - batch.num_tokens) if prefill else 1
                    if view.reserve(r, r.cached + tokens):
                        r.meta.ready_iter = stamp
                        r.sched_stamp = stamp
                        r.meta.last_run_s = view.now
                        batch.add(r, tokens, prefill)
        return batch

    # -- memory management ----------------------------------------------------------------------------------------
    def _place(self, view, r, tokens, stamp) -> bool:
        """Reserve KV for `r`'s tokens this step, preempting lower-priority resident jobs that are not in the batch."""
        while True:
            if r.state == RUNNING:
                ok = view.reserve(r, r.cached + tokens)
            else:
                ok = view.admit(r, r.cached + tokens)
            if ok:
                return True
            if r.state == WAITING and self.config.memory_policy == "defer":
                return False
            victim = self._victim(view, r, stamp)
            if victim is None:
                if r.state == RUNNING:                     # nothing below it: it yields its own KV
                    self._evict(view, r, stamp, urgent=True)
                return False
            self._evict(view, victim, stamp, urgent=True)

    def _victim(self, view, r, stamp):
        best = None
        for v in view.running:
            if v is r or v.sched_stamp == stamp or v.meta.prio <= r.meta.prio:
                continue
            if best is None or v.meta.prio > best.meta.prio:
                best = v
        return best

    def _evict(self, view, v, stamp, urgent):
        mode = "swap" if self.config.memory_policy == "swap" else "recompute"
        before = view.step_swap_out
        view.preempt(v, mode=mode, front=False)
        v.sched_stamp = stamp
        moved = view.step_swap_out - before
        if moved and self.config.swap_overlap and not urgent:
            view.step_swap_out -= moved                    # proactive offload: copied while the batch computes
            view.step_swap_hidden += moved
        if v.state == SWAPPED:
            self.stats["urgent_swaps" if urgent else "offloads"] += 1
        else:
            self.stats["recomputes"] += 1

    def _dynamic_swapping(self, view, jobs, stamp):
        """Algorithm 2, corrected (spec §2.6), run between iterations: order every live job by EWT; the queued jobs
        the next batch could take (within its token budget) need their prompts' KV, and when free memory falls
        short, resident jobs later in the EWT order than all of them are offloaded (latest first) in the
        background; swapped jobs are uploaded, in EWT order, into what free memory is left. A job moved one way
        is not moved back for `swap_cooldown_iters` iterations (hysteresis: without it a stream of short arrivals
        shuttles the same long jobs across PCIe every step)."""
        c = self.config
        K = c.aging_s
        ahead, ewt = 0.0, []
        for r in jobs:                                     # jobs are in priority order
            rem = r.meta.prio[2]
            promote = max(0.0, K - (view.now - r.meta.last_run_s)) if K and not r.meta.boosted else math.inf
            ewt.append((min(ahead, promote), r.meta.prio, r))
            ahead += rem
        ewt.sort(key=lambda x: (x[0], x[1]))
        mem = self.mem
        need, tokens, last_waiting = 0, c.max_batch_tokens, -1
        for i, (_, _, r) in enumerate(ewt):
            if r.state == WAITING and r.input_tokens <= tokens:
                tokens -= r.input_tokens
                need += mem.blocks_for(r.input_tokens + 1)
                last_waiting = i
        deficit = need - (mem.free_blocks - int((1 - c.gpu_set_frac) * mem.total_blocks))
        if deficit > 0:
            for _, _, r in reversed(ewt[last_waiting + 1:]):
                if deficit <= 0:
                    break
                if (r.state == RUNNING and r.sched_stamp != stamp
                        and stamp - r.meta.moved_iter >= c.swap_cooldown_iters):
                    deficit -= r.blocks
                    r.meta.moved_iter = stamp
                    self._evict(view, r, stamp, urgent=False)
        avail = mem.free_blocks - need - int((1 - c.gpu_set_frac) * mem.total_blocks)
        uploaded = []
        for _, _, r in ewt:
            if r.state != SWAPPED or stamp - r.meta.moved_iter < c.swap_cooldown_iters:
                continue
            blocks = mem.blocks_for(r.cached + 1)
            if blocks > avail or not mem.can_reserve(r, r.cached + 1, admission=True):
                continue
            before = view.step_swap_in
            if view.swap_in(r, r.cached + 1):
                avail -= blocks
                r.meta.ready_iter = stamp + 1              # usable once the upload has finished
                r.meta.moved_iter = stamp
                self.stats["uploads"] += 1
                uploaded.append(r)
                if c.swap_overlap:
                    moved = view.step_swap_in - before
                    view.step_swap_in -= moved
                    view.step_swap_hidden += moved
        if not uploaded and not view.running:
            # nothing resident: the planning margin and the hysteresis must not keep the top swapped job out
            for _, _, r in ewt:
                if r.state == SWAPPED and mem.can_reserve(r, r.cached + 1, admission=True):
                    if view.swap_in(r, r.cached + 1):
                        r.meta.ready_iter = stamp + 1
                        r.meta.moved_iter = stamp
                        self.stats["uploads"] += 1
                        uploaded.append(r)
                        break
        return uploaded


_A = "ALISE"
register_policy("alise", Alise, f"{_A}: preemptive SRTF on predicted length (Eq. 3-5), aging, overrun doubling, "
                "EWT-ordered KV swap overlapped with compute")
register_policy("alise-defer", Alise, f"{_A} with the Defer strawman: new jobs wait while memory is full",
                memory_policy="defer")
register_policy("alise-recompute", Alise, f"{_A} with the Recompute strawman: preempted jobs' KV is dropped",
                memory_policy="recompute")
