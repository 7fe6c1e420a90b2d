"""Apt-Serve (SIGMOD'25): per-iteration prefill/decode choice and the hybrid-cache knapsack, solved greedily."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy

KV, HIDDEN = "kv", "hidden"

# Apt-Serve Table 3: (TTFT, P99 TBT) SLOs in seconds per dataset and model; set them as the policy's
# ttft_slo_s / tbt_slo_s and as the scenario's `slo:` so scheduler and metric agree.
SLO_TABLE = {
    "sharegpt": {"opt-13b": (1.0, 1.0), "opt-30b": (1.5, 1.0), "opt-66b": (2.0, 1.0)},
    "humaneval": {"opt-13b": (0.5, 0.5), "opt-30b": (1.0, 0.5), "opt-66b": (1.5, 0.5)},
    "longbench": {"opt-13b": (4.0, 1.0), "opt-30b": (4.5, 1.0), "opt-66b": (5.0, 1.0)},
}
_KIND_ORDER = {"hidden": 0, "kv": 1, "upgrade": 2}   # ties: a hidden item always precedes its upgrade


@dataclass
class Candidate:
    """One request as the knapsack sees it: pending time p, KV size m (blocks), hidden size h, value knobs."""
    req: object
    p: float
    m: int
    h: int
    violated: bool
    running: bool
    hidden: bool = False      # its cache is hidden now (a running request)


@dataclass
class Item:
    theta: float        # marginal value per block
    cand: Candidate
    dm: int             # blocks this item adds
    kind: str           # kv | hidden | upgrade
    tokens: int         # tokens it puts into the batch (0 for an upgrade)


class AptServe(Policy):
    """Stage 1: the queue with the larger summed pending time picks the iteration type. Stage 2: choose which
    requests run and with which cache type, maximising Σ g_i (Eq. 5) under the block budget (Eq. 7)."""

    name = "aptserve"

    @dataclass
    class Config:
        scheduling: str = "adaptive"     # adaptive (the knapsack) | fcfs (arrival order, hidden only when KV fails)
        cache: str = "hybrid"            # hybrid | kv_only
        base: str = "vllm"               # vllm: prefill or decode iterations | sarathi: mixed, chunked (Apt-Serve-S)
        ttft_slo_s: float = 1.0          # TTFT target (s) the scheduler values requests by (Table 3, ShareGPT, OPT-13B)
        tbt_slo_s: float = 1.0           # time-between-tokens target (s), likewise
        fallback: str = "near_zero"      # value of requests already past SLO: near_zero | decay | off
        decay: float = 0.4               # Apt-Serve* (§6.6): g ← decay·p for violated requests
        rho_scale: float = 1.0           # scheduler's ρ / true restore cost (reference code ≈ 0.3)
        n_excludes_violated: bool = False  # reference code: N = |W|+|R| − #violated
        max_num_seqs: int = 256          # running requests at most (vLLM 0.5's default, as the reference code)
        max_batched_tokens: int = 2048   # tokens per iteration at most (vLLM 0.5's default)
        chunk_tokens: int = 512          # Sarathi base: token budget per mixed iteration
        keep_running_type: bool = False  # False (the paper, §2.4/§2.9): every decode iteration re-decides each running
                                         # request's cache type; a hidden request whose KV now fits takes the upgrade
                                         # item and is re-prefilled in KV (or is dropped if it is not selected).
                                         # True: a running request keeps its type unless violated, so a hidden
                                         # request rebuilds its K/V at every decode step for the rest of its life
                                         # (measured at 1.625 req/s, seed 0: 131 s of 469 s busy; served 80%)

        def validate(self, where="policy"):
            for key, allowed in (("scheduling", ("adaptive", "fcfs")), ("cache", ("hybrid", "kv_only")),
                                 ("base", ("vllm", "sarathi")), ("fallback", ("near_zero", "decay", "off"))):
                if getattr(self, key) not in allowed:
                    raise UserError(f"{where}.{key}: {getattr(self, key)!r} is not allowed; "
                                    f"allowed: {', '.join(allowed)}")
            for key in ("ttft_slo_s", "tbt_slo_s", "max_num_seqs", "max_batched_tokens", "chunk_tokens"):
                if not getattr(self, key) > 0:
                    raise UserError(f"{where}.{key}: must be > 0, got {getattr(self, key)!r}")
            if not 0.0 <= self.decay <= 1.0:
                raise UserError(f"{where}.decay: must be in [0, 1], got {self.decay}")
            if self.rho_scale < 0:
                raise UserError(f"{where}.rho_scale: must be >= 0, got {self.rho_scale}")

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        self.rho = 0.0
        self.stats = {"prefill_iters": 0, "decode_iters": 0, "mixed_iters": 0, "type_switches": 0,
                      "hidden_admissions": 0, "kv_admissions": 0, "knapsack_calls": 0, "hidden_decode_steps": 0,
                      "decode_drops": 0, "hidden_recompute_tokens": 0}
        self.record_knapsacks = False     # tests set it to keep (candidates, budget, N, ρ, chosen, budgets, tokens)
        self.knapsacks: list = []

    # -- memory -------------------------------------------------------------------------------------------
    def profile_batch(self):
        return self.config.max_batched_tokens, self.config.max_num_seqs

    def kv_layout(self, memory, costmodel):
        return ("hidden_cache", {"kv_only": self.config.cache == "kv_only"})

    def bind(self, view):
        mem = view.memory
        # ρ: seconds of K/V restoration per KV block of context, from the same cost model that charges it.
        self.rho = self.config.rho_scale * view.costmodel.hidden_recompute_time(mem.block_size)

    def infeasible_reason(self, req, capacity_tokens, block_size):
        why = super().infeasible_reason(req, capacity_tokens, block_size)
        if why is None and self.config.base == "vllm" and req.prompt_tokens > self.config.max_batched_tokens:
            why = f"prompt longer than max_batched_tokens = {self.config.max_batched_tokens}"
        return why

    # -- runtime information (§4.2) -----------------------------------------------------------------------
    def _candidate(self, view, r, running: bool) -> Candidate:
        cfg, mem = self.config, view.memory
        started = r.generated > 0
        last = r.token_times[-1] if started else r.arrival_s
        p = view.now - last
        tokens = (r.cached + 1) if (running and r.is_decode) else r.input_tokens
        m = mem.blocks_for(tokens)
        h = mem.hidden_blocks(m) if (cfg.cache == "hybrid" and mem.hidden_allowed and m > 1) else m
        violated = p > (cfg.tbt_slo_s if started else cfg.ttft_slo_s)
        hidden = running and r.blocks > 0 and mem.is_hidden(r)
        return Candidate(r, p, m, h, violated and cfg.fallback != "off", running, hidden)

    def _items(self, cands, N, budget: int) -> list:
        """Options per request (§2.9): KV alone, or a hidden item plus a hidden→KV upgrade item. An option heavier
        than the whole budget is left out (the appendix's 2-approximation assumes every item fits alone); a request
        whose KV cannot fit may still enter as hidden when that has positive value."""
        rho, cfg = self.rho, self.config
        items = []
        for c in cands:
            tok = self._tokens(c)
            kv_fits = c.m <= budget
            if cfg.keep_running_type and c.running and not c.violated:
                # switch-cost aware: a running request is offered in the cache type it has. Eq. 5's value stands;
                # a hidden request whose penalty exceeds its pending time keeps a tiny positive value, since the
                # alternative, dropping it, costs a full recompute. Never heavier than its current cache.
                if c.hidden and c.h <= budget:
                    items.append(Item(max(c.p - N * rho * c.m, 1e-9 * c.p + 1e-12) / c.h, c, c.h, HIDDEN, tok))
                elif not c.hidden and kv_fits:
                    items.append(Item(c.p / c.m, c, c.m, KV, tok))
                continue
            if c.violated:
                if kv_fits:
                    value = cfg.decay * c.p if cfg.fallback == "decay" else 1e-9 * c.p
                    items.append(Item(value / c.m, c, c.m, KV, tok))
                continue
            kv_theta = c.p / c.m
            if c.h < c.m and c.h <= budget:
                penalty = N * rho * c.m                     # Eq. 5–6: every queued request feels the slowdown
                hidden_theta = (c.p - penalty) / c.h
                # hidden pays off (concavity: θ_hidden ≥ θ_upgrade), or it is the only option that fits
                if hidden_theta >= kv_theta or (not kv_fits and hidden_theta > 0):
                    items.append(Item(hidden_theta, c, c.h, HIDDEN, tok))
                    if kv_fits:
                        items.append(Item(penalty / (c.m - c.h), c, c.m - c.h, "upgrade", 0))
                    continue
            if kv_fits:
                items.append(Item(kv_theta, c, c.m, KV, tok))
        items.sort(key=lambda it: (-it.theta, _KIND_ORDER[it.kind], it.cand.req.arrival_s, it.cand.req.id))
        return items

    def _tokens(self, c: Candidate) -> int:
        r = c.req
        return 1 if (c.running and r.is_decode) else r.input_tokens - r.cached

    def knapsack(self, cands, budget: int, N: int, token_budget: int = 0, seq_budget: int = 0) -> dict:
        """Algorithm 1 of the appendix: take items by θ until the first that does not fit, then keep the better
        of that prefix and the critical request alone (the 2-approximation). Returns {req: 'kv'|'hidden'}."""
        self.stats["knapsack_calls"] += 1
        chosen, used, value, tokens = {}, 0, 0.0, 0
        critical = None
        for it in self._items(cands, N, budget):
            r = it.cand.req
            if it.kind == "upgrade" and r not in chosen:
                continue
            new_req = it.kind != "upgrade"
            fits = used + it.dm <= budget
            if new_req and token_budget and tokens and tokens + it.tokens > token_budget:
                fits = False
            if new_req and seq_budget and len(chosen) + 1 > seq_budget:
                fits = False
            if not fits:
                critical = it
                break
            used += it.dm
            value += it.theta * it.dm
            tokens += it.tokens
            chosen[r] = KV if it.kind == "upgrade" else it.kind
        if critical is not None:
            alone = self._best_alone(critical.cand, budget, N)
            if alone is not None and alone[1] > value:
                chosen = {critical.cand.req: alone[0]}
        if self.record_knapsacks:
            # token counts are taken now: the requests' state moves on after the call
            self.knapsacks.append((list(cands), budget, N, self.rho, dict(chosen), token_budget, seq_budget,
                                   [self._tokens(c) for c in cands]))
        return chosen

    def _best_alone(self, c: Candidate, budget: int, N: int):
        if c.violated:
            return (KV, 0.0) if c.m <= budget else None
        if self.config.keep_running_type and c.running:          # only its current type (see _items)
            if c.hidden:
                return (HIDDEN, c.p - N * self.rho * c.m) if c.h <= budget else None
            return (KV, c.p) if c.m <= budget else None
        options = []
        if c.m <= budget:
            options.append((KV, c.p))
        if c.h < c.m and c.h <= budget:
            options.append((HIDDEN, c.p - N * self.rho * c.m))
        return max(options, key=lambda o: o[1]) if options else None

    # -- iteration ------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        if self.config.base == "sarathi":
            return self._schedule_mixed(view)
        if self.config.scheduling == "fcfs":
            return self._schedule_fcfs(view)
        cfg, mem = self.config, view.memory
        W = [self._candidate(view, r, False) for r in view.waiting]
        R = [self._candidate(view, r, True) for r in view.running]
        N = self._n(W, R)
        seq_room = cfg.max_num_seqs - len(R)
        S_W = self.knapsack(W, mem.free_blocks, N, cfg.max_batched_tokens, seq_room) if W and seq_room > 0 else {}
        urg_W = sum(c.p for c in W)
        urg_R = sum(c.p for c in R)
        if R and (urg_R > urg_W or not S_W):
            return self._decode(view, R, N)
        return self._prefill(view, S_W)

    def _n(self, W, R) -> int:
        n = len(W) + len(R)
        if self.config.n_excludes_violated:
            n -= sum(c.violated for c in W) + sum(c.violated for c in R)
        return max(n, 1)

    def _prefill(self, view, chosen: dict) -> Batch:
        batch, mem = Batch(), view.memory
        self.stats["prefill_iters"] += 1
        for r, kind in chosen.items():
            mem.set_type(r, kind == HIDDEN)
            if not view.admit(r, r.input_tokens):
                mem.set_type(r, False)
                break
            self.stats["hidden_admissions" if kind == HIDDEN else "kv_admissions"] += 1
            batch.add(r, r.input_tokens - r.cached, True)
        return batch

    def _decode(self, view, R, N) -> Batch:
        mem = view.memory
        self.stats["decode_iters"] += 1
        chosen = self.knapsack(R, mem.total_blocks, N)
        keep = []
        for c in R:
            r = c.req
            kind = chosen.get(r)
            if kind is None:
                self.stats["decode_drops"] += 1
                view.preempt(r, "recompute", front=True)
            elif (kind == HIDDEN) != mem.is_hidden(r):
                self.stats["type_switches"] += 1      # no in-place conversion: drop and re-prefill (§2.4)
                view.preempt(r, "recompute", front=True)
            else:
                keep.append(r)
        return self._decode_batch(view, keep)

    def _decode_batch(self, view, reqs, batch=None) -> Batch:
        batch = Batch() if batch is None else batch
        mem = view.memory
        for r in reqs:
            if not view.reserve(r, r.cached + 1):
                view.preempt(r, "recompute", front=True)
                continue
            if mem.is_hidden(r):
                view.step_hidden_recompute += r.cached
                self.stats["hidden_decode_steps"] += 1
                self.stats["hidden_recompute_tokens"] += r.cached
            batch.add(r, 1, False)
        return batch

    # -- FCFS ablation: arrival order, vLLM prefill-first; hidden cache only when KV does not fit ----------
    def _schedule_fcfs(self, view) -> Batch:
        cfg, mem = self.config, view.memory
        batch = Batch()
        hybrid = cfg.cache == "hybrid" and mem.hidden_allowed
        for r in list(view.waiting):
            if len(view.running) >= cfg.max_num_seqs:
                break
            if batch.num_tokens and batch.num_tokens + r.input_tokens > cfg.max_batched_tokens:
                break
            kv = mem.blocks_needed(r.input_tokens, False)
            if kv <= mem.free_blocks:
                hidden = False
            elif hybrid and kv > 1 and mem.blocks_needed(r.input_tokens, True) <= mem.free_blocks:
                hidden = True               # the batch-size limit is reached: new requests get hidden cache
            else:
                break
            mem.set_type(r, hidden)
            if not view.admit(r, r.input_tokens):
                mem.set_type(r, False)
                break
            self.stats["hidden_admissions" if hidden else "kv_admissions"] += 1
            batch.add(r, r.input_tokens, True)
        if batch.reqs:
            self.stats["prefill_iters"] += 1
            return batch
        self.stats["decode_iters"] += 1
        running = list(view.running)
        keep = []
        while running:
            r = running.pop(0)
            while not mem.can_reserve(r, r.cached + 1) and running:
                view.preempt(running.pop(), "recompute", front=True)     # vLLM: the latest arrival goes
            if not mem.can_reserve(r, r.cached + 1):
                view.preempt(r, "recompute", front=True)
                continue
            keep.append(r)
        return self._decode_batch(view, keep)

    # -- Apt-Serve-S: the knapsack over W ∪ R on a Sarathi base (mixed batches, chunked prefill) -----------
    def _schedule_mixed(self, view) -> Batch:
        cfg, mem = self.config, view.memory
        self.stats["mixed_iters"] += 1
        W = [self._candidate(view, r, False) for r in view.waiting]
        R = [self._candidate(view, r, True) for r in view.running]
        N = self._n(W, R)
        # Two knapsacks as in the vLLM base, without the iteration-type choice: first which running requests keep
        # their cache (budget: the whole pool), then which waiting ones join (budget: what is left). One joint
        # knapsack over W ∪ R let fresh arrivals displace requests that had just been served, and recomputation
        # churned (we measured ~25× more evicted tokens).
        if cfg.scheduling == "fcfs":
            chosen = {c.req: (KV if not mem.is_hidden(c.req) else HIDDEN) for c in R}
        else:
            chosen = self.knapsack(R, mem.total_blocks, N)
        kept = sum(mem.blocks_needed(c.req.cached + 1 if c.req.is_decode else c.req.input_tokens,
                                     chosen[c.req] == HIDDEN) for c in R if c.req in chosen)
        if cfg.scheduling == "fcfs":
            chosen.update({c.req: KV for c in W})
        elif W:
            chosen.update(self.knapsack(W, max(mem.total_blocks - kept, 0), N,
                                        seq_budget=max(cfg.max_num_seqs - len(R), 0)))
        batch = Batch()
        decodes, prefills = [], []
        for c in R:
            r = c.req
            kind = chosen.get(r)
            if kind is None or (kind == HIDDEN) != mem.is_hidden(r):
                self.stats["type_switches"] += kind is not None
                view.preempt(r, "recompute", front=True)
            else:
                (decodes if r.is_decode else prefills).append(r)
        self._decode_batch(view, decodes, batch)
        budget = cfg.chunk_tokens
        for r in prefills:
            if batch.num_tokens >= budget:
                break
            self._chunk(view, batch, r, budget)
        for c in W:
            kind = chosen.get(c.req)
            if kind is None:
                if cfg.scheduling == "fcfs":
                    break
                continue
            if batch.num_tokens >= budget or len(view.running) >= cfg.max_num_seqs:
                break
            r = c.req
            mem.set_type(r, kind == HIDDEN)
            if not view.admit(r, r.input_tokens):
                mem.set_type(r, False)
                if cfg.scheduling == "fcfs":
                    break
                continue
            self.stats["hidden_admissions" if kind == HIDDEN else "kv_admissions"] += 1
            self._chunk(view, batch, r, budget)
        return batch

    def _chunk(self, view, batch, r, budget):
        c = min(r.input_tokens - r.cached, budget - batch.num_tokens)
        if c <= 0:
            return
        if view.memory.is_hidden(r):
            view.step_hidden_recompute += r.cached     # earlier chunks are attended through rebuilt K/V
        batch.add(r, c, True)


register_policy("aptserve", AptServe, "Apt-Serve: urgency-chosen prefill/decode iterations, hybrid KV/hidden cache "
                "knapsack solved by the greedy 2-approximation, SLO-violated requests demoted")
register_policy("aptserve-kv", AptServe, "Apt-Serve adaptive scheduling with KV cache only (ablation)",
                cache="kv_only")
register_policy("aptserve-fcfs", AptServe, "Apt-Serve hybrid cache with FCFS scheduling (ablation): hidden cache "
                "only when a new request's KV does not fit", scheduling="fcfs")
register_policy("aptserve-decay", AptServe, "Apt-Serve* : violated requests keep 0.4 of their value (less starvation)",
                fallback="decay")
register_policy("aptserve-s", AptServe, "Apt-Serve-S: the hybrid-cache knapsack on a Sarathi base (mixed batches, "
                "chunked prefill 512)", base="sarathi")
register_policy("aptserve-code", AptServe, "Apt-Serve's knapsack as the paper and its reference code run it: every "
                "decode iteration re-decides each running request's cache type (the default since verdicts2; kept as "
                "a name for the greedy-gap study)", keep_running_type=False)
register_policy("aptserve-sticky", AptServe, "Apt-Serve variant: a running request keeps its cache type unless violated "
                "(hidden requests rebuild K/V at every decode step until they finish)", keep_running_type=True)
