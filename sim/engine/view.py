"""What a policy sees of one replica (queues, memory, cost model, clock) and the only actions that change it."""
from __future__ import annotations

from collections import deque

from sim.engine.request import RUNNING, SWAPPED, WAITING, Request
from sim.kv.paged import KVCacheManager


class ReplicaView:
    """What a policy sees of one replica, and the only actions through which it may change state."""

    def __init__(self, memory: KVCacheManager, costmodel):
        self.memory = memory
        self.costmodel = costmodel
        self.waiting: deque = deque()
        self.running: list = []
        self.swapped: deque = deque()
        self.now = 0.0
        self.iteration = 0
        self.kv_cached_tokens = 0          # Σ m over requests on the GPU
        self.step_preemptions = 0
        self.step_swap_in = 0
        self.step_swap_out = 0
        self.step_hidden_recompute = 0     # hidden-cached context tokens whose K/V a policy rebuilds this step
        # True when reserve is plain block accounting, so a policy may inline it on its hot path.
        self.plain_reserve = (type(memory).reserve is KVCacheManager.reserve
                              and type(memory).blocks_for is KVCacheManager.blocks_for
                              and type(self).reserve is ReplicaView.reserve)
        self.step_swap_hidden = 0          # swap tokens a policy moved in the background (overlapped with compute)
        self.cohort = None                 # the engine's DecodeCohort when the policy opted in (sim/engine/cohort.py)
        self.loose: list = []              # with a cohort: running requests outside it, in running order
        # Prefix caching (sim/kv/prefix_cache.py): on when the manager can look prompts up.
        self.prefix_caching = hasattr(memory, "lookup")
        self.looked_up: list = []          # waiting requests looked up this step (a hit not admitted lapses)
        self.spec_tokens = 0               # speculative decoding: draft tokens a decode verifies per step (0: off)
        self.step_disk_s = 0.0             # disk reads of prefix blocks admitted this step (sim/kv/tiers.py)
        self.lora = None                   # multi-LoRA (sim/engine/lora.py): max_loras, the skip counter

    def _run(self, req) -> None:
        self.running.append(req)
        if self.cohort is not None:
            self.loose.append(req)

    # -- actions ----------------------------------------------------------------------------------------------
    def reserve(self, req: Request, tokens: int) -> bool:
        """Grow a running request's KV allocation to `tokens`."""
        return self.memory.reserve(req, tokens)

    def lookup_prefix(self, req: Request) -> int:
        """With prefix caching: how many of a waiting request's tokens are already computed (cached full blocks),
        set as req.cached so the policy sizes its chunk from there; admit() takes them. Call it before sizing a
        waiting request's chunk; without prefix caching (or for a request holding KV) it changes nothing."""
        if not self.prefix_caching or req.state != WAITING or req.blocks:
            return req.cached
        self.looked_up.append(req)
        return self.memory.lookup(req)

    def admit(self, req: Request, tokens: int) -> bool:
        """Move a waiting request onto the GPU with `tokens` KV reserved (admission watermark applies); with
        prefix caching the blocks its lookup found are shared rather than computed again."""
        if not self.memory.admit(req, tokens):
            return False
        self.waiting.remove(req)
        req.state = RUNNING
        self._run(req)
        if req.cached:                     # a prefix hit: those tokens are on the GPU already
            self.kv_cached_tokens += req.cached
            loaded = self.memory.loaded_tokens
            if loaded:                     # ... some of them loaded back from the CPU tier this step
                self.step_swap_in += loaded
                self.step_disk_s += getattr(self.memory, "disk_load_s", 0.0)   # ... read from disk before that
        if req.first_scheduled_s is None:
            req.first_scheduled_s = self.now
            req.hit_tokens = req.cached
        return True

    def enter_running(self, req: Request) -> None:
        """A request whose KV is already in place joins the running set without an admission (a disaggregated
        decode replica receiving a transferred prefill: the cluster reserved its blocks when the transfer began)."""
        req.state = RUNNING
        self._run(req)
        self.kv_cached_tokens += req.cached

    def end_schedule(self) -> None:
        """After a policy's schedule(): lookups that were not admitted lapse (a waiting request holds no KV)."""
        for r in self.looked_up:
            if r.state == WAITING:
                r.cached = 0
                r.hit = None
        self.looked_up.clear()

    def swap_in(self, req: Request, tokens: int) -> bool:
        if not self.memory.swap_in(req, tokens):
            return False
        self.swapped.remove(req)
        req.state = RUNNING
        self._run(req)
        self.kv_cached_tokens += req.cached
        self.step_swap_in += req.cached
        return True

    def preempt(self, req: Request, mode: str = "recompute", front: bool = True) -> None:
        """Take a running request off the GPU: swap its KV to CPU, or drop it and recompute later."""
        if req.cohort is not None:
            raise RuntimeError(f"{req!r} preempted while in the decode cohort (materialize it first)")
        for run in (self.running, self.loose) if self.cohort is not None else (self.running,):
            if run and run[-1] is req:
                run.pop()
            else:
                run.remove(req)
        self.kv_cached_tokens -= req.cached
        self.step_preemptions += 1
        if mode == "swap" and self.memory.can_swap_out(req):
            self.step_swap_out += self.memory.swap_out(req)
            req.state = SWAPPED
            req.swaps += 1
            (self.swapped.appendleft if front else self.swapped.append)(req)
            return
        if req.cached >= req.input_tokens:         # decode-phase eviction: generated tokens join the prompt
            req.input_tokens = req.cached + 1
        req.evicted_tokens += req.cached
        self.memory.free(req)              # before forgetting them: prefix caching keeps its computed blocks
        req.cached = 0
        req.state = WAITING
        req.evictions += 1
        (self.waiting.appendleft if front else self.waiting.append)(req)
