"""Apt-Serve's hybrid cache pool: one block pool where each request holds either KV cache or hidden-state cache."""
from __future__ import annotations

import math

from sim.kv.paged import KVCacheManager


class HybridCacheManager(KVCacheManager):
    """KV blocks as in vLLM; a hidden-cache request of n tokens takes ⌈⌈n/B⌉·ratio⌉ blocks (Apt-Serve §4.3,
    the reference code packs two hidden blocks into one K+V block). The cache type is fixed while the request
    holds memory: switching means freeing and recomputing, as the paper prescribes."""

    exact_counts = False    # its own block layout: the engine keeps every request on the per-request path

    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.0,
                 swap_capacity_tokens: int = 0, hidden_ratio: float = 0.5):
        super().__init__(capacity_tokens, block_size, watermark, swap_capacity_tokens)
        self.hidden_ratio = float(hidden_ratio)
        self.hidden: set = set()          # ids of requests whose context lives as hidden states

    @property
    def hidden_allowed(self) -> bool:
        """A hidden cache only saves memory when it is smaller than KV (never for GQA models, spec §8.1)."""
        return self.hidden_ratio < 1.0

    def hidden_blocks(self, kv_blocks: int) -> int:
        return math.ceil(kv_blocks * self.hidden_ratio)

    def blocks_needed(self, tokens: int, hidden: bool) -> int:
        kv = self.blocks_for(tokens)
        return self.hidden_blocks(kv) if hidden else kv

    def is_hidden(self, req) -> bool:
        return req.id in self.hidden

    def set_type(self, req, hidden: bool) -> None:
        """Choose the cache type of a request that holds no memory (a new or recompute-preempted request)."""
        if req.blocks:
            raise RuntimeError(f"request {req.id} holds {req.blocks} blocks; its cache type cannot change in place")
        if hidden and not self.hidden_allowed:
            raise RuntimeError("hidden cache is not smaller than KV for this model")
        (self.hidden.add if hidden else self.hidden.discard)(req.id)

    def can_reserve(self, req, tokens: int, admission: bool = False) -> bool:
        extra = self.blocks_needed(tokens, self.is_hidden(req)) - req.blocks
        if extra <= 0:
            return True
        return self.free_blocks - extra >= (self.watermark_blocks if admission else 0)

    def reserve(self, req, tokens: int, admission: bool = False) -> bool:
        extra = self.blocks_needed(tokens, self.is_hidden(req)) - req.blocks
        if extra <= 0:
            return True
        if self.free_blocks - extra < (self.watermark_blocks if admission else 0):
            return False
        self.free_blocks -= extra
        req.blocks += extra
        return True

    def free(self, req) -> None:
        super().free(req)
        self.hidden.discard(req.id)     # the cache is gone; the next prefill chooses the type afresh

    def can_swap_out(self, req) -> bool:
        return False                    # Apt-Serve never swaps (spec §2.4): preemption is by recompute
