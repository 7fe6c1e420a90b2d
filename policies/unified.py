"""InferMax Algorithm 1 as one configurable loop; vLLM, Sarathi, Orca, ... are presets of it (spec infermax §2)."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy

ORDERS = ("prefill_first", "decode_first", "running_first", "ranked")
RANK_KEYS = ("arrival", "input", "output", "predicted")
RESERVATIONS = ("incremental", "prompt", "full", "max_model_len", "predicted")
VICTIMS = ("tail", "longest_input", "least_progress", "most_cached")
PREEMPTIONS = ("recompute", "swap")
UNLIMITED = 1 << 40

_NEXT_CAND, _NEXT_GROUP = 0, 1
_RUNNING, _SWAPPED, _WAITING = "running", "swapped", "waiting"   # Request.state values (sim.request; policies do not import sim)


def _choice(value, allowed, where):
    if value not in allowed:
        raise UserError(f"{where}: {value!r} is not allowed; allowed: {', '.join(allowed)}")


def _snapshot(queue):
    """Iterate a copy of the waiting deque taken now, without copying it (the loop mostly stops after one or
    two candidates). While one candidate is considered the deque only loses that candidate (admitted) or
    gains stamped victims at either end, so the next one of the copy is found at or after the same index."""
    i = 0
    for left in range(len(queue) - 1, -1, -1):
        r = queue[i]
        nxt = queue[i + 1] if left else None
        yield r
        if nxt is None:
            return
        i = queue.index(nxt, i)      # identity: Request has no __eq__


def _take_blocks(mem, r, tokens) -> bool:
    """KVCacheManager.reserve inlined (the view vouched for plain block accounting: view.plain_reserve)."""
    extra = -(-tokens // mem.block_size) - r.blocks
    if extra <= 0:
        return True
    if mem.free_blocks < extra:
        return False
    mem.free_blocks -= extra
    r.blocks += extra
    return True


class UnifiedScheduler(Policy):
    """GetNextBatch of Algorithm 1: ordered groups → hybrid check → CanAllocate(C, P, M, R_max) → evict or move on."""

    name = "unified"
    speculative_decoding = True     # a decode takes view.spec_tokens drafts when the engine speculates
    lora_scheduling = True          # admissions keep to view.lora.max_loras distinct adapters (multi-LoRA)

    @dataclass
    class Config:
        order: str = "prefill_first"        # group order: [R_w,R_r] | [R_r^d,R_r^p,R_w] | [R_r,R_w] | one ranked group
        rank_key: str = "arrival"           # ranked order: ascending arrival | initial input | output | predicted output
        hybrid: bool = False                # prefill and decode requests in the same batch
        chunked: bool = False               # split prompts to the remaining prefill budget
        C: int = 4096                       # max tokens per batch (0 = unlimited, -1 = vLLM v1's for the GPU)
        P: int = 4096                       # max prefill tokens per batch (0 = unlimited, -1 = C)
        p_counts_decode_tokens: bool = True  # spec A3: prefill budget is P − all tokens already in the batch
        R_max: int = 0                      # max running size (requests holding KV); 0 = unlimited (spec A2), -1 = v1's
        reservation: str = "prompt"         # KV reserved at admission: see RESERVATIONS; 'full' = eviction-free I+O−1
        reservation_padding: float = 0.0    # extra fraction on a predicted length ('predicted' reservation)
        max_model_len: int = 4096           # reservation size for 'max_model_len' (Orca, FasterTransformer)
        evict_for_waiting: bool = False     # M-failure of a waiting candidate evicts lower-priority running requests
        evict_for_running: bool = True      # M-failure of a running candidate evicts other running requests
        self_evict: bool = True             # with no victim left, a running candidate evicts itself (vLLM)
        victim: str = "tail"                # which running request to evict (spec A6)
        requeue: str = "front"              # evicted requests go to the front (vLLM) or back (paper text) of R_w
        preemption: str = "recompute"       # recompute (InferMax, vLLM v1) or swap to CPU (vLLM v0)
        skip_blocked: bool = False          # after a failure try the next candidate instead of the next group (A7)
        admit_after_preemption: bool = True  # vLLM v1: no waiting admissions on a step that preempted
        static_batching: bool = False       # FasterTransformer: admit only when nothing is running
        peak_admission: bool = False        # LightLLM: admit only if projected peak KV of running ∪ {cand} fits
        prefix_caching: bool = False        # the modelled engine's default for automatic prefix caching (vLLM v1: on)
        long_prefill_token_threshold: int = 0   # vLLM v1: cap on one prefill chunk (0 = none)

        def validate(self, where="policy"):
            _choice(self.order, ORDERS, f"{where}.order")
            _choice(self.rank_key, RANK_KEYS, f"{where}.rank_key")
            _choice(self.reservation, RESERVATIONS, f"{where}.reservation")
            _choice(self.victim, VICTIMS, f"{where}.victim")
            _choice(self.preemption, PREEMPTIONS, f"{where}.preemption")
            _choice(self.requeue, ("front", "back"), f"{where}.requeue")
            for k in ("C", "P", "R_max"):
                v = getattr(self, k)
                if not isinstance(v, int) or isinstance(v, bool) or v < -1:
                    raise UserError(f"{where}.{k}: must be an integer >= 0 (0 = unlimited) or -1 (vLLM v1's default "
                                    f"for the GPU), got {v!r}")
            for k in ("max_model_len", "long_prefill_token_threshold"):
                v = getattr(self, k)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise UserError(f"{where}.{k}: must be a non-negative integer, got {v!r}")
            if self.reservation_padding < 0:
                raise UserError(f"{where}.reservation_padding: must be >= 0, got {self.reservation_padding}")

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        self._limits(self.config.C, self.config.P, self.config.R_max)
        self.prepare(None)                  # -1 limits: the small-GPU defaults until the engine names the GPU

    def _limits(self, C, P, R_max):
        self.C = C or UNLIMITED
        self.P = min((C if P == -1 else P) or UNLIMITED, self.C)
        self.R_max = R_max
        self.chunk_cap = self.config.long_prefill_token_threshold or UNLIMITED

    def prepare(self, costmodel) -> None:
        """-1 limits take vLLM v1's OpenAI-server defaults for the GPU (EngineArgs.get_batch_defaults): on a GPU
        with at least 70 GiB that is not an A100, max_num_batched_tokens 8192 and max_num_seqs 1024, else
        2048 and 256."""
        c = self.config
        if -1 not in (c.C, c.P, c.R_max):
            return
        gpu = getattr(costmodel, "gpu", None)
        big = gpu is not None and gpu.mem_bytes >= 70 * 1024 ** 3 and "a100" not in gpu.name
        tokens, seqs = (8192, 1024) if big else (2048, 256)
        self._limits(tokens if c.C == -1 else c.C, c.P, seqs if c.R_max == -1 else c.R_max)

    def profile_batch(self):
        tokens = self.C if self.C < UNLIMITED else self.config.max_model_len
        return int(tokens), int(self.R_max or 256)

    # -- feasibility ------------------------------------------------------------------------------------------
    def infeasible_reason(self, req, capacity_tokens, block_size):
        c = self.config
        reason = super().infeasible_reason(req, capacity_tokens, block_size)
        if reason:
            return reason
        if c.reservation == "max_model_len":
            if req.prompt_tokens + req.output_tokens - 1 > c.max_model_len:
                return f"prompt+output-1 exceeds max_model_len = {c.max_model_len}"
            if c.max_model_len > capacity_tokens:
                return f"max_model_len = {c.max_model_len} exceeds KV capacity M = {capacity_tokens}"
        if not c.chunked and req.prompt_tokens > self.P:
            return f"prompt longer than the prefill budget P = {self.P} without chunked prefill"
        if c.peak_admission and req.prompt_tokens + req.output_tokens > capacity_tokens:
            # LightLLM projects prompt + every output token; alone it still does not fit, so it is never admitted
            return f"projected peak (prompt + output tokens) exceeds KV capacity M = {capacity_tokens}"
        return None

    def admission_tokens(self, req):
        # A waiting request enters with its first chunk (the whole prompt up to the chunk budget): the chunk is
        # not shrunk to fit free memory, so that is what the admission watermark must leave room for.
        c = self.config
        first = min(req.prompt_tokens, self.C) if c.chunked else req.prompt_tokens
        if c.reservation == "incremental":
            return first
        return self._admission_target(req, first)

    # -- fast-forward ---------------------------------------------------------------------------------------
    fast_forward_safe = False   # a subclass that changes scheduling sets True only if steady_decode still holds

    def steady_decode(self, view, after_full_decode):
        """All running requests decode and fit the token budget; queued ones either do not exist or were
        just blocked by a cause that stays put while KV only shrinks (budget, R_max, memory, no victim)."""
        cls = type(self)
        if cls is not UnifiedScheduler and not cls.fast_forward_safe:
            return False
        if cls.on_commit is not Policy.on_commit or len(view.running) > self.C:
            return False
        queued = bool(view.waiting or view.swapped)
        # LightLLM's projected peak moves as requests decode, so a blocked admission may become possible.
        if queued and (not after_full_decode or self.config.peak_admission):
            return False
        # Cohort members are decodes by construction; only the others need a look.
        for r in (view.loose if view.cohort is not None else view.running):
            if r.cached < r.input_tokens:
                return False
        return True

    def decode_cohort(self, view):
        """The running group is where decodes get their token: at the head of the batch (decode-first), after
        the admissions (prefill-first, whose waiting group then must not evict running requests), or ahead of
        the running prefills' chunks (running-first, hybrid, while those prefills are the tail of the running
        order). There the whole set is taken, or skipped (a prefill-only batch), or the step falls back to the
        per-request path (see _cohort_step)."""
        c = self.config
        return (type(self) is UnifiedScheduler and not c.peak_admission and getattr(view, "plain_reserve", False)
                and (c.order == "decode_first" or (c.order == "prefill_first" and not c.evict_for_waiting)
                     or (c.order == "running_first" and c.hybrid)))

    def _cohort_step(self, view, cohort, batch, st) -> None:
        """The cohort's part of this step, decided where the running group begins."""
        stamp = view.iteration
        if st["phase"] is True and not self.config.hybrid:
            # A prefill-only batch: the decodes wait, no state changes. Members stay possible victims, so a
            # running prefill still to be placed (it may need one) gets the per-request picture.
            if any(r.cached < r.input_tokens and r.sched_stamp != stamp for r in view.loose):
                cohort.materialize()
            return
        if self._take_cohort(view, cohort, batch, stamp, st):
            st["phase"] = False
        else:
            cohort.materialize()            # budget or KV short: per request, with eviction, this step

    def _take_cohort(self, view, cohort, batch, stamp, st) -> bool:
        """Take the whole decode cohort into the batch if every running decode would get its token this step
        (all fit the budget C and their next KV blocks fit free memory: then no order or eviction matters).
        Running-first takes the running group in running order; where the running prefills are the tail of it
        (vLLM v1's FCFS running list keeps them there: a request is appended when it enters and stays behind
        every decode until its prefill is done) that is decode-first's group, decodes then prefills. A prefill
        with decodes behind it would take its chunk before them: per request, this step."""
        bs, need, decodes, prefills = view.memory.block_size, 0, cohort.n, 0
        for r in view.loose:
            if r.cached >= r.input_tokens:
                decodes += 1
                extra = -(-(r.cached + 1) // bs) - r.blocks
                if extra > 0:
                    need += extra
            elif r.sched_stamp != stamp:
                if self.config.order == "prefill_first":
                    return False            # a running prefill among the decodes: their order matters
                prefills += 1
        if decodes > self.C - batch.num_tokens:
            return False
        if prefills and self.config.order == "running_first" and not all(
                r.cohort is None and r.cached < r.input_tokens for r in view.running[-prefills:]):
            return False
        context = cohort.take(stamp, need)
        if context is None and self._tail_victim_frees(view, cohort, need, stamp):
            # The per-request path would stop at a decode short of a block before the tail and evict the tail;
            # its blocks cover the rest, so that is the step's only eviction, whatever the order.
            tail = self._tail(view, stamp)
            if tail.cohort is not None:
                cohort.drop(tail)
            self._preempt(view, tail, stamp, st)
            context = cohort.take(stamp, need)
        if context is None:
            return False
        batch.cohort, batch.cohort_context = cohort.n, context
        batch.num_tokens += cohort.n
        return True

    @staticmethod
    def _tail(view, stamp):
        """The tail victim: the last running request not yet scheduled this step (cohort members never are)."""
        for r in reversed(view.running):
            if r.sched_stamp != stamp:
                return r
        return None

    def _tail_victim_frees(self, view, cohort, need, stamp) -> bool:
        """Do the decodes before the tail run short of blocks, and do the tail's blocks cover them? The tail is a
        cohort member or a running prefill (`need`: the decodes outside the cohort, none of them the tail)."""
        c = self.config
        tail = self._tail(view, stamp) if c.evict_for_running and c.victim == "tail" else None
        if tail is None:
            return False
        free = view.memory.free_blocks
        if tail.cohort is not None:
            before = cohort.blocks_due() - cohort.block_due(tail) + need
            blocks = max(tail.blocks, -(-(tail.cached + cohort.steps - tail.cohort) // view.memory.block_size))
            return free < before <= free + blocks
        return tail.cached < tail.input_tokens and cohort.blocks_due() + need <= free + tail.blocks

    # -- helpers ----------------------------------------------------------------------------------------------
    def _rank(self, r):
        k = self.config.rank_key
        if k == "input":
            return (r.prompt_tokens, r.id)
        if k == "output":
            return (r.output_tokens, r.id)
        if k == "predicted":
            return (r.predicted_output_tokens, r.id)
        return (r.arrival_s, r.id)

    def _groups(self, view, batch=None, st=None):
        """Yield the ordered groups lazily: each is built when reached, after earlier groups changed the queues.
        Where the running group begins (decode and prefill first) the decode cohort, if any, takes its step."""
        order = self.config.order
        cohort = view.cohort
        running = view.running if cohort is None else view.loose      # cohort members are taken whole
        waiting = lambda: (list(view.swapped) + list(view.waiting) if view.swapped  # noqa: E731
                           else _snapshot(view.waiting))           # (swapped take precedence, vLLM v0)
        if order == "prefill_first":
            yield waiting()
            if cohort is not None and cohort.n:
                self._cohort_step(view, cohort, batch, st)
            yield list(running)
        elif order == "decode_first":
            if cohort is not None and cohort.n:
                self._cohort_step(view, cohort, batch, st)
            decodes, prefills = [], []
            for r in running:
                (decodes if r.cached >= r.input_tokens else prefills).append(r)
            yield decodes
            yield prefills
            yield waiting()
        elif order == "running_first":
            if cohort is not None and cohort.n:
                self._cohort_step(view, cohort, batch, st)
            yield list(running)
            yield waiting()
        else:
            yield sorted(list(running) + list(waiting()), key=self._rank)

    def _admission_target(self, r, c):
        """KV tokens a request must hold after this step when it (re)enters the running set."""
        mode = self.config.reservation
        if mode == "incremental":
            return r.cached + c
        if mode == "prompt":
            return max(r.input_tokens, r.cached + c)
        remaining = r.output_tokens - r.generated
        if mode == "full":
            return r.input_tokens + remaining - 1
        if mode == "max_model_len":
            return max(self.config.max_model_len, r.cached + c)
        pred = max(r.predicted_output_tokens - r.generated, 1)
        padded = int(-(-pred * (1.0 + self.config.reservation_padding) // 1))
        return max(r.input_tokens + padded - 1, r.input_tokens)

    def _peak_fits(self, view, cand):
        """LightLLM: project every running request's KV forward with its remaining output; the peak must fit."""
        items = [(r.output_tokens - r.generated, r.cached) for r in view.running]
        items.append((cand.output_tokens - cand.generated, cand.input_tokens))
        items.sort()
        total_now = sum(s for _, s in items)
        peak, grown_done, n = 0, 0, len(items)
        # At the moment the k-th shortest finishes (t = rem_k), requests k.. still hold size + rem_k.
        for k, (rem, _) in enumerate(items):
            live = total_now - grown_done + rem * (n - k)
            peak = max(peak, live)
            grown_done += items[k][1]
        return peak <= view.memory.capacity_tokens

    def _victim(self, view, cand, stamp, waiting_cand):
        rule = self.config.victim
        best = None
        # Members of a non-empty cohort here were all taken this step (see _cohort_step): only loose ones remain.
        for r in reversed(view.loose if view.cohort is not None else view.running):
            if r is cand or r.sched_stamp == stamp:
                continue
            if waiting_cand and not self._lower_priority(r, cand):
                continue
            if rule == "tail":
                if self.config.order != "ranked":
                    return r
                if best is None or self._rank(r) > self._rank(best):
                    best = r
            elif best is None:
                best = r
            elif rule == "longest_input" and r.input_tokens > best.input_tokens:
                best = r
            elif rule == "least_progress" and r.cached < best.cached:
                best = r
            elif rule == "most_cached" and r.cached > best.cached:
                best = r
        return best

    def _lower_priority(self, r, cand):
        if self.config.order == "ranked":
            return self._rank(r) > self._rank(cand)
        return (r.arrival_s, r.id) > (cand.arrival_s, cand.id)

    # -- Algorithm 1 ------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        cfg = self.config
        batch = Batch()
        stamp = view.iteration
        st = {"preempted": False, "phase": None, "static_block": cfg.static_batching and bool(view.running)}
        # Hot path: a running request whose share (one decode token, or a prefill chunk) fits the budget and
        # its next blocks is what most candidates are; it is taken inline (the state changes _consider makes)
        # and anything else (admission, swap-in, eviction, unchunked prefill) goes through _consider.
        inline = (getattr(view, "plain_reserve", False) and type(self)._consider is UnifiedScheduler._consider
                  and not getattr(view, "spec_tokens", 0))
        mem, C, hybrid, chunked = view.memory, self.C, cfg.hybrid, cfg.chunked
        group_stops = inline and hybrid and chunked and not cfg.skip_blocked
        for group in self._groups(view, batch, st):
            for cand in group:
                if cand.sched_stamp == stamp:
                    continue
                if inline and cand.state == _RUNNING:
                    m, phase = cand.cached, st["phase"]
                    if m >= cand.input_tokens:
                        c = 1 if batch.num_tokens < C and (hybrid or phase is not True) else 0
                    elif chunked and (hybrid or phase is not False):
                        used = batch.num_tokens
                        c = min(cand.input_tokens - m, C - used, self.chunk_cap,
                                self.P - (used if cfg.p_counts_decode_tokens else batch.num_prefill_tokens))
                    else:
                        c = 0
                    if c > 0 and _take_blocks(mem, cand, m + c):
                        cand.sched_stamp = stamp
                        prefill = m < cand.input_tokens
                        batch.add(cand, c, prefill)
                        st["phase"] = prefill
                        continue
                elif group_stops and cand.cached < cand.input_tokens and min(
                        C - batch.num_tokens,
                        self.P - (batch.num_tokens if cfg.p_counts_decode_tokens else batch.num_prefill_tokens)) <= 0:
                    break       # a prefill with no budget left: _consider would say next group (chunked, hybrid)
                if self._consider(view, cand, batch, stamp, st) == _NEXT_GROUP:
                    break
        return batch

    def _consider(self, view, cand, batch, stamp, st):
        cfg = self.config
        holding = cand.state == _RUNNING
        is_prefill = cand.cached < cand.input_tokens
        if not cfg.hybrid and st["phase"] is not None and is_prefill != st["phase"]:   # ② CheckHybridBatching
            return _NEXT_CAND
        if not holding:
            if st["static_block"] or (st["preempted"] and not cfg.admit_after_preemption):
                return _NEXT_GROUP
            if cand.adapter >= 0 and getattr(view, "lora", None) is not None and not self._lora_fits(view, cand, st):
                return _NEXT_CAND                  # vLLM: a request that would pass max_loras is skipped
            if view.prefix_caching and cand.state == _WAITING:
                view.lookup_prefix(cand)           # cached full blocks count as computed (vLLM v1)
        # ③ CanAllocate: token budgets
        used = batch.num_tokens
        if is_prefill:
            need = cand.input_tokens - cand.cached
            p_left = self.P - (used if cfg.p_counts_decode_tokens else batch.num_prefill_tokens)
            room = min(p_left, self.C - used)
            if cfg.chunked:
                c = min(need, room, self.chunk_cap)
            elif need <= room:
                c = need
            elif batch.num_prefill_tokens == 0 and used == 0:
                c = need   # a refill longer than the budget (prompt grew by eviction) runs alone rather than never
            else:
                c = 0
        else:
            c = 1 if used < self.C else 0
            spec = getattr(view, "spec_tokens", 0)
            if c and spec and cand.generated:     # speculative decoding: the last token and its drafts, within
                # the budget (a request with no token yet, a P/D decode side's first step, has no drafts)
                c = min(1 + min(spec, cand.output_tokens - cand.generated - 1), self.C - used)
        if c <= 0:
            return _NEXT_CAND if cfg.skip_blocked else _NEXT_GROUP
        if not holding and self.R_max and len(view.running) >= self.R_max:
            return _NEXT_CAND if cfg.skip_blocked else _NEXT_GROUP
        if not holding and cfg.peak_admission and not self._peak_fits(view, cand):
            return _NEXT_CAND if cfg.skip_blocked else _NEXT_GROUP
        # ③ CanAllocate: memory, with ④ evict-and-retry
        while True:
            if holding:
                ok = view.reserve(cand, cand.cached + c)
            elif cand.state == _SWAPPED:
                ok = view.swap_in(cand, cand.cached + c)
            else:
                ok = view.admit(cand, self._admission_target(cand, c))
            if ok:
                break
            if (cfg.evict_for_running if holding else cfg.evict_for_waiting):
                victim = self._victim(view, cand, stamp, waiting_cand=not holding)
                if victim is not None:
                    self._preempt(view, victim, stamp, st)
                    continue
                if holding and cfg.self_evict:
                    self._preempt(view, cand, stamp, st)
                    return _NEXT_CAND
            return _NEXT_CAND if cfg.skip_blocked else _NEXT_GROUP
        cand.sched_stamp = stamp
        batch.add(cand, c, is_prefill)
        st["phase"] = is_prefill
        if not holding and "loras" in st and cand.adapter >= 0:
            st["loras"].add(cand.adapter)
        return _NEXT_CAND

    @staticmethod
    def _lora_fits(view, cand, st) -> bool:
        """May a waiting request with an adapter join? Its adapter is already running, or fewer than max_loras
        distinct adapters are (every running request's, and those admitted this step)."""
        active = st.get("loras")
        if active is None:
            active = st["loras"] = {r.adapter for r in view.running if r.adapter >= 0}
        if cand.adapter in active or len(active) < view.lora.max_loras:
            return True
        view.lora.skipped += 1
        return False

    def _preempt(self, view, r, stamp, st):
        view.preempt(r, mode=self.config.preemption, front=self.config.requeue == "front")
        r.sched_stamp = stamp
        st["preempted"] = True


# -- presets: each a configuration of the one loop, nothing more ------------------------------------------------
_INFERMAX = dict(C=4096, P=4096)
_BASES = {
    "vllm": ("vLLM v0 as InferMax models it: prefill-first, no hybrid, no chunking, evict running on M-failure",
             dict(order="prefill_first", hybrid=False, chunked=False, **_INFERMAX)),
    "vllm-hy": ("vLLM with hybrid batching: prefill-first, decodes may join prefill batches",
                dict(order="prefill_first", hybrid=True, chunked=False, **_INFERMAX)),
    "sarathi": ("Sarathi-Serve: decode-first, hybrid, chunked prefill, P=512, C=4096",
                dict(order="decode_first", hybrid=True, chunked=True, C=4096, P=512)),
    "sarathi-p=c": ("Sarathi with P=C=4096: admits up to C/I new requests per batch",
                    dict(order="decode_first", hybrid=True, chunked=True, **_INFERMAX)),
    "sarathi-nocp": ("Sarathi without chunked prefill (a prompt must fit whole in P)",
                     dict(order="decode_first", hybrid=True, chunked=False, **_INFERMAX)),
    "sarathi-nohy": ("Sarathi without hybrid batching or chunking: behaves like request-level batching",
                     dict(order="decode_first", hybrid=False, chunked=False, **_INFERMAX)),
}
for _name, (_summary, _knobs) in _BASES.items():
    register_policy(_name, UnifiedScheduler, _summary, **_knobs)
    register_policy(f"{_name}-ef", UnifiedScheduler, _summary.split(":")[0] + ", eviction-free (reserve I+O-1)",
                    reservation="full", **_knobs)

_RANKED = dict(order="ranked", hybrid=True, chunked=True, C=4096, P=512, skip_blocked=True, evict_for_waiting=True)
register_policy("rank-org", UnifiedScheduler, "one group ranked by arrival (InferMax A.3)", rank_key="arrival", **_RANKED)
register_policy("rank-i", UnifiedScheduler, "one group ranked by ascending input size (InferMax A.3)",
                rank_key="input", **_RANKED)
register_policy("rank-o", UnifiedScheduler, "one group ranked by ascending output size (InferMax A.3)",
                rank_key="output", **_RANKED)
register_policy("orca", UnifiedScheduler, "Orca: running first, whole prefills join decodes, reserve max_model_len, "
                "never preempt", order="running_first", hybrid=True, chunked=False, C=0, P=0, R_max=256,
                reservation="max_model_len", evict_for_running=False, self_evict=False)
register_policy("fastertransformer", UnifiedScheduler, "FasterTransformer: request-level static batching, "
                "reserve max_model_len", order="prefill_first", hybrid=False, chunked=False, C=0, P=0, R_max=256,
                reservation="max_model_len", static_batching=True, evict_for_running=False, self_evict=False)
register_policy("deepspeed-fastgen", UnifiedScheduler, "DeepSpeed-FastGen Dynamic SplitFuse: decode-first, "
                "hybrid, chunked to a fixed token budget P=C=2048", order="decode_first", hybrid=True, chunked=True,
                C=2048, P=2048)
register_policy("lightllm", UnifiedScheduler, "LightLLM: prefill-first, token-level KV, admission only if the "
                "projected peak KV (known output lengths) fits", order="prefill_first", hybrid=False, chunked=False,
                **_INFERMAX, peak_admission=True)
register_policy("vllm-v1", UnifiedScheduler, "vLLM v1 as the engine runs it: running first, chunked to the token "
                "budget, preempt from the tail (recompute), admit waiting only on steps without preemption, prefix "
                "caching on; budgets as v1 picks them per GPU (8192 tokens / 1024 seqs on >= 70 GiB non-A100 GPUs, "
                "else 2048 / 256)",
                order="running_first", hybrid=True, chunked=True, C=-1, P=-1, R_max=-1,
                reservation="incremental", admit_after_preemption=False, prefix_caching=True)
