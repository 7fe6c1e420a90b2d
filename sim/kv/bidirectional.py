"""BROS bidirectional KV blocks: RT fills a block from the left, BE from the right; overwritten BE slots go to CPU."""
from __future__ import annotations

from sim.kv.paged import KVCacheManager


class BidirectionalKVManager(KVCacheManager):
    """Slot-level accounting of BROS §5. Each block holds at most one RT owner (left) and one BE owner (right).

    A request's context (m tokens) is split into `resident` slots on the GPU and `cpu` slots checkpointed to
    host memory. RT growth order (spec §6.4): own last block's empty slots → a free block → the BE-only block
    with most empty slots → lazy checkpoint: overwrite the BE peer's slots in its last block. BE growth: own last
    block → a free block → the RT-only block with most empty slots. With `bidirectional=False` a block has one
    owner, as in vLLM. Restoring CPU slots (when the owner runs again) places them as new slots and is reported
    through `take_swapped_in()` so the policy can charge the H2D transfer."""

    exact_counts = False    # its own block layout: the engine keeps every request on the per-request path

    def __init__(self, capacity_tokens: int, block_size: int = 16, is_rt=None, bidirectional: bool = True):
        super().__init__(capacity_tokens, block_size, 0.0, 0)
        n, self.S = self.total_blocks, self.block_size
        self.rt_owner = [None] * n
        self.rt_len = [0] * n
        self.be_owner = [None] * n
        self.be_len = [0] * n
        self.free_set = set(range(n))
        self.rt_only: set = set()        # RT-owned blocks with no BE owner and empty slots (BE may share them)
        self.be_only: set = set()        # and vice versa
        self.req_blocks: dict = {}       # id → list of block ids, in fill order
        self.resident: dict = {}
        self.cpu: dict = {}
        self.is_rt = is_rt or (lambda req: req.cls == "rt")
        self.bidirectional = bidirectional
        self.checkpointed_slots = 0      # D2H slots written by lazy checkpointing / extreme-case swap-out
        self.restored_slots = 0          # H2D slots swapped back
        self.cpu_peak_slots = 0
        self._swapped_in = 0
        self._journal = None
        self._pending_ck = 0

    # -- queries ----------------------------------------------------------------------------------------------
    def held(self, req) -> int:
        return self.resident.get(req.id, 0) + self.cpu.get(req.id, 0)

    @property
    def offloaded_tokens(self) -> int:
        return sum(self.cpu.values())

    def cpu_slots(self, req) -> int:
        return self.cpu.get(req.id, 0)

    def cpu_slots_of(self, reqs) -> list:
        """cpu_slots of many requests (a scheduler ranking a long queue every step)."""
        held = self.cpu.get
        return [held(r.id, 0) for r in reqs]

    def take_swapped_in(self) -> int:
        n, self._swapped_in = self._swapped_in, 0
        return n

    def shared_blocks(self) -> int:
        return sum(1 for b in range(self.total_blocks) if self.rt_owner[b] is not None
                   and self.be_owner[b] is not None)

    # -- journalled writes (a failed reservation leaves no trace) ----------------------------------------------
    def _set(self, arr, b, v):
        self._journal.append((arr, b, arr[b]))
        arr[b] = v
        if arr is not self.rt_only:        # every block array change may move the block between open sets
            self._classify(b)

    def _classify(self, b):
        rt, be = self.rt_owner[b] is not None, self.be_owner[b] is not None
        room = self.rt_len[b] + self.be_len[b] < self.S
        (self.rt_only.add if rt and not be and room else self.rt_only.discard)(b)
        (self.be_only.add if be and not rt and room else self.be_only.discard)(b)

    def _dset(self, d, key, v):
        self._journal.append((d, key, d.get(key, _MISSING)))
        d[key] = v

    def _touch_free(self, b, now_free: bool):
        was = b in self.free_set
        if was == now_free:
            return
        self._journal.append((self.free_set, b, was))
        (self.free_set.add if now_free else self.free_set.discard)(b)

    def _rollback(self):
        for container, key, old in reversed(self._journal):
            if container is self.free_set:
                (self.free_set.add if old else self.free_set.discard)(key)
            elif isinstance(container, dict):
                if old is _MISSING:
                    container.pop(key, None)
                else:
                    container[key] = old
            else:
                container[key] = old
                self._classify(key)

    # -- growth ---------------------------------------------------------------------------------------------
    def can_reserve(self, req, tokens: int, admission: bool = False) -> bool:
        """Whether `reserve` would succeed: tried for real, then rolled back."""
        if tokens - self.resident.get(req.id, 0) <= 0 and not self.cpu.get(req.id, 0):
            return True
        self._journal = []
        ok = self._grow(req, max(tokens - self.resident.get(req.id, 0), self.cpu.get(req.id, 0)), self.is_rt(req))
        self._rollback()
        self._journal = None
        return ok

    def reserve(self, req, tokens: int, admission: bool = False) -> bool:
        """Hold `tokens` slots for `req` on the GPU, bringing any CPU-checkpointed slots back first."""
        cpu = self.cpu.get(req.id, 0)
        need = tokens - self.resident.get(req.id, 0)
        if need <= 0 and cpu == 0:
            return True
        self._journal = []
        self._pending_ck = 0
        ok = self._grow(req, max(need, cpu), self.is_rt(req))
        if ok:
            if self._pending_ck:
                self.checkpointed_slots += self._pending_ck
                self.cpu_peak_slots = max(self.cpu_peak_slots, sum(self.cpu.values()))
            if cpu:
                self._dset(self.cpu, req.id, 0)
                self._swapped_in += cpu
                self.restored_slots += cpu
            self.free_blocks = len(self.free_set)
            req.blocks = len(self.req_blocks.get(req.id, ()))
        else:
            self._rollback()
        self._journal = None
        return ok

    def _grow(self, req, n: int, rt: bool) -> bool:
        rid = req.id
        blocks = list(self.req_blocks.get(rid, []))
        self._dset(self.req_blocks, rid, blocks)
        own_len, peer_len = (self.rt_len, self.be_len) if rt else (self.be_len, self.rt_len)
        owner, peer_owner = (self.rt_owner, self.be_owner) if rt else (self.be_owner, self.rt_owner)
        while n > 0:
            b = blocks[-1] if blocks else None
            if b is not None:
                empty = self.S - own_len[b] - peer_len[b]
                if empty > 0:
                    k = min(n, empty)
                    self._set(own_len, b, own_len[b] + k)
                    self._add_resident(rid, k)
                    n -= k
                    continue
            nb = self._new_block(rt)
            if nb is not None:
                self._set(owner, nb, rid)
                self._touch_free(nb, False)
                blocks.append(nb)
                continue
            if rt and self.bidirectional and b is not None and self.be_len[b] > 0:
                k = min(n, self.be_len[b])            # lazy checkpoint: the BE peer's slots about to be overwritten
                victim = self.be_owner[b]
                self._set(self.be_len, b, self.be_len[b] - k)
                self._set(self.rt_len, b, self.rt_len[b] + k)
                self._add_resident(rid, k)
                self._add_resident(victim, -k)
                self._dset(self.cpu, victim, self.cpu.get(victim, 0) + k)
                if self.be_len[b] == 0:
                    self._set(self.be_owner, b, None)
                    vb = [x for x in self.req_blocks[victim] if x != b]
                    self._dset(self.req_blocks, victim, vb)
                self._pending_ck += k
                n -= k
                continue
            return False
        return True

    def _add_resident(self, rid, k):
        self._dset(self.resident, rid, self.resident.get(rid, 0) + k)

    def _new_block(self, rt: bool):
        if self.free_set:
            return next(iter(self.free_set))
        if not self.bidirectional:
            return None
        # Share a block held only by the other class: the one with the most empty slots (BROS FindBlock heuristic).
        best, best_empty = None, 0
        for b in (self.be_only if rt else self.rt_only):
            empty = self.S - self.rt_len[b] - self.be_len[b]
            if empty > best_empty or (empty == best_empty and best is not None and b < best):
                best, best_empty = b, empty
        return best

    # -- release --------------------------------------------------------------------------------------------
    def _release_gpu(self, req):
        rid = req.id
        for b in self.req_blocks.pop(rid, []):
            if self.rt_owner[b] == rid:
                self.rt_owner[b], self.rt_len[b] = None, 0
            if self.be_owner[b] == rid:
                self.be_owner[b], self.be_len[b] = None, 0
            if self.rt_owner[b] is None and self.be_owner[b] is None:
                self.free_set.add(b)
            self._classify(b)
        self.resident.pop(rid, None)
        self.free_blocks = len(self.free_set)
        req.blocks = 0

    def free(self, req) -> None:
        """Drop the request's KV everywhere (finished, or preempted for recompute)."""
        self._release_gpu(req)
        self.cpu.pop(req.id, None)

    def swap_out_all(self, req) -> int:
        """Extreme case (§5): move every resident slot of `req` to CPU; returns slots moved."""
        k = self.resident.get(req.id, 0)
        self._release_gpu(req)
        if k:
            self.cpu[req.id] = self.cpu.get(req.id, 0) + k
            self.checkpointed_slots += k
            self.cpu_peak_slots = max(self.cpu_peak_slots, sum(self.cpu.values()))
        return k

    def can_swap_out(self, req) -> bool:
        return False    # the engine's whole-request swap is not used; BROS moves slots itself

    def check(self) -> None:
        """Invariants (tests): per-block occupancy ≤ S, per-request slot sums, free set consistency."""
        res = {}
        for b in range(self.total_blocks):
            assert self.rt_len[b] + self.be_len[b] <= self.S, b
            assert (self.rt_owner[b] is None) == (self.rt_len[b] == 0) or self.rt_owner[b] is not None, b
            free = self.rt_owner[b] is None and self.be_owner[b] is None
            assert free == (b in self.free_set), b
            if not self.bidirectional:
                assert self.rt_owner[b] is None or self.be_owner[b] is None, b
            for o, ln in ((self.rt_owner[b], self.rt_len[b]), (self.be_owner[b], self.be_len[b])):
                if o is not None:
                    res[o] = res.get(o, 0) + ln
            room = self.rt_len[b] + self.be_len[b] < self.S
            assert (b in self.rt_only) == (self.rt_owner[b] is not None and self.be_owner[b] is None and room), b
            assert (b in self.be_only) == (self.be_owner[b] is not None and self.rt_owner[b] is None and room), b
        for rid, n in self.resident.items():
            assert res.get(rid, 0) == n, (rid, res.get(rid, 0), n)
        assert self.free_blocks == len(self.free_set)


_MISSING = object()
