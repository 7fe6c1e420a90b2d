"""Automatic prefix caching (vLLM v1's): full KV blocks named by a hash chain of their content, shared by reference,
kept after their owners finish and evicted least-recently-freed first; an optional CPU tier behind them.

Block identity. A request's tokens are its prompt segments (`Request.prefix`: (key, length) pairs the workload says
it shares with others), then its own unique rest of the prompt, then its generated tokens. Block b's identity is
an integer interned from (identity of block b-1, the pieces of content it covers), so two requests share block b
exactly when their first (b+1)·B tokens are the same content. Interning instead of hashing makes identities exact
(no collisions) and independent of the process's hash seed.

Block pool (counts stay the engine's plain `free_blocks`, so the fast paths work unchanged):
- a block is in use (reference count > 0, held by running requests), or free. A free block is either cached (its
  identity can still be hit) or blank;
- free blocks wait in one queue, oldest first; an allocation takes blocks from its head, evicting the cached ones
  it takes. Allocations only decrement `free_blocks`; the queue catches up (pops its head) before anything reads
  it (a lookup), which takes exactly the blocks eager popping would have taken, since both consume in queue order;
- freed blocks join the queue's tail in a canonical order: by the time they were freed, then request id, and
  within a request last block first (vLLM frees in reverse so a request's prefix outlives its tail). The order
  does not depend on which engine path freed them, which keeps the fast paths bit-identical to the plain loop.
  Blank blocks side by side in the queue are one run (a run is taken block by block from its head, so two
  adjacent runs and their sum evict alike), and while no identity is pending the pending frees are all blank and
  join the tail's run unsorted: a speculative run's rejected drafts free a block a few times per step;
- full blocks become hittable when their tokens are committed (prefill chunks), or when the request frees them
  (blocks filled while decoding: only their own request, or a later turn of its conversation, can hit those, and
  both look only after the free).

A lookup (vLLM's get_computed_blocks) finds the longest run of leading blocks that are cached, capped so at least
one prompt token is computed. With a CPU tier, it goes on through blocks held in CPU memory: those are loaded
back (PCIe time charged to the step that admits the request) instead of recomputed. The CPU tier receives every
cached block when it is freed (the copy runs in the background and is not charged), up to its capacity, evicting
its own least recently used blocks.

Departures from vLLM, on purpose: a block whose content is already cached under another block stays blank (vLLM
keeps both copies cached); blocks become hittable after the step that computes them, not within it."""
from __future__ import annotations

from collections import OrderedDict

from costmodels.errors import UserError
from sim.kv.paged import KVCacheManager


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _time_then_request(p):
    """A pending free's place in the queue: its time, then its request (a stable sort keeps the rest)."""
    return p[0], p[1]


def new_chain() -> list:
    """A request's chain record: ids, state after the walked tokens, tokens walked, blocks that may carry an
    identity (None: not yet known)."""
    return [[], (-1, ()), 0, None]


class BlockChains:
    """Interns block identities for one block size and extends each request's chain on demand."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.ids: dict = {}          # (parent id, content pieces) → block identity
        self.memo: dict = {}         # (parent id, open pieces, segment) → (new ids, parent id, open pieces)
        self.prefixes: dict = {}     # a prefix's segments → (ids, state, tokens) after walking all of them

    def _intern(self, parent, pieces) -> int:
        key = (parent, pieces)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.ids)
        return i

    def _walk(self, state, key, off: int, take: int):
        """Extend a chain state (last full block's id, pieces of the open block) by tokens [off, off + take) of
        segment `key`; returns the new full blocks' ids and the new state. A piece continuing the open block's last
        piece of the same segment merges with it, so a content's identities do not depend on how the walk was cut.
        Memoised: requests repeating a prefix reuse the walk."""
        memo_key = (state, key, off, take)
        hit = self.memo.get(memo_key)
        if hit is not None:
            return hit
        parent, open_pieces = state
        pieces = list(open_pieces)
        used = sum(p[2] - p[1] for p in pieces)
        B, pos, end, out = self.block_size, off, off + take, []
        while pos < end:
            t = min(B - used, end - pos)
            if pieces and pieces[-1][0] == key and pieces[-1][2] == pos:
                pieces[-1] = (key, pieces[-1][1], pos + t)
            else:
                pieces.append((key, pos, pos + t))
            pos += t
            used += t
            if used == B:
                parent = self._intern(parent, tuple(pieces))
                out.append(parent)
                pieces, used = [], 0
        result = (tuple(out), (parent, tuple(pieces)))
        if len(self.memo) < 1_000_000:          # bounded: only shared prefixes repeat
            self.memo[memo_key] = result
        return result

    def prefix_walk(self, prefix) -> tuple:
        """(ids of the full blocks, chain state, tokens) after walking all of a hashable prefix's segments."""
        walked = self.prefixes.get(prefix)
        if walked is None:
            state, new = (-1, ()), []
            for key, n in prefix:
                more, state = self._walk(state, key, 0, n)
                new.extend(more)
            walked = self.prefixes[prefix] = (tuple(new), state, sum(n for _, n in prefix))
        return walked

    def chain(self, req, n_blocks: int) -> list:
        """The identities of `req`'s first n_blocks full blocks (prompt segments, own prompt, generated tokens)."""
        ch = req.chain
        if ch is None:
            ch = req.chain = new_chain()
        ids = ch[0]
        if len(ids) >= n_blocks:
            return ids
        if not ch[2] and req.prefix and _hashable(req.prefix):   # the same segments share one walk
            walked = self.prefix_walk(req.prefix)
            ids.extend(walked[0])
            ch[1], ch[2] = walked[1], walked[2]
            if len(ids) >= n_blocks:
                return ids
        segs = list(req.prefix or ())
        shared = sum(n for _, n in segs)
        if req.prompt_tokens > shared:
            segs.append((("u", req.id), req.prompt_tokens - shared))
        segs.append((("g", req.id), 1 << 40))      # generated tokens: as many as needed
        walked, state, start = ch[2], ch[1], 0
        for key, n in segs:
            if walked >= start + n:                # walked already
                start += n
                continue
            off = walked - start
            take = min(n - off, n_blocks * self.block_size - walked)
            new, state = self._walk(state, key, off, take)
            ids.extend(new)
            walked += take
            start += n
            if len(ids) >= n_blocks:
                break
        ch[1], ch[2] = state, walked
        return ids


class PrefixCachingKVManager(KVCacheManager):
    """The paged manager with vLLM v1's automatic prefix caching and an optional CPU offload tier."""

    exact_counts = True            # block accounting stays plain counts: the decode cohort may run on it
    # the cached identities are closed under "parent of": not here (the free queue can evict an inner block and
    # strand the cached blocks after it), always under SGLang's leaf-first eviction (sim/kv/radix.py)
    prefix_closed = False
    caches_finished_tails = False  # a finished request's private blocks are blank (vLLM's queue holds them in the
                                   # same places; nobody can hit them), not identities to intern and count

    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.0,
                 swap_capacity_tokens: int = 0, cpu_cache_blocks: int = 0):
        super().__init__(capacity_tokens, block_size, watermark, swap_capacity_tokens)
        if cpu_cache_blocks < 0:
            raise UserError(f"memory.cpu_offload: must hold >= 0 blocks, got {cpu_cache_blocks}")
        self.chains = BlockChains(self.block_size)
        self.ref: dict = {}                 # cached identity → requests holding it (0: free, waiting in the queue)
        self.held: dict = {}                # request id → identities it holds, a prefix of its blocks
        self.pristine = self.total_blocks   # never-used blank blocks at the queue's head
        self.queue: OrderedDict = OrderedDict()   # free blocks after the pristine ones: identity, or a blank run
        self.runs: dict = {}                # blank run key (negative) → blocks in the run
        self.queued = 0                     # blocks in the queue (identities count one, runs their length)
        self.pending: list = []             # (time, request id, blank blocks, identities) freed, not yet queued
        self.pending_cached = False         # an identity is pending (else pending order is moot: all blank)
        self._blank = 0
        self.clock = 0.0                    # the engine's time, set before it schedules or commits
        self.cpu_capacity = int(cpu_cache_blocks)
        self.cpu: OrderedDict = OrderedDict()     # CPU tier: identities, least recently used first
        # statistics
        self.hit_blocks = 0                 # blocks found on the GPU at admissions
        self.cpu_hit_blocks = 0             # blocks loaded back from the CPU tier
        self.query_blocks = 0               # blocks asked for at admissions (the prompt's, less the last token)
        self.evicted_blocks = 0             # cached blocks evicted from the GPU
        self.loaded_tokens = 0              # KV tokens the latest admission loaded from the CPU tier
        self.generation_refs: set = set()   # requests whose generated tokens a later prompt names ("g", id)
        self._private = 0                   # keys of never-hittable blocks in the CPU tier (negative, unique)

    def bind_requests(self, requests) -> None:
        """Note which requests' answers later prompts repeat (multi-turn): only their generated blocks can be hit
        by another request."""
        for r in requests:
            for key, _ in r.prefix or ():
                if isinstance(key, tuple) and len(key) == 2 and key[0] == "g":
                    self.generation_refs.add(key[1])

    def _shareable(self, req) -> int:
        """Leading blocks of `req` another request could ever hit: those inside its shared prompt segments (all of
        them when a later turn repeats its answer). The rest is private: only the request itself, after a
        preemption, could hit it, so those blocks get identities only when it is preempted; a finished request's
        private blocks are freed as blank (same queue positions, same CPU-tier traffic, no identity work)."""
        ch = req.chain
        if ch is None:
            ch = req.chain = new_chain()
        n = ch[3]
        if n is None:
            shared = sum(k for _, k in req.prefix or ())
            if req.prompt_tokens <= shared and req.id in self.generation_refs:
                n = 1 << 62
            else:
                n = shared // self.block_size
            ch[3] = n
        return n

    # -- the queue ------------------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Queue the pending frees in canonical order, then drop from the head what allocations took."""
        if self.pending:
            self._queue_pending()
        debt = self._owed()
        if not debt:
            return
        q, ref, runs = self.queue, self.ref, self.runs
        while debt:
            k, _ = q.popitem(last=False)
            if k >= 0:                      # a cached block: evicted
                del ref[k]
                self.evicted_blocks += 1
                debt -= 1
            else:                           # a run of blank blocks: take what is owed, keep the rest at the head
                n = runs[k]
                if n > debt:
                    runs[k] = n - debt
                    q[k] = None
                    q.move_to_end(k, last=False)
                    debt = 0
                else:
                    del runs[k]
                    debt -= n

    def _queue_pending(self) -> None:
        """Move the pending frees to the queue's tail in canonical order. Blank blocks that end up side by side
        join one run: a run is taken from its head block by block, so two adjacent runs and their sum give the
        same evictions. With no identity pending (rejected drafts' tails, finished requests' private blocks) the
        order among them is moot and not sorted for."""
        pending = self.pending
        if not self.pending_cached:
            self._queue_blank(sum(p[2] for p in pending))
            pending.clear()
            return
        self.pending_cached = False
        q, blank, queued = self.queue, 0, 0
        for _, _, b, keys in self._pending_in_order():
            blank += b                      # a request's blank blocks go before its identities (evicted first)
            if keys:
                self._queue_blank(blank)
                blank = 0
                for k in keys:
                    q[k] = None
                queued += len(keys)
        self._queue_blank(blank)
        self.queued += queued
        pending.clear()

    def _queue_blank(self, n: int) -> None:
        """n blank blocks at the queue's tail: added to the run there, or a new run."""
        if not n:
            return
        q = self.queue
        if q:
            last = next(reversed(q))
            if last < 0:
                self.runs[last] += n
                self.queued += n
                return
        self._blank -= 1
        self.runs[self._blank] = n
        q[self._blank] = None
        self.queued += n

    def _owed(self) -> int:
        """Blocks allocations took beyond the free pristine ones, which the queue must now give up (0: none). The
        pristine blocks are used first; what is owed leaves the queue's count."""
        debt = self.pristine + self.queued - self.free_blocks
        if debt <= 0:
            return 0
        take = min(debt, self.pristine)
        self.pristine -= take
        debt -= take
        self.queued -= debt
        return debt

    def _to_cpu(self, k) -> None:
        if not self.cpu_capacity:
            return
        cpu = self.cpu
        if k in cpu:
            cpu.move_to_end(k)
            return
        cpu[k] = None
        self._trim_cpu()

    def _trim_cpu(self) -> None:
        """The CPU tier back to its capacity, least recently used out (a tier below overrides where they go)."""
        cpu = self.cpu
        while len(cpu) > self.cpu_capacity:
            cpu.popitem(last=False)

    # -- lookups and admission -----------------------------------------------------------------------------------
    def lookup(self, req) -> int:
        """Tokens of `req` already computed: the longest cached run of its leading full blocks (GPU, then the CPU
        tier), leaving at least its last token to compute. Sets req.cached; admit() takes the hit or it lapses."""
        self._settle()
        B = self.block_size
        limit = min((req.input_tokens - 1) // B, self._shareable(req))
        if limit <= 0:
            req.hit = None
            return 0
        ids = self.chains.chain(req, limit)
        gpu = self._cached_run(ids, limit)
        cpu_n = 0
        if self.cpu_capacity:
            cpu = self.cpu
            while gpu + cpu_n < limit and ids[gpu + cpu_n] in cpu:
                cpu_n += 1
        req.hit = (gpu, cpu_n)
        req.cached = (gpu + cpu_n) * B
        return req.cached

    def cached_prefix_tokens(self, req) -> int:
        """Prompt tokens of `req` (a request not on this replica) this cache holds on the GPU now, in leading full
        blocks of its shared segments: what a cache-aware router asks. Changes nothing."""
        if not req.prefix or not _hashable(req.prefix):
            return 0
        self._settle()
        ids = self.chains.prefix_walk(req.prefix)[0]
        return self._cached_run(ids, min(len(ids), (req.prompt_tokens - 1) // self.block_size)) * self.block_size

    def _cached_run(self, ids, limit: int) -> int:
        """How many of the chain's first `limit` identities are cached, counted from the first up to one that is
        not. With `prefix_closed` (a cached block's parent is always cached) that is a bisection."""
        ref = self.ref
        if self.prefix_closed:
            lo, hi = 0, limit
            while lo < hi:
                mid = (lo + hi) // 2
                if ids[mid] in ref:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        n = 0
        while n < limit and ids[n] in ref:
            n += 1
        return n

    def admit(self, req, tokens: int) -> bool:
        """Take the hit found by lookup (touch GPU blocks, load CPU ones into fresh blocks), then reserve `tokens`."""
        hit = req.hit
        self.loaded_tokens = 0
        if not hit:
            return self.reserve(req, tokens, admission=True)
        gpu, cpu_n = hit
        ids = req.chain[0]
        ref, q = self.ref, self.queue
        held = ids[:gpu]
        revived = [i for i in held if not ref[i]]   # cached blocks waiting in the free queue come back into use
        extra = self.blocks_for(tokens) - gpu       # loaded CPU blocks and the rest are fresh blocks
        if self.free_blocks - len(revived) - max(extra, 0) < self.watermark_blocks:
            req.hit = None
            req.cached = 0
            return False
        for i in revived:
            del q[i]
        self.free_blocks -= len(revived)
        self.queued -= len(revived)
        for i in held:
            ref[i] += 1
        req.blocks = gpu
        if cpu_n:                               # loaded blocks are cached again on the GPU under their identity
            self.free_blocks -= cpu_n
            req.blocks += cpu_n
            for i in ids[gpu:gpu + cpu_n]:
                self.cpu.move_to_end(i)
                if i in ref:                    # cannot happen (the GPU run stopped before it); keep it blank
                    break
                ref[i] = 1
                held.append(i)
        self.held[req.id] = held
        self.query_blocks += (req.input_tokens - 1) // self.block_size
        self.hit_blocks += gpu
        self.cpu_hit_blocks += cpu_n
        self.loaded_tokens = cpu_n * self.block_size     # the view charges their PCIe transfer to this step
        req.hit = None
        if not self.reserve(req, tokens, admission=False):    # cannot fail: checked above
            raise RuntimeError("prefix-cache admission lost its blocks")
        return True

    # -- registering computed blocks and freeing -----------------------------------------------------------------
    def register(self, req, upto_tokens: int, private: bool = False) -> None:
        """Make `req`'s shareable full blocks up to `upto_tokens` hittable (their content is computed); with
        `private`, its own blocks beyond them too (it is being preempted and may come back for them)."""
        n = upto_tokens // self.block_size
        held = self.held.get(req.id)
        if held is not None and len(held) >= n:      # the common case: nothing new to register
            return
        shareable = self._shareable(req)
        if private:
            req.chain[3] = max(shareable, n)
        else:
            n = min(n, shareable)
        held = self.held.get(req.id)
        if held is None:
            held = self.held[req.id] = []
        if len(held) >= n:
            return
        ids = self.chains.chain(req, n)
        self._settle()          # blocks allocations have taken are gone: not "cached in another block" any more
        ref = self.ref
        for b in range(len(held), n):
            i = ids[b]
            if i in ref:                     # the same content is cached in another block: this one stays blank
                break
            ref[i] = 1
            held.append(i)

    def free(self, req) -> None:
        if req.blocks:
            # A request with all its tokens will never come back for its private blocks: they are freed blank. (Its
            # output count, not its completion time: the engine frees KV before it stamps the completion.)
            finished = req.generated >= req.output_tokens and not self.caches_finished_tails
            self.register(req, req.cached, private=not finished)
            held = self.held.pop(req.id, ())
            ref = self.ref
            keys = []
            blank = req.blocks - len(held)             # blank tail blocks go first (evicted first)
            if finished and self.cpu_capacity:           # private full blocks still travel to the CPU tier
                for _ in range(req.cached // self.block_size - self._shareable(req)):
                    self._private -= 1
                    self._to_cpu(self._private)
            for i in reversed(held):
                r = ref[i] - 1
                ref[i] = r
                if not r:
                    keys.append(i)
            if keys:
                self.pending_cached = True
                if self.cpu_capacity:                    # every freed cached block is copied to the CPU tier
                    for i in keys:
                        self._to_cpu(i)
            self.free_blocks += blank + len(keys)
            self.pending.append((self.clock, req.id, blank, keys))
        else:
            self.held.pop(req.id, None)
        req.blocks = 0

    def trim(self, req, tokens: int) -> int:
        """Release the blank tail blocks past those `tokens` need (rejected speculative drafts): decode blocks are
        never registered, so they return to the free queue as a blank run, evicted first. (release_tails for one,
        inline: the plain loop trims every verify pass.)"""
        extra = req.blocks + (-tokens // self.block_size)
        if extra <= 0:
            return 0
        if len(self.held.get(req.id, ())) > req.blocks - extra:
            raise RuntimeError(f"trim of {req!r} would release registered prefix blocks")
        self.pending.append((self.clock, req.id, extra, ()))
        self.free_blocks += extra
        req.blocks -= extra
        return extra

    def release_tails(self, freed: int, trims) -> int:
        """trim at several steps' ends at once (sim/engine/specwalk.py): `freed` blocks, `trims()` the trims one by
        one ((time, request, blocks it held then, tokens it kept), in time order), each a blank run queued at its
        time. Pending as one entry: only an identity pending beside them makes their order matter
        (_pending_in_order asks then). The caller keeps the requests' block counts. Returns `freed`."""
        self.pending.append((None, trims, freed, ()))
        self.free_blocks += freed
        return freed

    def _pending_in_order(self) -> list:
        """The pending frees one by one (release_tails's written out), sorted: (time, request id, blank blocks,
        identities) in queue order."""
        bs, registered, out = self.block_size, self.held, []
        for p in self.pending:
            if p[0] is not None:
                out.append(p)
                continue
            for when, req, held, tokens in p[1]():
                extra = held + (-tokens // bs)
                if extra <= 0:
                    continue
                if len(registered.get(req.id, ())) > held - extra:
                    raise RuntimeError(f"trim of {req!r} would release registered prefix blocks")
                out.append((when, req.id, extra, ()))
        out.sort(key=_time_then_request)
        return out

    def blocks_returned_on_free(self, req) -> int:
        """Blocks free(req) would return now: its own, not those other requests still hold."""
        held = self.held.get(req.id, ())
        return req.blocks - sum(1 for i in held if self.ref[i] > 1)

    def swap_in(self, req, tokens: int) -> bool:
        ok = super().swap_in(req, tokens)
        if ok:
            self.held[req.id] = []            # fresh blocks: registered again when freed
        return ok

    # -- reporting ----------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        self._settle()          # evictions the allocations so far imply, however lazily the queue caught up
        q = self.query_blocks
        return {"prefix_hit_rate": (self.hit_blocks + self.cpu_hit_blocks) / q if q else float("nan"),
                "prefix_gpu_hit_tokens": self.hit_blocks * self.block_size,
                "prefix_cpu_hit_tokens": self.cpu_hit_blocks * self.block_size,
                "prefix_evicted_blocks": self.evicted_blocks}
