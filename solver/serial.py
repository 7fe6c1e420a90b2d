"""Proven optima for memory-tight identical requests: enumerate batch skeletons, solve each one's chunk sizes as a QP.

Where n identical requests (prompt I0, output O ≥ 2) have 2·I0 ≥ M, two requests past their prefill can never share
the KV budget without an eviction (each holds at least I0; at 2·I0 = M neither could take another token). So every
eviction-free schedule is *serial*: request k's prefill completes in some batch, its O − 1 decodes follow, and no
other request completes a prefill until it is done. With labels in completion order (the requests are
interchangeable) such a schedule has exactly n·O event batches — batch k·O completes request k's prefill, the next
O − 1 decode it — plus any batches that carry prefill chunks only. What is left to choose is:
  * which decode batches also carry prefill chunks (each pays the prefill bias), a subset of the (n − 1)(O − 1)
    decode batches before the last prefill completes: the *skeleton*;
  * the chunk sizes, a convex QP per skeleton: minimise sq·Σ c² subject to each prompt being processed by its own
    completion batch (and not before it), and the KV in each batch at most M.
Everything else in the batch times (biases, tokens, KV reads) is fixed by the skeleton. Relaxing chunk sizes to reals
gives, per skeleton, a lower bound (a Lagrangian dual value, valid for any multipliers); the least over all
skeletons, with the analytic bound for schedules of more than n·O batches, bounds every eviction-free schedule. The
best skeleton's QP solution is rounded to whole tokens and improved by single-token moves; its exact re-timing is
the incumbent. When I0 is large, rounding costs far less than the 1e-6 proof tolerance.

With evictions allowed, schedules that evict nothing are the ones above, and those that evict in a decode phase are
bounded by solver.bounds.decode_eviction_bound_ms (an eviction mid-prefill is never needed); so the eviction-free
optimum is proven for both problems when that bound is not below it."""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.bounds import decode_eviction_bound_ms
from solver.schedule import Schedule, Step, evaluate

MAX_SKELETONS = 1 << 12      # (n − 1)(O − 1) decode batches can carry chunks: at most 12 of them (4096 QPs)


@dataclass
class SerialResult:
    status: str                 # optimal | gap (bound and incumbent further apart than the tolerance) | time_limit |
    #                             qp_limit
    value_ms: float             # the incumbent's exact objective (inf if stopped before any)
    bound_ms: float             # proven lower bound over every schedule of the instance
    schedule: Schedule | None   # None: stopped by a limit before any skeleton gave a schedule
    skeletons: int              # QPs solved
    time_s: float
    notes: list = field(default_factory=list)


def applies(inst) -> tuple[bool, str]:
    """Whether every eviction-free schedule is serial and the skeletons are few enough. Returns (yes, reason)."""
    opt = inst.options
    if inst.online:
        return False, "requests arrive over time"
    if opt.objective != "makespan":
        return False, f"objective {opt.objective} (the skeleton decomposition is for makespan)"
    if len(set(zip(inst.prompt, inst.output))) != 1:
        return False, "requests differ in (prompt, output)"
    I0, O, n = inst.prompt[0], inst.output[0], inst.n
    if O < 2 or 2 * I0 < inst.M:
        return False, f"2·I0 = {2 * I0} < M = {inst.M} or O < 2: requests need not run one after another"
    if not opt.chunked or not opt.hybrid:
        return False, "chunked prefill and hybrid batches must both be on"
    if opt.C < inst.M or inst.P_eff < inst.M or (opt.R_max and opt.R_max < n):
        return False, "C, P or R_max could bind (the QP models the KV budget only)"
    carry = (n - 1) * (O - 1)
    if 1 << carry > MAX_SKELETONS:
        return False, f"{1 << carry} skeletons (at most {MAX_SKELETONS})"
    return True, f"{n} identical requests with 2·I0 >= M: every eviction-free schedule is serial"


class _Skeletons:
    """The chunk-size QP of one skeleton: variables x[k, b] for request k in the batches b it may use."""

    def __init__(self, inst):
        self.inst = inst
        self.T = inst.terms
        self.I0, self.O, self.n, self.M = inst.prompt[0], inst.output[0], inst.n, inst.M
        self.J = self.n * self.O
        last = (self.n - 1) * self.O
        self.decode_batches = [j for j in range(last) if j % self.O]
        self.fixed_ms = (self.J * self.T.base + self.T.tok * self.n * (self.I0 + self.O - 1)
                         + self.n * (self.O - 1) * self.T.dbase + self.n * self.T.pbase
                         + self.T.kv * self.n * sum(self.I0 + t - 1 for t in range(2, self.O + 1)))

    def batches(self, carry, extra=()):
        """The skeleton's batches in order, as (event batch j or None for a chunk-only one, may carry chunks, KV of
        the request past its prefill): event batch j completes request j/O's prefill or decodes its token j%O + 1;
        `extra` lists the event batches that a chunk-only batch precedes."""
        out = []
        for j in range((self.n - 1) * self.O + 1):
            k, r = divmod(j, self.O)
            held_before = 0 if j % self.O == 0 else self.I0 + r - 1        # a request finishing frees its KV
            out += [(None, True, held_before)] * extra.count(j)
            out.append((j, r == 0 or j in carry, 0 if r == 0 else self.I0 + r))
        return out

    def layout(self, batches):
        fills = [b for b, (j, _, _) in enumerate(batches) if j is not None and j % self.O == 0]
        cols = [(k, b) for k in range(self.n) for b in range(fills[k] + 1) if batches[b][1]]
        return cols, fills

    def solve_qp(self, carry, extra=()):
        """(dual bound on sq·Σ c² in ms, (columns, primal chunk sizes)) for one skeleton, (inf, None) if none."""
        import highspy
        batches = self.batches(carry, extra)
        cols, fills = self.layout(batches)
        N = len(cols)
        A = np.zeros((self.n, N))                          # each prompt whole by its completion batch: Σ y = 1
        for c, (k, _) in enumerate(cols):
            A[k, c] = 1.0
        G, h = [], []                                      # KV per batch ≤ M; unfinished before completion
        for b in range(fills[-1] + 1):
            G.append([1.0 if bb <= b <= fills[k] else 0.0 for k, bb in cols])
            h.append((self.M - batches[b][2]) / self.I0)
            for k in range(self.n):
                if b < fills[k]:
                    G.append([1.0 if (kk == k and bb <= b) else 0.0 for kk, bb in cols])
                    h.append((self.I0 - 1) / self.I0)
        G, h, b_eq = np.array(G), np.array(h), np.ones(self.n)
        hs = highspy.Highs()
        hs.setOptionValue("output_flag", False)
        hs.setOptionValue("threads", 1)
        inf = highspy.kHighsInf
        rows = np.vstack([A, G])
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = N, rows.shape[0]
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = np.zeros(N), np.zeros(N), np.full(N, inf)
        lp.row_lower_ = np.concatenate([b_eq, np.full(len(h), -inf)])
        lp.row_upper_ = np.concatenate([b_eq, h])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        starts, index, value = [0], [], []
        for c in range(N):
            nz = np.nonzero(rows[:, c])[0]
            index += nz.tolist()
            value += rows[nz, c].tolist()
            starts.append(len(index))
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = starts, index, value
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = N, lp.num_row_
        hs.passModel(lp)
        hess = highspy.HighsHessian()                      # Σ y² = ½ yᵀ(2I)y
        hess.dim_, hess.format_ = N, highspy.HessianFormat.kTriangular
        hess.start_, hess.index_, hess.value_ = list(range(N + 1)), list(range(N)), [2.0] * N
        hs.passHessian(hess)
        hs.run()
        if hs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return math.inf, None
        sol = hs.getSolution()
        y, duals = np.array(sol.col_value), np.array(sol.row_dual)
        # any multipliers give a valid Lagrangian bound; take the better of the two sign conventions
        bound = max(self._dual_value(s * duals, A, b_eq, G, h) for s in (1.0, -1.0))
        return self.T.sq * self.I0 ** 2 * bound, (batches, cols, self.I0 * y)

    def _dual_value(self, duals, A, b, G, h) -> float:
        """min over y ≥ 0 of Σ y² + λ·(b − A y) + μ·(G y − h), for λ free and μ ≥ 0 (clipped): a lower bound."""
        lam = -duals[:len(b)]
        mu = np.maximum(duals[len(b):], 0.0)
        r = G.T @ mu - A.T @ lam
        return float(lam @ b - mu @ h - np.sum(np.minimum(r, 0.0) ** 2) / 4.0)

    # -- whole tokens -------------------------------------------------------------------------------------------
    def to_integer(self, batches, cols, x):
        """Chunks from rounded-down cumulative progress (so no batch's KV grows), then single-token moves that
        lower Σ c² (and the prefill biases) while keeping every limit. Returns {request: {batch: tokens}}."""
        fills = self.layout(batches)[1]
        chunks = {k: {} for k in range(self.n)}
        cum = {k: 0.0 for k in range(self.n)}
        for (k, b), v in zip(cols, x):
            cum[k] += v
            done = sum(chunks[k].values())
            whole = self.I0 if b == fills[k] else min(int(math.floor(cum[k] + 1e-9)), self.I0 - 1)
            chunks[k][b] = max(whole - done, 0)
        self._improve(batches, fills, chunks)
        return chunks

    def _cost(self, batches, chunks) -> float:
        """The skeleton-dependent part of the makespan: sq·Σ c² and the prefill bias of decode and chunk-only
        batches that carry a chunk (a chunk-only batch left empty is dropped, saving its base cost too)."""
        T = self.T
        used = {b for k in chunks for b, c in chunks[k].items() if c > 0}
        extra = sum(T.pbase + (T.base if batches[b][0] is None else 0.0) for b in used
                    if batches[b][0] is None or batches[b][0] % self.O)
        return T.sq * sum(c * c for k in chunks for c in chunks[k].values()) + extra

    def _feasible(self, batches, fills, chunks) -> bool:
        for b in range(fills[-1] + 1):
            kv = batches[b][2]
            for k in range(self.n):
                if b <= fills[k]:
                    cum = sum(c for bb, c in chunks[k].items() if bb <= b)
                    if b < fills[k] and cum >= self.I0:
                        return False
                    kv += cum
            if kv > self.M:
                return False
        return all(chunks[k][fills[k]] >= 1 for k in range(self.n))

    def _improve(self, batches, fills, chunks) -> None:
        best = self._cost(batches, chunks)
        improved = True
        while improved:
            improved = False
            for k in range(self.n):
                for a, b in itertools.permutations(sorted(chunks[k]), 2):
                    if chunks[k][a] == 0:
                        continue
                    chunks[k][a] -= 1
                    chunks[k][b] += 1
                    cost = self._cost(batches, chunks)
                    if cost < best - 1e-15 and self._feasible(batches, fills, chunks):
                        best, improved = cost, True
                    else:
                        chunks[k][a] += 1
                        chunks[k][b] -= 1

    def schedule(self, batches, chunks) -> Schedule:
        """The whole schedule: the skeleton's batches (empty chunk-only ones dropped), then the last decodes."""
        steps = []
        for b, (j, _, _) in enumerate(batches):
            tokens = {k: chunks[k][b] for k in range(self.n) if chunks[k].get(b, 0) > 0}
            if j is not None and j % self.O:
                tokens[j // self.O] = 1
            if tokens:
                steps.append(Step(tokens, []))
        k = self.n - 1
        steps += [Step({k: 1}, []) for _ in range(self.O - 1)]
        return Schedule(steps)


def solve_serial(inst, tol: float = 1e-6, time_limit_s: float = math.inf, qp_limit: int = 0) -> SerialResult:
    """Every skeleton's QP, with X = 0, 1, … chunk-only batches while X of them could still pay; the least dual
    bound (eviction schedules bounded analytically) and the best rounded schedule. Stopped by the time limit, the
    bound still holds: every skeleton not yet solved has at least the current X chunk-only batches."""
    t0 = time.perf_counter()
    sk = _Skeletons(inst)
    T = inst.terms
    positions = range((sk.n - 1) * sk.O + 1)           # a chunk-only batch before any event batch up to the last fill
    best_bound, count, pruned = math.inf, 0, 0
    incumbent, best_sched = math.inf, None
    X, stopped = 0, False
    while not stopped and sk.fixed_ms + X * (T.base + T.pbase) < best_bound:
        base = sk.fixed_ms + X * (T.base + T.pbase)
        for extra in itertools.combinations_with_replacement(positions, X):
            # every decode batch carrying is the loosest skeleton with these extras: its QP bounds all the others
            floor, _ = sk.solve_qp(tuple(sk.decode_batches), extra)
            count += 1
            for r in range(len(sk.decode_batches) + 1):
                if base + r * T.pbase + floor >= best_bound:
                    pruned += math.comb(len(sk.decode_batches), r)
                    continue
                for carry in itertools.combinations(sk.decode_batches, r):
                    if time.perf_counter() - t0 > time_limit_s or (qp_limit and count >= qp_limit):
                        stopped = "qp_limit" if qp_limit and count >= qp_limit else "time_limit"
                        break
                    bound, primal = sk.solve_qp(carry, extra)
                    count += 1
                    value = base + r * T.pbase + bound
                    if primal is not None and value < best_bound:
                        best_bound = value
                        sched = sk.schedule(primal[0], sk.to_integer(*primal))
                        ms = evaluate(inst, sched).objective(inst, "makespan") * 1e3
                        if ms < incumbent:
                            incumbent, best_sched = ms, sched
                if stopped:
                    break
            if stopped:
                break
        if not stopped:
            X += 1
    more = sk.fixed_ms + X * (T.base + T.pbase)        # every schedule with X or more chunk-only batches
    notes = [f"{count} chunk-size QPs (HiGHS) over skeletons with up to {X - (not stopped)} chunk-only batch(es); "
             f"{pruned} skeletons cut by their loosest relaxation"
             + (f"; stopped at the {stopped.replace('_', ' ')}" if stopped else "")]
    bound_ms = min(best_bound, more)
    if inst.options.evictions:
        evicting = decode_eviction_bound_ms(inst)
        if evicting < bound_ms:
            notes.append(f"schedules that evict are bounded only at {evicting:.6f} ms")
        bound_ms = min(bound_ms, evicting)
    bound_ms = min(bound_ms, incumbent)
    proven = math.isfinite(incumbent) and incumbent - bound_ms <= tol * incumbent
    status = "optimal" if proven else (stopped or "gap")
    return SerialResult(status, incumbent, bound_ms, best_sched, count, time.perf_counter() - t0, notes)
