"""SGLang's radix-tree prefix cache on the paged pool: cached blocks form a tree, and eviction takes the least
recently used unreferenced leaf, never a node another cached block hangs from.

The tree. Block identities (sim/kv/prefix_cache.py) are interned from (parent identity, content), so the cached
identities already are a radix tree of pages: a node is one block of block_size tokens, its parent the block
before it. SGLang's RadixCache with page_size = block_size matches on the same boundaries (page_size 1, its
default, is memory.block_size 1 here). Lookups and sharing are the prefix cache's: the longest run of cached
leading blocks, referenced while a request holds them (SGLang's lock_ref along the matched path).

Eviction (SGLang mem_cache/radix_cache.py, evict): free slots that hold nothing are used first (pristine blocks,
then blank blocks); only when they run out are cached blocks evicted, one leaf at a time, the leaf with the
oldest last access first (a FIFO and a heap on last_access_time, see __init__), and a parent whose last cached
child went becomes a leaf in turn. A node's last access is when it was last released (its holders finished or
were retracted); ties go to the order the blocks were freed, tail first. vLLM's manager (the parent class)
instead evicts in free-queue order, which can drop an inner block and strand the cached blocks after it; this one
cannot."""
from __future__ import annotations

import heapq
from collections import deque
from functools import partial

from sim.kv.prefix_cache import BlockChains, PrefixCachingKVManager


class TreeChains(BlockChains):
    """BlockChains that remember each identity's parent (the radix tree's edges)."""

    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.parent: list = []               # identity -> parent identity (-1: the root)

    def _intern(self, parent, pieces) -> int:
        key = (parent, pieces)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.ids)
            self.parent.append(parent)
        return i


class RadixKVManager(PrefixCachingKVManager):
    """The prefix-caching pool with SGLang's radix-tree eviction (least recently used unreferenced leaf first)."""

    # SGLang inserts a finished request's whole sequence into the tree (cache_finished_req): its own blocks become
    # leaves, evicted by last access like any other, not free slots used before every cached block
    caches_finished_tails = True
    # only leaves are evicted and a chain is registered from its cached head on, so a cached block's parent is
    # cached: a chain's cached blocks are a leading run, found by bisection (PrefixCachingKVManager._cached_run)
    prefix_closed = True

    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.0,
                 swap_capacity_tokens: int = 0, cpu_cache_blocks: int = 0):
        super().__init__(capacity_tokens, block_size, watermark, swap_capacity_tokens, cpu_cache_blocks)
        self.chains = TreeChains(self.block_size)
        self.children: dict = {}             # identity -> its cached children
        self.last_access: dict = {}          # identity -> time it was last released
        # eviction candidates (last access, push order, identity), checked when taken (lazily): most are pushed in
        # order (frees come in time order), so they wait in a FIFO; one pushed out of order (a parent that became
        # a leaf, with its older last access) goes to a heap. The least of the two heads is the least candidate.
        self.fifo: deque = deque()
        self.heap: list = []
        self._fifo_t = -float("inf")         # the last access of the FIFO's newest entry
        self._pushes = 0
        self.evicted_leaves = 0              # cached blocks evicted (always leaves here)

    # -- the tree's edges follow every identity that becomes cached ------------------------------------------
    def _track(self, req, before: int) -> None:
        new = len(self.ref) - before
        if new > 0:
            parent, children = self.chains.parent, self.children
            for i in self.held[req.id][-new:]:
                p = parent[i]
                if p >= 0:
                    children[p] = children.get(p, 0) + 1

    def register(self, req, upto_tokens: int, private: bool = False) -> None:
        self._settle()                       # (evictions first: what is new in ref after this is what registered)
        before = len(self.ref)
        super().register(req, upto_tokens, private)
        self._track(req, before)

    def admit(self, req, tokens: int) -> bool:
        before = len(self.ref)
        ok = super().admit(req, tokens)
        if ok:
            self._track(req, before)
        return ok

    # -- the free pool -----------------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Queue the pending frees (canonical order, as the parent's), then pay what allocations took: pristine
        blocks, blank blocks, then least recently used unreferenced leaves."""
        q, ref, heap = self.queue, self.ref, self.heap
        pending = self.pending
        if pending and not self.pending_cached:      # blank blocks only: their order is moot
            self._queue_pending()
        elif pending:
            self.pending_cached = False
            last, pushes, queued = self.last_access, self._pushes, self.queued
            append, tail = self.fifo.append, self._fifo_t
            heap_push = partial(heapq.heappush, heap)
            blank = 0
            for t, _, b, keys in self._pending_in_order():
                if t < tail:                    # out of order (frees are stamped by a clock that only advances)
                    push = heap_push
                else:
                    push, tail = append, t
                blank += b
                for k in keys:
                    q[k] = None
                    last[k] = t
                    pushes += 1
                    push((t, pushes, k))
                queued += len(keys)
            self._pushes, self.queued, self._fifo_t = pushes, queued, tail
            self._queue_blank(blank)            # (blank blocks are used before any cached one, in any order)
            pending.clear()
        debt = self._owed()
        if not debt:
            return
        runs = self.runs
        while debt and runs:                    # blank blocks carry nothing: used before any cached one
            k = next(iter(runs))
            n = runs[k]
            if n > debt:
                runs[k] = n - debt
                debt = 0
            else:
                del runs[k]
                del q[k]
                debt -= n
        if not debt:
            return
        children, parent, last = self.children, self.chains.parent, self.last_access
        fifo, pop, evicted = self.fifo, heapq.heappop, 0
        popleft = fifo.popleft
        while debt:
            if heap and (not fifo or heap[0] < fifo[0]):
                t, _, k = pop(heap)
            elif fifo:
                t, _, k = popleft()
            else:
                raise RuntimeError("radix cache: allocations took more blocks than are free or evictable")
            if ref.get(k, 1) or children.get(k) or last.get(k) != t:
                continue                        # in use again, not a leaf (yet), or an older entry
            del q[k]
            del ref[k]
            evicted += 1
            debt -= 1
            p = parent[k]
            if p >= 0:
                left = children[p] - 1
                if left:
                    children[p] = left
                else:
                    del children[p]
                    if ref.get(p, 1) == 0:      # the parent is an unreferenced leaf now
                        self._pushes += 1
                        t = last[p]
                        if t < self._fifo_t:
                            heapq.heappush(heap, (t, self._pushes, p))
                        else:
                            self._fifo_t = t
                            fifo.append((t, self._pushes, p))
        self.evicted_blocks += evicted
        self.evicted_leaves += evicted

    def stats(self) -> dict:
        out = super().stats()
        out["radix_evicted_leaves"] = self.evicted_leaves
        out["radix_cached_blocks"] = len(self.ref)
        return out
