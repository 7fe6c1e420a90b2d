"""Uniform steady verify steps, a window of them at a time: every request verifies all k drafts, so a step's price is
a function of one integer and a request's tokens over many steps a running sum of its draws.

sim/engine/specstretch.py takes steady verify steps one at a time with the general step's work. Most steady steps
are simpler: while every running request has more than k + 1 tokens left, each is scheduled with exactly 1 + k
tokens and none can finish, so the batch's sums are fixed but for Σ context (pk): n verify chunks of k + 1 tokens,
Σc² = n (k + 1)², Σc·m = (k + 1) pk; the drafter's one-token passes read pk + n, pk + 2n, ... tokens. Such steps
are priced from pk alone (step_price: the cost model's own float operations, in its order, a block of pks at once
with numpy for a roofline model; a call per pk otherwise) and worked out a window at a time (_window): step s,
request i takes draw s n + i of the one generator's stream (the plain loop's order), so a request's gains over the
window are a strided slice of the draws and its KV tokens their running sum; its KV blocks change only where that
sum nears a block boundary (found by bisection: the block past it is reserved and, while the tokens kept stay
below it, trimmed back at the step's end, at that step's clock, as the prefix cache stamps its frees); the clock
is the steps' times added in order. On a lone replica with nothing queued a window also takes requests' last
verify passes (fewer drafts: those steps priced from their sums) up to the first completion, which it commits as
the plain loop does; and a window's last step may be the one that ends at or past the next arrival (it delivers
the arrival; the stretch then ends). Where a window does not apply (a short one, KV the window could need beyond
the free blocks, block sizes under k + 1) the same uniform steps go through a tight step-by-step loop
(uniform_steps).

Everything else is the plain loop's: reservations checked before each step, counters, rows or tally; a request's
token times over a window are kept as a run (Request.spans: the window's step ends, its tokens per step), written
out with others' when its TBT statistics are worked out (sim/metrics/tokens.py: unspan), the same floats.
Windows stop before a step they cannot take (a plain decode, the last token of a request; a request near its end
with requests queued; blocks that do not fit; in a cluster, a step past what the router has decided) or
max_iterations; specstretch's loop then takes that step."""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from functools import reduce
from itertools import accumulate, repeat
from operator import add

import numpy as np

from costmodels.base import CostModel
from costmodels.roofline import RooflineCostModel
from sim.engine.request import RUNNING

# after a window: another, none (uniform steps ended), the step-by-step loop, completions (the order shrinks)
MORE, DONE, STEP, FINISHED = "more", "done", "step", "finished"
WINDOW = 64            # uniform steps worked out at once at most (a stretch averages ~16 on the example)
MIN_WINDOW = 4         # fewer: the step-by-step loop is cheaper than the window's set-up
BLOCK = 2048           # uniform steps' prices worked out together, by Σ context (step_price; callgrind on the
                       # example: 512 and 4096 cost 1 % more, their fills' numpy calls or unused prices)
PRICED_BLOCKS = 64     # blocks kept at most, all batch sizes together (then dropped; ~128 KB each)
INF = math.inf


def _roofline(cm) -> bool:
    """A roofline model whose time_from_sums and cpu_time are the base ones (their float operations inlined below)."""
    cls = type(cm)
    return (isinstance(cm, RooflineCostModel) and cls.time_from_sums is RooflineCostModel.time_from_sums
            and cls.cpu_time is CostModel.cpu_time)


def step_price(cm, dcm, n: int, k: int, scale: float, kept: dict):
    """pk -> (seconds, the drafter's part) of a uniform step, as the step-by-step loop prices it: n verify chunks of
    k + 1 tokens with Σ context pk, time_from_sums(n (k + 1), n, n (k + 1)², (k + 1) pk, pk, 0, 0), plus (one
    float add) the drafter's k one-token passes over n decodes reading pk + n, pk + 2n, ... tokens, each
    time_from_sums(n, 0, 0, 0, 0, n, kv) - cpu_time(n), summed in that order and scaled as Speculation._sums_time
    adds them (0.0 without a drafter: `dcm` None). A pure function of pk, kept once priced in `kept` (shared by
    every batch size of the run, keyed by it, and emptied when full: a few MB at most).

    For a roofline target and drafter (smooth decode) the prices of BLOCK consecutive pks are worked out at once
    with numpy: time_from_sums's float operations in its order, elementwise (IEEE's, the scalar floats); the
    example's windows touch 30 blocks (13 batch sizes) for ~28,000 steps. Otherwise one pk at a time through the
    models' calls."""
    k1 = k + 1
    T, c2 = n * k1, n * k1 * k1
    f = cm.time_from_sums
    f(T, n, c2, 0, 0, 0, 0)                                  # grows the tables to T if they are short
    if dcm is not None:
        dcm.time_from_sums(n, 0, 0, 0, 0, n, 1)
    if _roofline(cm) and (dcm is None or _roofline(dcm) and not dcm._dec[5] and n not in dcm._small):
        a0, a1, a2, a3, a4 = cm._pre
        A1, A2, A4 = a1 * c2, a2 * (T - 0), a4 * n
        L, E, S = cm._layer[T], cm._emb[T], cm._step[n]
        layers, ov, cpu = cm.layers, cm.params_in_use["step_overhead_s"], cm.cpu_time(n)
        if dcm is not None:
            c = dcm._dec
            c0, occ, C2, c3, floor = c[0], dcm._occ[n], c[2] * n, c[3], dcm._kv_read_s
            dL, dE, dS = dcm._layer[n], dcm._emb[n], dcm._step[n]
            dlayers, dov, dcpu = dcm.layers, dcm.params_in_use["step_overhead_s"], dcm.cpu_time(n)
        def fill(b):
            pk = np.arange(b * BLOCK, (b + 1) * BLOCK, dtype=np.int64)
            # time_from_sums: attn = 0.0, then += the prefill terms left to right; layer + layers*attn + emb + step
            attn = 0.0 + ((((a0 * (k1 * pk) + A1) + A2) + a3 * pk) + A4)
            t = (((((L + layers * attn) + E) + S) + ov) + cpu)
            if dcm is None:
                return (t + 0.0).tolist(), [0.0] * BLOCK
            d = None
            for i in range(1, k1):                            # a pass: smooth decode attention, less its CPU time
                kv = pk + i * n
                x = np.maximum(((kv * c0) * occ + C2) + c3, kv * floor)
                x = (((((dL + dlayers * x) + dE) + dS) + dov) + dcpu) - dcpu
                d = x if d is None else d + x
            d = d * scale
            return (t + d).tolist(), d.tolist()

        def block(b):
            blk = kept.get((n, b))
            if blk is None:
                if len(kept) >= PRICED_BLOCKS:
                    kept.clear()
                blk = kept[n, b] = fill(b)
            return blk

        def price(pk):
            b = pk // BLOCK
            dts, ds = block(b)
            return dts[pk - b * BLOCK], ds[pk - b * BLOCK]

        def many(pks):
            """A window's nondecreasing pks: their prices and drafter's parts, as lists, a block's run at a time."""
            dts, ds = [], []
            i, end = 0, len(pks)
            while i < end:
                b = pks[i] // BLOCK
                base = b * BLOCK
                j = bisect_left(pks, base + BLOCK, i)
                bdts, bds = block(b)
                at = [p - base for p in pks[i:j]]
                dts += map(bdts.__getitem__, at)
                ds += map(bds.__getitem__, at)
                i = j
            return dts, ds
        return price, many
    passes: dict = {}                # a pass's seconds by KV read: a step's passes mostly repeat earlier ones'
    dcpu = dcm.cpu_time(n) if dcm is not None else 0.0

    def price(pk):
        p = kept.get((n, pk))
        if p is None:
            d = 0.0
            if dcm is not None:
                d = None
                for kv in range(pk + n, pk + k1 * n, n):
                    x = passes.get(kv)
                    if x is None:
                        x = passes[kv] = dcm.time_from_sums(n, 0, 0, 0, 0, n, kv) - dcpu
                    d = x if d is None else d + x
                d *= scale
            if len(kept) >= PRICED_BLOCKS * BLOCK:
                kept.clear()
                passes.clear()
            p = kept[n, pk] = (f(T, n, c2, k1 * pk, pk, 0, 0) + d, d)
        return p

    def many(pks):
        dts, ds = [], []
        for dt, d in map(price, pks):
            dts.append(dt)
            ds.append(d)
        return dts, ds
    return price, many


def window_prices(many, drafter: bool):
    """(pks, clock, arrival) -> (dts, ds, ends): a window's steps at nondecreasing Σ contexts pks priced (many:
    step_price's), the drafter's parts (None without one), and their ends (the clock's sequential adds), up to the
    first step that ends at or past `arrival`, included."""
    def prices(pks, now, arrival):
        if not pks:
            return [], [] if drafter else None, []
        dts, ds = many(pks)
        ends = list(accumulate(dts, initial=now))
        del ends[0]
        steps = bisect_left(ends, arrival) + 1
        if steps < len(ends):
            del ends[steps:], dts[steps:], ds[steps:]
        return dts, ds if drafter else None, ends
    return prices


def applies(sim) -> bool:
    """Uniform steps are walked here when the draws are the plain ones a step reads (checked per stretch) and the
    KV manager's used tokens are the free-block count's (fixed for the run)."""
    from sim.kv.paged import KVCacheManager
    return sim.spec_steady and type(sim.memory).used_tokens is KVCacheManager.used_tokens \
        and type(sim.memory).offloaded_tokens is KVCacheManager.offloaded_tokens


def _window(sim, now, order, mode, lefts, price, prices, arrival, tails):
    """Up to WINDOW steady verify steps worked out request by request: step s, request i reads draw s n + i, so a
    request's gains over the window are a strided slice of the draws and its KV tokens their running sum; its
    KV blocks change only where that sum crosses a block boundary (found by bisection), the steps' prices are the
    one loop over steps. The steps are uniform ones, and with `tails` (a lone replica, nothing queued) also
    requests' last verify passes (k_eff = left - 1 < k drafts: those steps priced from their sums), up to the
    first completion, which ends the window (FINISHED: the caller takes up the shorter order), or a request
    left with one token (its plain decode is the loop's). Nothing is done (0 returned) when the window would be
    short, the drawn block runs out within it, or the blocks the window could need at most do not fit the free
    ones (then a step could fall short: the step-by-step loop decides). Returns (steps taken, the clock, what
    follows)."""
    view, mem, spec = sim.view, sim.memory, sim.speculation
    n, k = len(order), spec.k
    k1 = k + 1
    low = min(lefts)
    # a step is uniform while every request has k + 2 tokens left or more; a tail step needs 2 (a verify pass)
    w = min(WINDOW, low - (1 if tails else k1))     # each step gains one token at least
    stop = sim.max_iterations
    if stop:
        w = min(w, stop - view.iteration)
    if w < (1 if tails and low <= k1 + MIN_WINDOW else MIN_WINDOW):
        return 0, now, STEP
    ms0 = [r.cached for r in order]
    pk = sum(ms0)
    if arrival < INF:                               # every uniform step takes price(pk) at least (monotone in
        w = min(w, int((arrival - now) / price(pk)[0]) + 1)    # pk), so the one delivering the arrival is within w
    cap = w
    fresh = mode == "rate"
    if fresh:
        draws = spec._draws
        while len(draws) < w * n:                   # the generator's next block, behind the draws left
            spec.more_draws()
        # the window's draws (a full verify pass's tokens each), last first as the list holds them (draw
        # q = s n + i at offset w n - 1 - q); request i's are every n-th from offset w n - 1 - i down
        wn = w * n
        tail = draws[len(draws) - wn:]
        seqs = [tail[wn - 1 - i::-n] for i in range(n)]
    else:
        seqs = [[mode + 1] * w for _ in range(n)]
    cums = [list(accumulate(g)) for g in seqs]
    t0 = w                                          # the first tail step
    if tails:
        for left, cum in zip(lefts, cums):          # up to the step ending with one token left or none
            w = min(w, bisect_left(cum, left - 1) + 1)
            if left <= k:
                t0 = 0
            else:                                   # its passes verify k drafts until it has k left or fewer
                t0 = min(t0, bisect_left(cum, left - k) + 1)
    else:
        for left, cum in zip(lefts, cums):          # uniform while the tokens before a step <= left - k - 2
            w = min(w, bisect_right(cum, left - k - 2) + 1)
    totals = list(map(sum, zip(*seqs)))
    # the steps' prices and ends (as the step-by-step loop prices them: the target's step plus the drafter's
    # passes; the clock's sequential float adds), up to the first ending at or past the next arrival event: it
    # delivers the arrival, as the loop's would, and ends the stretch (in a cluster: up to what the router has
    # decided, before the arrival)
    pks = list(accumulate(totals[:w - 1], initial=pk))
    dts, ds, ends = prices(pks[:t0] if t0 < w else pks, now, arrival)
    partial = []                                    # (step, request, tokens) of tail passes with fewer than k drafts
    if len(ends) == t0 < w and not (ends and ends[-1] >= arrival):     # tail steps: time_from_sums of their sums
        time_from_sums = sim.costmodel.time_from_sums
        end = ends[-1] if ends else now
        for s in range(t0, w):
            T = c2 = ck = 0
            for i, (m0, left, cum) in enumerate(zip(ms0, lefts, cums)):
                before = cum[s - 1] if s else 0
                c = left - before
                if c > k:
                    c = k1
                else:
                    partial.append((s, i, c))
                T += c
                c2 += c * c
                ck += c * (m0 + before)
            p = pks[s]
            d = price(p)[1]                         # (the drafter's passes: n decodes)
            dt = time_from_sums(T, n, c2, ck, p, 0, 0) + d
            end += dt
            dts.append(dt)
            if ds is not None:
                ds.append(d)
            ends.append(end)
            if end >= arrival:
                break
    steps = len(ends)
    clock = sim.arrival_clock
    crossing = steps and ends[-1] >= arrival
    if clock.cluster:                               # synced is monotone in the end time: the longest prefix
        if crossing:
            steps -= 1
            crossing = False
        lo, hi = 0, steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if clock.synced(ends[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        steps = lo
        del ends[steps:], dts[steps:]
    if not steps:
        return 0, now, DONE
    t = ends[-1]
    start0 = now
    last = steps - 1
    # completions: only at the window's last step (the first that ends one); a finishing pass keeps what was left
    done = []
    if tails and steps == w:
        for i, (left, cum) in enumerate(zip(lefts, cums)):
            if cum[last] >= left:
                done.append(i)
                g = seqs[i] = seqs[i][:steps]
                over = cum[last] - left
                g[last] -= over
                cum[last] = left
                totals[last] -= over

    # KV: a request's reservation (for its next k + 1 tokens, or all it has left) only grows over the window; if
    # the largest fit, every step's does
    bs = mem.block_size
    held0 = [r.blocks for r in order]
    grow = 0
    for b0, m0, cum, left in zip(held0, ms0, cums, lefts):
        res = m0 + (cum[last - 1] if steps > 1 else 0) + k1
        if res > m0 + left:
            res = m0 + left
        res = -(-res // bs)
        if res > b0:
            grow += res - b0
    free0 = mem.free_blocks
    if grow > free0:
        return 0, now, STEP
    # commit: the draws taken; per request its tokens, token times and KV events
    if fresh:
        del draws[len(draws) - steps * n:]
    if ds is not None:                              # added step by step, as the loop's float sum
        spec.draft_time_s = reduce(add, ds[:steps], spec.draft_time_s)
    first_trims = []                                # step 0's trims: (request, blocks held, tokens kept)
    gives = []                                      # (request, first step, end step, blocks held): a block given
    freed = 0                                       # back at each of those steps' ends
    delta = [0] * steps                             # blocks the window's requests hold after each step, less before
    produced = 0
    for i, (r, b0, m0, cum, g) in enumerate(zip(order, held0, ms0, cums, seqs)):
        got = cum[last]
        left = lefts[i]
        produced += got
        lefts[i] = left - got
        r.cached = m0 + got
        r.generated += got
        # its token times, ends[s] g[s] times for each step s, are written out at its completion with others'
        # (sim/metrics/tokens.py: unspan)
        if r.spans is None:
            r.spans = []
        r.spans.append((len(r.token_times), ends, g))
        # step 0 from the blocks it holds (a reservation may have left more)
        m1 = m0 + cum[0]
        held = m0 + k1 if k1 < left else m0 + left
        held = -(-held // bs)
        if b0 > held:
            held = b0
        kept = -(-m1 // bs)
        if held > kept:
            first_trims.append((i, held, m1))
            freed += held - kept
        delta[0] += kept - b0
        # then each block boundary B below its last token: steps starting within k1 tokens of it reserve the
        # block past it, and give it back at their end while the tokens kept stay at or below B; the step that
        # crosses B keeps it
        B = kept * bs - m0                          # (relative to m0, as cum is)
        while B < left:
            first = bisect_right(cum, B - k1) + 1   # the first step s >= 1 with m_s + k1 > B
            if first >= steps:
                break
            cross = bisect_right(cum, B)            # the first step whose end holds more than B
            if first < cross:                       # (those steps keep more than B - bs tokens: one block each)
                stop = cross if cross < steps else steps
                gives.append((i, first, stop, (B + m0) // bs + 1))
                freed += stop - first
            if cross >= steps:
                break
            delta[cross] += 1
            B += bs
        r.blocks = -(-(m0 + got) // bs)
    if freed:                                       # the rejected drafts' blocks; their trims one by one only
        reqs = tuple(order)                         # if the manager asks (a prefix cache ordering them)

        def trims():
            """The window's trims as the plain loop makes them: (time, request, blocks held, tokens kept), in step
            then running order."""
            events = [(0, i, held, m1) for i, held, m1 in first_trims]
            for i, first, stop, blocks in gives:
                m0, cum = ms0[i], cums[i]
                events += [(s, i, blocks, m0 + cum[s]) for s in range(first, stop)]
            events.sort()
            return [(ends[s], reqs[i], held, tok) for s, i, held, tok in events]
        mem.release_tails(freed, trims)
    held_after = list(accumulate(delta))
    mem.free_blocks = free0 - held_after[-1]
    mem.clock = t
    view.now = ends[-2] if steps > 1 else start0
    view.iteration += steps
    kv0 = view.kv_cached_tokens
    view.kv_cached_tokens = kv0 + produced
    sim.tokens_generated += produced
    # every request verified a pass each step: all k drafts, but for the tail passes (k_eff = k + 1 - their
    # shortfall), and gained its accepted drafts plus one
    passes = n * steps
    short = short_tokens = 0                        # drafts the tail passes did not have, and their tokens
    if partial:
        partial = [(s, i, c) for s, i, c in partial if s < steps]
        short = sum(k1 - c for _, _, c in partial)
        short_tokens = sum(seqs[i][s] for s, i, _ in partial)
    spec.verified_many(passes, n * k * steps - short, produced - passes, produced, passes - len(partial),
                       produced - short_tokens, freed)
    used0 = mem.total_blocks - free0
    used = [(used0 + h) * bs for h in held_after]
    running, queue_n = view.running, len(view.waiting) + len(view.swapped)
    running_n = len(running)
    kv = list(accumulate(totals[:steps], initial=kv0 - mem.offloaded_tokens))
    del kv[0]
    if done:                                        # the plain loop's commit: completions, then the step's row
        for i in done:
            sim.finish_batched(order[i], t)
        running[:] = [r for r in running if r.state == RUNNING]
        used[-1] = mem.used_tokens
        kv[-1] = view.kv_cached_tokens - mem.offloaded_tokens
    if crossing:                                    # the arrivals due by the last step's end (the plain loop's
        sim._deliver(ends[-2] if steps > 1 else start0, t)      # delivery, before its commit: nothing here reads
        queue_last = len(view.waiting) + len(view.swapped)      # the queue)
    if sim.record_iterations:
        starts = [start0] + ends[:-1]
        const = repeat(n)
        zero = repeat(0)
        rows = sim.iter_rows
        rows.extend(zip(starts, dts, const, zero, const, repeat(running_n), repeat(queue_n), used, kv,
                        zero, zero, zero))
        if done or crossing:
            rows[-1] = rows[-1][:5] + (len(running), queue_last if crossing else queue_n) + rows[-1][7:]
    else:
        tally = sim.tally
        tally.add(n, running_n, 0, steps)
        if done:
            tally.running += len(running) - running_n
        tally.kv_alloc_tokens += sum(used)
        top_used = max(used)
        if top_used > tally.kv_alloc_max:
            tally.kv_alloc_max = top_used
    sim.spec_walked_iterations += steps
    sim.spec_window_iterations += steps
    if done:
        return steps, t, FINISHED
    # more uniform steps may follow only when the window's own length stopped it
    return steps, t, MORE if steps == cap == WINDOW and w == cap and not crossing else DONE


def uniform_steps(sim, now: float, order: list, dcm, scale: float, prices: dict, tails: bool = False):
    """Take uniform steady verify steps of `order` from `now` (the last scheduled step's requests, the whole running
    set; with requests queued the caller has checked that n (k + 1) is the last scheduled step's token count), and
    with `tails` (a lone replica, nothing queued) requests' last verify passes up to a completion, in windows.
    Returns (steps taken, the clock after them, whether requests completed: the caller takes up the rest).
    `prices`: pricing by batch size n (Speculation.walk_prices), made on first use: step_price and the windows'."""
    view, mem, spec = sim.view, sim.memory, sim.speculation
    mode = spec.walk_draws(order)
    if mode is None:
        return 0, now, False
    k = spec.k
    k1 = k + 1
    n = len(order)
    lefts = [r.output_tokens - r.generated for r in order]
    if min(lefts) <= (1 if tails and k1 <= mem.block_size else k1):
        return 0, now, False
    fns = prices.get(n)
    if fns is None:
        price, many = step_price(sim.costmodel, dcm, n, k, scale, spec.walk_kept)
        fns = prices[n] = (price, window_prices(many, dcm is not None))
    price, window = fns
    clock = sim.arrival_clock
    arrival = clock.time
    taken = 0
    if k1 <= mem.block_size:                        # (a step then reserves one block per request at most)
        while True:
            steps, now, then = _window(sim, now, order, mode, lefts, price, window, arrival, tails)
            taken += steps
            if then is not MORE:
                break
        if then is DONE or then is FINISHED:
            return taken, now, then is FINISHED
    walked = taken
    cluster = clock.cluster
    bs = mem.block_size
    trim = mem.trim
    max_it = sim.max_iterations
    stop = max_it - view.iteration if max_it else -1
    draws = spec._draws
    fresh = mode == "rate"
    pop = draws.pop if fresh else repeat(mode + 1).__next__      # a full verify pass's tokens
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
        dt, d = price(pk)
        end = now + dt
        if end >= arrival or (cluster and not clock.synced(end)):
            break
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
                g = pop()
            except IndexError:                          # the block is used up: the generator's next one
                draws = spec.refill()
                pop = draws.pop
                g = pop()
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
        return walked, now, False
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
    # uniform steps: every request verified all k drafts
    spec.verified_many(n * taken, n * k * taken, produced - n * taken, produced, n * taken, produced, freed)
    spec.draft_time_s = draft_total
    if not record:
        tally = sim.tally
        tally.add(n, running_n, 0, taken)
        tally.kv_alloc_tokens += used_sum
        if used_max > tally.kv_alloc_max:
            tally.kv_alloc_max = used_max
    sim.spec_walked_iterations += taken
    return walked + taken, now, False
