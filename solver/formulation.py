"""The InferMax CSP (spec §4.2–4.5) as a MILP: variables per request × batch slot, constraints (1)–(5) and §4.4."""
from __future__ import annotations

from solver.model import MilpModel


def bounds_ms(inst) -> tuple[float, float]:
    """Upper bounds on one batch's duration and on any idle wait (ms), used as Big-M for time products."""
    T, n = inst.terms, inst.n
    U = [inst.peak(i) for i in range(n)]
    cmax = [min(inst.options.C, u) for u in U]
    t_max = (T.tok * sum(cmax) + T.base + T.sq * sum(c * c for c in cmax) + T.pbase
             + T.kv * sum(u + 1 for u in U) + T.dbase)
    return t_max, 1e3 * max(inst.arrival)


def identical_pairs(inst) -> list:
    """Consecutive members of each group of requests with the same prompt, output and arrival."""
    groups = {}
    for i in range(inst.n):
        groups.setdefault((inst.prompt[i], inst.output[i], inst.arrival[i]), []).append(i)
    return [(g[k], g[k + 1]) for g in groups.values() for k in range(len(g) - 1)]


def max_generating(inst) -> int:
    """Most requests that can generate a token in one batch: each then holds at least its prompt I0 of KV."""
    room, k = inst.M, 0
    for p in sorted(inst.prompt):
        if p > room:
            break
        room -= p
        k += 1
    return max(k, 1)


def token_cliques(inst) -> list:
    """Sets of tokens no two of which can be generated in one batch: token t of i needs I0+t−1 KV in its batch,
    two tokens of one request never share a batch, and two of different requests conflict when their KV
    exceeds M together. Each set gives the cut Σ x ≤ y_j. Greedy from every token as a seed, heaviest first."""
    w = {(i, t): inst.prompt[i] + t - 1 for i in range(inst.n) for t in range(1, inst.output[i] + 1)}
    order = sorted(w, key=lambda k: -w[k])
    conflict = lambda a, b: a[0] == b[0] or w[a] + w[b] > inst.M  # noqa: E731
    out = set()
    for seed in order:
        clique = [seed]
        for tok in order:
            if tok != seed and all(conflict(tok, c) for c in clique):
                clique.append(tok)
        if len({i for i, _ in clique}) > 1:
            out.add(tuple(sorted(clique)))
    return sorted(out)


def min_batches(inst) -> int:
    """A lower bound on the number of non-empty batches: token t of request i needs I0+t−1 KV in its batch, so
    the token events pack into bins of M (Martello–Toth L2, solver.bounds), one token per request per batch."""
    from solver.bounds import min_batches as packing_bound
    return packing_bound(inst.prompt, inst.output, inst.M)


def build(inst, J: int, goal_ms: float | None = None) -> MilpModel:
    """Build the model over J batch slots. Objective in ms (see SolverOptions.objective); `goal_ms` turns the
    objective into a constraint `objective <= goal_ms` and solves for feasibility only."""
    opt, T, n = inst.options, inst.terms, inst.n
    md = MilpModel()
    V = md.index
    U = [inst.peak(i) for i in range(n)]
    cmax = [min(opt.C, u) for u in U]
    t_max, idle_max = bounds_ms(inst)
    BT = t_max + idle_max
    obj = opt.objective
    need_f = obj == "mean_ttft"
    need_zc = obj == "sum_completion"

    # j = 0: the initial state, as fixed columns (presolve removes them; keeps every row uniform in j)
    for i in range(n):
        md.var(("I", i, 0), inst.prompt[i], inst.prompt[i], True)
        for name in ("m", "mz", "done", "gc", "f"):
            md.var((name, i, 0), 0, 0, True)
    md.var(("acc", 0), 0, 0)

    for j in range(1, J + 1):
        for i in range(n):
            u, cm = U[i], cmax[i]
            Ilo = inst.prompt[i]
            md.var(("I", i, j), Ilo, u if opt.evictions else Ilo, True)
            for name in ("m", "mp"):
                md.var((name, i, j), 0, u, True)
            md.var(("c", i, j), 0, cm, True)
            md.var(("gc", i, j), 0, inst.output[i], True)
            for name in ("d", "g", "cz", "mz", "mpz", "dg", "done", "ed"):
                md.binary((name, i, j))
            md.var(("e", i, j), 0, 1 if opt.evictions else 0, True)
            if need_f:
                md.binary(("f", i, j))
            md.var(("q", i, j), 0, float(cm) ** 2)          # q >= c²: exact square (backend-specific link)
            md.var(("w", i, j), 0, u + 1)                    # KV read by a decode step: dg·(m_{j-1}+1)
            md.squares.append((V[("q", i, j)], V[("c", i, j)], cm, i))
        for name in ("y", "yp", "yd"):
            md.binary((name, j))
        md.var(("T", j), 0, t_max)
        md.var(("s", j), 0, idle_max if inst.online else 0)
        md.var(("acc", j), 0)

    for j in range(1, J + 1):
        y, yp, yd = V[("y", j)], V[("yp", j)], V[("yd", j)]
        for i in range(n):
            u, cm, O = U[i], cmax[i], inst.output[i]
            v = lambda name, jj=j: V[(name, i, jj)]  # noqa: E731
            I, I0, m, m0 = v("I"), v("I", j - 1), v("m"), v("m", j - 1)
            mp, c, cz, d, g, e, ed, dg = v("mp"), v("c"), v("cz"), v("d"), v("g"), v("e"), v("ed"), v("dg")
            done, done0, mz, mz0, mpz = v("done"), v("done", j - 1), v("mz"), v("mz", j - 1), v("mpz")
            # d = 𝟙[m_{j-1} >= I_{j-1}] (decode phase before batch j)
            md.ge([(m0, 1), (I0, -1), (d, -u)], -u)
            md.le([(m0, 1), (I0, -1), (d, -u)], -1)
            # ed = e ∧ d
            md.le([(ed, 1), (e, -1)], 0)
            md.le([(ed, 1), (d, -1)], 0)
            md.ge([(ed, 1), (e, -1), (d, -1)], -1)
            # (2) I grows to m_{j-1}+1 on a decode-phase eviction, else stays
            md.ge([(I, 1), (I0, -1)], 0)
            md.le([(I, 1), (I0, -1), (ed, -u)], 0)
            md.le([(I, 1), (m0, -1), (ed, u)], 1 + u)
            md.ge([(I, 1), (m0, -1), (ed, -u)], 1 - u)
            # evict only running requests (§4.4.5)
            md.le([(e, 1), (mz0, -1)], 0)
            # (4) nothing processed when evicted; one token in decode; nothing after completion
            md.le([(c, 1), (e, cm)], cm)
            md.le([(c, 1), (d, cm)], 1 + cm)
            md.le([(c, 1), (done0, cm)], cm)
            # cz = 𝟙[c > 0]
            md.le([(cz, 1), (c, -1)], 0)
            md.le([(c, 1), (cz, -cm)], 0)
            # (3) in-batch KV mp = (1-e)·m_{j-1} + c; a prefill never overshoots its input
            md.ge([(mp, 1), (m0, -1), (c, -1), (e, u)], 0)
            md.le([(mp, 1), (m0, -1), (c, -1)], 0)
            md.le([(mp, 1), (e, u)], u)
            md.le([(mp, 1), (I0, -1), (d, -u)], 0)
            # completion releases memory: m = mp unless done
            md.le([(m, 1), (mp, -1)], 0)
            md.ge([(m, 1), (mp, -1), (done, u)], 0)
            md.le([(m, 1), (done, u)], u)
            # mz = 𝟙[m > 0], mpz >= 𝟙[mp > 0]
            md.le([(mz, 1), (m, -1)], 0)
            md.le([(m, 1), (mz, -u)], 0)
            md.le([(mp, 1), (mpz, -u)], 0)
            # token generation link (§4.4.2)
            md.le([(g, 1), (cz, -1)], 0)
            md.le([(g, 1), (e, 1)], 1)
            md.ge([(g, 1), (c, -1), (d, -cm)], -cm)                   # decode: g >= c
            md.le([(g, 1), (c, -1), (d, 1)], 1)                       # decode: g <= c
            md.ge([(mp, 1), (I0, -1), (g, -u), (d, u)], -u)           # prefill: g ⇒ mp = I_{j-1}
            u1 = u + 1
            md.le([(mp, 1), (I0, -1), (g, -u1), (d, -u1), (cz, u1)], u1 - 1)  # prefill: mp = I ∧ c>0 ⇒ g
            # valid cut: the t-th token of i is generated with I0+t−1 KV in the batch (mp = I0 + gc − 1 when g)
            md.ge([(mp, 1), (g, -u), (v("gc"), -1)], -O)
            md.ge([(v("w"), 1), (dg, -u), (v("gc"), -1)], -O)          # same for the KV a decode step reads
            # dg = d ∧ g
            md.le([(dg, 1), (d, -1)], 0)
            md.le([(dg, 1), (g, -1)], 0)
            md.ge([(dg, 1), (d, -1), (g, -1)], -1)
            # (1) and completion: gc counts tokens; done = 𝟙[gc = O]
            gc, gc0 = v("gc"), v("gc", j - 1)
            md.eq([(gc, 1), (gc0, -1), (g, -1)], 0)
            md.ge([(gc, 1), (done, -O)], 0)
            md.le([(gc, 1), (done, -1)], O - 1)
            if need_f:
                f, f0 = v("f"), v("f", j - 1)
                md.le([(f, 1), (gc, -1)], 0)
                md.ge([(f, 1), (g, -1)], 0)
                md.ge([(f, 1), (f0, -1)], 0)
            # w = dg·(m_{j-1}+1)
            w = v("w")
            md.ge([(w, 1), (m0, -1), (dg, -u1)], 1 - u1)
            md.le([(w, 1), (dg, -u1)], 0)
            md.le([(w, 1), (m0, -1)], 1)
            # batch indicators
            md.le([(cz, 1), (y, -1)], 0)
            md.ge([(yp, 1), (cz, -1), (d, 1)], 0)
            md.ge([(yd, 1), (dg, -1)], 0)
            if not opt.chunked:
                md.ge([(g, 1), (cz, -1), (d, 1)], 0)                  # a prefill completes in the batch it starts
            if inst.online:                                            # starts only after it arrives
                md.ge([(V[("acc", j - 1)], 1), (V[("s", j)], 1), (cz, -1e3 * inst.arrival[i])], 0)
        cs = [V[("c", i, j)] for i in range(n)]
        dgs = [V[("dg", i, j)] for i in range(n)]
        md.le([(y, 1)] + [(V[("cz", i, j)], -1) for i in range(n)], 0)
        md.le([(yp, 1), (y, -1)], 0)
        md.le([(yd, 1), (y, -1)], 0)
        if j < J:
            md.ge([(y, 1), (V[("y", j + 1)], -1)], 0)                  # symmetry breaking: busy slots first
        if not opt.hybrid:
            md.le([(yp, 1), (yd, 1)], 1)
        # (5) batch limits
        md.le([(c, 1) for c in cs], opt.C)
        md.le([(c, 1) for c in cs] + [(x, -1) for x in dgs], inst.P_eff)
        if opt.p_counts_decode_tokens:
            md.le([(c, 1) for c in cs] + [(yp, opt.C)], inst.P_eff + opt.C)
        md.le([(V[("mp", i, j)], 1) for i in range(n)] + [(y, -inst.M)], 0)   # (5) M; no KV in unused slots
        if inst.R_eff < n:
            md.le([(V[("mpz", i, j)], 1) for i in range(n)], inst.R_eff)
        # batch time (ms) from the linear cost model, paper features
        terms = [(V[("T", j)], 1), (y, -T.base), (yp, -T.pbase), (yd, -T.dbase)]
        for i in range(n):
            terms += [(V[("c", i, j)], -T.tok), (V[("q", i, j)], -T.sq), (V[("dg", i, j)], T.sq),
                      (V[("w", i, j)], -T.kv)]
        md.eq(terms, 0)
        md.eq([(V[("acc", j)], 1), (V[("acc", j - 1)], -1), (V[("s", j)], -1), (V[("T", j)], -1)], 0)
        if inst.online:
            md.le([(V[("s", j)], 1), (y, -idle_max)], 0)
    for i in range(n):
        md.eq([(V[("gc", i, J)], 1)], inst.output[i])                 # (1) termination
        # valid cut: at least the prompt and O−1 decode tokens are processed (refills only add)
        md.ge([(V[("c", i, j)], 1) for j in range(1, J + 1)], U[i])
    # token-indexed strengthening: X_{i,t,j} = 𝟙[token t of i generated by batch j]; token t needs I0+t−1 KV
    if opt.token_cuts and sum(inst.output) * J <= opt.token_cuts:
        for i in range(n):
            O = inst.output[i]
            for t in range(1, O + 1):
                md.var(("X", i, t, 0), 0, 0, True)
                for j in range(1, J + 1):
                    md.binary(("X", i, t, j))
            for j in range(1, J + 1):
                X = lambda t, jj=j: V[("X", i, t, jj)]  # noqa: E731
                md.eq([(V[("gc", i, j)], 1)] + [(X(t), -1) for t in range(1, O + 1)], 0)
                kv = [(V[("mp", i, j)], 1)]
                for t in range(1, O + 1):
                    md.ge([(X(t), 1), (X(t, j - 1), -1)], 0)
                    if t < O:
                        md.le([(X(t + 1), 1), (X(t, j - 1), -1)], 0)
                    kv += [(X(t), -(inst.prompt[i] + t - 1)), (X(t, j - 1), inst.prompt[i] + t - 1)]
                md.ge(kv, 0)
                # a decode step generating token t reads exactly I0+t−1 KV: w >= Σ_t (I0+t−1)·x_t − U·(g − dg)
                u = U[i]
                md.ge([(V[("w", i, j)], 1), (V[("g", i, j)], u), (V[("dg", i, j)], -u)] + kv[1:], 0)
        for clique in token_cliques(inst):
            for j in range(1, J + 1):
                terms = [(V[("y", j)], -1)]
                for i, t in clique:
                    terms += [(V[("X", i, t, j)], 1), (V[("X", i, t, j - 1)], -1)]
                md.le(terms, 0)
    # valid cut: a batch generates tokens for at most K requests, K = most prompts that fit in M together
    K = max_generating(inst)
    if K < n:
        for j in range(1, J + 1):
            md.le([(V[("g", i, j)], 1) for i in range(n)] + [(V[("y", j)], -K)], 0)
    # valid cut: Σ over batches of in-batch KV >= Σ_i Σ_t (I0+t−1), and each batch holds <= M
    md.ge([(V[("y", j)], 1) for j in range(1, J + 1)], min_batches(inst))
    # identical requests are interchangeable: relabel so that the lower index never finishes later (valid for
    # every objective here, since they depend on requests only through their (I0, O, arrival) multiset)
    for i, i2 in identical_pairs(inst):
        for j in range(1, J + 1):
            md.ge([(V[("done", i, j)], 1), (V[("done", i2, j)], -1)], 0)

    # objective (ms), or the goal as a constraint
    t0 = 1e3 * min(inst.arrival)
    expr, const = [], 0.0
    if obj == "makespan":
        expr, const = [(V[("acc", J)], 1.0)], -t0
    else:
        key, flag = ("zc", "done") if need_zc else ("zf", "f")
        scale = 1.0 if need_zc else 1.0 / n
        for i in range(n):
            for j in range(1, J + 1):
                z = md.var((key, i, j), 0, BT)
                md.ge([(z, 1), (V[("s", j)], -1), (V[("T", j)], -1), (V[(flag, i, j - 1)], BT)], 0)
                expr.append((z, scale))
            const -= 1e3 * inst.arrival[i] * scale
    if obj == "makespan":
        # the analytic bound as a cut on the objective: it lifts the root bound the LP alone finds
        from solver.bounds import makespan_bound_ms
        md.ge([(V[("acc", J)], 1)], makespan_bound_ms(inst)[0] + t0)
    if goal_ms is None:
        for col, coef in expr:
            md.add_cost(col, coef)
        md.obj_offset = const
    else:
        md.le(expr, goal_ms - const)
    return md
