"""Schedules by event packing: which batch makes each token, each prompt in one chunk, under the KV budget (a MILP).

The full CSP decides chunk sizes, evictions and token events at once, and on heterogeneous instances HiGHS rarely
gets past the presets' schedules in its time limit. Here each request's prompt is processed whole in the batch that
makes its first token and its decodes follow; what is chosen is only the batch of every token event
(time-indexed, cumulative binaries), so that the KV every request holds — its prompt and tokens so far, from its
first token to its last — fits M in every batch, with C, P, R_max and hybrid batching respected. Tokens processed,
KV reads and Σ c² are then fixed, and the objective is what the choice moves: the base bias of every batch and the
prefill and decode biases of the batches that hold a first token or a decode. With evictions on, a request may also be
evicted after a token and make its next token by refilling its whole input in that token's batch (priced at the
refill's extra tokens and square, its prefill bias). The result is a valid schedule (an incumbent and a warm start
for the CSP), not a bound: chunked prefills are left out. Offline only. packing_model(relax=True) is the bound."""
from __future__ import annotations

import math

from solver.backends import solve_highs
from solver.bounds import later_token_ms
from solver.model import MilpModel
from solver.schedule import Schedule, Step


def packing_model(inst, J: int, relax: bool = False, evictions: bool | None = None) -> MilpModel | None:
    """The event-packing MILP over J batches, or None where a whole prompt breaks C or P (or arrivals differ).

    relax=True gives instead a relaxation of the whole CSP (makespan, offline), whose optimum bounds every schedule
    of at most J batches that make tokens: a prompt may be chunked (so no C or P rows, and no KV before the first
    token), a decode-phase eviction (with evictions on) frees the request's KV until it resumes, and each resume
    costs at least the cheapest refill extra of that request; batch costs only where a token is made, the decode
    bias at the cheaper of the two biases; the tokens, KV reads and Σ c² every schedule pays are the offset.
    `evictions` overrides the instance's switch (False: a bound over the eviction-free schedules only)."""
    opt, T, n = inst.options, inst.terms, inst.n
    if inst.online or max(inst.output) > J or (not relax and any(p > min(opt.C, inst.P_eff) for p in inst.prompt)):
        return None
    evictions_on = opt.evictions if evictions is None else evictions
    evict = relax and evictions_on         # relaxation: an evicted request is free until it resumes
    resumes = not relax and evictions_on   # schedule: evict after a token, refill whole in the next token's batch
    md = MilpModel()
    X = {}
    for i in range(n):
        for t in range(1, inst.output[i] + 1):
            for j in range(J):
                X[i, t, j] = md.binary(("X", i, t, j))
    y = [md.binary(("y", j), T.base) for j in range(J)]
    yp = [md.binary(("yp", j), T.pbase) for j in range(J)]
    yd = [md.binary(("yd", j), min(T.pbase, T.dbase) if evict else T.dbase) for j in range(J)]
    if relax:
        md.obj_offset = (T.tok * sum(inst.peak(i) for i in range(n)) + T.sq * sum(inst.prompt)
                         + sum(later_token_ms(T, inst.prompt[i], t) for i in range(n)
                               for t in range(2, inst.output[i] + 1)))

    def event(i, t, j):                       # 1 where batch j makes token t of request i
        return [(X[i, t, j], 1.0)] + ([(X[i, t, j - 1], -1.0)] if j else [])

    for i in range(n):
        I0, O = inst.prompt[i], inst.output[i]
        for t in range(1, O + 1):
            md.eq([(X[i, t, J - 1], 1.0)], 1)                              # every token is made
            for j in range(1, J):
                md.ge([(X[i, t, j], 1.0), (X[i, t, j - 1], -1.0)], 0)     # cumulative
            if t > 1:                                                     # one token per request per batch
                md.eq([(X[i, t, 0], 1.0)], 0)
                for j in range(1, J):
                    md.le([(X[i, t, j], 1.0), (X[i, t - 1, j - 1], -1.0)], 0)
            for j in range(J):
                # a later token is a decode, or with evictions a refill, which pays no more than a first token's
                # prefill bias in the same batch: yd + yp ≥ it there
                flags = [(yp[j], 1.0)] if t == 1 else [(yd[j], 1.0)] + ([(yp[j], 1.0)] if evict else [])
                if resumes and t > 1 and j:
                    flags.append((_resume(md, inst, i, t, j, event), 1.0))      # a refill is not a decode
                md.ge(flags + [(c, -v) for c, v in event(i, t, j)], 0)
        if resumes and O > 1:
            for j in range(J):
                z = md.index[("z", i, j)] if ("z", i, j) in md.index else md.binary(("z", i, j))
                for t in range(1, O + 1):
                    md.le([(z, 1.0)] + event(i, t, j), 1)                 # never in a batch that makes its token
                    if t > 1 and j:
                        md.ge([(yp[j], 1.0), (md.index[("res", i, t, j)], -1.0)], 0)
                if j:      # once evicted it holds nothing until a batch makes its next token (by the refill)
                    md.ge([(z, 1.0), (md.index[("z", i, j - 1)], -1.0)]
                          + [term for t in range(1, O + 1) for term in event(i, t, j)], 0)
        if evict and O > 1:
            refill = min(T.tok * (I0 + t - 2) - later_token_ms(T, I0, t) for t in range(2, O + 1))
            for j in range(J):
                z = md.binary(("z", i, j))                                # holds no KV in batch j (evicted)
                for t in range(1, O + 1):
                    md.le([(z, 1.0)] + event(i, t, j), 1)                 # never in a batch that makes its token
                if j:
                    md.ge([(md.var(("r", i, j), 0, 1, cost=refill), 1.0), (md.index[("z", i, j - 1)], -1.0),
                           (z, 1.0)], 0)                                  # a resume: evicted before, not now
    for j in range(J):
        held, tokens, prefill, running = [], [], [], []
        for i in range(n):
            I0, O = inst.prompt[i], inst.output[i]
            # active from its first token to its last: a ≥ X_1,j − X_O,j−1; it holds I0 + tokens so far − 1 KV
            a = md.var(("a", i, j), 0, 1)
            md.ge([(a, 1.0), (X[i, 1, j], -1.0)] + ([(X[i, O, j - 1], 1.0)] if j else []), 0)
            v = md.var(("v", i, j), 0, I0 + O)
            free = [(md.index[("z", i, j)], I0 + O)] if ("z", i, j) in md.index else []
            md.ge([(v, 1.0), (a, -(I0 + O - 1))] + [(X[i, t, j], -1.0) for t in range(2, O + 1)] + free, -(O - 1))
            held.append((v, 1.0))
            running.append((a, 1.0))
            running += [(c, -1.0) for c, _ in free]
            tokens += [(c, I0 * s) for c, s in event(i, 1, j)]
            prefill += [(c, I0 * s) for c, s in event(i, 1, j)]
            for t in range(2, O + 1):
                tokens += event(i, t, j)
                if ("res", i, t, j) in md.index:                          # a refill: I0 + t − 1 prefill tokens
                    tokens.append((md.index[("res", i, t, j)], I0 + t - 2))
                    prefill.append((md.index[("res", i, t, j)], I0 + t - 1))
        md.le(held, inst.M)
        if not relax:
            md.le(tokens, opt.C)
            md.le(tokens if opt.p_counts_decode_tokens else prefill, inst.P_eff)   # (the first: conservative)
        if inst.R_eff < n:
            md.le(running, inst.R_eff)
        md.ge([(y[j], 1.0), (yp[j], -1.0)], 0)
        md.ge([(y[j], 1.0), (yd[j], -1.0)], 0)
        if j + 1 < J:
            md.ge([(y[j], 1.0), (y[j + 1], -1.0)], 0)                    # busy batches first
        if not opt.hybrid and not relax:
            md.le([(yp[j], 1.0), (yd[j], 1.0)], 1)
    return md


def _resume(md: MilpModel, inst, i: int, t: int, j: int, event) -> int:
    """res = 1 where batch j makes token t of request i by a refill (it was evicted in batch j − 1), priced at what
    the refill costs over a decode: I0 + t − 2 more tokens, its chunk's square, less the decode's KV read."""
    T, I0 = inst.terms, inst.prompt[i]
    z = md.index[("z", i, j - 1)] if ("z", i, j - 1) in md.index else md.binary(("z", i, j - 1))
    extra = T.tok * (I0 + t - 2) + T.sq * (I0 + t - 1) ** 2 - T.kv * (I0 + t - 1)
    res = md.binary(("res", i, t, j), extra)
    md.le([(res, 1.0), (z, -1.0)], 0)
    md.le([(res, 1.0)] + [(c, -v) for c, v in event(i, t, j)], 0)
    md.ge([(res, 1.0), (z, -1.0)] + [(c, -v) for c, v in event(i, t, j)], -1)
    return res


def event_bound_ms(inst, J: int, time_limit_s: float = math.inf, node_limit: int = 0) -> float:
    """A lower bound (ms) on the makespan of every schedule whose token-making batches number at most J: the best
    bound HiGHS proves on the relaxed event model in the time given (nan if it cannot run). With evictions on, the
    larger of that model's bound and min(its eviction-free bound, the analytic bound of schedules that evict in a
    decode phase): the eviction-free relaxation is far tighter, its LP not being loosened by free evictions."""
    if inst.options.objective != "makespan":
        return math.nan
    md = packing_model(inst, J, relax=True)
    if md is None:
        return math.nan
    if not inst.options.evictions:
        return _proved(md, inst, time_limit_s, node_limit)
    from solver.bounds import decode_eviction_bound_ms
    split = min(_proved(packing_model(inst, J, relax=True, evictions=False), inst, time_limit_s / 2, node_limit),
                decode_eviction_bound_ms(inst))
    return max(_proved(md, inst, time_limit_s / 2, node_limit), split)


def _proved(md, inst, time_limit_s: float, node_limit: int = 0) -> float:
    r = solve_highs(md, inst.options, None, time_limit_s, {}, node_limit)
    return r.bound if math.isfinite(r.bound) else -math.inf


def packing_schedule(inst, J: int, time_limit_s: float = math.inf, seed: Schedule | None = None,
                     evictions: bool = False, node_limit: int = 0) -> Schedule | None:
    """The best event packing HiGHS finds within the limits over J batches, as a schedule; None if it found none
    (callers keep what they had). `seed`, an eviction-free schedule of at most J batches, starts it (its token
    events pack, as it held at least that KV). evictions=True (where the instance allows them) lets the packing
    evict and refill. node_limit: branch-and-bound nodes (the same answer on any machine); else the time limit."""
    md = packing_model(inst, J, evictions=evictions and inst.options.evictions)
    if md is None:
        return None
    start = _start_from(md, inst, seed, J) if seed is not None else None
    r = solve_highs(md, inst.options, start, time_limit_s, {}, node_limit)
    if r.x is None:
        return None
    on = lambda key: key in md.index and r.x[md.index[key]] > 0.5      # noqa: E731
    made, holds, steps = [0] * inst.n, [False] * inst.n, []
    for j in range(J):
        # evicted before this batch: a request that holds KV past a token, with its z set here
        evict = [i for i in range(inst.n) if holds[i] and 0 < made[i] < inst.output[i] and on(("z", i, j))]
        for i in evict:
            holds[i] = False
        tokens = {}
        for i in range(inst.n):
            t = made[i] + 1
            if t <= inst.output[i] and on(("X", i, t, j)):
                # first token: the whole prompt; after an eviction: the whole refill (I0 + t − 1); else a decode
                tokens[i] = inst.prompt[i] if t == 1 else (1 if holds[i] else inst.prompt[i] + t - 1)
                made[i], holds[i] = t, t < inst.output[i]
        if tokens or evict:
            steps.append(Step(tokens, evict))
    return Schedule(steps)


def _start_from(md: MilpModel, inst, seed: Schedule, J: int) -> list | None:
    """Every column of the packing model at the token events of `seed` (None if it evicts or is too long)."""
    from solver.schedule import evaluate
    steps = [st for st in seed.steps if st.tokens or st.evict]
    if len(steps) > J or any(st.evict for st in steps):
        return None
    vals = evaluate(inst, Schedule(steps), J).values
    T, x = inst.terms, {}
    for j in range(J):
        busy = pre = dec = False
        for i in range(inst.n):
            I0, O = inst.prompt[i], inst.output[i]
            made = vals[("gc", i, j + 1)]
            before = vals[("gc", i, j)] if j else 0
            for t in range(1, O + 1):
                x[("X", i, t, j)] = int(made >= t)
            if made > before:
                busy = True
                pre, dec = pre or before == 0, dec or before > 0
            a = int(made >= 1 and before < O)
            x[("a", i, j)] = a
            x[("v", i, j)] = max(0, (I0 + O - 1) * a + max(made - 1, 0) - (O - 1))
        x[("y", j)], x[("yp", j)], x[("yd", j)] = int(busy), int(pre), int(dec)
    return md.start_vector(x)