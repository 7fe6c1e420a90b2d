"""What a router knows of one replica: the requests and tokens it sent there and has seen leave, kept symmetric.

Every request a pool's router sends is charged once, by id, with the tokens that pool counts for it; whatever way
it leaves that replica (completes, hands its KV to a decode replica, is refused or dropped as infeasible) the same
charge is taken back. So outstanding requests and tokens can never go negative, and after a run that was not cut
short every ledger is empty (sim/cluster/cluster.py checks it). What a pool counts per request:
- serve (no disaggregation): prompt + output tokens, the work and the KV the request brings;
- prefill: prompt tokens, the work done there (its one token rides on the last prompt position);
- decode: prompt + output tokens, the KV the request will hold there while it generates."""
from __future__ import annotations

import heapq
import math


class LedgerError(RuntimeError):
    """A hand-off the cluster driver got wrong (a bug, never a user mistake)."""


class RouterLedger:
    """One replica's ledger. A request leaves at a time: the router, deciding at time t, counts it as gone only if
    it left before t, which is what it would know if every replica had run exactly up to t. So a replica whose
    exact fast path has already applied a stretch past t (its state ahead of the router) reads the same as one
    run iteration by iteration; routers that read only the ledger let replicas run ahead (sim/cluster/routers.py)."""
    __slots__ = ("routed", "routed_tokens", "completed", "completed_tokens", "open", "later", "book", "index")

    def __init__(self):
        self.routed = self.routed_tokens = self.completed = self.completed_tokens = 0
        self.open: dict = {}               # request id → tokens charged, while the request is on this replica
        self.later: list = []              # (time, tokens) of requests gone at a time not yet reached: a heap
        self.book = None                   # the pool's LedgerBook (sim/cluster/book.py), which then keeps `later`
        self.index = -1                    # ... and this ledger's place in it

    def send(self, rid, tokens: int) -> None:
        if rid in self.open:
            raise LedgerError(f"request {rid} sent twice to one replica")
        self.open[rid] = tokens
        self.routed += 1
        self.routed_tokens += tokens
        if self.book is not None:
            self.book.changed(self)

    def finish(self, rid, t: float = -math.inf) -> None:
        """Request `rid` left at time t (default: at once, as a request refused on arrival)."""
        tokens = self.open.pop(rid, None)
        if tokens is None:
            raise LedgerError(f"request {rid} left a replica it was never sent to")
        if t == -math.inf:
            self.completed += 1
            self.completed_tokens += tokens
            if self.book is not None:
                self.book.changed(self)
        elif self.book is not None:
            self.book.departed(self, t, tokens)
        else:
            heapq.heappush(self.later, (t, tokens))

    def settle(self, now: float) -> None:
        """Count what left before `now`."""
        if self.book is not None:
            self.book.settle(now)
            return
        later = self.later
        while later and later[0][0] < now:
            _, tokens = heapq.heappop(later)
            self.completed += 1
            self.completed_tokens += tokens

    @property
    def outstanding_requests(self) -> int:
        return self.routed - self.completed

    @property
    def outstanding_tokens(self) -> int:
        return self.routed_tokens - self.completed_tokens
