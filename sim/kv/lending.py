"""KV lending (EconoServe's KVC pipelining): a GT's allocated-but-not-yet-written blocks are lent to a shorter GT.

Blocks move between requests' allocations, never through the free pool, so lent space is counted exactly once
(in the borrower) and returns to its lender when the borrower finishes or is preempted. A lender that is gone
by then passes the claim to its own lender, or to the free pool."""
from __future__ import annotations


class Loan:
    __slots__ = ("lender", "borrower", "blocks")

    def __init__(self, lender, borrower, blocks):
        self.lender, self.borrower, self.blocks = lender, borrower, blocks


class LoanLedger:
    """Who lent how many blocks to whom, on top of a KVCacheManager's per-request block counts."""

    def __init__(self, memory):
        self.memory = memory
        self.by_borrower: dict[int, Loan] = {}
        self.by_lender: dict[int, list] = {}
        self.lent_blocks_total = 0

    def lendable_blocks(self, lender) -> int:
        """Blocks of `lender`'s allocation that it has not written (its own, not counting what it borrowed)."""
        written = self.memory.blocks_for(lender.cached + 1)   # +1: the slot of the token it writes next
        return max(0, lender.blocks - written)

    def lend(self, lender, borrower, blocks: int) -> bool:
        if blocks <= 0 or borrower.id in self.by_borrower or blocks > self.lendable_blocks(lender):
            return False
        lender.blocks -= blocks
        borrower.blocks += blocks
        loan = Loan(lender, borrower, blocks)
        self.by_borrower[borrower.id] = loan
        self.by_lender.setdefault(lender.id, []).append(loan)
        self.lent_blocks_total += blocks
        return True

    def borrowed(self, req) -> int:
        loan = self.by_borrower.get(req.id)
        return loan.blocks if loan else 0

    def outstanding(self, lender) -> list:
        return self.by_lender.get(lender.id, [])

    def settle(self, req, lender_alive) -> int:
        """`req` is about to release its KV: return its loan (from its own blocks, or from the free pool if
        the engine already freed them) and hand loans it made to its own lender. Returns blocks returned."""
        returned = 0
        loan = self.by_borrower.pop(req.id, None)
        parent = loan.lender if loan else None
        if loan is not None:
            self.by_lender[parent.id].remove(loan)
            if not self.by_lender[parent.id]:
                del self.by_lender[parent.id]
            if lender_alive(parent):
                # What `req` lent on (it hosted shorter GTs in turn) goes back to the parent with those loans, below;
                # the rest of the loan returns now.
                give = loan.blocks - sum(sub.blocks for sub in self.by_lender.get(req.id, ()))
                if req.blocks:                             # still held by the borrower: move them back
                    req.blocks -= give
                else:                                      # already freed into the pool: reclaim them
                    self.memory.free_blocks -= give
                parent.blocks += give
                returned = give
        for sub in self.by_lender.pop(req.id, []):         # loans this request made outlive it
            if parent is not None and lender_alive(parent):
                sub.lender = parent
                self.by_lender.setdefault(parent.id, []).append(sub)
            else:
                sub.lender = None
                del self.by_borrower[sub.borrower.id]      # the borrower now simply owns those blocks
        return returned
