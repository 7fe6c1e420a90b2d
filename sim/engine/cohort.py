"""Exact steady decode cohort: running decodes that gain one token per step, kept as a count and a sum."""
from __future__ import annotations

import math

import numpy as np

from sim.metrics import finalize_many

FLUSH = 4096    # completed members whose TBT statistics are computed together (finalize_many)
ENDS = 1024     # the end-time array's first size (and its least after a compaction)


class DecodeCohort:
    """Running decode requests that every step extends by one token each, accounted for in aggregate.

    A member's `cached`, `generated`, `blocks`, `sched_stamp` and `token_times` stay as they were when it
    joined (at step `r.cohort`); its true values follow from the steps taken since. Per step the cohort
    costs O(1): Σ cached grows by the member count, and the KV blocks due are a counter. A member with s0
    spare slots in its blocks takes a new block at steps f = join + s0 + 1, f + B, f + 2B, ... (block size
    B) until its last token, so members are counted by f mod B from f on: step s needs as many blocks as
    that count for s mod B. Free memory is charged each step, so it is always exact. Per request there are
    two events, kept in calendars keyed by step: its first new block (f) and its last token. Its token times
    are the slice of `ends` (one end time per step) since it joined: the floats the plain loop appends.

    The engine joins requests at commit and commits each step; a policy that opted in (Policy.decode_cohort)
    either takes the whole cohort for a step (`take`), or takes out a member it evicts (`drop`), or calls
    `materialize` first, which writes the true values back and empties the cohort, so anything that needs
    the per-request picture gets it."""

    def __init__(self, view, memory, keep_token_times: bool = False):
        self.view = view
        self.memory = memory
        self.keep_token_times = keep_token_times
        self.pending = []                   # (completed request, its token times since joining) to finalize
        self.on_final = None                # called with the requests a flush finalized (their rows are final)
        self.flush_at = FLUSH               # pending completions that trigger a flush
        self.block_size = memory.block_size
        self.n = 0                          # members
        self.cached = 0                     # Σ true cached over members
        self.steps = 0                      # steps taken since the cohort was last empty
        self.ends = np.empty(ENDS)          # ends[s - 1 - base]: end time of step s (grown, or compacted, below)
        self.base = 0                       # steps before base + 1 are no live member's: dropped from `ends`
        self.compactions = 0                # times `ends` dropped such steps (diagnostics)
        self.last_iteration = -1            # the iteration in which the latest step ran
        self.tokens = 0                     # decode tokens generated in aggregate (diagnostics)
        self.taking = [0] * self.block_size  # members past their first new block, by f mod B
        self.first_block = {}               # step f → how many members take their first new block in it
        self.done_at = {}                   # step → members whose last output token that step produces

    # -- the policy's side ------------------------------------------------------------------------------------
    def blocks_due(self) -> int:
        """KV blocks the next step needs."""
        s = self.steps + 1
        return self.taking[s % self.block_size] + self.first_block.get(s, 0)

    def take(self, iteration: int, also_blocks: int = 0):
        """Schedule every member for one decode token and charge the KV blocks due; returns Σ(m + 1) read, or
        None (and no change) if those blocks plus `also_blocks` more do not fit free memory."""
        s = self.steps + 1
        res = s % self.block_size
        first = self.first_block.get(s, 0)
        due = self.taking[res] + first
        if due + also_blocks > self.memory.free_blocks:
            return None
        if first:
            del self.first_block[s]
            self.taking[res] += first
        self.memory.free_blocks -= due
        self.last_iteration = iteration
        self.tokens += self.n
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
        f = self._first_block_step(r)
        if f <= last:
            self.first_block[f] = self.first_block.get(f, 0) + 1

    def commit(self, now: float) -> list:
        """Close the step that ran; returns the members that produced their last token in it (still members)."""
        s = self.steps
        if s - self.base == len(self.ends):
            self.room(s, 1)
        self.ends[s - self.base] = now
        self.steps = s + 1
        self.cached += self.n
        return self.done_at.pop(s + 1, ())

    def room(self, s: int, k: int) -> np.ndarray:
        """`ends` with room for the end times of steps s + 1 .. s + k (s: the steps taken so far). Full, it keeps
        only the steps a live member joined at or after (a cohort that never empties would otherwise hold one
        float per step of the whole run: gigabytes at fleet scale); completed members waiting in `pending`
        keep views of the old array, which lives until they are flushed."""
        base, ends = self.base, self.ends
        if s - base + k <= len(ends):
            return ends
        lo = min((r.cohort for members in self.done_at.values() for r in members), default=s)
        keep = s - lo
        new = np.empty(max(ENDS, 2 * (keep + k)))
        new[:keep] = ends[lo - base:s - base]
        self.ends, self.base = new, lo
        self.compactions += lo > base
        return new

    def leave(self, r) -> None:
        """Take out a member that completed in the latest step with its true state; its TBT statistics follow
        at the next flush (many at once are cheaper), from its token times since joining."""
        self._stop_blocks(r, self.steps)
        if len(self.pending) >= self.flush_at:
            self.flush()        # (before r joins: the engine finishes r, its completion time and state, after this)
        # a view: `ends` is never rewritten under it (room() compacts into a new array)
        self.pending.append((r, self.ends[r.cohort - self.base:self.steps - self.base]))
        self._remove(r)

    def drop(self, r) -> None:
        """Take out a member that did not complete (the policy evicts it) with its true state."""
        last = r.cohort + r.output_tokens - r.generated
        self.done_at[last].remove(r)
        self._stop_blocks(r, last)
        r.token_times.extend(self.ends[r.cohort - self.base:self.steps - self.base].tolist())
        self._remove(r)
        self.view.loose[:] = [x for x in self.view.running if x.cohort is None]

    def block_due(self, r) -> int:
        """Does member r take a new KV block in the next step (1) or not (0)?"""
        s = self.steps + 1
        f = self._first_block_step(r)
        return int(f <= s and (s - f) % self.block_size == 0)

    def flush(self) -> None:
        """Reduce the completed members' token times to their TBT statistics (finalize_request's floats)."""
        finalize_many(self.pending, self.keep_token_times)
        if self.on_final is not None:
            self.on_final([r for r, _ in self.pending])
        self.pending.clear()

    def materialize(self) -> None:
        """Write every member's true values back and empty the cohort: the plain per-request path takes over."""
        if self.n:
            for r in self.view.running:
                if r.cohort is not None:
                    r.token_times.extend(self.ends[r.cohort - self.base:self.steps - self.base].tolist())
                    self._settle(r)
            self._reset()
        self.view.loose[:] = self.view.running

    def _stop_blocks(self, r, last) -> None:
        """Stop counting a member's block growth (its last step in the cohort: `last`)."""
        f = self._first_block_step(r)
        if f <= min(last, self.steps):      # it was taking blocks
            self.taking[f % self.block_size] -= 1
        elif f <= last:                     # it was still to take its first
            left = self.first_block[f] - 1
            if left:
                self.first_block[f] = left
            else:                           # no one left to take a block then: every key is a step to come
                del self.first_block[f]

    def _remove(self, r) -> None:
        self._settle(r)
        self.n -= 1
        self.cached -= r.cached
        if not self.n:
            self._reset()

    def _first_block_step(self, r) -> int:
        """The step whose token first overflows a member's blocks at joining (from its joining-time state)."""
        return r.cohort + r.blocks * self.block_size - r.cached + 1

    def _settle(self, r) -> None:
        """True cached, generated, blocks and stamp (token times are the caller's), and out of the cohort."""
        k = self.steps - r.cohort
        if k:
            r.cached += k
            r.generated += k
            blocks = -(-r.cached // self.block_size)      # every step reserved up to its token
            if blocks > r.blocks:
                r.blocks = blocks
            r.sched_stamp = self.last_iteration
        r.cohort = None

    def _reset(self) -> None:
        """No member refers to past steps any more: start the step count over (keeps `ends` short)."""
        self.n = self.cached = self.steps = self.base = 0
        if self.pending:                    # their views keep the old end times; later steps write a new array
            self.ends = np.empty(ENDS)
        self.taking = [0] * self.block_size
        self.first_block.clear()
        self.done_at.clear()


def quiet_steps(cohort, t, start, s, cached, free, arrival, limit, steps, parts):
    """The steady cohort's steps from step s (Σ cached `cached`, `free` blocks free, clock t) in the common case:
    step times from DecodeStepTime.at's parts (a linear model), no adapters, no per-step record and the paged
    manager's used tokens. Between two events (a member's first new block, a member's last token) a step's KV
    due is the cohort's `taking` count for its residue, so only those steps look at the calendars; the end times
    go into `ends` at once. The rules are _cohort_steps' step for step: each starts before `arrival`, ends
    before `limit`, fits its blocks, at most `steps` of them, stopping after one that completes members.

    Returns (clock, start of the last step (`start` if none was taken), steps taken, free blocks, Σ free blocks
    after each step that completed no one, the members the last step completed or ()): the caller writes the
    counters back."""
    base, sdn, b_d, cpu, a_d = parts
    n, bs = cohort.n, cohort.block_size
    taking, first_block, done_at = cohort.taking, cohort.first_block, cohort.done_at
    # every key of both calendars is a step to come (later than s): their least is the next event of each kind
    nf = min(first_block) if first_block else math.inf
    nd = min(done_at) if done_at else math.inf
    s0, t0, free_sum, done = s, t, 0, 0
    last = s + steps
    new = []                                                    # the steps' end times
    while s < last and t < arrival:
        cached += n                                             # (Σ context the step reads, and after it)
        t2 = t + ((base + (a_d * cached + sdn + b_d)) + cpu)   # the float add SimPy's timeout would do
        if not t2 < limit:
            cached -= n
            break                                               # the plain loop takes this step, after the router
        s += 1
        if s == nf:
            res = s % bs
            first = first_block[s]
            due = taking[res] + first
            if due > free:
                s -= 1
                cached -= n
                break                                           # KV short: the plain loop evicts
            del first_block[s]
            taking[res] += first
            nf = min(first_block) if first_block else math.inf
        else:
            due = taking[s % bs]
            if due > free:
                s -= 1
                cached -= n
                break
        free -= due
        t = t2
        new.append(t2)
        if s == nd:
            if done_at[s]:
                done = s                                        # popped below, once `ends` has room
                break
            del done_at[s]                                      # (members dropped since joining)
            nd = min(done_at) if done_at else math.inf
        free_sum += free
    k = s - s0
    if k:
        start = new[-2] if k > 1 else t0
        ends = cohort.room(s0, k)
        lo = s0 - cohort.base
        ends[lo:lo + k] = new
    return t, start, k, free, free_sum, done_at.pop(done) if done else ()
