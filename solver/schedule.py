"""A schedule as the solver sees it (per batch: tokens per request, evictions) and its exact forward evaluation."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from costmodels.errors import UserError


@dataclass
class Step:
    """One batch: `tokens[i]` = c_{i,j} > 0 for requests in it; `evict` = requests dropped before it runs."""
    tokens: dict = field(default_factory=dict)
    evict: list = field(default_factory=list)


@dataclass
class Schedule:
    steps: list

    def __len__(self) -> int:
        return len(self.steps)

    def to_json(self) -> str:
        return json.dumps([{"tokens": {str(i): c for i, c in s.tokens.items()}, "evict": s.evict}
                           for s in self.steps])

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls([Step({int(i): int(c) for i, c in d["tokens"].items()}, [int(i) for i in d["evict"]])
                    for d in json.loads(text)])


class InvalidSchedule(UserError):
    """A schedule breaks a CSP constraint (the message names the batch and the rule)."""


@dataclass
class Trajectory:
    """Every CSP variable's value along a schedule, plus its wall-clock outcome (ms inside, s in the metrics)."""
    values: dict          # (name, i, j) or (name, j) -> value, the names of solver.formulation
    batch_ms: list
    start_ms: list
    end_ms: list
    completion_s: list
    first_token_s: list
    evictions: int

    @property
    def makespan_s(self) -> float:
        return self.end_ms[-1] / 1e3 if self.end_ms else 0.0

    def objective(self, inst, name: str) -> float:
        """The objective in seconds: makespan from the first arrival, Σ completion (e2e) time, or mean TTFT."""
        t0 = min(inst.arrival)
        if name == "makespan":
            return max(self.completion_s) - t0
        if name == "sum_completion":
            return sum(c - a for c, a in zip(self.completion_s, inst.arrival))
        return sum(f - a for f, a in zip(self.first_token_s, inst.arrival)) / inst.n


def evaluate(inst, schedule: Schedule, horizon: int | None = None) -> Trajectory:
    """Run the InferMax state machine (§2.4) over `schedule`, check every CSP constraint, and time each batch.

    Raises InvalidSchedule naming the first violated rule; otherwise returns all variable values, which is
    what a warm start needs and what the solver's result is re-checked against."""
    opt, n = inst.options, inst.n
    steps = [s for s in schedule.steps if s.tokens or s.evict]
    J = horizon if horizon is not None else len(steps)
    if len(steps) > J:
        raise InvalidSchedule(f"schedule has {len(steps)} batches, more than the horizon J = {J}")
    I = list(inst.prompt)
    m = [0] * n
    gen = [0] * n
    done = [False] * n
    started = [False] * n
    comp = [None] * n
    first = [None] * n
    vals, batch_ms, start_ms, end_ms = {}, [], [], []
    now = 0.0
    evictions = 0
    T = inst.terms
    for j in range(1, J + 1):
        step = steps[j - 1] if j <= len(steps) else Step()
        where = f"batch {j}"
        for i in list(step.tokens) + list(step.evict):
            if not 0 <= i < n:
                raise InvalidSchedule(f"{where}: request {i} does not exist")
        if step.evict and not opt.evictions:
            raise InvalidSchedule(f"{where}: evicts {step.evict} but evictions are switched off")
        arrive = max([inst.arrival[i] * 1e3 for i in step.tokens] + [now])
        idle = arrive - now if step.tokens else 0.0
        n_tok = n_pre = 0
        sq = kv = 0
        has_pre = has_dec = False
        mp_total = running = 0
        for i in range(n):
            d = int(m[i] >= I[i])
            e = int(i in step.evict)
            c = int(step.tokens.get(i, 0))
            Ip, mprev = I[i], m[i]
            if e:
                if mprev == 0:
                    raise InvalidSchedule(f"{where}: evicts request {i}, which holds no KV")
                if c:
                    raise InvalidSchedule(f"{where}: request {i} is evicted and processed in the same batch")
                evictions += 1
                if d:
                    I[i] = mprev + 1
                m[i] = 0
            if c < 0:
                raise InvalidSchedule(f"{where}: request {i} has negative tokens {c}")
            if c and done[i]:
                raise InvalidSchedule(f"{where}: request {i} already completed")
            g = 0
            if c:
                if d:
                    if c != 1:
                        raise InvalidSchedule(f"{where}: decode request {i} processes {c} tokens (must be 1)")
                    has_dec, kv, g = True, kv + mprev + 1, 1
                else:
                    if mprev + c > Ip:
                        raise InvalidSchedule(f"{where}: request {i} prefills {c} tokens past its input {Ip}")
                    if not opt.chunked and (mprev != 0 or c != Ip):
                        raise InvalidSchedule(f"{where}: request {i} chunk of {c} of {Ip} with chunked prefill off")
                    has_pre, n_pre, sq = True, n_pre + c, sq + c * c
                    g = int(mprev + c == Ip)
                n_tok += c
            mp = m[i] + c
            m[i] = mp
            mp_total += mp
            running += mp > 0
            gen[i] += g
            if g and not started[i]:
                started[i] = True
            fin = g and gen[i] == inst.output[i]
            vals.update({("I", i, j): I[i], ("d", i, j): d, ("e", i, j): e, ("c", i, j): c, ("cz", i, j): int(c > 0),
                         ("g", i, j): g, ("dg", i, j): d * g, ("ed", i, j): e * d, ("mp", i, j): mp,
                         ("mpz", i, j): int(mp > 0), ("q", i, j): c * c, ("w", i, j): (mprev + 1) * d * g})
            if fin:
                done[i] = True
                m[i] = 0
            vals.update({("gc", i, j): gen[i], ("m", i, j): m[i], ("mz", i, j): int(m[i] > 0), ("done", i, j): int(done[i]),
                         ("f", i, j): int(started[i])})
        if n_tok > opt.C:
            raise InvalidSchedule(f"{where}: {n_tok} tokens exceed C = {opt.C}")
        p_used = n_tok if (opt.p_counts_decode_tokens and has_pre) else n_pre
        if p_used > inst.P_eff:
            raise InvalidSchedule(f"{where}: {p_used} prefill-budget tokens exceed P = {inst.P_eff}")
        if mp_total > inst.M:
            raise InvalidSchedule(f"{where}: KV {mp_total} exceeds M = {inst.M}")
        if running > inst.R_eff:
            raise InvalidSchedule(f"{where}: {running} running requests exceed R_max = {inst.R_eff}")
        if has_pre and has_dec and not opt.hybrid:
            raise InvalidSchedule(f"{where}: mixes prefill and decode with hybrid batching off")
        t = 0.0
        if n_tok:
            t = T.tok * n_tok + T.base + (T.sq * sq + T.pbase if has_pre else 0.0) + (T.kv * kv + T.dbase if has_dec
                                                                                      else 0.0)
        start = now + idle
        now = start + t
        batch_ms.append(t)
        start_ms.append(start)
        end_ms.append(now)
        vals.update({("y", j): int(n_tok > 0), ("yp", j): int(has_pre), ("yd", j): int(has_dec), ("s", j): idle,
                     ("T", j): t, ("acc", j): now})
        for i in range(n):
            g = vals[("g", i, j)]
            if g and first[i] is None:
                first[i] = now / 1e3
            if g and vals[("done", i, j)] and comp[i] is None:
                comp[i] = now / 1e3
    for i in range(n):                       # token-indexed view: X[i,t,j] = token t generated by batch j
        for t in range(1, inst.output[i] + 1):
            for j in range(1, J + 1):
                vals[("X", i, t, j)] = int(vals[("gc", i, j)] >= t)
    missing = [i for i in range(n) if not done[i]]
    if missing:
        raise InvalidSchedule(f"schedule ends with request(s) {missing} unfinished "
                              f"(generated {[gen[i] for i in missing]} of {[inst.output[i] for i in missing]})")
    # z: the batch durations a request waits through before finishing / before its first token (objective helpers)
    for i in range(n):
        for j in range(1, J + 1):
            tau = vals[("s", j)] + vals[("T", j)]
            prev_done = vals[("done", i, j - 1)] if j > 1 else 0
            prev_f = vals[("f", i, j - 1)] if j > 1 else 0
            vals[("zc", i, j)] = tau * (1 - prev_done)
            vals[("zf", i, j)] = tau * (1 - prev_f)
    return Trajectory(vals, batch_ms, start_ms, end_ms, comp, first, evictions)
