"""What a router knows of one replica: the requests and tokens it sent there and has seen leave, kept symmetric.

Every request a pool's router sends is charged once, by id, with the tokens that pool counts for it; whatever way
it leaves that replica (completes, hands its KV to a decode replica, is refused or dropped as infeasible) the same
charge is taken back. So outstanding requests and tokens can never go negative, and after a run that was not cut
short every ledger is empty (sim/cluster/cluster.py checks it). What a pool counts per request:
- serve (no disaggregation): prompt + output tokens, the work and the KV the request brings;
- prefill: prompt tokens, the work done there (its one token rides on the last prompt position);
- decode: prompt + output tokens, the KV the request will hold there while it generates."""
from __future__ import annotations


class LedgerError(RuntimeError):
    """A hand-off the cluster driver got wrong (a bug, never a user mistake)."""


class RouterLedger:
    __slots__ = ("routed", "routed_tokens", "completed", "completed_tokens", "open")

    def __init__(self):
        self.routed = self.routed_tokens = self.completed = self.completed_tokens = 0
        self.open: dict = {}               # request id → tokens charged, while the request is on this replica

    def send(self, rid, tokens: int) -> None:
        if rid in self.open:
            raise LedgerError(f"request {rid} sent twice to one replica")
        self.open[rid] = tokens
        self.routed += 1
        self.routed_tokens += tokens

    def finish(self, rid) -> None:
        tokens = self.open.pop(rid, None)
        if tokens is None:
            raise LedgerError(f"request {rid} left a replica it was never sent to")
        self.completed += 1
        self.completed_tokens += tokens

    @property
    def outstanding_requests(self) -> int:
        return len(self.open)

    @property
    def outstanding_tokens(self) -> int:
        return self.routed_tokens - self.completed_tokens
