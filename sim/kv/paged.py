"""Paged KV memory: capacity M in tokens, blocks, admission watermark, and CPU swap space."""
from __future__ import annotations

from costmodels.errors import UserError


class KVCacheManager:
    """Block accounting for GPU KV and CPU swap space. Block size 1 gives InferMax's token granularity."""

    exact_counts = True     # plain per-request block counts: the engine's decode cohort may account in aggregate
    loaded_tokens = 0       # KV tokens the latest admission loaded from a CPU tier (none here)
    clock = 0.0             # the engine's time at the latest schedule or commit (prefix caching orders frees by it)

    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.0,
                 swap_capacity_tokens: int = 0):
        if capacity_tokens <= 0:
            raise UserError(f"memory.M: must be a positive number of KV tokens, got {capacity_tokens}")
        if block_size <= 0:
            raise UserError(f"memory.block_size: must be a positive integer, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise UserError(f"memory.watermark: must be in [0, 1), got {watermark}")
        self.block_size = int(block_size)
        self.total_blocks = int(capacity_tokens) // self.block_size
        if self.total_blocks == 0:
            raise UserError(f"memory.M: {capacity_tokens} tokens hold no block of {block_size} tokens")
        self.capacity_tokens = self.total_blocks * self.block_size
        self.free_blocks = self.total_blocks
        self.watermark_blocks = int(watermark * self.total_blocks)
        self.swap_total_blocks = int(swap_capacity_tokens) // self.block_size
        self.swap_free_blocks = self.swap_total_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def used_tokens(self) -> int:
        """Allocated KV (blocks × block size), the quantity bounded by M."""
        return (self.total_blocks - self.free_blocks) * self.block_size

    @property
    def offloaded_tokens(self) -> int:
        """Context tokens of GPU-running requests that currently sit in host memory (BROS lazy checkpoints)."""
        return 0

    def can_reserve(self, req, tokens: int, admission: bool = False) -> bool:
        extra = self.blocks_for(tokens) - req.blocks
        if extra <= 0:
            return True
        floor = self.watermark_blocks if admission else 0
        return self.free_blocks - extra >= floor

    def reserve(self, req, tokens: int, admission: bool = False) -> bool:
        """Grow `req`'s allocation to hold `tokens`; False (and no change) if it does not fit."""
        extra = self.blocks_for(tokens) - req.blocks
        if extra <= 0:
            return True
        floor = self.watermark_blocks if admission else 0
        if self.free_blocks - extra < floor:
            return False
        self.free_blocks -= extra
        req.blocks += extra
        return True

    def admit(self, req, tokens: int) -> bool:
        """Reserve for a request entering the GPU (the admission watermark applies)."""
        return self.reserve(req, tokens, admission=True)

    def blocks_returned_on_free(self, req) -> int:
        """Blocks free(req) would return to the pool now."""
        return req.blocks

    def free(self, req) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0

    def trim(self, req, tokens: int) -> int:
        """Release `req`'s blocks past those `tokens` need (speculative decoding: rejected drafts); returns how many."""
        extra = req.blocks - self.blocks_for(tokens)
        if extra <= 0:
            return 0
        self.free_blocks += extra
        req.blocks -= extra
        return extra

    def release_tails(self, freed: int, trims) -> int:
        """trim at several steps' ends at once (sim/engine/specwalk.py): `freed` blocks in all; `trims()` lists
        them one by one, (time, request, blocks it held then, tokens it kept) in time order, for a manager that
        needs them (the prefix cache); the caller keeps the requests' block counts. Returns `freed`."""
        self.free_blocks += freed
        return freed

    def lending_ledger(self):
        """A ledger of blocks lent between requests' allocations on this manager (EconoServe, sim/kv/lending.py)."""
        from sim.kv.lending import LoanLedger
        return LoanLedger(self)

    def can_swap_out(self, req) -> bool:
        return self.swap_free_blocks >= self.blocks_for(req.cached)

    def swap_out(self, req) -> int:
        """Move the cached KV to CPU; returns tokens transferred."""
        n = self.blocks_for(req.cached)
        self.swap_free_blocks -= n
        req.swap_blocks = n
        self.free(req)
        return req.cached

    def drop_swapped(self, req) -> None:
        """A swapped request leaves without coming back: its CPU copy is released."""
        self.swap_free_blocks += req.swap_blocks
        req.swap_blocks = 0

    def swap_in(self, req, tokens: int) -> bool:
        if not self.reserve(req, tokens, admission=True):
            return False
        self.swap_free_blocks += req.swap_blocks
        req.swap_blocks = 0
        return True
