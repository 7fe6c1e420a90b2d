"""Memory invariants checked after every scheduling decision and commit (shared by the EconoServe/ALISE tests)."""
from sim.engine.request import DONE, RUNNING, SWAPPED


def check_memory(sim, batch=None):
    """No block is double-counted or lost, and no request on the GPU holds fewer KV slots than tokens cached."""
    mem, view = sim.memory, sim.view
    held = 0
    for r in sim.requests:
        if r.state == RUNNING:
            held += r.blocks
            assert r.blocks * mem.block_size >= r.cached, f"{r!r} lost KV: {r.blocks} blocks < {r.cached} tokens"
        else:
            assert r.blocks == 0, f"{r!r} holds {r.blocks} GPU blocks while {r.state}"
        if r.state != SWAPPED:
            assert r.swap_blocks == 0 or r.state == DONE and r.swap_blocks == 0
    assert held + mem.free_blocks == mem.total_blocks, (held, mem.free_blocks, mem.total_blocks)
    assert 0 <= mem.free_blocks <= mem.total_blocks
    swapped = sum(r.swap_blocks for r in sim.requests if r.state == SWAPPED)
    assert swapped + mem.swap_free_blocks == mem.swap_total_blocks
    if batch is not None:
        for r, c in zip(batch.reqs, batch.tokens):
            assert r.state == RUNNING, f"{r!r} scheduled while not on the GPU"
            assert r.blocks * mem.block_size >= r.cached + c, f"{r!r} scheduled {c} tokens without KV for them"


def check_loans(policy):
    """Lent space is counted once (in the borrower) and a lender never loses a token it has written."""
    ledger = getattr(policy, "ledger", None)
    if ledger is None:
        return
    for loan in ledger.by_borrower.values():
        b = loan.borrower
        assert b.state != DONE, "a finished borrower still holds a loan"
        if b.state == RUNNING:          # a guest may host shorter GTs in turn (recursive pipelining)
            relent = sum(sub.blocks for sub in ledger.by_lender.get(b.id, []))
            assert b.blocks + relent >= loan.blocks, f"borrower {b!r} holds fewer blocks than it borrowed"
        if loan.lender is not None:
            assert loan in ledger.by_lender[loan.lender.id]
    for lid, loans in ledger.by_lender.items():
        for loan in loans:
            assert loan.lender.id == lid and ledger.by_borrower.get(loan.borrower.id) is loan


def instrument(sim):
    """Wrap the policy so every schedule and commit is followed by the invariant checks; returns a counter."""
    pol = sim.policy
    sched, commit = pol.schedule, pol.on_commit
    seen = {"steps": 0}

    def schedule(view):
        b = sched(view)
        check_memory(sim, b)
        check_loans(pol)
        seen["steps"] += 1
        return b

    def on_commit(view, batch, dt):
        commit(view, batch, dt)
        check_memory(sim)
        check_loans(pol)

    pol.schedule, pol.on_commit = schedule, on_commit
    return seen
