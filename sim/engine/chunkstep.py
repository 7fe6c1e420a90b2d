"""A chunked prefill's next step beside the decode cohort, made without the scheduler: the same batch, cheaper.

On a busy replica under Sarathi-Serve or vLLM v1 most scheduled steps (59% on the 100-replica fleet benchmark) find
one state: nothing queued, the decode cohort, and one running request part way through its prompt. For the unified
scheduler itself (not a subclass) in decode-first or running-first order, hybrid and chunked, schedule() then
(1) takes the whole cohort if its n decodes fit the budget C and its KV blocks due fit free memory, and (2) gives
the prefill a chunk of min(prompt left, C - n, the chunk cap, P - n (or P where P counts prefill tokens only))
tokens if that is positive and its blocks fit what is left; running-first also needs the prefill to be last in
the running order (else _take_cohort leaves the cohort to the per-request path). When both fit, next_batch makes
that batch with the same state changes (the cohort's take, the prefill's blocks and stamp); when either does not,
it changes nothing and the caller asks the policy, whose evictions or per-request path decide. The rule lives
here rather than as a policy method so that the policies' code, which the reproduction report's row stamps hash,
is unchanged (as specstretch.next_order)."""
from __future__ import annotations

from policies.base import Batch
from sim.engine.request import RUNNING


def rule(policy, view):
    """The knobs next_batch needs when the policy's steps in that state can be made here (else None); fixed for
    a run. Only with a decode cohort (the engine checked Policy.decode_cohort), no adapters and no drafts."""
    from policies.unified import UnifiedScheduler
    c = policy.config
    if (type(policy) is not UnifiedScheduler or view.cohort is None or getattr(view, "lora", None) is not None
            or getattr(view, "spec_tokens", 0) or not (c.hybrid and c.chunked)
            or c.order not in ("decode_first", "running_first")):
        return None
    return policy.C, policy.P, policy.chunk_cap, c.p_counts_decode_tokens, c.order == "running_first"


def next_batch(knobs, view):
    """The batch schedule() would return with nothing queued and exactly one running request outside the cohort,
    that request in its prefill; None (and nothing changed) when this is not that state or something does not
    fit."""
    r = view.loose[0]
    m = r.cached
    if r.state != RUNNING or m >= r.input_tokens:
        return None
    C, P, cap, p_counts_decode, running_first = knobs
    cohort, mem = view.cohort, view.memory
    n = cohort.n
    if n > C or (running_first and view.running[-1] is not r):
        return None
    c = min(r.input_tokens - m, C - n, cap, P - n if p_counts_decode else P)
    if c <= 0:
        return None
    extra = -(-(m + c) // mem.block_size) - r.blocks
    if extra < 0:
        extra = 0
    stamp = view.iteration
    batch = Batch()
    if n:
        context = cohort.take(stamp, extra)         # None: the cohort's blocks and the chunk's do not both fit
        if context is None:
            return None
        batch.cohort, batch.cohort_context, batch.num_tokens = n, context, n
    elif extra > mem.free_blocks:
        return None
    mem.free_blocks -= extra
    r.blocks += extra
    r.sched_stamp = stamp
    batch.add(r, c, True)
    return batch
