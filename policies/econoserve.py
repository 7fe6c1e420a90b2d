"""EconoServe (spec econoserve): decoupled PT/GT queues, time-synced GT groups with KV reserved for the padded
predicted length, a reserved KV pool, offload-free preemption, KV pipelining and SLO/KV-aware ordering."""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

import numpy as np

from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy
from policies.length_aware import (RUNNING, SWAPPED, WAITING, decode_step_time_s, prefill_time_s,
                                   target_forward_size)

PT, GT = "pt", "gt"


class Task:
    """EconoServe's bookkeeping for one request (kept in req.meta)."""
    __slots__ = ("role", "pred", "alloc", "deadline", "slo_s", "group", "lender_slot", "region_blocks",
                 "failed", "stops", "first_alloc", "pt_key", "from_reserve")

    def __init__(self, pred, slo_s, deadline):
        self.role = PT
        self.pred = pred              # predicted total output tokens (raw, unpadded)
        self.alloc = 0                # padded predicted tokens still to generate, the GT's KV reservation
        self.deadline = deadline
        self.slo_s = slo_s
        self.group = None             # the admitted group (None while queued or when hosted)
        self.lender_slot = None       # (host, start, length) when hosted in another GT's allocation
        self.region_blocks = 0
        self.failed = False           # hit a KV allocation failure at least once
        self.stops = 0                # offload-free preemptions (under-provisioned, reserve exhausted)
        self.first_alloc = None       # padded predicted output length at the first GT allocation
        self.pt_key = None
        self.from_reserve = 0         # blocks it extended into from the reserved pool (returned when its KV goes)


class Group:
    __slots__ = ("members", "live")

    def __init__(self, members):
        self.members = members
        self.live = len(members)


class EconoServe(Policy):
    """One iteration = Algorithm 1: GT groups on a group completion (+ hosted GTs), then PTs up to the TFS."""

    name = "econoserve"

    @dataclass
    class Config:
        padding: float = 0.15               # predicted RL is padded by this fraction (10/15/20 %: Alpaca/ShareGPT/Book)
        reserved_frac: float = 0.03         # KV headroom GT admission never takes (1.2/3/5 % in §2)
        tfs_tokens: int = 0                 # target forward size; 0 = the cost model's throughput knee
        decouple: bool = True               # separate PT and GT queues (False: PTs wait for KV like GTs' groups)
        synced: bool = True                 # GT groups admitted only when a group completes (or none runs)
        admit_on_any_release: bool = False  # also admit when any GT finishes and frees KV (ambiguity 13)
        ordering: bool = True               # three-level deadline / occupied KV / length order (False: FCFS)
        kvcpipe: bool = True                # lend allocated-but-unwritten KV to shorter GTs
        pipe_buffer_frac: float = 0.15      # b: hosted GT's predicted RL ≤ region − b (15/15/10 %)
        pipe_buffer_base: str = "level"     # b relative to the level's region ('level') or the host's RL ('host')
        pipe_hosted_count: str = "figure"   # hosted GTs per host at level k: 2^(k-1) ('figure') or 2^k ('text')
        pipe_max_depth: int = 4             # levels of KV pipelining (halves of a host's allocation) tried at most
        gt_queue_cap_frac: float = 0.25     # new PTs wait while queued GTs + partial PTs hold this share of M
        rl_group_granularity: int = 32      # GTs whose padded predicted RL round to the same multiple form a group
        slo_scale: float = 2.0              # JCT SLO = slo_scale · (t_p + t_g · predicted RL) for ordering
        deadline_mode: str = "slack"        # deadline bucket on the remaining time (deadline − now, §2.7 ordering by
                                            # deadline) or on the fixed SLO length ('static', the old reading)
        deadline_edges_s: tuple = (0.2, 0.5, 2.0)   # the paper's deadline ranges (variant econoserve-wide-deadlines:
                                                    # three more edges, for SLOs of many seconds)
        len_bucket: int = 128               # ordering: predicted lengths compared in buckets of this many tokens
        occ_bucket: int = 128               # ordering: occupied KV compared in buckets of this many tokens
        repredict: str = "noisy_remaining"  # L_new after a stop: predictor noise on the true remaining length | padding
        repredict_mu: float = -0.191        # log-normal noise of the re-prediction: mu (ShareGPT calibration)
        repredict_sigma: float = 0.218      # and sigma
        seed: int = 0                       # seed of the re-prediction noise

        def validate(self, where="policy"):
            if self.pipe_buffer_base not in ("level", "host"):
                raise UserError(f"{where}.pipe_buffer_base: {self.pipe_buffer_base!r}; allowed: level, host")
            if self.pipe_hosted_count not in ("figure", "text"):
                raise UserError(f"{where}.pipe_hosted_count: {self.pipe_hosted_count!r}; allowed: figure, text")
            if self.deadline_mode not in ("slack", "static"):
                raise UserError(f"{where}.deadline_mode: {self.deadline_mode!r}; allowed: slack, static")
            if self.repredict not in ("noisy_remaining", "padding"):
                raise UserError(f"{where}.repredict: {self.repredict!r}; allowed: noisy_remaining, padding")
            for k in ("padding", "reserved_frac", "pipe_buffer_frac"):
                if not 0 <= getattr(self, k) < 1:
                    raise UserError(f"{where}.{k}: must be in [0, 1), got {getattr(self, k)}")
            if self.rl_group_granularity < 1:
                raise UserError(f"{where}.rl_group_granularity: must be >= 1")
            for k in ("len_bucket", "occ_bucket"):      # bucket widths in tokens: divisors
                if getattr(self, k) < 1:
                    raise UserError(f"{where}.{k}: must be an integer >= 1 (tokens), got {getattr(self, k)}")
            if self.seed < 0:
                raise UserError(f"{where}.seed: must be an integer >= 0, got {self.seed}")

    # -- setup ------------------------------------------------------------------------------------------------
    def bind(self, view):
        c = self.config
        self.mem = view.memory
        self.ledger = view.memory.lending_ledger()   # KV lending lives with the KV manager (sim/kv/lending.py)
        self.tfs = c.tfs_tokens or target_forward_size(view.costmodel)
        self.t_g = decode_step_time_s(view.costmodel)
        self.cm = view.costmodel
        self.reserve_blocks = int(c.reserved_frac * self.mem.total_blocks)
        self.reserve_used = 0             # reserve blocks under-provisioned GTs extended into
        self.rng = np.random.default_rng(c.seed)
        self.pt_heap: list = []
        self.partial: list = []           # PTs with part of the prompt prefilled (hold KV, served first)
        self.q_g: list = []               # GTs waiting for admission (KV of prompt resident, or swapped)
        self.active: list = []            # admitted GTs (group members and hosted)
        self._defer: list = []
        self.trigger = True
        self.stats = dict(gt_admissions=0, groups=0, group_sizes=[], hosted=0, hosted_done=0, hosted_preempted=0,
                          reserve_extensions=0, offload_free_stops=0, safety_evictions=0, lent_blocks=0,
                          host_reclaims=0, reserve_blocks_used_max=0, queue_group_sizes=[], pipe_slots=0,
                          pipe_no_candidate=0)
        self.now = 0.0

    # -- ordering ---------------------------------------------------------------------------------------------
    def _bucket(self, x, edges):
        return bisect.bisect_left(edges, x)

    def _key(self, r, length):
        t = r.meta
        if not self.config.ordering:
            return (r.arrival_s, r.id)
        c = self.config
        due = t.slo_s if c.deadline_mode == "static" else t.deadline - self.now
        return (self._bucket(due, c.deadline_edges_s), -(r.cached // c.occ_bucket),
                -(length // c.len_bucket), r.arrival_s, r.id)

    def _padded(self, tokens):
        return max(1, math.ceil(tokens * (1.0 + self.config.padding)))

    def _new_arrivals(self, view):
        # Arrivals since the last step sit at the right end of view.waiting (this policy re-queues evicted
        # requests at the right end too, before later arrivals), so scan from the right until a known one.
        for r in reversed(view.waiting):
            if r.meta is not None:
                break
            pred = r.predicted_output_tokens
            slo = self.config.slo_scale * (prefill_time_s(self.cm, r.prompt_tokens) + self.t_g * self._padded(pred))
            r.meta = Task(pred, slo, r.arrival_s + slo)
            self._push_pt(r)

    def _push_pt(self, r):
        r.meta.role = PT
        r.meta.pt_key = self._key(r, r.input_tokens)
        heapq.heappush(self.pt_heap, (r.meta.pt_key, r.id, r))

    # -- GT lifecycle -----------------------------------------------------------------------------------------
    def _alive(self, r):
        return r.state == RUNNING

    def _to_queue(self, r, alloc):
        t = r.meta
        alloc = min(alloc, self.mem.capacity_tokens - r.cached)   # a prediction beyond M could never be admitted
        t.role, t.alloc, t.group, t.lender_slot = GT, max(1, alloc), None, None
        if t.first_alloc is None:
            t.first_alloc = alloc + r.generated
        self.q_g.append(r)

    def _leave_group(self, r):
        g = r.meta.group
        if g is not None:
            r.meta.group = None
            g.live -= 1
            if g.live == 0:
                self.trigger = True

    def _stop(self, view, r, reason):
        """Offload-free preemption: the GT stops, keeps its KV on the GPU, and re-queues with a new prediction."""
        t = r.meta
        t.failed = True
        t.stops += 1
        self.active.remove(r)
        self._leave_group(r)
        remaining_true = r.output_tokens - r.generated
        c = self.config
        if c.repredict == "noisy_remaining":
            new = self._padded(remaining_true * math.exp(self.rng.normal(c.repredict_mu, c.repredict_sigma)))
        else:
            new = max(self.mem.block_size, math.ceil(c.padding * t.alloc))
        self.stats[reason] += 1
        self._to_queue(r, new)

    def _preempt_hosted(self, view, r):
        """A hosted GT that must give its region back is swapped to CPU (copy-on-write in the paper)."""
        t = r.meta
        t.failed = True
        self.active.remove(r)
        self.ledger.settle(r, self._alive)
        self._return_reserve(r)
        view.preempt(r, mode="swap", front=False)
        r.sched_stamp = view.iteration
        self.stats["hosted_preempted"] += 1
        remaining_true = r.output_tokens - r.generated
        c = self.config
        new = self._padded(remaining_true * math.exp(self.rng.normal(c.repredict_mu, c.repredict_sigma)))
        if r.state == WAITING:                     # no swap space: the engine recomputes it as a PT
            self._push_pt(r)
        else:
            self._to_queue(r, new)

    def _grow(self, view, r) -> bool:
        """Make room for the token `r` writes this step; False if it stopped or was preempted instead."""
        need = r.cached + 1
        if self.mem.blocks_for(need) <= r.blocks:
            return True
        t = r.meta
        if t.lender_slot is not None:              # hosted GT ran past its borrowed region
            self._preempt_hosted(view, r)
            return False
        loans = self.ledger.outstanding(r)
        while loans and self.mem.blocks_for(need) > r.blocks:   # the lender takes its space back
            self.stats["host_reclaims"] += 1
            self._preempt_hosted(view, loans[-1].borrower)
            loans = self.ledger.outstanding(r)
        if self.mem.blocks_for(need) <= r.blocks:
            return True
        extra = self.mem.blocks_for(need) - r.blocks
        if extra <= self.reserve_blocks - self.reserve_used and view.reserve(r, need):
            # under-provisioned: extend from the reserved pool only (the paper's reserve), never other free KV
            self.reserve_used += extra
            t.from_reserve += extra
            self.stats["reserve_extensions"] += 1     # absorbed by the reserve: not an allocation failure
            self.stats["reserve_blocks_used_max"] = max(self.stats["reserve_blocks_used_max"], self.reserve_used)
            return True
        self._stop(view, r, "offload_free_stops")
        return False

    def _return_reserve(self, r):
        """`r`'s KV is leaving the GPU: the reserve blocks it extended into are the reserve's again."""
        self.reserve_used -= r.meta.from_reserve
        r.meta.from_reserve = 0

    def _demand_blocks(self, r):
        return max(0, self.mem.blocks_for(r.cached + r.meta.alloc) - r.blocks)

    def _admit_gt(self, view, r) -> bool:
        target = r.cached + r.meta.alloc
        if r.state == SWAPPED:
            if not view.swap_in(r, target):
                return False
        elif not view.reserve(r, target):
            return False
        self.q_g.remove(r)
        self.active.append(r)
        self.stats["gt_admissions"] += 1
        return True

    def _admit_groups(self, view, stamp):
        """Alg. 1 ①: whole groups (split if needed) in priority order until free-for-GT KV is allocated."""
        c = self.config
        gran = c.rl_group_granularity
        groups: dict = {}
        for r in self.q_g:
            if r.sched_stamp == stamp:
                continue
            groups.setdefault(-(-r.meta.alloc // gran), []).append(r)
        if not groups:
            return []
        # the paper's Fig. 2 measure (SyncCoupled groups): same-RL groups among every request waiting now, queued
        # GTs and prompts not yet run alike (mechanism counter beside the groups admitted below)
        pending: dict = {}
        for r in self.q_g:
            pending[-(-r.meta.alloc // gran)] = pending.get(-(-r.meta.alloc // gran), 0) + 1
        for _, _, r in self.pt_heap:
            if r.state == WAITING and r.meta.role == PT:
                k = -(-self._padded(r.meta.pred) // gran)
                pending[k] = pending.get(k, 0) + 1
        self.stats["queue_group_sizes"].extend(pending.values())
        ordered = []
        for members in groups.values():
            members.sort(key=lambda r: self._key(r, r.meta.alloc))
            ordered.append((self._key(members[0], members[0].meta.alloc), members))
        ordered.sort(key=lambda x: x[0])
        free_for_gt = self.mem.free_blocks - (self.reserve_blocks - self.reserve_used)
        if not self.active and not any(r.on_gpu and r.cached < r.input_tokens for r in view.running):
            free_for_gt = self.mem.free_blocks     # nothing else can release KV: the reserve may be used
        admitted = []
        while ordered and free_for_gt > 0:
            demands = sorted((sum(self._demand_blocks(r) for r in m), i) for i, (_, m) in enumerate(ordered))
            _, members = ordered[0]
            need = sum(self._demand_blocks(r) for r in members)
            if need > free_for_gt:                 # binary search for the group that best fills what is left
                j = bisect.bisect_right(demands, (free_for_gt, len(ordered))) - 1
                if j >= 0:
                    members = ordered[demands[j][1]][1]
            pick = []
            left = free_for_gt
            for r in members:                      # admits the whole group, or splits the head group to fit
                d = self._demand_blocks(r)
                if d <= left:
                    pick.append(r)
                    left -= d
            if not pick:
                break
            ordered = [(k, m) for k, m in ordered if m is not members] + \
                      ([(self._key(members[0], members[0].meta.alloc), [r for r in members if r not in pick])]
                       if len(pick) < len(members) else [])
            ordered.sort(key=lambda x: x[0])
            got = [r for r in pick if self._admit_gt(view, r)]
            if not got:
                break
            free_for_gt = self.mem.free_blocks - (self.reserve_blocks - self.reserve_used)
            grp = Group(got)
            for r in got:
                r.meta.group = grp
            self.stats["groups"] += 1
            self.stats["group_sizes"].append(len(got))
            admitted.append(grp)
        return admitted

    def _pipeline(self, view, hosts, stamp):
        """Alg. 1 ②: recursively place shorter queued GTs in the second halves of the hosts' allocations."""
        c, bs = self.config, self.mem.block_size
        cands = sorted((r for r in self.q_g if r.state == RUNNING and r.sched_stamp != stamp),
                       key=lambda r: r.meta.alloc)
        allocs = [r.meta.alloc for r in cands]
        for host in hosts:
            l_blocks = self.mem.blocks_for(host.meta.alloc)
            slots = [(0, l_blocks, host)]          # occupied regions, in blocks from the start of host's allocation
            for k in range(1, c.pipe_max_depth + 1):
                region = l_blocks >> k
                if region <= 0:
                    break
                base = region if c.pipe_buffer_base == "level" else l_blocks
                target = region * bs - int(c.pipe_buffer_frac * base * bs)
                if target < 1:
                    break
                count = 2 ** (k - 1) if c.pipe_hosted_count == "figure" else 2 ** k
                for j in range(min(count, 2 ** (k - 1))):
                    start = (2 * j + 1) * region
                    i = bisect.bisect_right(allocs, target) - 1
                    self.stats["pipe_slots"] += 1         # a region offered for lending
                    if i < 0:                              # no queued GT short enough to finish inside it
                        self.stats["pipe_no_candidate"] += 1
                        break
                    lender = min((s for s in slots if s[0] <= start - region < s[0] + s[1]
                                  and s[0] + s[1] >= start + region), key=lambda s: s[1])[2]
                    guest = cands[i]
                    if not self.ledger.lend(lender, guest, region):
                        continue
                    cands.pop(i)
                    allocs.pop(i)
                    self.q_g.remove(guest)
                    guest.meta.lender_slot = (host, start, region)
                    guest.meta.region_blocks = region
                    self.active.append(guest)
                    slots.append((start, region, guest))
                    self.stats["hosted"] += 1
                    self.stats["lent_blocks"] += region

    # -- Algorithm 1 ------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        c = self.config
        stamp = view.iteration
        self.now = view.now
        self._new_arrivals(view)
        if c.deadline_mode == "slack" and c.ordering and self.pt_heap:   # remaining time moves requests between
            self.pt_heap = [(self._key(r, r.input_tokens), i, r) for _, i, r in self.pt_heap]   # deadline ranges
            for k, _, r in self.pt_heap:
                r.meta.pt_key = k
            heapq.heapify(self.pt_heap)
        batch = Batch()
        for r in list(self.active):                # GTs already running: one token each
            if r.state == RUNNING and r.sched_stamp != stamp and self._grow(view, r):
                r.sched_stamp = stamp
                batch.add(r, 1, False)
        if self.trigger or not c.synced or not self.active:
            self.trigger = False
            hosts = self._admit_groups(view, stamp)
            if c.kvcpipe:
                self._pipeline(view, [r for g in hosts for r in g.members], stamp)
            for r in self.active:
                if r.sched_stamp != stamp and r.state == RUNNING and self._grow(view, r):
                    r.sched_stamp = stamp
                    batch.add(r, 1, False)
        self._fill_prompts(view, batch, stamp)
        if not batch.reqs:
            self._unblock(view, stamp)
        return batch

    def _fill_prompts(self, view, batch, stamp):
        """Alg. 1 ③: PTs (partially prefilled first, then in order) up to the target forward size."""
        budget = self.tfs - batch.num_tokens
        still = []
        for r in sorted(self.partial, key=lambda r: r.meta.pt_key):
            if r.state != RUNNING or r.cached >= r.input_tokens:
                continue
            chunk = min(r.input_tokens - r.cached, budget)
            if chunk > 0 and r.sched_stamp != stamp and view.reserve(r, r.cached + chunk):
                r.sched_stamp = stamp
                batch.add(r, chunk, True)
                budget -= chunk
            still.append(r)
        self.partial = still
        heap = self.pt_heap
        # Prompts admitted now become GTs that wait for generation KV while holding their prompt KV; capping that
        # backlog keeps the GT queue admissible (the paper's reserve replenishment is unspecified, ambiguity 10).
        backlog = sum(r.blocks for r in self.q_g) + sum(r.blocks for r in self.partial)
        cap = self.config.gt_queue_cap_frac * self.mem.total_blocks
        while budget > 0 and heap and backlog < cap:
            _, _, r = heap[0]
            if r.state != WAITING or r.meta.role != PT or r.sched_stamp == stamp:
                heapq.heappop(heap)
                if r.state == WAITING and r.sched_stamp == stamp:   # preempted this step: retry next step
                    self._defer.append(r)
                continue
            chunk = min(r.input_tokens - r.cached, budget)
            if not view.admit(r, r.cached + chunk):
                break
            heapq.heappop(heap)
            r.sched_stamp = stamp
            batch.add(r, chunk, True)
            budget -= chunk
            backlog += r.blocks
            if r.cached + chunk < r.input_tokens:
                self.partial.append(r)
        for r in self._defer:
            heapq.heappush(heap, (r.meta.pt_key, r.id, r))
        self._defer = []

    def _unblock(self, view, stamp):
        """Liveness valve (not in the paper): if nothing can run because queued GTs' and partial PTs' KV fills
        the memory, recompute-evict the lowest-priority holder so the head of the queues can proceed."""
        holders = [r for r in view.running if r not in self.active and r.sched_stamp != stamp]
        if not holders:
            return
        victim = max(holders, key=lambda r: self._key(r, r.meta.alloc if r.meta.role == GT else r.input_tokens))
        if victim in self.q_g:
            self.q_g.remove(victim)
        if victim in self.partial:
            self.partial.remove(victim)
        victim.meta.failed = True
        self._return_reserve(victim)
        view.preempt(victim, mode="recompute", front=False)
        victim.sched_stamp = stamp
        self.stats["safety_evictions"] += 1
        self._push_pt(victim)

    def on_commit(self, view, batch, batch_time_s):
        for r in batch.reqs:
            t = r.meta
            if r.completion_s is not None:         # finished: return loans, leave its group
                if r in self.active:
                    self.active.remove(r)
                if t.lender_slot is not None:
                    self.stats["hosted_done"] += 1
                self.ledger.settle(r, self._alive)
                self._return_reserve(r)
                self._leave_group(r)
                if self.config.admit_on_any_release:
                    self.trigger = True
            elif t.role == PT and r.cached >= r.input_tokens:   # prompt done: the request becomes a GT
                self._to_queue(r, self._padded(t.pred) - r.generated)


_V = "EconoServe"
register_policy("econoserve", EconoServe, f"{_V}: decoupled PT/GT queues, synced GT groups, padded exact KV "
                "allocation with reserve, offload-free preemption, KV pipelining, SLO/KV-aware ordering")
register_policy("econoserve-sdo", EconoServe, f"{_V}-SDO: no KV pipelining", kvcpipe=False)
register_policy("econoserve-sd", EconoServe, f"{_V}-SD (SyncDecoupled): no ordering (FCFS), no pipelining",
                kvcpipe=False, ordering=False)
register_policy("econoserve-d", EconoServe, f"{_V}-D (UnsyncDecoupled): GTs admitted every iteration, FCFS, "
                "no pipelining", kvcpipe=False, ordering=False, synced=False)
register_policy("econoserve-unsynced", EconoServe, f"{_V} with GT groups admitted every iteration (synced admission "
                "ablated alone; ordering and pipelining kept)", synced=False)
register_policy("econoserve-wide-deadlines", EconoServe, f"{_V} with deadline ranges extended past the paper's 2 s "
                "(0.2/0.5/2/8/32/128 s): a variant, not the paper's ordering",
                deadline_edges_s=(0.2, 0.5, 2.0, 8.0, 32.0, 128.0))
