"""Steady speculative decode steps without the scheduler: the plain loop's verify steps, same floats, same draws.

Between admissions, preemptions, completions and arrivals a speculating replica whose policy vouches for a steady
decode (Policy.steady_decode) runs the same step again and again: every running request verifies
k' = min(k, output left - 1) drafts, scheduled with 1 + k' tokens in the order the last scheduled step took them
(the policy's order is its running order or a static rank, neither of which changes while the running set does
not). Such a step is taken here without schedule(), the BatchShape or the policy's per-candidate checks: the
reservations, acceptance draws (from the one generator, in that order), KV trims, step time (the cost model's
time_from_sums, which accepts_decode_sums promises equals batch_time of the shape) and commit are the plain
loop's own, in its order, so the tables are bit-identical. A run of such steps stops before a step whose blocks
do not fit (the plain loop preempts), after a step in which an arrival is delivered, at max_iterations and, with
requests queued, before a step whose token count differs from the last scheduled one (a smaller budget use could
let a queued prefill in; with nothing queued the count only shrinks, within budget) or after a completion; with
nothing queued on a lone replica a completion only shortens the order (the policy vouches again). A stretch also
starts right after the step that admitted the last prefill when the policy knows the next order without
scheduling (next_order). Acceptance draws cannot be known before the step, so there is no closed form;
the uniform steps (every request verifies all k drafts), and on a lone replica with nothing queued also requests'
last verify passes to a completion and the step that delivers an arrival, are worked out a window at a time
(specwalk.py), the rest here one at a time (on the example, 365 of 29,209 steady steps)."""
from __future__ import annotations

from functools import cache

from sim.engine import specwalk
from sim.engine.request import RUNNING
from sim.engine.speculative import verify_pass


def applies(sim) -> bool:
    """Can this Simulation take steady speculative steps here at all (fixed for the run)?"""
    spec, mem = sim.speculation, sim.memory
    return (spec is not None and sim.exact_fast_paths and sim.lora is None
            and sim.costmodel.accepts_decode_sums() and spec.sums and sim.view.plain_reserve
            and getattr(mem, "kv_bits", 16) == 16)


def next_order(policy, view, k: int):
    """After a step that admitted the last prefill: the running set in the order the next schedule() takes it, each
    request with its full verify pass (1 + min(k, left - 1) tokens), when that is known without scheduling; else
    None. Known for vLLM v1's unified scheduler itself (not a subclass) in running-first, decode-first or
    prefill-first order with nothing queued: its running group is view.running in order, and a decode's verify
    pass is clipped only by the token budget C, checked here. (The rule lives here rather than as a policy method
    so that the policies' code, which the reproduction report's row stamps hash, is unchanged.)"""
    if type(policy) is not _unified() or policy.config.order == "ranked" or view.waiting or view.swapped \
            or view.cohort is not None:
        return None
    tokens = 0
    for r in view.running:
        if not r.generated:                # no drafts before its first token (a P/D decode side): schedule it
            return None
        left = r.output_tokens - r.generated - 1
        tokens += 1 + (k if k < left else left)
    return list(view.running) if tokens <= policy.C else None


@cache
def _unified():
    """policies.unified.UnifiedScheduler, imported on first use (policies import the engine's modules)."""
    from policies.unified import UnifiedScheduler
    return UnifiedScheduler


def full_verify_step(batch, k: int) -> bool:
    """Before its commit: did the scheduled step give every request its full 1 + k' tokens, decodes only (the
    budget clipped no verify pass)?"""
    if batch.hold_output or batch.cohort:
        return False
    for r, c in zip(batch.reqs, batch.tokens):
        left = r.output_tokens - r.generated
        if r.cached < r.input_tokens or c != 1 + (k if left - 1 > k else left - 1):
            return False
    return True


def _survivors(sim, order: list, queued: bool, lone: bool):
    """After a steady step that completed requests: the order the next steps take, or None when the stretch ends.
    With nothing queued the freed KV admits nobody: the plain loop's next schedule() takes the rest of the running
    set in the same order, as the policy vouches again (a lone replica without sessions: a completion there
    changes no other state the steps read)."""
    if queued or not lone or not sim.policy.steady_decode(sim.view, False):
        return None
    it = sim.view.iteration
    rest = []
    for r in order:
        if r.state == RUNNING:
            rest.append(r)
        else:
            r.sched_stamp = it
    return rest or None


def steady_steps(sim, now: float, order: list, full_tokens: int):
    """Take steady verify steps of `order` (the last scheduled step's requests, which are the whole running set)
    from `now`; a generator (a cluster replica yields as the plain loop does). Returns the replica's clock.

    The plain loop's calls are inlined where their class is known (KVCacheManager's blocks_for and reserve, as
    view.plain_reserve says; the rate's draws taken from the generator's block in order) and the speculation
    counters kept in locals: integer sums, written back at the end."""
    view, mem, cm, spec, clock = sim.view, sim.memory, sim.costmodel, sim.speculation, sim.arrival_clock
    k = spec.k
    cluster = clock.cluster
    lone = not cluster and sim.sessions is None
    queued = bool(view.waiting or view.swapped)
    arrived = sim.arrived
    bs = mem.block_size
    record = sim.record_iterations
    rows = sim.iter_rows
    time_from_sums = cm.time_from_sums
    # the drafter's passes as Speculation.draft_time prices them (no prefill chunk here): its cost model and scale
    dcm, scale = ((spec.draft_cm, 1.0) if spec.draft_cm is not None else (spec.target, spec.fraction)) \
        if spec.cfg.method != "ngram" else (None, 0.0)
    if not scale:
        dcm = None
    sums_time = spec._sums_time
    trim = mem.trim
    fresh = spec.rate_only()               # else spec.draw: per-request lists first, or a rate of 0 or 1
    max_it = sim.max_iterations
    waiting, swapped, running = view.waiting, view.swapped, view.running
    n = len(order)
    taken = freed = 0
    tally = [0] * 6                        # verify passes, drafts, accepted, tokens, full passes, their tokens
    cs = [0] * n
    # uniform steps (every request verifies k drafts) go through specwalk's tight loop; this loop takes the step
    # that stopped it (a request near its end, an arrival, a KV shortfall, ...) and any other steady one
    walkable = sim.spec_walk and not (queued and n * (k + 1) != full_tokens)
    tails = lone and not queued            # windows may run on to a completion (then the order shrinks, below)
    prices = spec.walk_prices
    while not (max_it and view.iteration >= max_it):
        if walkable:
            walked, now, finished = specwalk.uniform_steps(sim, now, order, dcm, scale, prices, tails)
            if walked:
                taken += walked
                if max_it and view.iteration >= max_it:
                    break
            if sim.arrived != arrived:     # its last step delivered an arrival, as the loop's step below would
                break
            if finished:
                rest = _survivors(sim, order, queued, lone)
                if rest is None:
                    break
                order, n, cs = rest, len(rest), [0] * len(rest)
                continue
        # the step's tokens, blocks to reserve and batch sums (as _spec_batch_time sums them); the reservations
        # are checked whole before any is made (a shortfall is the plain loop's preemption)
        need = tokens = n_pre = pt = c2 = ck = pk = n_dec = kv_read = 0
        grow = []
        for i, r in enumerate(order):
            left = r.output_tokens - r.generated
            m = r.cached
            if left > k:
                c = k + 1
            else:
                c = left
            cs[i] = c
            e = -(-(m + c) // bs) - r.blocks
            if e > 0:
                need += e
                grow.append((r, e))
            if c == 1:
                n_dec += 1
                kv_read += m + 1
            else:
                n_pre += 1
                pt += c
                c2 += c * c
                ck += c * m
                pk += m
        tokens = pt + n_dec
        if need > mem.free_blocks or (queued and tokens != full_tokens):
            break
        view.now = now
        view.iteration += 1
        mem.clock = now
        for r, e in grow:                  # KVCacheManager.reserve: the blocks past those held
            r.blocks += e
        mem.free_blocks -= need
        # verify passes' drafts run at context m + 1: their sum is pk + n_pre
        dt = time_from_sums(tokens, n_pre, c2, ck, pk, n_dec, kv_read) + (
            sums_time(dcm, scale, 0, 0, 0, 0, 0, n_pre, pk + n_pre) if n_pre and dcm is not None else 0.0)
        start, now = now, now + dt
        if cluster and not clock.synced(now):
            yield now
        if clock.time <= now:
            sim._deliver(start, now)
        mem.clock = now
        # the commit: _commit's verify branch, or its plain decode branch for the last token (k' = 0)
        finished = False
        generated = 0
        for r, c in zip(order, cs):
            if c > 1:
                gained = verify_pass(spec, r, c - 1, fresh, tally)
                m = r.cached + gained
                r.cached = m
                if r.blocks > -(-m // bs):     # trim releases nothing otherwise (and changes nothing)
                    freed += trim(r, m)
                r.token_times.extend([now] * gained)
            else:
                gained = 1
                r.cached += 1
                r.token_times.append(now)
            g = r.generated + gained
            r.generated = g
            generated += gained
            if g >= r.output_tokens:
                if lone:               # its TBT statistics later, with others' (finalize_many: the same floats)
                    sim.finish_batched(r, now)
                else:
                    sim._finish(r, now)
                finished = True
        view.kv_cached_tokens += generated      # (integers: the plain loop's per-request adds, summed)
        sim.tokens_generated += generated
        if finished:
            running[:] = [r for r in running if r.state == RUNNING]
        if record:
            rows.append((start, dt, n, 0, n, len(running), len(waiting) + len(swapped), mem.used_tokens,
                         view.kv_cached_tokens - mem.offloaded_tokens, 0, 0, 0))
        else:
            sim.tally.add(n, len(running), mem.used_tokens)
        taken += 1
        if sim.arrived != arrived:
            break
        if finished:
            rest = _survivors(sim, order, queued, lone)
            if rest is None:
                break
            order, n, cs = rest, len(rest), [0] * len(rest)
            walkable = sim.spec_walk
    if taken:
        it = view.iteration
        for r in order:
            r.sched_stamp = it
        sim.fast_forward_iterations += taken
        spec.verified_many(*tally, freed)
    return now
