"""Analytic lower bounds on the optimal objective, computed in microseconds from the instance alone.

Every token event of a request needs exactly I0 + t − 1 KV tokens in its batch (token t of a request with prompt
I0), a request generates at most one token per batch, and a batch holds at most M KV tokens. So the batches that
generate tokens form a bin packing of the token events, whose Martello–Toth L2 bound is a minimum batch count.
That count × the per-batch fixed cost, plus the per-token cost of the tokens every schedule processes, plus for
each later token the cheaper of its decode's KV read or a refill, bounds the makespan of any schedule."""
from __future__ import annotations

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
    return sum(v for k, v in parts.items() if k != "batches"), parts


def decode_eviction_bound_ms(inst) -> float:
    """A lower bound (ms) on the makespan of every schedule that evicts some request in its decode phase.

    Such a request makes its next token by a refill that re-processes at least I0 + t − 2 tokens where the makespan
    bound let the cheaper of that and a decode's KV read stand; so the bound rises by the cheapest such difference.
    (An eviction during a prefill is never needed: dropping the chunks it wastes leaves a schedule no dearer.)
    With the eviction-free optimum's bound B_ef, min(B_ef, this) bounds the evictions-allowed optimum."""
    T = inst.terms
    extra = min((T.tok * (inst.prompt[i] + t - 2) - later_token_ms(T, inst.prompt[i], t)
                 for i in range(inst.n) for t in range(2, inst.output[i] + 1)), default=math.inf)
    return makespan_bound_ms(inst)[0] + extra
