"""Exact optimal schedules by A* over multiset states, for offline instances whose requests fall into few classes.

A state holds, per unfinished request, (current input I, KV held m, tokens generated g); requests of one (I0, O)
class in equal states are interchangeable, so a state is a sorted tuple per class. One edge is one batch: each
request idles, is evicted, or processes a prefill chunk / one decode token, under C, P, M and R_max. Every
objective here adds up over batches (makespan: the batch time; Σ completion: the batch time × requests still
unfinished; mean TTFT: × requests still without a token / n), so the cheapest path to the all-done state is the
optimum. The heuristic is an admissible bound on what is left (solver.bounds); nodes whose f exceeds the best
known schedule's value are cut. Dominance rules that keep it exact:
  * only requests in their decode phase are evicted: an eviction mid-prefill only wastes the chunks before it, and
    dropping those chunks (and the eviction) leaves a schedule no dearer under every objective, with every limit
    looser. (Evictions the batch does not need for memory are kept: a request cannot be evicted in the batch that
    starts its refill, so "evict later" is not always available — the exhaustive test caught that rule.)
  * requests of one class in one state take their actions in non-decreasing order (permutations are the same
    multiset successor).
  * when C and P exceed M (so neither ever binds: every processed token lands in the batch's KV), a chunk is never
    followed, in its prefill episode, by a chunk more than one token smaller: moving a token from the earlier
    chunk to the later one lowers Σ c² and the KV held in between, and changes nothing else. So a non-final chunk
    c leaves at least c − 1 tokens: c ≤ ⌊(R + 1)/2⌋ of the R left. The other way round, a chunk more than one
    token above the episode's previous chunk needs a full batch (KV = M) since that chunk, or the token could move
    earlier. A state remembers, per request mid-prefill, its last chunk and whether a full batch came since.
With an admissible heuristic and re-expansion of improved states, the first all-done state taken off the queue
is optimal, and the least f left in the queue is a valid lower bound when the search stops early."""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

from solver.bounds import later_token_ms, run_conflict_bound_ms
from solver.schedule import Schedule, Step

IDLE, EVICT = -1, 0          # actions; a positive action is the number of tokens processed


@dataclass
class SearchResult:
    status: str                     # optimal | time_limit | node_limit | no_better
    value_ms: float                 # the best schedule's objective (ms), inf if none
    bound_ms: float                 # proven lower bound (ms)
    schedule: Schedule | None
    expanded: int
    generated: int
    time_s: float
    notes: list = field(default_factory=list)


AUTO_MAX_PREFILL = 128       # backend auto: Σ prompt tokens (chunk choices) up to which the search is tried first
AUTO_MAX_PREFILL_RULES = 256  # the same where the chunk-size rules apply (C, P > M): §4.5 I = 64 is proven in ~6 s


def applies(inst, max_classes: int = 4, auto: bool = False) -> tuple[bool, str]:
    """Whether the search applies: offline, few (I0, O) classes, and (for backend auto) few chunk choices, since
    every chunk size of every prompt is a branch. Returns (yes, reason)."""
    if inst.online:
        return False, "requests arrive over time (the search is for offline instances)"
    classes = {(p, o) for p, o in zip(inst.prompt, inst.output)}
    if len(classes) > max_classes:
        return False, f"{len(classes)} request classes (the search takes at most {max_classes})"
    chunks = sum(min(p, inst.P_eff) for p in inst.prompt) if inst.options.chunked else 0
    limit = AUTO_MAX_PREFILL_RULES if chunk_rules_apply(inst) else AUTO_MAX_PREFILL
    if auto and chunks > limit:
        return False, (f"{chunks} prompt tokens to chunk (auto tries the search up to {limit}; "
                       f"--backend search forces it)")
    return True, f"{len(classes)} request class(es), offline"


def chunk_rules_apply(inst) -> bool:
    """A batch processes at most M tokens (each one lands in the KV), so C, P > M never bind and the chunk-size
    rules of the module doc are exact."""
    return inst.options.C > inst.M and inst.P_eff > inst.M


class _Problem:
    def __init__(self, inst):
        self.inst = inst
        opt = inst.options
        self.T = inst.terms
        self.C, self.P, self.M, self.R = opt.C, inst.P_eff, inst.M, inst.R_eff
        self.chunked, self.hybrid, self.evictions = opt.chunked, opt.hybrid, opt.evictions
        self.balanced_chunks = chunk_rules_apply(inst)
        self.p_counts_decode = opt.p_counts_decode_tokens
        self.objective = opt.objective
        self.n = inst.n
        self.classes = sorted({(p, o) for p, o in zip(inst.prompt, inst.output)})
        self.members = {c: [i for i in range(inst.n) if (inst.prompt[i], inst.output[i]) == c] for c in self.classes}
        self._h_memo: dict = {}

    def start(self):
        return tuple(tuple(sorted((I0, 0, 0, 0, 0) for _ in self.members[(I0, O)])) for I0, O in self.classes)

    # -- heuristic --------------------------------------------------------------------------------------------
    def _own(self, k, s):
        """Lower bound on the cost of the batches request (class k, state s) still needs, counted once each
        (base cost per batch, its own processed tokens, later-token reads or refills, its prefill's terms)."""
        T = self.T
        I0, O = self.classes[k]
        I, m, g = s
        left = O - g
        cost = left * (T.base + min(T.pbase, T.dbase))
        if m < I:                                   # still prefilling: the rest of I, then decodes
            cost += (T.tok + T.sq) * (I - m) + T.pbase - min(T.pbase, T.dbase) + T.tok * (left - 1)
            first_later = g + 2
        else:
            cost += T.tok * left
            first_later = g + 1
        cost += sum(later_token_ms(T, I0, t) for t in range(max(first_later, 2), O + 1))
        return cost

    def h(self, state) -> float:
        # the bound reads (I, m, g) only: states that differ in their chunk-rule memory share one value
        key = tuple(tuple(sorted(s[:3] for s in group)) for group in state) if self.balanced_chunks else state
        v = self._h_memo.get(key)
        if v is None:
            v = self._h_memo[key] = self._h(key)
        return v

    def _h(self, state) -> float:
        T = self.T
        if self.objective == "makespan":
            reqs = [(I0, O, *s[:3]) for (I0, O), group in zip(self.classes, state) for s in group]
            return run_conflict_bound_ms(T, self.M, reqs, self.chunked, self.evictions)
        if self.objective == "sum_completion":
            return sum(self._own(k, s[:3]) for k, group in enumerate(state) for s in group)
        # mean TTFT: each request still without a token waits at least one batch holding its remaining prefill
        total = 0.0
        for k, group in enumerate(state):
            for I, m, g, *_ in group:
                if g == 0:
                    total += T.base + T.pbase + (T.tok + T.sq) * (I - m)
        return total / self.n

    # -- successors -------------------------------------------------------------------------------------------
    def successors(self, state):
        """Yield (cost_ms, next_state, moves) for every batch from `state`; moves = [(class, before, action)]."""
        flat = [(k, s) for k, group in enumerate(state) for s in group]
        n = len(flat)
        unfinished = n
        no_token = sum(1 for _, s in flat if s[2] == 0)
        options = []
        for k, (I, m, g, last, tight) in flat:
            acts = [IDLE]
            if self.evictions and m >= I:           # decode phase only (module doc)
                acts.append(EVICT)
            if m < I:                               # prefill: any chunk (whole prompt only without chunking)
                R = I - m
                hi = min(R, self.C, self.P)
                if not self.chunked:
                    acts += [R] if m == 0 and I <= hi else []
                elif self.balanced_chunks:          # chunk-size rules (module doc)
                    lo = max(1, last - 1)                       # never more than one below the last chunk
                    up = hi if tight or not last else min(hi, last + 1)   # above it only after a full batch
                    acts += list(range(lo, min(up, (R + 1) // 2) + 1)) + \
                        ([R] if lo <= R <= up and R > (R + 1) // 2 else [])
                else:
                    acts += list(range(1, hi + 1))
            else:
                acts.append(1)                      # one decode token
            options.append(acts)
        held = [s[1] for _, s in flat]
        out = []
        choice = [IDLE] * n

        def rec(idx, tokens, prefill_tok, kv_total, running):
            if idx == n:
                if tokens == 0:
                    return
                out.append((tuple(choice), kv_total))
                return
            k, s = flat[idx]
            I, m, g = s[:3]
            prev_same = idx > 0 and flat[idx - 1] == flat[idx]
            for a in options[idx]:
                if prev_same and a < choice[idx - 1]:
                    continue                        # identical requests: non-decreasing actions only
                if a == IDLE:
                    kv, run, t, p = m, int(m > 0), 0, 0
                elif a == EVICT:
                    kv, run, t, p = 0, 0, 0, 0
                else:
                    decode = m >= I
                    kv, run, t = m + a, 1, a
                    p = 0 if decode else a
                if tokens + t > self.C or kv_total + kv > self.M or running + run > self.R:
                    continue
                if prefill_tok + p > self.P:
                    continue
                choice[idx] = a
                rec(idx + 1, tokens + t, prefill_tok + p, kv_total + kv, running + run)
            choice[idx] = IDLE

        rec(0, 0, 0, 0, 0)
        T = self.T
        for ch, kv_total in out:
            n_tok = sq = kv = 0
            has_pre = has_dec = False
            nxt = [[] for _ in self.classes]
            moves = []
            p_tok = 0
            full = self.balanced_chunks and kv_total == self.M     # a full batch lifts the next chunks' caps
            for i, (k, (I, m, g, last, tight)) in enumerate(flat):
                a = ch[i]
                O = self.classes[k][1]
                if a == IDLE:
                    nxt[k].append((I, m, g, last, int(tight or (full and last > 0))))
                elif a == EVICT:
                    nxt[k].append((m + 1 if m >= I else I, 0, g, 0, 0))
                else:
                    n_tok += a
                    if m >= I:
                        has_dec, kv = True, kv + m + 1
                        g2, m2 = g + 1, m + 1
                    else:
                        has_pre, sq, p_tok = True, sq + a * a, p_tok + a
                        m2 = m + a
                        g2 = g + (m2 == I)
                    if g2 < O:
                        mid = self.balanced_chunks and m2 < I        # a prefill episode goes on: remember its chunk
                        nxt[k].append((I, m2, g2, a if mid else 0, int(full) if mid else 0))
                moves.append((k, (I, m, g, last, tight), a))
            if has_pre and has_dec and not self.hybrid:
                continue
            if self.p_counts_decode and has_pre and n_tok > self.P:
                continue
            t = T.tok * n_tok + T.base + (T.sq * sq + T.pbase if has_pre else 0.0) + \
                (T.kv * kv + T.dbase if has_dec else 0.0)
            if self.objective == "sum_completion":
                cost = t * unfinished
            elif self.objective == "mean_ttft":
                cost = t * no_token / self.n
            else:
                cost = t
            yield cost, tuple(tuple(sorted(gr)) for gr in nxt), moves


def search(inst, upper_ms: float = math.inf, time_limit_s: float = 60.0, node_limit: int = 5_000_000) -> SearchResult:
    """A* from the initial state; `upper_ms` (a known schedule's objective) prunes everything that cannot beat it."""
    t0 = time.perf_counter()
    pb = _Problem(inst)
    start = pb.start()
    goal = tuple(() for _ in pb.classes)
    best_g = {start: 0.0}
    parent = {start: None}
    tie = itertools.count()
    h0 = pb.h(start)
    heap = [(h0, next(tie), 0.0, start)]
    cutoff = upper_ms * (1 + 1e-12)
    expanded = generated = 0
    status = "no_better"
    while heap:
        f, _, g, state = heapq.heappop(heap)
        if g > best_g.get(state, math.inf) + 1e-9:
            continue                                # a stale entry: the state was reached cheaper since
        if state == goal:
            return SearchResult("optimal", g, g, _rebuild(pb, parent, state), expanded, generated,
                                time.perf_counter() - t0)
        expanded += 1
        if expanded % 256 == 1 and time.perf_counter() - t0 > time_limit_s:
            status = "time_limit"
            heapq.heappush(heap, (f, next(tie), g, state))     # not expanded: it still bounds the optimum
            break
        if expanded > node_limit:
            status = "node_limit"
            heapq.heappush(heap, (f, next(tie), g, state))
            break
        for cost, nxt, moves in pb.successors(state):
            g2 = g + cost
            if g2 >= best_g.get(nxt, math.inf) - 1e-9:
                continue
            f2 = g2 + pb.h(nxt)
            if f2 > cutoff:
                continue
            best_g[nxt] = g2
            parent[nxt] = (state, moves)
            generated += 1
            heapq.heappush(heap, (f2, next(tie), g2, nxt))
    # stopped early, or nothing beats upper_ms: the least f left (or the cutoff itself) bounds the optimum
    bound = min((e[0] for e in heap), default=math.inf)
    if status == "no_better":
        bound = upper_ms                            # every schedule cheaper than upper_ms was ruled out
    return SearchResult(status, math.inf, min(bound, upper_ms), None, expanded, generated,
                        time.perf_counter() - t0)


def _rebuild(pb, parent, state) -> Schedule:
    """The batches along the path, with canonical requests mapped back to request ids of the same class/state."""
    path = []
    while parent[state] is not None:
        prev, moves = parent[state]
        path.append(moves)
        state = prev
    path.reverse()
    cur = {i: (pb.inst.prompt[i], 0, 0) for i in range(pb.n)}
    cls = {i: pb.classes.index((pb.inst.prompt[i], pb.inst.output[i])) for i in range(pb.n)}
    steps = []
    for moves in path:
        used = set()
        tokens, evict = {}, []
        updates = {}
        for k, before, a in moves:
            i = next(i for i in range(pb.n) if i not in used and cls[i] == k and cur[i] == before[:3])
            used.add(i)
            I, m, g = before[:3]
            if a == EVICT:
                evict.append(i)
                updates[i] = (m + 1 if m >= I else I, 0, g)
            elif a > 0:
                tokens[i] = a
                m2 = m + a
                updates[i] = (I, m2, g + 1) if m >= I else (I, m2, g + (m2 == I))
        cur.update(updates)
        steps.append(Step(tokens, evict))
    return Schedule(steps)
