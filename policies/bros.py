"""BROS (arXiv 2504.09590): least-slack RT packing under a cost-model time budget, BE fill/replace, bidirectional KV."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from costmodels.base import BatchShape
from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy

RT, BE = "rt", "be"
_RUNNING = "running"        # Request.state of a request on the GPU (its on_gpu; policies do not import sim)


class CostTally:
    """A candidate batch's shape kept as running sums, so Alg. 1 can price `batch + req` in O(1) per probe (integer
    sums: the same floats whatever the order members came and went in)."""

    def __init__(self, costmodel):
        self.cm = costmodel
        self.fast = hasattr(costmodel, "time_from_sums")
        self.members = []          # (req, tokens, context, swap_in, is_decode)
        # n_tokens, n_prefill, sum_c2, sum_ck, sum_k_prefill, n_decode, kv_read, swap-in slots
        self.sums = [0] * 8

    @staticmethod
    def _terms(member):
        _, c, k, sw, decode = member
        return (c, 0, 0, 0, 0, 1, k + 1, sw) if decode else (c, 1, c * c, c * k, k, 0, 0, sw)

    def _shift(self, member, sign: int) -> None:
        self.sums = [a + sign * b for a, b in zip(self.sums, self._terms(member))]

    def add(self, member) -> None:
        self.members.append(member)
        self._shift(member, 1)

    def insert(self, idx: int, member) -> None:
        self.members.insert(idx, member)
        self._shift(member, 1)

    def pop(self, idx: int):
        member = self.members.pop(idx)
        self._shift(member, -1)
        return member

    def time(self, extra=None) -> float:
        if not self.members and not extra:
            return 0.0
        if self.fast:
            s = self.sums if extra is None else [a + b for a, b in zip(self.sums, self._terms(extra))]
            return self.cm.time_from_sums(*s[:7]) + self.cm.swap_time(s[7])
        members = self.members + ([extra] if extra else [])
        shape = BatchShape(swap_in_tokens=sum(m[3] for m in members))
        for _, c, k, _, decode in members:
            if decode:
                shape.decode_context.append(k + 1)
            else:
                shape.prefill_tokens.append(c)
                shape.prefill_context.append(k)
        return self.cm.batch_time(shape)


def _entry(req, mem):
    """(req, tokens, context, swap-in slots, is_decode) for a request's next step (whole prompt, no chunking)."""
    swap = mem.cpu_slots(req) if hasattr(mem, "cpu_slots") else 0   # bidirectional layout only
    if req.is_decode:
        return (req, 1, req.cached, swap, True)
    return (req, req.input_tokens - req.cached, req.cached, swap, False)


class Bros(Policy):
    """Algorithm 1 (priority-based packing) with the spec's guards (§5.5) and TCP-like batch sizing (§5.4)."""

    name = "bros"

    @dataclass
    class Config:
        rt_ttft_slo_s: float = 0.4      # real-time requests' TTFT target (s), what least-slack packing protects
        rt_tpot_slo_s: float = 0.2      # real-time requests' time-per-output-token target (s)
        b_base: int = 128               # adaptive batch size: start, reset value
        b_max: int = 4096               # cap on doubling (the paper has none; memory bounds it in practice)
        bidirectional: bool = True      # off: one owner per block, RT short of memory recomputes BE (ablation)
        replace: bool = True            # BE may replace the least urgent selected RT (lines 25–31)
        t_avg_alpha: float = 0.1        # EMA factor of the iteration-latency average T_avg

        def validate(self, where="policy"):
            for k in ("rt_ttft_slo_s", "rt_tpot_slo_s", "b_base", "b_max"):
                if not getattr(self, k) > 0:
                    raise UserError(f"{where}.{k}: must be > 0, got {getattr(self, k)!r}")
            if not 0 < self.t_avg_alpha <= 1:
                raise UserError(f"{where}.t_avg_alpha: must be in (0, 1], got {self.t_avg_alpha}")

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        self.B = self.config.b_base
        self.t_avg = None
        self.stats = {"time_bound_iters": 0, "replacements": 0, "extreme_swapouts": 0, "recompute_victims": 0,
                      "swap_in_slots": 0}

    def kv_layout(self, memory, costmodel):
        return ("bidirectional", {"bidirectional": self.config.bidirectional})

    def on_commit(self, view, batch, batch_time_s):
        a = self.config.t_avg_alpha
        self.t_avg = batch_time_s if self.t_avg is None else (1 - a) * self.t_avg + a * batch_time_s

    # -- urgency ------------------------------------------------------------------------------------------
    def _slack(self, view, r) -> float:
        cfg = self.config
        if r.generated:
            return cfg.rt_tpot_slo_s - (view.now - r.token_times[-1])
        return cfg.rt_ttft_slo_s - (view.now - r.arrival_s)

    # -- Algorithm 1 -------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        cfg, mem = self.config, view.memory
        pool = list(view.running) + list(view.waiting)
        slack = self._slack
        ranked = sorted((slack(view, r), r.arrival_s, r.id, r) for r in pool if r.cls == RT)   # (ids are unique)
        rts = [x[3] for x in ranked]
        live = [x[0] for x in ranked]
        # BE: least CPU-resident KV first; pending (decode) before waiting; then arrival (spec §8.6 default). Taken
        # lazily from a heap: the loop below mostly stops after a few of a long queue.
        be = [r for r in pool if r.cls != RT]
        bes = [(c, r.state != _RUNNING, r.arrival_s, r.id, r)                  # (not on the GPU)
               for c, r in zip(mem.cpu_slots_of(be), be)]        # (BROS runs on the bidirectional layout)
        heapq.heapify(bes)
        feasible = [s for s in live if s > 0]
        # Guard (b): late requests stop constraining T; when every RT request is late the step is still held to
        # one TPOT target, so late requests are not made later still by an unbounded batch (our resolution).
        budget = min(feasible) if feasible else (cfg.rt_tpot_slo_s if rts else math.inf)
        tally = CostTally(view.costmodel)
        chosen, protected = [], set()
        time_bound = False
        for i, r in enumerate(rts):
            if len(chosen) >= self.B:
                break
            e = _entry(r, mem)
            if tally.time(e) > budget and chosen:
                time_bound = True
                break
            if tally.time(e) > budget:
                time_bound = True              # guard (a): the head runs even if its step alone is too long
            if not self._place(view, r, chosen, rt=True):
                continue    # skip (paper: break): a request that finds no memory must not stall the RT decodes behind
            tally.add(e)
            chosen.append(r)
            if i == 0:
                protected.add(r)                 # guard 3: the most urgent RT is never replaced
        while bes:
            r = heapq.heappop(bes)[4]
            if len(chosen) >= self.B and not (cfg.replace and len(chosen) > len(protected)):
                break
            e = _entry(r, mem)
            if len(chosen) < self.B and tally.time(e) <= budget:
                if not self._place(view, r, chosen, rt=False):
                    break
                tally.add(e)
                chosen.append(r)
                continue
            if not cfg.replace:
                break
            victim_idx = self._replaceable(view, tally, chosen, protected)
            if victim_idx is None:
                break
            popped = tally.pop(victim_idx)
            victim = chosen.pop(victim_idx)
            if len(chosen) < self.B and tally.time(e) <= budget and self._place(view, r, chosen, rt=False):
                tally.add(e)
                chosen.append(r)
                self.stats["replacements"] += 1
            else:
                tally.insert(victim_idx, popped)
                chosen.insert(victim_idx, victim)
                break
        if time_bound:
            self.stats["time_bound_iters"] += 1
            self.B = cfg.b_base                    # aggressive backoff
        else:
            self.B = min(2 * self.B, cfg.b_max)    # gradual expansion
        return self._emit(view, chosen)

    def _replaceable(self, view, tally, chosen, protected):
        """Index of the least urgent selected RT whose deadline survives skipping this step (constraint 6)."""
        t_next = tally.time()
        t_avg = self.t_avg or t_next
        for idx in range(len(chosen) - 1, -1, -1):
            r = chosen[idx]
            if r.cls != RT:
                continue
            if r in protected:
                return None
            if self._slack(view, r) - t_next - t_avg >= 0:
                return idx
            return None
        return None

    def _place(self, view, r, chosen, rt: bool) -> bool:
        """FindPreemptBlock / FindBlock: reserve the step's slots, falling back to the extreme case for RT."""
        mem = view.memory
        target = r.cached + 1 if r.is_decode else r.input_tokens
        while True:
            ok = view.reserve(r, target) if r.on_gpu else view.admit(r, target)
            if ok:
                return True
            if not rt and chosen:
                return False
            # RT: FindPreemptBlock's extreme case. BE with an empty batch: our livelock guard (paper silent) —
            # otherwise BE requests holding all memory could each wait for another to finish.
            victim = self._victim(view, r, chosen)
            if victim is None:
                return False
            if mem.bidirectional:
                mem.swap_out_all(victim)          # extreme case: drop the victim's slots to CPU, swap in later
                self.stats["extreme_swapouts"] += 1
            else:
                view.preempt(victim, "recompute", front=False)   # no-bi-cache ablation: recompute
                self.stats["recompute_victims"] += 1

    def _victim(self, view, r, chosen):
        """BE first, then RT with the most slack; only requests holding GPU slots and not in this batch."""
        mem = view.memory
        taken = set(id(x) for x in chosen)
        cands = [x for x in view.running if x is not r and id(x) not in taken and mem.resident.get(x.id, 0) > 0]
        be = [x for x in cands if x.cls != RT]
        if be and r.cls != RT:
            return max(be, key=lambda x: (x.arrival_s, x.id))      # the newest BE yields to older BE work
        if be:
            return max(be, key=lambda x: (mem.resident.get(x.id, 0), x.arrival_s))
        rt = [x for x in cands if x.cls == RT]
        # Only a fully resident RT decode may push out another RT request. Letting new prompts or swapped-out
        # requests (which must restore their slots) evict RT work made every step swap one RT request out and
        # another back in — a thrash we measured; the paper is silent. Swapped-out RT waits for free memory.
        if rt and r.cls == RT and r.on_gpu and not mem.cpu_slots(r):
            return max(rt, key=lambda x: self._slack(view, x))
        return None

    def _emit(self, view, chosen) -> Batch:
        batch, mem = Batch(), view.memory
        for r in chosen:
            e = _entry(r, mem)
            batch.add(r, e[1], not e[4])
        moved = mem.take_swapped_in()
        view.step_swap_in += moved
        self.stats["swap_in_slots"] += moved
        return batch


class RoundRobin(Policy):
    """BROS-RR baseline: alternate RT and BE iterations (FCFS within a class), plain blocks, recompute on
    shortage; mixed prefill/decode batches like BROS's engine."""

    name = "bros-rr"

    @dataclass
    class Config:
        max_batch: int = 256            # requests per iteration
        max_batched_tokens: int = 4096  # tokens per iteration

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        self.turn = RT

    def schedule(self, view) -> Batch:
        cls = self.turn
        has = {c: any(r.cls == c or (c == BE and r.cls != RT) for r in list(view.running) + list(view.waiting))
               for c in (RT, BE)}
        if not has[cls]:
            cls = BE if cls == RT else RT
        self.turn = BE if cls == RT else RT
        mine = (lambda r: r.cls == RT) if cls == RT else (lambda r: r.cls != RT)
        batch = Batch()
        running = [r for r in view.running if mine(r)]
        keep = []
        while running:
            r = running.pop(0)
            while not view.memory.can_reserve(r, r.cached + 1) and running:
                view.preempt(running.pop(), "recompute", front=True)
            if view.reserve(r, r.cached + 1):
                keep.append(r)
            else:
                view.preempt(r, "recompute", front=True)
        for r in keep:
            batch.add(r, 1, False)
        for r in [r for r in view.waiting if mine(r)]:
            if len(batch) >= self.config.max_batch:
                break
            c = r.input_tokens - r.cached
            if batch.num_tokens + c > self.config.max_batched_tokens and batch.num_tokens:
                break
            if not view.admit(r, r.input_tokens):
                if not batch.reqs and view.running:
                    # The other class holds all memory: recompute its newest request so this turn can progress.
                    view.preempt(max(view.running, key=lambda x: (x.arrival_s, x.id)), "recompute", front=True)
                break
            batch.add(r, c, True)
        return batch


register_policy("bros", Bros, "BROS: least-slack RT packing under the cost-model time budget, BE fill and "
                "replacement, adaptive batch size, bidirectional KV blocks with lazy checkpointing")
register_policy("bros-nobi", Bros, "BROS without bidirectional KV (ablation): one owner per block, recompute BE "
                "when RT lacks blocks", bidirectional=False)
register_policy("bros-rr", RoundRobin, "BROS-RR baseline: alternate RT/BE iterations, FCFS, recompute on shortage")
