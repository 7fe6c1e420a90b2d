"""Scheduled steps of the two commonest states beside the decode cohort, made without the scheduler: the same batch.

On a busy replica under Sarathi-Serve most scheduled steps (98% on the fleet benchmark's workload, 10 replicas
× 30k) find one of two states: nothing queued, the decode cohort, and one running request part way through its
prompt (59%); or no running request outside the cohort and one request waiting, just arrived (39%). For the
unified scheduler itself (not a subclass) in decode-first or running-first order, hybrid and chunked, schedule() then
(1) takes the whole cohort if its n decodes fit the budget C and its KV blocks due fit free memory, and (2) gives
the prefill a chunk of min(prompt left, C - n, the chunk cap, P - n (or P where P counts prefill tokens only))
tokens if that is positive and its blocks fit what is left (a waiting request: it is admitted with the policy's
admission target, the watermark applying); running-first also needs a running prefill to be last in the running
order (else _take_cohort leaves the cohort to the per-request path). When everything fits, these functions make
that batch with the same state changes (the cohort's take, the prefill's blocks and stamp, the admission through
the view); when anything does not, they change nothing and the caller asks the policy, whose evictions or
per-request path decide. Admissions are made here only without prefix caching (a lookup would come between the
cohort's take and the admission, and may evict), adapters or a budget on running requests that is reached. The rule
lives here rather than as a policy method so that the policies' code, which the reproduction report's row stamps
hash, is unchanged (as specstretch.next_order)."""
from __future__ import annotations

from policies.base import Batch
from sim.engine.request import RUNNING, WAITING
from sim.engine.view import ReplicaView
from sim.kv.paged import KVCacheManager


def rule(policy, view):
    """The knobs step() needs when the policy's steps in those states can be made here (else None); fixed for
    a run. Only with a decode cohort (the engine checked Policy.decode_cohort), no adapters and no drafts."""
    from policies.unified import UnifiedScheduler
    c = policy.config
    if (type(policy) is not UnifiedScheduler or view.cohort is None or view.lora is not None
            or view.spec_tokens or not (c.hybrid and c.chunked)
            or c.order not in ("decode_first", "running_first")):
        return None
    mem = view.memory
    admits = (not view.prefix_caching and not c.static_batching and type(view).admit is ReplicaView.admit
              and type(mem).admit is KVCacheManager.admit)
    return (policy.C, policy.P, policy.chunk_cap, c.p_counts_decode_tokens, c.order == "running_first",
            policy if admits else None)


def step(knobs, view):
    """The batch schedule() would return in either state (see the module), or None (nothing changed)."""
    if view.swapped:
        return None
    if not view.waiting:
        return next_batch(knobs, view) if len(view.loose) == 1 else None
    if len(view.waiting) == 1 and not view.loose and knobs[5] is not None:
        return admission(knobs, view)
    return None


def next_batch(knobs, view):
    """The batch schedule() would return with nothing queued and exactly one running request outside the cohort,
    that request in its prefill; None (and nothing changed) when this is not that state or something does not
    fit."""
    r = view.loose[0]
    m = r.cached
    if r.state != RUNNING or m >= r.input_tokens:
        return None
    C, P, cap, p_counts_decode, running_first, _ = knobs
    cohort, mem = view.cohort, view.memory
    n = cohort.n
    if n > C or (running_first and view.running[-1] is not r):
        return None
    c = min(r.input_tokens - m, C - n, cap, P - n if p_counts_decode else P)
    if c <= 0:
        return None
    extra = max(0, mem.blocks_for(m + c) - r.blocks)
    stamp = view.iteration
    batch = Batch()
    if n:
        context = cohort.take(stamp, extra)         # None: the cohort's blocks and the chunk's do not both fit
        if context is None:
            return None
        batch.cohort, batch.cohort_context, batch.num_tokens = n, context, n
    elif extra > mem.free_blocks:
        return None
    mem.reserve(r, m + c)                           # fits: checked above (the cohort's blocks taken first)
    r.sched_stamp = stamp
    batch.add(r, c, True)
    return batch


def admission(knobs, view):
    """The batch schedule() would return with no running request outside the cohort and one waiting: the cohort and
    the waiting request's first chunk, admitted with the policy's admission target; None (and nothing changed) when
    the budget, the running cap, the cohort's blocks or the admission (watermark included) does not fit."""
    r = view.waiting[0]
    if r.state != WAITING or r.blocks:
        return None
    C, P, cap, p_counts_decode, _, policy = knobs
    cohort, mem = view.cohort, view.memory
    n = cohort.n
    if n > C:
        return None
    c = min(r.input_tokens - r.cached, min(P - n if p_counts_decode else P, C - n), cap)
    if c <= 0 or (policy.R_max and len(view.running) >= policy.R_max):
        return None
    tokens = policy._admission_target(r, c)
    extra = mem.blocks_for(tokens)
    reserve = extra + mem.watermark_blocks if extra > 0 else 0     # KVCacheManager.admit's rule, after the cohort
    stamp = view.iteration
    batch = Batch()
    if n:
        context = cohort.take(stamp, reserve)       # None: the cohort's blocks and the admission do not both fit
        if context is None:
            return None
        batch.cohort, batch.cohort_context, batch.num_tokens = n, context, n
    elif reserve > mem.free_blocks:
        return None
    if not view.admit(r, tokens):                   # fits: checked above as KVCacheManager.admit checks
        raise RuntimeError(f"chunkstep: {r!r} did not fit its admission after the cohort's take")
    r.sched_stamp = stamp
    batch.add(r, c, True)
    return batch
