"""One pool's router ledgers settled together, and its least-loaded replica found in O(log n), not by a scan.

The least_tokens and least_requests routers read every replica's outstanding count per request and take the
lowest index among the least loaded: a scan of the pool per request, most of a 1,000-replica fleet's routing time.
A book gives the same answer from a heap of (load, replica index) kept current as ledgers change. It also keeps
one heap of the pool's time-stamped departures instead of one per ledger: a router deciding at t counts what left
before t on every replica at once, which is what settling each ledger it reads at t gives, because decisions come
in time order (sim/cluster/ledger.py)."""
from __future__ import annotations

import heapq

TOKENS, REQUESTS = "tokens", "requests"


class LedgerBook:
    """The ledgers of one pool (index = replica position in the pool). `key`: the load the heap orders by
    (TOKENS: outstanding tokens, REQUESTS: outstanding requests)."""

    def __init__(self, ledgers, key: str):
        self.ledgers = list(ledgers)
        self.key = key
        self.later: list = []               # (time, pool index, tokens): departures not yet counted
        self.version = [0] * len(self.ledgers)
        self.heap = [(0, i, 0) for i in range(len(self.ledgers))]    # (load, pool index, version); stale lapse
        for i, ledger in enumerate(self.ledgers):
            if ledger.routed or ledger.later:
                raise ValueError("a book starts from empty ledgers")
            ledger.book, ledger.index = self, i

    def changed(self, ledger) -> None:
        """A ledger's counts moved: its current load joins the heap (its earlier entry lapses)."""
        i = ledger.index
        v = self.version[i] + 1
        self.version[i] = v
        load = ledger.routed_tokens - ledger.completed_tokens if self.key == TOKENS else \
            ledger.routed - ledger.completed
        heap = self.heap
        heapq.heappush(heap, (load, i, v))
        if len(heap) > 4 * len(self.ledgers) + 1024:    # mostly lapsed entries: rebuild from the current ones
            self.heap = [e for e in heap if e[2] == self.version[e[1]]]
            heapq.heapify(self.heap)

    def departed(self, ledger, t: float, tokens: int) -> None:
        heapq.heappush(self.later, (t, ledger.index, tokens))

    def settle(self, now: float) -> None:
        """Count on every ledger what left before `now`."""
        later, ledgers = self.later, self.ledgers
        while later and later[0][0] < now:
            _, i, tokens = heapq.heappop(later)
            ledger = ledgers[i]
            ledger.completed += 1
            ledger.completed_tokens += tokens
            self.changed(ledger)

    def least(self, now: float) -> int:
        """The lowest pool index among the replicas with the least load, as the router would read it at `now`."""
        self.settle(now)
        heap, version = self.heap, self.version
        while heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]
