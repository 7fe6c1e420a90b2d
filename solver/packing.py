"""Schedules by event packing: which batch makes each token, each prompt in one chunk, under the KV budget (a MILP).

The full CSP decides chunk sizes, evictions and token events at once, and on heterogeneous instances HiGHS rarely
gets past the presets' schedules in its time limit. Here each request's prompt is processed whole in the batch that
makes its first token and its decodes follow, never evicted; what is chosen is only the batch of every token event
(time-indexed, cumulative binaries), so that the KV every request holds — its prompt and tokens so far, from its
first token to its last — fits M in every batch, with C, P, R_max and hybrid batching respected. Tokens processed,
KV reads and Σ c² are then fixed, and the objective is what the choice moves: the base bias of every batch and the
prefill and decode biases of the batches that hold a first token or a decode. The result is a valid schedule (an
incumbent and a warm start for the CSP), not a bound: chunked prefills and evictions are left out. Offline only."""
from __future__ import annotations

from solver.backends import solve_highs
from solver.model import MilpModel
from solver.schedule import Schedule, Step


def packing_model(inst, J: int) -> MilpModel | None:
    """The event-packing MILP over J batches, or None where a whole prompt breaks C or P (or arrivals differ)."""
    opt, T, n = inst.options, inst.terms, inst.n
    if inst.online or any(p > min(opt.C, inst.P_eff) for p in inst.prompt) or max(inst.output) > J:
        return None
    md = MilpModel()
    X = {}
    for i in range(n):
        for t in range(1, inst.output[i] + 1):
            for j in range(J):
                X[i, t, j] = md.binary(("X", i, t, j))
    y = [md.binary(("y", j), T.base) for j in range(J)]
    yp = [md.binary(("yp", j), T.pbase) for j in range(J)]
    yd = [md.binary(("yd", j), T.dbase) for j in range(J)]

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
                md.ge([(yp[j] if t == 1 else yd[j], 1.0)] + [(c, -v) for c, v in event(i, t, j)], 0)
    for j in range(J):
        held, tokens, prefill, running = [], [], [], []
        for i in range(n):
            I0, O = inst.prompt[i], inst.output[i]
            # active from its first token to its last: a ≥ X_1,j − X_O,j−1; it holds I0 + tokens so far − 1 KV
            a = md.var(("a", i, j), 0, 1)
            md.ge([(a, 1.0), (X[i, 1, j], -1.0)] + ([(X[i, O, j - 1], 1.0)] if j else []), 0)
            v = md.var(("v", i, j), 0, I0 + O)
            md.ge([(v, 1.0), (a, -(I0 + O - 1))] + [(X[i, t, j], -1.0) for t in range(2, O + 1)], -(O - 1))
            held.append((v, 1.0))
            running.append((a, 1.0))
            tokens += [(c, I0 * s) for c, s in event(i, 1, j)]
            prefill += [(c, I0 * s) for c, s in event(i, 1, j)]
            for t in range(2, O + 1):
                tokens += event(i, t, j)
        md.le(held, inst.M)
        md.le(tokens, opt.C)
        md.le(tokens if opt.p_counts_decode_tokens else prefill, inst.P_eff)   # (the first: conservative)
        if inst.R_eff < n:
            md.le(running, inst.R_eff)
        md.ge([(y[j], 1.0), (yp[j], -1.0)], 0)
        md.ge([(y[j], 1.0), (yd[j], -1.0)], 0)
        if j + 1 < J:
            md.ge([(y[j], 1.0), (y[j + 1], -1.0)], 0)                    # busy batches first
        if not opt.hybrid:
            md.le([(yp[j], 1.0), (yd[j], 1.0)], 1)
    return md


def packing_schedule(inst, J: int, time_limit_s: float, seed: Schedule | None = None) -> Schedule | None:
    """The best event packing HiGHS finds in the time given over J batches, as a schedule; None if none. `seed`, an
    eviction-free schedule of at most J batches, starts it (its token events pack, as it held at least that KV)."""
    md = packing_model(inst, J)
    if md is None:
        return None
    start = _start_from(md, inst, seed, J) if seed is not None else None
    r = solve_highs(md, inst.options, start, time_limit_s, {})
    if r.x is None:
        return None
    steps = []
    for j in range(J):
        tokens = {}
        for i in range(inst.n):
            for t in range(1, inst.output[i] + 1):
                now = r.x[md.index[("X", i, t, j)]] > 0.5
                before = j > 0 and r.x[md.index[("X", i, t, j - 1)]] > 0.5
                if now and not before:
                    tokens[i] = inst.prompt[i] if t == 1 else 1
        if tokens:
            steps.append(Step(tokens, []))
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