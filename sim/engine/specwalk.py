"""Uniform steady verify steps in one tight loop: every request verifies all k drafts, so a step's price is a function
of one integer.

sim/engine/specstretch.py takes steady verify steps one at a time with the general step's work: per request the
chunk size, the batch's five sums, a cost-model call for the target and k (cached) calls for the drafter. Most steady
steps are simpler: while every running request has more than k + 1 tokens left, each is scheduled with exactly
1 + k tokens and none can finish, so the batch's sums are fixed but for Σ context (pk): n verify chunks of k + 1
tokens, Σc² = n (k + 1)², Σc·m = (k + 1) pk; the drafter's one-token passes read pk + n, pk + 2n, ... tokens. Such
steps are taken here with the step's price from pk alone (the cost model's own float operations, in its order, for
a roofline model; a call per step otherwise), the KV each request must reserve for the next step worked out in the
commit of this one, and the state in locals.

Everything else is the plain loop's, in its order: the acceptance draws (one per request per step, in the running
order, from the one generator), reservations checked whole before the step, trims of rejected drafts at the step's
end (the prefix cache stamps its frees with the clock), token times, counters, rows or tally. The loop stops before
a step that is not uniform (a request with k + 1 tokens or fewer left), whose blocks do not fit, that would end at
or after the next arrival event (or, in a cluster, past what the router has decided) or pass max_iterations;
specstretch's loop then takes that step."""
from __future__ import annotations

from itertools import repeat

from costmodels.base import CostModel
from costmodels.roofline import RooflineCostModel
from sim.engine.speculative import PASS_CACHE



def target_price(cm, n: int, k1: int):
    """pk -> seconds of a step of n verify chunks of k1 tokens with Σ context pk: time_from_sums(n k1, n, n k1²,
    k1 pk, pk, 0, 0), its float operations inlined for a roofline model."""
    T, c2 = n * k1, n * k1 * k1
    cls = type(cm)
    if not (isinstance(cm, RooflineCostModel) and cls.time_from_sums is RooflineCostModel.time_from_sums
            and cls.cpu_time is CostModel.cpu_time):
        f = cm.time_from_sums
        return lambda pk: f(T, n, c2, k1 * pk, pk, 0, 0)
    cm.time_from_sums(T, n, c2, 0, 0, 0, 0)              # grows the tables to T if they are short
    a0, a1, a2, a3, a4 = cm._pre
    A1, A2, A4 = a1 * c2, a2 * (T - 0), a4 * n
    L, E, S = cm._layer[T], cm._emb[T], cm._step[n]
    layers, ov, cpu = cm.layers, cm.params_in_use["step_overhead_s"], cm.cpu_time(n)

    def price(pk):
        # time_from_sums: attn = 0.0, then += the prefill terms left to right; layer + layers*attn + emb + step
        attn = 0.0 + ((((a0 * (k1 * pk) + A1) + A2) + a3 * pk) + A4)
        return (((L + layers * attn) + E) + S) + ov + cpu
    return price


def draft_pass(cm, n: int):
    """kv -> seconds of one drafter pass over n one-token decodes reading kv tokens, as Speculation._sums_time
    prices it: time_from_sums(n, 0, 0, 0, 0, n, kv) - cpu_time(n), inlined for a roofline model's smooth decode."""
    cls = type(cm)
    if not (isinstance(cm, RooflineCostModel) and cls.time_from_sums is RooflineCostModel.time_from_sums
            and cls.cpu_time is CostModel.cpu_time and not cm._dec[5] and n not in cm._small):
        f, cpu = cm.time_from_sums, cm.cpu_time(n)
        return lambda kv: f(n, 0, 0, 0, 0, n, kv) - cpu
    cm.time_from_sums(n, 0, 0, 0, 0, n, 1)               # grows the tables to n if they are short
    c = cm._dec
    c0, occ, C2, c3, floor = c[0], cm._occ[n], c[2] * n, c[3], cm._kv_read_s
    L, E, S = cm._layer[n], cm._emb[n], cm._step[n]
    layers, ov, cpu = cm.layers, cm.params_in_use["step_overhead_s"], cm.cpu_time(n)

    def price(kv):
        attn = max(kv * c0 * occ + C2 + c3, kv * floor)
        return ((((L + layers * attn) + E) + S) + ov + cpu) - cpu
    return price


def applies(sim) -> bool:
    """Uniform steps are walked here when the draws are the plain ones a step reads (checked per stretch) and the
    KV manager's used tokens are the free-block count's (fixed for the run)."""
    from sim.kv.paged import KVCacheManager
    return sim.spec_steady and type(sim.memory).used_tokens is KVCacheManager.used_tokens \
        and type(sim.memory).offloaded_tokens is KVCacheManager.offloaded_tokens


def uniform_steps(sim, now: float, order: list, dcm, scale: float, prices: dict):
    """Take uniform steady verify steps of `order` from `now` (the last scheduled step's requests, the whole running
    set; with requests queued the caller has checked that n (k + 1) is the last scheduled step's token count).
    Returns (steps taken, the clock after them). `prices`: pricing by batch size n (Speculation.walk_prices), made
    on first use: the target's step, the drafter's pass and the drafter passes priced so far, by KV read."""
    view, mem, spec = sim.view, sim.memory, sim.speculation
    mode = spec.walk_draws(order)
    if mode is None:
        return 0, now
    k = spec.k
    k1 = k + 1
    n = len(order)
    lefts = [r.output_tokens - r.generated for r in order]
    if min(lefts) <= k1:
        return 0, now
    fns = prices.get(n)
    if fns is None:
        fns = prices[n] = (target_price(sim.costmodel, n, k1), draft_pass(dcm, n) if dcm is not None else None, {})
    target, dpass, passes = fns
    if len(passes) >= PASS_CACHE:
        passes.clear()
    known = passes.get
    clock = sim.arrival_clock
    arrival = clock.time
    cluster = clock.cluster
    bs = mem.block_size
    trim = mem.trim
    max_it = sim.max_iterations
    stop = max_it - view.iteration if max_it else -1
    draws = spec._draws
    fresh = mode == "rate"
    pop = draws.pop if fresh else repeat(mode).__next__
    record = sim.record_iterations
    rows = sim.iter_rows
    running_n = len(view.running)
    queue_n = len(view.waiting) + len(view.swapped)
    total_blocks = mem.total_blocks
    offloaded = mem.offloaded_tokens
    # per request, in locals until the end: KV tokens, capacity (blocks x block size), token-time appenders
    m0 = [r.cached for r in order]
    ms = list(m0)
    caps = [r.blocks * bs for r in order]
    ext = [r.token_times.extend for r in order]
    rng = range(n)
    pk = sum(ms)
    # (request, blocks) it must add for the next step's 1 + k tokens, past those it holds
    pend = [(i, -(-(m + k1 - c) // bs)) for i, m, c in zip(rng, ms, caps) if m + k1 > c]
    need = sum(e for _, e in pend)
    free = mem.free_blocks
    kvc = view.kv_cached_tokens
    it = view.iteration
    taken = produced = freed = used_sum = used_max = 0
    draft_total = spec.draft_time_s
    low = min(lefts)
    while low > k1 and need <= free and taken != stop:
        dt = target(pk)
        if dpass is not None:
            # the drafter's passes read kv, kv + n, ...; the next step's start G tokens later, so most were
            # priced already (a pure function of kv: the same float whether looked up or computed)
            kv = pk + n
            d = known(kv)
            if d is None:
                d = passes[kv] = dpass(kv)
            for i in range(1, k):
                x = known(kv + i * n)
                if x is None:
                    x = passes[kv + i * n] = dpass(kv + i * n)
                d += x
            d *= scale
            dt = dt + d
        else:
            dt = dt + 0.0
        end = now + dt
        if end >= arrival or (cluster and not clock.synced(end)):
            break
        if dpass is not None:
            draft_total += d
        # the step: its reservations, then the commit (draws in the running order)
        if need:
            for i, e in pend:
                caps[i] += e * bs
            free -= need
            pend = []
            need = 0
        start, now = now, end
        it += 1
        gained = 0
        low = 1 << 62
        for i in rng:
            try:
                j = pop()
            except IndexError:                          # the block is used up: the generator's next one
                draws = spec.refill()
                pop = draws.pop
                j = pop()
            if j > k:
                j = k
            g = j + 1
            m = ms[i] + g
            ms[i] = m
            left = lefts[i] - g
            lefts[i] = left
            if left < low:
                low = left
            gained += g
            ext[i]([now] * g)
            cap = caps[i]
            if cap - m >= bs:                           # blocks past those m tokens need: the rejected drafts' tail
                r = order[i]
                r.blocks = cap // bs
                mem.clock = now
                x = trim(r, m)
                freed += x
                free += x
                cap -= x * bs
                caps[i] = cap
            if m + k1 > cap:                            # the next step's reservation
                e = -(-(m + k1 - cap) // bs)
                pend.append((i, e))
                need += e
        pk += gained
        produced += gained
        kvc += gained
        used = (total_blocks - free) * bs
        if record:
            rows.append((start, dt, n, 0, n, running_n, queue_n, used, kvc - offloaded, 0, 0, 0))
        else:
            used_sum += used
            if used > used_max:
                used_max = used
        taken += 1
    if not taken:
        return 0, now
    if fresh:
        spec._draws = draws
    for r, m, a, c in zip(order, ms, m0, caps):
        r.cached = m
        r.generated += m - a
        r.blocks = c // bs
    mem.free_blocks = free
    mem.clock = now
    view.now = start
    view.iteration = it
    view.kv_cached_tokens = kvc
    sim.tokens_generated += produced
    spec.steps += n * taken
    spec.proposed += n * k * taken
    spec.accepted += produced - n * taken
    spec.tokens += produced
    spec.full_steps += n * taken
    spec.full_tokens += produced
    spec.freed_blocks += freed
    spec.draft_time_s = draft_total
    if not record:
        tally = sim.tally
        tally.add(n, running_n, 0, taken)
        tally.kv_alloc_tokens += used_sum
        if used_max > tally.kv_alloc_max:
            tally.kv_alloc_max = used_max
    sim.spec_walked_iterations += taken
    return taken, now
