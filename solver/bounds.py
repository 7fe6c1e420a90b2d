"""Analytic lower bounds on the optimal objective, computed in microseconds from the instance alone.

Every token event of a request needs exactly I0 + t − 1 KV tokens in its batch (token t of a request with prompt
I0), a request generates at most one token per batch, and a batch holds at most M KV tokens. So the batches that
generate tokens form a bin packing of the token events, whose Martello–Toth L2 bound is a minimum batch count.
That count × the per-batch fixed cost, plus the per-token cost of the tokens every schedule processes, plus for
each later token the cheaper of its decode's KV read or a refill, bounds the makespan of any schedule."""
from __future__ import annotations

import functools
import math


def martello_toth_l2(weights, capacity: int) -> int:
    """The L2 lower bound on the bins of size `capacity` needed for items `weights` (each ≤ capacity)."""
    w = sorted((int(x) for x in weights if x > 0), reverse=True)
    if not w:
        return 0
    best = math.ceil(sum(w) / capacity)
    half = capacity / 2
    for k in sorted({0, *(x for x in w if x <= half)}):
        n1 = [x for x in w if x > capacity - k]
        n2 = [x for x in w if capacity - k >= x > half]
        n3 = [x for x in w if half >= x >= k]
        room = len(n2) * capacity - sum(n2)
        best = max(best, len(n1) + len(n2) + max(0, math.ceil((sum(n3) - room) / capacity)))
    return best


def token_events(prompts, outputs, generated=None):
    """(request, KV in the batch) for every token still to be generated: token t needs I0 + t − 1."""
    generated = generated or [0] * len(prompts)
    return [(i, prompts[i] + t - 1) for i in range(len(prompts)) for t in range(generated[i] + 1, outputs[i] + 1)]


def min_batches(prompts, outputs, M: int, generated=None) -> int:
    """Fewest batches that can generate the remaining tokens: a request's tokens need distinct batches, and the
    token events pack into bins of M (Martello–Toth L2)."""
    generated = generated or [0] * len(prompts)
    most = max((o - g for o, g in zip(outputs, generated)), default=0)
    return max(most, martello_toth_l2([w for _, w in token_events(prompts, outputs, generated)], M))


def later_token_ms(terms, I0: int, t: int) -> float:
    """Least extra cost of generating token t ≥ 2: a decode reads I0 + t − 1 KV, a refill re-processes at least
    the I0 + t − 2 dropped tokens."""
    return min(terms.kv * (I0 + t - 1), terms.tok * (I0 + t - 2))


def makespan_bound_ms(inst) -> tuple[float, dict]:
    """A lower bound (ms) on the makespan of every schedule of the instance, and its parts (for the report)."""
    T, n = inst.terms, inst.n
    batches = min_batches(inst.prompt, inst.output, inst.M)
    tokens = sum(inst.peak(i) for i in range(n))          # I0 + O − 1 processed tokens per request, at least
    later = sum(later_token_ms(T, inst.prompt[i], t) for i in range(n) for t in range(2, inst.output[i] + 1))
    squares = sum(inst.prompt)                             # Σ c² ≥ Σ c over each prompt's chunks
    # every batch pays its fixed cost and at least the cheaper of the prefill and decode biases (it holds one or
    # the other); some batch holds a prefill, so the prefill bias is paid at least once in full
    per_batch = T.base + min(T.pbase, T.dbase)
    parts = {"batches": batches, "batch_ms": batches * per_batch, "token_ms": T.tok * tokens, "later_ms": later,
             "prefill_ms": T.pbase - min(T.pbase, T.dbase) + T.sq * squares}
    packing = sum(v for k, v in parts.items() if k != "batches")
    runs = run_conflict_bound_ms(T, inst.M, fresh_requests(inst), inst.options.chunked, inst.options.evictions)
    parts["run_conflict_ms"] = runs
    return max(packing, runs), parts


def fresh_requests(inst) -> list:
    """The instance's requests as run_conflict_bound_ms takes them: (I0, O, I, m, g) before any batch."""
    return [(inst.prompt[i], inst.output[i], inst.prompt[i], 0, 0) for i in range(inst.n)]


def decode_eviction_bound_ms(inst) -> float:
    """A lower bound (ms) on the makespan of every schedule that evicts some request in its decode phase.

    Such a request makes its next token by a refill that re-processes at least I0 + t − 2 tokens where the makespan
    bound let the cheaper of that and a decode's KV read stand; so the bound rises by the cheapest such difference.
    (An eviction during a prefill is never needed: dropping the chunks it wastes leaves a schedule no dearer.)
    With the eviction-free optimum's bound B_ef, min(B_ef, this) bounds the evictions-allowed optimum."""
    T = inst.terms
    extra = min((T.tok * (inst.prompt[i] + t - 2) - later_token_ms(T, inst.prompt[i], t)
                 for i in range(inst.n) for t in range(2, inst.output[i] + 1)), default=math.inf)
    packing = sum(v for k, v in makespan_bound_ms(inst)[1].items() if k not in ("batches", "run_conflict_ms"))
    return max(packing + extra, run_conflict_bound_ms(T, inst.M, fresh_requests(inst), inst.options.chunked,
                                                      True, min_evictions=1))


# -- the run-conflict bound ---------------------------------------------------------------------------------------
# A request's *run* is a stretch of its token events with no eviction between them; from the run's first event to its
# last it holds at least w KV (its current input once it has one, else the prompt it will complete). Take a set Q of
# requests whose w pairwise add up to at least M ("conflicting"). Two events of Q in one batch would hold more than M,
# except two run-starting events holding exactly w each with w_a + w_b = M; both then need more KV for their next
# token while the other holds w, so one of the two is evicted before either goes on. Hence, with e_Q decode-phase
# evictions among Q: Q's decode events take distinct batches (base + decode bias each), its (re)fill-completing events
# take at least P_Q + e_Q − min(e_Q, ⌊P_Q/2⌋) further batches (base + prefill bias each). Each eviction turns a
# decode into a refill that re-processes at least I0 + t − 2 tokens, which costs its extra over the cheaper of the two
# that the later-token term already counts.
# Prefill chunks: the k-th member of Q to complete its (re)fill can have placed its chunks only in the k batches that
# complete Q's fills so far, the refill batches, and X other batches that carry a chunk. Each such other batch pays
# the prefill bias on top of what was counted for it, so Σ c² ≥ Σ_k R_k² / (k + e + X) is traded against X.

@functools.lru_cache(maxsize=1 << 16)
def _chunk_ms(T, Rq: tuple, Rother: tuple, fills: int, free: int, excess: int, chunked: bool) -> float:
    """Least cost of the prefill-chunk terms: X extra chunk-carrying batches (the first `excess` of them only pay
    the prefill bias's excess over the lower bias, the rest the whole prefill bias) against Σ c² ≥ the harmonic
    bound. Rq: remaining prefill of Q's members (any order), Rother: of the rest; fills: Q's fill batches."""
    if not Rq and not Rother:
        return 0.0
    if not chunked:                                      # one chunk per prompt: c² = R² exactly
        return T.sq * sum(r * r for r in Rq + Rother)
    lo = min(T.pbase, T.dbase)
    linear = sum(Rq) + sum(Rother)                       # Σ c² ≥ Σ c
    other_sq = sum(r * r for r in Rother)
    best = math.inf
    X = 0 if Rq or fills + free > 0 else 1              # without Q's (re)fill batches something must carry them
    while X <= linear:
        carry = min(X, excess) * (T.pbase - lo) + max(0, X - excess) * T.pbase
        if carry >= best:
            break
        harmonic = sum(r * r / (k + 1 + free + X) for k, r in enumerate(Rq)) + other_sq / max(fills + free + X, 1)
        best = min(best, carry + T.sq * max(linear, harmonic))
        X += 1
    return best


def run_conflict_bound_ms(T, M: int, reqs, chunked: bool = True, evictions: bool = True,
                          min_evictions: int = 0) -> float:
    """A lower bound (ms) on the cost of finishing `reqs`, each (I0, O, I, m, g): prompt, output, current input,
    KV held, tokens generated (unfinished requests only), over every schedule (without evictions if `evictions`
    is false; with at least `min_evictions` decode-phase evictions otherwise)."""
    if not reqs:
        return 0.0
    lo = min(T.pbase, T.dbase)
    weights, most, tokens, later, extras, members = [], 0, 0, 0.0, [], []
    for r in reqs:
        w, left, tok, lat, ext, member = _request_terms(T, *r)
        weights += w
        most = max(most, left)
        tokens += tok
        later += lat
        extras += ext
        members.append(member)
    weights.sort(reverse=True)
    L2 = max(most, _packing(tuple(weights), M))
    extras.sort()
    if min_evictions > len(extras) or (min_evictions and not evictions):
        return math.inf                                  # no schedule of that kind exists
    base = T.tok * tokens + later
    floor = base + L2 * (T.base + lo)                    # every schedule has at least L2 batches
    strongest = 0.0
    for Q in _conflict_sets(members, M):             # each Q gives a valid bound: keep the largest
        best = math.inf
        P = sum(1 for k in Q if not members[k][1])
        D = sum(members[k][2] for k in Q) - P
        share = P // 2 if _exact_pair(members, Q, M) else 0
        # sorted: the largest remainders get the most carriers, which gives the least (so valid) harmonic sum
        Rq = tuple(sorted(members[k][3] for k in Q if members[k][3] > 0))
        Rother = tuple(sorted(members[k][3] for k in range(len(members)) if k not in Q and members[k][3] > 0))
        spent = 0.0
        for e in range(0, (len(extras) if evictions else 0) + 1):
            if e:
                spent += extras[e - 1]
            if e < min_evictions:
                continue
            if spent + floor >= best:                    # every later e costs at least this much
                break
            cost = math.inf
            for eq in range(0, min(e, D) + 1):
                fills = P + eq - min(eq, share)
                B = (D - eq) + fills
                excess = max(0, L2 - B)
                c = (D - eq) * (T.base + T.dbase) + fills * (T.base + T.pbase) + excess * (T.base + lo)
                c += _chunk_ms(T, Rq, Rother, fills, e, excess, chunked)
                cost = min(cost, c)
            best = min(best, cost + spent + base)
        strongest = max(strongest, best)
    return strongest


@functools.lru_cache(maxsize=1 << 16)
def _request_terms(T, I0: int, O: int, I: int, m: int, g: int):
    """One request's share of the bound: its token events' KV, events left, tokens it must still process, the
    later-token term, each later token's refill extra, and (w, in decode phase, events left, remaining prefill)."""
    decode = m >= I
    left = O - g
    first_later = max(g + 1 if decode else g + 2, 2)
    weights = [I0 + t - 1 for t in range(g + 1, O + 1)]
    tokens = left if decode else (I - m) + left - 1
    later = sum(later_token_ms(T, I0, t) for t in range(first_later, O + 1))
    extras = [T.tok * (I0 + t - 2) - later_token_ms(T, I0, t) for t in range(first_later, O + 1)]
    return weights, left, tokens, later, extras, (m if decode else I, decode, left, 0 if decode else I - m)


@functools.lru_cache(maxsize=1 << 16)
def _packing(weights: tuple, M: int) -> int:
    return martello_toth_l2(weights, M)


def _conflict_sets(members, M):
    """Candidate sets Q of pairwise-conflicting requests (the empty set among them). Conflict is w_a + w_b ≥ M, a
    threshold graph: its cliques are the requests with 2w ≥ M plus at most one lighter request."""
    ok = [k for k, (w, decode, left, _) in enumerate(members) if left >= (1 if decode else 2) and w > 0]
    heavy = [k for k in ok if 2 * members[k][0] >= M]
    out = [()]
    if heavy:
        out.append(tuple(heavy))
        floor = min(members[k][0] for k in heavy)
        for k in ok:
            if k not in heavy and members[k][0] + floor >= M:
                out.append(tuple(heavy) + (k,))
    else:
        for a in ok:
            for b in ok:
                if a < b and members[a][0] + members[b][0] >= M:
                    out.append((a, b))
    return out


def _exact_pair(members, Q, M) -> bool:
    """Whether two of Q's (re)fill-completing events can share a batch (their w add up to exactly M)."""
    fresh = [members[k][0] for k in Q if not members[k][1]]
    return any(fresh[a] + fresh[b] == M for a in range(len(fresh)) for b in range(a + 1, len(fresh)))
