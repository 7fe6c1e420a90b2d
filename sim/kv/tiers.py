"""A disk tier under the prefix cache's CPU tier (an LMCache-style GPU → CPU → disk hierarchy).

Blocks the CPU tier evicts (least recently used) are written to disk, up to its capacity, least recently used out;
the write runs in the background and is not charged. A lookup goes on from the GPU and CPU runs through blocks held
on disk; admitting the request promotes them to the CPU tier (they leave the disk: the tiers hold a block once) and
loads them onto the GPU with the CPU ones: the PCIe copy is charged as for the CPU tier, and the disk read before
it at the disk's bandwidth (all tensor-parallel shards share the disk) is added to the step that admits it.
A lookup that is not admitted moves nothing. The summary gives hits per tier (prefix_gpu/cpu/disk_hit_tokens)."""
from __future__ import annotations

from collections import OrderedDict

from sim.kv.prefix_cache import PrefixCachingKVManager
from sim.kv.radix import RadixKVManager


class DiskTier:
    """Mixin for a prefix-caching manager with a CPU tier: a disk tier under it."""

    def __init__(self, *args, disk_blocks: int = 0, disk_seconds_per_block: float = 0.0, **kw):
        super().__init__(*args, **kw)
        self.disk_capacity = int(disk_blocks)
        self.disk: OrderedDict = OrderedDict()     # identities on disk, least recently used first
        self.disk_seconds_per_block = float(disk_seconds_per_block)
        self.disk_pending: dict = {}               # request id -> blocks of its lookup found on disk
        self.disk_load_s = 0.0                     # disk read time of the latest admission
        self.disk_hit_blocks = 0
        self.disk_writes = 0                       # blocks the CPU tier demoted to disk

    def _to_cpu(self, k) -> None:
        """The prefix cache's _to_cpu with the disk under it, in one call (it runs for every freed cached block):
        the block leaves the disk (a block lives in one tier below the GPU), joins the CPU tier or is touched there,
        and a block the CPU tier then holds too many of goes down to disk."""
        disk = self.disk
        disk.pop(k, None)
        if not self.cpu_capacity:
            return
        cpu = self.cpu
        if k in cpu:
            cpu.move_to_end(k)
            return
        cpu[k] = None
        while len(cpu) > self.cpu_capacity:       # full: the least recently used go down to disk
            old, _ = cpu.popitem(last=False)
            if self.disk_capacity:
                if len(disk) >= self.disk_capacity:
                    disk.popitem(last=False)
                disk[old] = None
                self.disk_writes += 1

    def _trim_cpu(self) -> None:
        """The CPU tier back to its capacity after promotions (admit): its newest block goes in again through
        _to_cpu, whose loop sends the least recently used ones down to disk (the newest is on no disk: a block
        lives in one tier)."""
        if len(self.cpu) > self.cpu_capacity:
            k, _ = self.cpu.popitem()
            self._to_cpu(k)

    def lookup(self, req) -> int:
        cached = super().lookup(req)
        self.disk_pending.pop(req.id, None)
        hit = req.hit
        if hit is None or not self.disk:
            return cached
        gpu, cpu_n = hit
        limit = min((req.input_tokens - 1) // self.block_size, self._shareable(req))
        ids, disk, d = req.chain[0], self.disk, 0
        while gpu + cpu_n + d < limit and ids[gpu + cpu_n + d] in disk:
            d += 1
        if d:
            req.hit = (gpu, cpu_n + d)
            req.cached = (gpu + cpu_n + d) * self.block_size
            self.disk_pending[req.id] = d
        return req.cached

    def admit(self, req, tokens: int) -> bool:
        d = self.disk_pending.pop(req.id, 0)
        self.disk_load_s = 0.0
        if not d or not req.hit:
            return super().admit(req, tokens)
        gpu, cpu_n = req.hit
        promoted = req.chain[0][gpu + cpu_n - d:gpu + cpu_n]
        for i in promoted:                         # into the CPU tier; the parent's admission loads them from there
            del self.disk[i]
            self.cpu[i] = None
        ok = super().admit(req, tokens)
        if not ok:                                 # not admitted: back where they were
            for i in promoted:
                del self.cpu[i]
                self.disk[i] = None
            return False
        self.disk_hit_blocks += d
        self.disk_load_s = d * self.disk_seconds_per_block
        self._trim_cpu()
        return True

    def stats(self) -> dict:
        out = super().stats()
        B = self.block_size
        out["prefix_cpu_hit_tokens"] = (self.cpu_hit_blocks - self.disk_hit_blocks) * B
        out["prefix_disk_hit_tokens"] = self.disk_hit_blocks * B
        out["prefix_disk_writes"] = self.disk_writes
        return out


class TieredPrefixKVManager(DiskTier, PrefixCachingKVManager):
    """vLLM's automatic prefix caching with CPU and disk tiers."""


class TieredRadixKVManager(DiskTier, RadixKVManager):
    """SGLang's radix cache with CPU and disk tiers."""
