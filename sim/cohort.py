"""Exact steady decode cohort: running decodes that gain one token per step, kept as a count and a sum."""
from __future__ import annotations

import numpy as np


class DecodeCohort:
    """Running decode requests that every step extends by one token each, accounted for in aggregate.

    A member's `cached`, `generated`, `sched_stamp` and `token_times` stay as they were when it joined (at
    step `r.cohort`); its true values are those plus the steps taken since. What is left per request are
    sparse events, kept in calendars keyed by step: one more KV block every block_size tokens (taken eagerly,
    so `blocks` and free memory are always exact) and the last token. A member's token times are the slice
    of `ends` (one end time per step) since it joined: the same floats the plain loop appends one by one.

    The engine joins requests at commit and commits each step; a policy that opted in (Policy.decode_cohort)
    either takes the whole cohort for a step (`take`) or calls `materialize` first, which writes the true
    values back and empties the cohort, so anything that needs the per-request picture gets it."""

    def __init__(self, view, memory):
        self.view = view
        self.memory = memory
        self.block_size = memory.block_size
        self.n = 0                  # members
        self.cached = 0             # Σ true cached over members
        self.steps = 0              # steps taken since the cohort was last empty
        self.ends = np.empty(1024)  # ends[s - 1]: end time of step s (grown by doubling)
        self.last_iteration = -1    # the iteration in which the latest step ran
        self.block_due = {}         # step → members that need one more KV block to take part in it
        self.done_at = {}           # step → members whose last output token that step produces

    # -- the policy's side ------------------------------------------------------------------------------------
    def blocks_due(self) -> int:
        """KV blocks the next step needs (the policy checks they fit before it takes the cohort)."""
        due = self.block_due.get(self.steps + 1)
        return len(due) if due else 0

    def take(self, iteration: int) -> int:
        """Schedule every member for one decode token: reserve the blocks due; returns Σ(m + 1) read."""
        s = self.steps + 1
        due = self.block_due.pop(s, None)
        if due:
            self.memory.free_blocks -= len(due)
            nxt = s + self.block_size
            later = self.block_due.get(nxt)
            for r in due:
                r.blocks += 1
                if nxt <= r.cohort + r.output_tokens - r.generated:     # still running at that step
                    if later is None:
                        later = self.block_due[nxt] = []
                    later.append(r)
        self.last_iteration = iteration
        return self.cached + self.n

    # -- the engine's side --------------------------------------------------------------------------------------
    def join(self, r) -> None:
        """Add a running decode that has just been committed; it takes part from the next step on."""
        t0 = self.steps
        r.cohort = t0
        self.n += 1
        self.cached += r.cached
        last = t0 + r.output_tokens - r.generated
        self.done_at.setdefault(last, []).append(r)
        first_block = t0 + r.blocks * self.block_size - r.cached + 1    # step whose token overflows the blocks
        if first_block <= last:
            self.block_due.setdefault(first_block, []).append(r)

    def commit(self, now: float) -> list:
        """Close the step that ran; returns the members that produced their last token in it (still members)."""
        s = self.steps
        if s == len(self.ends):
            self.ends = np.concatenate((self.ends, np.empty(s)))
        self.ends[s] = now
        self.steps = s + 1
        self.cached += self.n
        return self.done_at.pop(s + 1, ())

    def leave(self, r):
        """Take out a member that completed: its true counts, and its token times since joining (an array)."""
        t0, k = r.cohort, self.steps - r.cohort
        r.cached += k
        r.generated += k
        r.sched_stamp = self.last_iteration
        r.cohort = None
        tail = self.ends[t0:self.steps].copy()   # survives the reset below
        self.n -= 1
        self.cached -= r.cached
        if not self.n:
            self._reset()
        return tail

    def materialize(self) -> None:
        """Write every member's true values back and empty the cohort: the plain per-request path takes over."""
        if self.n:
            for r in self.view.running:
                if r.cohort is not None:
                    self._settle(r)
            self._reset()
        self.view.loose[:] = self.view.running

    def _settle(self, r) -> None:
        t0 = r.cohort
        k = self.steps - t0
        if k:
            r.cached += k
            r.generated += k
            r.sched_stamp = self.last_iteration
            r.token_times.extend(self.ends[t0:self.steps].tolist())
        r.cohort = None

    def _reset(self) -> None:
        """No member refers to past steps any more: drop them (keeps `ends` short on long runs)."""
        self.n = self.cached = self.steps = 0
        self.block_due.clear()
        self.done_at.clear()
