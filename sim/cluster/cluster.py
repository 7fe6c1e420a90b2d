"""A cluster: replicas on one simulated clock behind a router, or disaggregated prefill and decode pools.

Each replica is a full Simulation (its own policy, KV manager, cost model; GPUs and models may differ) whose loop
runs as a generator (Simulation.start_in_cluster). The driver below interleaves them in time order:
- arrivals are routed in time order, all of one instant before anything at that instant commits; a replica may
  commit an iteration ending at e only once every arrival up to e is routed, so it receives exactly the requests
  a single-replica run on its share would, at the same times (round-robin clusters reproduce single runs exactly);
- with disaggregation, replicas also affect each other: a prefill that completes hands its request to a decode
  replica, which reserves KV for it when it has room (the prefill replica keeps the KV until the transfer ends:
  back-pressure), the transfer runs over the link, and the request joins the decode replica's queue with its KV
  in place. There every replica advances one iteration at a time, earliest first, so these events happen in
  time order; the exact fast paths stay off in disaggregated pools.
The cluster's request table merges each request's life; sim/cluster/results.py builds the tables."""
from __future__ import annotations

import bisect
import copy
import heapq
import math
import os
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from costmodels.errors import UserError
from sim.cluster.book import REQUESTS, TOKENS, LedgerBook
from sim.cluster.clock import ReplicaClock
from sim.cluster.decompose import Decomposed, parse_workers, worker_count
from sim.cluster.ledger import LedgerError, RouterLedger
from sim.cluster.links import build_link
from sim.cluster.stream import RequestStream
from sim.cluster.routers import LeastRequests, LeastTokens, build_router, checked_pick
from sim.engine.loop import WAIT, Until
from sim.errors import SimulationStuck
from sim.engine.cohort import FLUSH
from sim.metrics.rowstore import RequestRows
from sim.engine.request import INFEASIBLE, Request
from sim.scenario.build import build_simulation, requests_from_table, scenario_model
from sim.scenario.config import Scenario, scenario_from_dict
from traces import build_workload

SERVE, PREFILL, DECODE = "serve", "prefill", "decode"
REPLICA_SECTIONS = ("model", "hardware", "costmodel", "memory", "policy", "sim")
FIRST_TOKEN = ("decode", "prefill")
# DistServe as EconoServe ran it: one prefill and one decode GPU per pair, KV over 100 Gb/s Ethernet, whole-prompt
# FCFS batches on the prefill side, continuous batching of decodes on the other, the first token streamed by the
# prefill instance. Counts, policies and the link can be overridden next to `preset`.
DISAGG_PRESETS = {"distserve": {"prefill": {"count": 1, "policy": {"name": "vllm"}},
                                "decode": {"count": 1, "policy": {"name": "vllm"}},
                                "link": {"kind": "ethernet-100g"}, "first_token": "prefill", "layerwise": False}}


# -- the cluster section ---------------------------------------------------------------------------------------
@dataclass
class ClusterSpec:
    groups: list                    # (pool, count, overrides)
    router: object = None
    decode_router: object = None
    link: object = None
    layerwise: bool = False
    first_token: str = "decode"
    where: list = field(default_factory=list)   # each group's place in the YAML (cluster.replicas[1], ...)
    autoscale: object = None        # sim/cluster/autoscale.py's AutoscaleSpec: the serving set changes over time
    workers: object = "auto"        # processes that run a decomposed cluster's replicas (sim/cluster/decompose.py)

    @property
    def disaggregated(self) -> bool:
        return any(pool != SERVE for pool, _, _ in self.groups)


# Completed requests a streaming replica finalizes together (sim/engine/cohort.py's FLUSH at most): about 260,000
# over the whole cluster (each held as an object until then, ~1 KB), at least MIN_FLUSH each (smaller batches
# finalize mostly one by one, slower)
MIN_FLUSH = 256

# An idle replica costs about 2 KB (a handle, a ledger; its simulation is built when first needed): more replicas
# than this many bytes each of the machine's memory can never run here.
BYTES_PER_IDLE_REPLICA = 4096


def _count(v, where) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UserError(f"{where}: must be an integer >= 1 (replicas), got {v!r}")
    return v


def _check_fits(groups) -> None:
    total = sum(count for _, count, _ in groups)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):        # not every platform says
        return
    if total * BYTES_PER_IDLE_REPLICA > memory:
        raise UserError(f"cluster: {total:,} replicas cannot fit in this machine's {memory / 2**30:.0f} GiB of "
                        f"memory (at least {BYTES_PER_IDLE_REPLICA} bytes each); at most "
                        f"{memory // BYTES_PER_IDLE_REPLICA:,}")


def _group(g, pool, where):
    """(pool, count, overrides) from an integer count or {count, <scenario sections>...}."""
    if isinstance(g, int) and not isinstance(g, bool):
        return pool, _count(g, where), {}
    if not isinstance(g, dict):
        raise UserError(f"{where}: expected a replica count or a mapping with count and sections, got {g!r}")
    bad = set(g) - {"count", *REPLICA_SECTIONS}
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: count, "
                        f"{', '.join(REPLICA_SECTIONS)}")
    for sec in REPLICA_SECTIONS:
        if sec in g and not isinstance(g[sec], dict):
            raise UserError(f"{where}.{sec}: expected a mapping")
    return pool, _count(g.get("count", 1), f"{where}.count"), {k: v for k, v in g.items() if k != "count"}


def parse_cluster(raw: dict) -> ClusterSpec:
    where = "cluster"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping")
    bad = set(raw) - {"replicas", "router", "disaggregation", "autoscale", "workers"}
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: replicas, router, "
                        "disaggregation, autoscale, workers")
    workers = parse_workers(raw.get("workers"), f"{where}.workers")
    if raw.get("autoscale") is not None and raw.get("disaggregation") is not None:
        raise UserError(f"{where}.autoscale: scales a co-located pool; not with disaggregation")
    dis = raw.get("disaggregation")
    if dis is not None:
        if "replicas" in raw:
            raise UserError(f"{where}: give replicas or disaggregation (prefill and decode pools), not both")
        if not isinstance(dis, dict):
            raise UserError(f"{where}.disaggregation: expected a mapping")
        if "preset" in dis:
            name = dis["preset"]
            if name not in DISAGG_PRESETS:
                raise UserError(f"{where}.disaggregation.preset: unknown preset {name!r}; allowed: "
                                f"{', '.join(DISAGG_PRESETS)}")
            base = copy.deepcopy(DISAGG_PRESETS[name])
            for k, v in dis.items():
                if k in (PREFILL, DECODE) and isinstance(v, int) and not isinstance(v, bool):
                    base[k]["count"] = v             # a count keeps the preset's pool settings
                elif k in (PREFILL, DECODE) and isinstance(v, dict):
                    base[k] = {**base[k], **v}
                elif k != "preset":
                    base[k] = v
            dis = base
        bad = set(dis) - {"prefill", "decode", "link", "layerwise", "first_token", "decode_router"}
        if bad:
            raise UserError(f"{where}.disaggregation: unknown key(s) {', '.join(sorted(bad))}; allowed: prefill, "
                            "decode, link, layerwise, first_token, decode_router")
        for pool in (PREFILL, DECODE):
            if pool not in dis:
                raise UserError(f"{where}.disaggregation.{pool}: missing (a count or a mapping with count)")
        groups = [_group(dis[p], p, f"{where}.disaggregation.{p}") for p in (PREFILL, DECODE)]
        _check_fits(groups)
        first = dis.get("first_token", "decode")
        if first not in FIRST_TOKEN:
            raise UserError(f"{where}.disaggregation.first_token: {first!r} is not allowed; allowed: "
                            f"{', '.join(FIRST_TOKEN)}")
        layerwise = dis.get("layerwise", False)
        if not isinstance(layerwise, bool):
            raise UserError(f"{where}.disaggregation.layerwise: expected true or false, got {layerwise!r}")
        return ClusterSpec(groups, raw.get("router"), dis.get("decode_router"),
                           build_link(dis.get("link"), f"{where}.disaggregation.link"), layerwise, first,
                           [f"{where}.disaggregation.{p}" for p in (PREFILL, DECODE)], workers=workers)
    reps = raw.get("replicas", 1)
    if isinstance(reps, list):
        if not reps:
            raise UserError(f"{where}.replicas: an empty list has no replicas; give a count >= 1 or groups")
        wheres = [f"{where}.replicas[{i}]" for i in range(len(reps))]
        groups = [_group(g, SERVE, w) for g, w in zip(reps, wheres)]
    else:
        wheres = [f"{where}.replicas"]
        groups = [_group(reps, SERVE, wheres[0])]
    _check_fits(groups)
    scale = None
    if raw.get("autoscale") is not None:
        from sim.cluster.autoscale import parse_autoscale
        scale = parse_autoscale(raw["autoscale"], sum(count for _, count, _ in groups))
    return ClusterSpec(groups, raw.get("router"), where=wheres, autoscale=scale, workers=workers)


def in_group(message: str, where: str, overrides: dict) -> str:
    """An error about a field a replica group sets names the group's field (cluster.replicas[1].hardware.gpu), not
    the scenario's (hardware.gpu), which may be fine."""
    if not where:
        return message
    for sec, over in overrides.items():
        for key in [*over, ""] if isinstance(over, dict) else [""]:
            field_ = f"{sec}.{key}" if key else sec
            if message.startswith(field_ + ":") or message.startswith(field_ + "."):
                return f"{where}.{message}"
    return message


def replica_scenario(scn: Scenario, overrides: dict) -> Scenario:
    """The scenario one replica runs: the cluster scenario's sections with the group's overrides (a policy or a
    cost model naming another `name`/`kind` replaces the section; other sections merge key by key)."""
    raw = scn.to_dict()
    raw.pop("cluster", None)
    for sec, over in overrides.items():
        replace = (sec == "policy" and "name" in over) or (sec == "costmodel" and "kind" in over)
        raw[sec] = dict(over) if replace else {**(raw.get(sec) or {}), **over}
    return scenario_from_dict(raw, source=scn.source or "cluster")


# -- replicas as the router sees them ----------------------------------------------------------------------------
class ReplicaGroup:
    """Replicas built from one scenario: what every one of them has before it runs (KV capacity, block size, the
    cost model's description, an idle replica's tables), from one prototype simulation built once."""

    def __init__(self, pool: str, scn: Scenario):
        self.pool, self.scn = pool, scn
        proto = build_simulation(scn, requests=[])
        self.capacity_tokens = proto.memory.capacity_tokens
        self.block_size = proto.memory.block_size
        self.costmodel_text = proto.costmodel.describe() if hasattr(proto.costmodel, "describe") else ""
        self.overheads = getattr(proto.costmodel, "overheads", None)
        self._idle = None
        self._proto = proto

    def take_prototype(self):
        """The prototype simulation for the first replica built (it was built exactly as a replica's), then None."""
        proto, self._proto = self._proto, None
        return proto

    def idle_result(self):
        """The tables of a replica that never received a request (computed once per group)."""
        if self._idle is None:
            self._idle = build_simulation(self.scn, requests=[]).result()
        return self._idle


class ReplicaHandle:
    """One replica: its simulation, its clock, and the counters a router keeps.

    The simulation is built when the replica is first needed (a request routed there, a hand-off): until then a
    replica is idle and costs a handle and a ledger, and a router reads it as empty (nothing queued or running,
    no KV in use, no prefix cached), which is what the built replica would report."""

    def __init__(self, index: int, pool: str, scn: Scenario, group, driver):
        self.index, self.pool, self.scn, self.group, self.driver = index, pool, scn, group, driver
        self._sim = None
        self.clock = None
        self.gpus = scn.hardware.tp
        self.gen = None
        self.result = None              # its SimResult, when it ran on its own
        self.state = "new"              # new (idle since 0, not started) | run | wait | done
        self.ledger = RouterLedger()    # what this replica's router sent here and saw leave
        self.pending: deque = deque()   # disaggregated decode: handoffs waiting for KV room here
        self.version = 0                # of its latest heap entry (earlier ones lapse)
        self.asleep = False             # yielded Until: resumed then, or at once when the router sends it one
        self.link_free = 0.0            # disaggregated prefill: when its outgoing link is next free

    @property
    def built(self) -> bool:
        return self._sim is not None

    @property
    def sim(self):
        if self._sim is None:
            self.driver.build(self)
        return self._sim

    # what routers read
    @property
    def routed(self) -> int:
        return self.ledger.routed

    @property
    def routed_tokens(self) -> int:
        return self.ledger.routed_tokens

    @property
    def completed(self) -> int:
        return self.ledger.completed

    @property
    def outstanding_requests(self) -> int:
        self.ledger.settle(self.driver.read_time)    # as the router knows it at its decision's time
        return self.ledger.outstanding_requests

    @property
    def outstanding_tokens(self) -> int:
        self.ledger.settle(self.driver.read_time)
        return self.ledger.outstanding_tokens

    @property
    def queued(self) -> int:
        if self._sim is None:
            return 0
        v = self._sim.view
        return len(v.waiting) + len(v.swapped) + len(self._sim.requests) - self.clock.arrived + len(self.pending)

    @property
    def running(self) -> int:
        return len(self._sim.view.running) if self._sim is not None else 0

    @property
    def kv_usage(self) -> float:
        if self._sim is None:
            return 0.0
        m = self._sim.memory
        return 1.0 - m.free_blocks / m.total_blocks

    @property
    def kv_blocks_in_use(self) -> int:
        if self._sim is None:
            return 0
        m = self._sim.memory
        return m.total_blocks - m.free_blocks

    @property
    def block_size(self) -> int:
        return self.group.block_size

    @property
    def capacity_tokens(self) -> int:
        return self.group.capacity_tokens

    @property
    def queued_prompt_tokens(self) -> int:
        if self._sim is None:
            return 0
        sim = self._sim
        waiting = sum(r.input_tokens - r.cached for r in sim.view.waiting)
        return waiting + sum(r.prompt_tokens for r in sim.requests[self.clock.arrived:])

    def has_adapter(self, adapter: int) -> bool:
        """Multi-LoRA: is this adapter in one of the replica's GPU slots (a request on it loads nothing)?"""
        lora = getattr(self._sim, "lora", None) if self._sim is not None else None
        return lora is not None and adapter in lora.slots

    def cached_prefix_tokens(self, req) -> int:
        if self._sim is None:
            return 0
        peek = getattr(self._sim.memory, "cached_prefix_tokens", None)
        return peek(req) if peek is not None else 0

    def __repr__(self):
        return f"replica {self.index} ({self.pool}, {self.scn.hardware.gpu} x{self.gpus})"


@dataclass
class Handoff:
    """A request moving from a prefill replica to a decode replica."""
    origin: Request
    prefill: Request
    src: ReplicaHandle
    dst: ReplicaHandle
    done_s: float                   # prefill completed (its KV ready)
    reserved_s: float = math.nan    # decode-side KV reserved: the transfer may start
    sent_s: float = math.nan        # transfer started (the link was free)
    arrived_s: float = math.nan     # transfer ended: the request is in the decode replica's queue
    decode: Request = None
    infeasible: str = ""


@dataclass
class ClusterRun:
    replicas: list
    handoffs: dict = field(default_factory=dict)     # request id → Handoff
    origin: list = field(default_factory=list)       # the workload's requests, in arrival order
    spec: ClusterSpec = None
    scaler: object = None                            # the Autoscaler, when the pool scales
    sessions: dict = None                            # closed-loop sessions: turns released, their pauses, abandoned


# -- the driver ------------------------------------------------------------------------------------------------
class Cluster:
    def __init__(self, scn: Scenario, requests=None):
        self.scn = scn
        self.spec = parse_cluster(scn.cluster)
        rng = np.random.default_rng(scn.seed)
        table = build_workload(scn.workload, rng) if requests is None else None
        # Closed-loop sessions: a turn is routed when the one before it completes plus its pause (wherever that ran)
        self.sessions = (bool((table["after"] >= 0).any()) if table is not None and "after" in table.columns
                         else requests is not None and any(r.after is not None for r in requests))
        self.replicas: list = []
        self.groups: list = []
        for k, (pool, count, overrides) in enumerate(self.spec.groups):
            try:
                group = ReplicaGroup(pool, replica_scenario(scn, overrides))
            except UserError as e:
                raise UserError(in_group(str(e), self.spec.where[k] if k < len(self.spec.where) else "", overrides)) \
                    from None
            self.groups.append(group)
            for _ in range(count):
                self.replicas.append(ReplicaHandle(len(self.replicas), pool, group.scn, group, self))
        # A serve pool whose replicas keep no per-request history (token times, prefix bindings) streams: requests
        # are made as the router reaches them and finished ones leave as table rows (sim/cluster/stream.py,
        # sim/metrics/rowstore.py), so memory follows the requests in flight, not the run's length.
        self.stream = (table is not None and not self.spec.disaggregated and RequestStream.fits(table)
                       and not self.sessions and not scn.lora
                       and not any(g._proto.keep_token_times or hasattr(g._proto.memory, "bind_requests")
                                   for g in self.groups))
        if self.stream:
            self.requests = RequestStream(table)
        else:
            if requests is None:
                requests = requests_from_table(table)
            self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        del table
        self.pd = self.spec.disaggregated
        if scn.lora and self.pd:
            raise UserError("lora: a disaggregated cluster does not run adapters (its hand-offs carry no adapter); "
                            "use a serve pool (cluster.replicas) or remove the lora section")
        if scn.lora:                    # adapters drawn over the whole workload, as one replica draws them
            from sim.engine.lora import assign_adapters, lora_config
            cfg = lora_config(scn.lora)
            assign_adapters(cfg, scn.seed if cfg.seed is None else cfg.seed, self.requests)
        # With sessions every replica advances one iteration at a time, earliest first, as with disaggregation: a
        # completion on one replica releases a turn the router may send to any other, which must not have run past
        # it (the exact fast paths are off there).
        self.lockstep = self.pd or self.sessions
        self.timers: list = []          # sessions: (time, created, sequence, turn) released and not yet routed
        self.turns_left = 0             # sessions: later turns neither routed nor abandoned
        self.session_stats = {"released": 0, "think_s": 0.0, "abandoned": 0}
        if self.sessions:
            if self.pd:
                raise UserError("workload: closed-loop sessions run on a serve pool; a disaggregated cluster does not "
                                "run them (set closed_loop: false)")
            for r in self.requests:
                r.followers = None
            for r in self.requests:
                if r.after is not None:
                    r.after.followers = (r.after.followers or []) + [r]
                    self.turns_left += 1
            self.turns = self.requests        # every turn: the prefix caches bind to all (a later one repeats answers)
            self.requests = [r for r in self.requests if r.after is None]
        self.front = [h for h in self.replicas if h.pool != DECODE]    # where arrivals go
        self.decode = [h for h in self.replicas if h.pool == DECODE]
        router_rng, decode_rng = (np.random.default_rng([scn.seed, k]) for k in (1, 2))
        self.router = build_router(self.spec.router, router_rng, "cluster.router")
        self.decode_router = build_router(self.spec.decode_router, decode_rng,
                                          "cluster.disaggregation.decode_router") if self.pd else None
        if self.pd:
            self._check_pools()
        self.looping = False            # the interleaved loop runs: a replica built now must also be started
        self.read_time = -math.inf      # when the router decides: ledgers count what left before it
        # Routers that read replica state beyond the ledgers see it exactly as of their decision only if the fast
        # paths stop before it (ArrivalClock.commit_limit); ledger-only routers let replicas run ahead.
        self.scaler = None
        if self.spec.autoscale is not None:
            from sim.cluster.autoscale import Autoscaler
            model = scenario_model(self.groups[0].scn)
            self.scaler = Autoscaler(self.spec.autoscale, self.front,
                                     model.weight_bytes() / self.groups[0].scn.hardware.tp)
        # least_tokens / least_requests in front of a serve pool: the least-loaded replica from a heap, the scan's
        # answer (sim/cluster/book.py); an extension subclassing them keeps its own pick; with autoscaling the
        # routable set changes, so the scan runs over the replicas serving at that moment
        key = {LeastTokens: TOKENS, LeastRequests: REQUESTS}.get(type(self.router))
        self.book = (LedgerBook([h.ledger for h in self.front], key)
                     if key and not self.pd and self.scaler is None else None)
        # A least-loaded router whose knowledge of completions lags (report_interval_s > 0) decides every arrival
        # of one report interval from the same ledger counts (those before the interval's report) plus its own
        # sends, so with the exact fast paths on it places the interval's arrivals together at the first one's
        # time: the same decisions, and the replicas run on to the next interval without stopping at each arrival.
        # Not with sessions, whose turns are released mid-interval (a turn placed at its own time comes before
        # the interval's later arrivals).
        self.batch_interval = (self.book is not None and self.router.config.report_interval_s > 0 and not self.sessions
                               and scn.sim.fast_forward)
        self.cut_at_decisions = self.router.reads_state or bool(self.pd and self.decode_router.reads_state) or \
            bool(self.scaler is not None and self.scaler.reads_state)
        self.runs_ahead = not (self.cut_at_decisions or self.lockstep)
        self.front_live = 0             # front replicas started and not finished (what decode replicas wait on)
        self.pending_total = 0          # hand-offs waiting for decode-side KV, over all decode replicas
        self.heap: list = []
        self.waiting: set = set()
        self.to_wake: list = []
        self.late_wakes = 0             # sleeping replicas a request woke at their step's end, not at once
        self.idx = 0
        self.T = self.requests[0].arrival_s if self.requests else math.inf
        self.timer_seq = 0
        self.handoffs: dict = {}
        self.origin_of: dict = {}

    def build(self, h) -> None:
        """Build replica h's simulation (first needed now) and wire it to the cluster."""
        sim = h.group.take_prototype() or build_simulation(h.scn, requests=[])
        mem = sim.memory
        if hasattr(mem, "bind_requests"):            # answers a later turn repeats, wherever that turn lands
            mem.bind_requests(self.turns if self.sessions else self.requests)
        sim.on_complete = (lambda r, h=h: self._prefill_done(h, r)) if h.pool == PREFILL else \
            (lambda r, h=h: self._done(h, r)) if self.sessions else \
            (lambda r, h=h: h.ledger.finish(r.id, r.completion_s))
        sim.on_drop = lambda r, h=h: self._dropped(h, r)
        if self.lockstep:                            # one iteration at a time, earliest first (module doc)
            sim.fast_forward = None
            sim.exact_fast_paths = False
        if h.pool == PREFILL:
            sim.hold_kv = True
        if self.stream:                              # completions wait for their rows in batches (MIN_FLUSH)
            sim.retire_rows(RequestRows(), max(MIN_FLUSH, min(FLUSH, (1 << 18) // len(self.replicas))))
        h._sim = sim
        h.clock = ReplicaClock(self, h, sim.requests, sim.view.waiting, sim.view)

    def _start(self, h) -> None:
        """Start a built replica's loop: it schedules at 0 as every replica does (idle until its first request;
        a replica started late has simply been idle until now, so its first steps are the same)."""
        h.gen = h.sim.start_in_cluster(h.clock)
        h.clock.start()
        if h.pool != DECODE:
            self.front_live += 1
        self._resume(h)

    def _check_pools(self):
        p, d = self.front[0].group, self.decode[0].group
        mp, md = scenario_model(p.scn), scenario_model(d.scn)
        if (mp.name, mp.layers, mp.hidden, mp.kv_heads, mp.head_dim) != (md.name, md.layers, md.hidden,
                                                                          md.kv_heads, md.head_dim):
            raise UserError(f"cluster.disaggregation: the decode pool serves {md.name} but the prefill pool "
                            f"{mp.name}; a KV cache only moves between replicas of the same model")
        self.kv_bytes_per_token = mp.kv_bytes_per_token(p.scn.memory.kv_dtype)
        self.layers = mp.layers
        if self.requests:
            small = min(r.prompt_tokens + r.output_tokens for r in self.requests)
            for pool in (self.front, self.decode):
                cap = max(g.capacity_tokens for g in {id(h.group): h.group for h in pool}.values())
                if cap < small:
                    raise UserError(f"cluster.disaggregation.{pool[0].pool}: its replicas hold {cap} KV tokens, "
                                    f"less than the smallest request's prompt + output ({small}); no request fits")

    # -- what the replica clocks ask --------------------------------------------------------------------------
    def horizon(self, h) -> float:
        """No event can reach replica h before this time."""
        bound = self.T                            # (decode replicas too: an arrival's prefill ends in a handoff)
        if self.lockstep and self.heap:
            bound = min(bound, self.heap[0][0])
        if self.to_wake:                          # a replica woken by a hand-off has not said when it next acts
            bound = min(bound, min(t for _, t in self.to_wake))
        return bound

    def synced(self, h, e: float) -> bool:
        """May replica h commit an iteration ending at e?"""
        if e >= self.T:
            return False
        if self.lockstep and self.heap and (e, h.index) > self.heap[0][:2]:
            return False
        # A replica a hand-off woke must first say when it next acts (it joins the heap): without this check one
        # busy replica could run on alone while the others' transfers wait forever (a livelock).
        return not self.to_wake

    def final(self, h) -> bool:
        """Will nothing more be sent to h?"""
        if self.turns_left:                       # sessions: a turn still to come may be sent anywhere
            return False
        if h.pool != DECODE:                      # (a prefill holding KV for transfers still gets releases)
            return self.idx >= len(self.requests) and not h.sim.held_kv
        return self.idx >= len(self.requests) and self.front_live == 0 and self.pending_total == 0

    # -- running replicas ---------------------------------------------------------------------------------------
    def _resume(self, h, value=None) -> None:
        try:
            v = h.gen.send(value) if h.state != "new" else next(h.gen)
        except StopIteration:
            self._stopped(h)
            return
        except SimulationStuck as e:              # one line that also says which replica
            raise SimulationStuck(f"{h!r}: {e}") from None
        if v is WAIT:
            h.state = "wait"
            self.waiting.add(h)
        else:
            h.state = "run"
            self._push(h, v)
            h.asleep = type(v) is Until
        if self.pd and h.pool == DECODE and h.pending:
            self._reserve(h, h.sim.view.now)

    def _stopped(self, h) -> None:
        """Replica h's loop returned: it has nothing more to do."""
        h.state = "done"
        if h.pool != DECODE:
            self.front_live -= 1
        self.waiting.discard(h)

    def _push(self, h, t: float) -> None:
        """Resume h at t; an earlier entry of h's in the heap lapses (skipped when popped)."""
        h.version += 1
        heapq.heappush(self.heap, (float(t), h.index, h.version))

    def _woken_at(self, h, t: float) -> float:
        """When to resume a sleeping replica that the router has just sent a request at t. A replica that walked
        its steps (sim/engine/loop.py, _cohort_lookahead) resumes at the end of the walked step the arrival falls
        in, which it must run before it can take the request and would otherwise stop at to wait for the router;
        that end is never later than the first point it would wait at, nor than its first completion, so no
        routing decision before it misses anything it does. One that slept on a bound (_cohort_wake_bound,
        nothing walked) resumes at t and commits its steps up to the arrival then."""
        sim = h._sim
        look = sim._lookahead
        if look is None or sim.max_iterations:
            return t
        ends = look[2][0]
        if not ends:
            return t
        j = bisect.bisect_left(ends, min(h.clock._own(), t))   # (the replica's own float for the arrival)
        e = ends[j] if j < len(ends) else ends[-1]
        self.late_wakes += e > t
        return e

    def _wake(self, h, t: float) -> None:
        if h.state == "new":                      # first needed now (a hand-off to an idle decode replica)
            self._start(h)
        elif h.state == "wait":
            self.waiting.discard(h)
            h.state = "run"
            self._resume(h, t)

    def run(self) -> ClusterRun:
        from sim.engine.loop import _quiet_gc
        if not self.lockstep and self.scaler is None and (self.router.stateless or len(self.front) == 1):
            # Decisions that read no replica state: place every request now and run each replica on its own
            # (the single-replica loop itself: a one-replica cluster costs nothing extra), in worker processes
            # where the pool streams (what a worker sends back: sim/cluster/decompose.py)
            job = Decomposed(self)
            job.run(worker_count(self.spec.workers, len(self.requests), len(job.used())) if self.stream else 1)
            self._check_ledgers()
            return ClusterRun(self.replicas, self.handoffs, self.requests, self.spec)
        if self.T <= 0.0:                        # arrivals at 0 are queued before any replica first schedules
            self._route_instant()
        with _quiet_gc():
            self.looping = True
            for h in self.replicas:
                if h.built and h.state == "new":
                    self._start(h)
            self._loop()
        self._check_ledgers()
        return ClusterRun(self.replicas, self.handoffs, self.requests, self.spec, self.scaler,
                          self.session_stats if self.sessions else None)

    def _check_ledgers(self) -> None:
        """After a run that was not cut short, every request has left every replica it was sent to."""
        for h in self.replicas:
            h.ledger.settle(math.inf)
        if any(h.sim.truncated for h in self.replicas if h.built):
            return
        for h in self.replicas:
            if h.ledger.open:
                rid = next(iter(h.ledger.open))
                raise LedgerError(f"{h!r}: {len(h.ledger.open)} request(s) routed there never left (first: {rid})")

    def _loop(self) -> None:
        heap, replicas = self.heap, self.replicas
        heappop, heappush = heapq.heappop, heapq.heappush
        plain = not self.pd                       # (a decode replica's hand-offs: _resume's last step)
        while True:
            if self.to_wake:
                self._flush_wakes()
            if self.T < math.inf and (not heap or self.T <= heap[0][0]):
                self._route_instant()
                continue
            if heap:
                _, i, version = heappop(heap)
                h = replicas[i]
                if version != h.version:
                    continue
                if not plain or h.state == "new":
                    self._resume(h)
                    continue
                # _resume and _push inlined: one of these per replica step that waits for the router
                try:
                    v = h.gen.send(None)
                except StopIteration:
                    self._stopped(h)
                    continue
                except SimulationStuck as e:
                    raise SimulationStuck(f"{h!r}: {e}") from None
                if v is WAIT:
                    h.state = "wait"
                    self.waiting.add(h)
                else:
                    h.state = "run"
                    h.version = version = h.version + 1
                    heappush(heap, (float(v), i, version))
                    h.asleep = type(v) is Until
                continue
            finished = [h for h in list(self.waiting) if h.clock.final]
            if not finished:
                if self.waiting:
                    raise UserError("cluster stuck: replicas wait for requests that cannot come "
                                    f"({', '.join(map(repr, sorted(self.waiting, key=lambda h: h.index)))})")
                break
            for h in sorted(finished, key=lambda h: h.index):
                self._wake(h, h.sim.view.now)
        for h in replicas:                        # KV still held for transfers that ended after the last step
            if h.built:
                h.clock.release_until(math.inf)

    def _flush_wakes(self) -> None:
        while self.to_wake:
            h, t = self.to_wake.pop(0)
            self._wake(h, t)

    # -- routing -------------------------------------------------------------------------------------------------
    def _route_instant(self) -> None:
        """Route every arrival at the next arrival time, one by one, then let the replicas that got one go on."""
        reqs, t = self.requests, self.T
        if self.pd:
            for h in [h for h in self.waiting if h.pool == PREFILL and h.clock.releases]:
                h.clock.release_until(t)          # idle prefill replicas free KV whose transfer has ended
        woken = []
        self.read_time = read = self.router.reported_at(t)
        batch = self.batch_interval
        front = self.scaler.serving(t) if self.scaler is not None else self.front
        turns = []
        while self.timers and self.timers[0][0] == t:   # sessions: turns released for this instant, in creation order
            turns.append(heapq.heappop(self.timers)[3])
        n = len(reqs)
        r = reqs[self.idx] if self.idx < n else None     # (the stream builds each request once: read it once)
        while r is not None and (r.arrival_s == t or batch and self.router.reported_at(r.arrival_s) == read) or turns:
            if r is not None and (r.arrival_s == t or batch):
                self.idx += 1
            else:
                r = turns.pop(0)
                self.turns_left -= 1
                self.session_stats["released"] += 1
                self.session_stats["think_s"] += r.think_s
            h = front[self.book.least(read) if self.book is not None else
                      checked_pick(self.router, r, front, t, 'cluster.router')]
            if self.pd:
                clone = Request(r.id, r.arrival_s, r.prompt_tokens, 1, cls=r.cls, prefix=r.prefix,
                                predicted_output_tokens=1, slo_ttft_s=r.slo_ttft_s, slo_tbt_s=r.slo_tbt_s)
                self.origin_of[r.id] = r
                target = clone
            else:
                target = r
            h.ledger.send(r.id, r.prompt_tokens if self.pd else r.prompt_tokens + r.output_tokens)
            if not h.sim.add_request(target, r.prompt_tokens + r.output_tokens if self.pd else 0):
                h.ledger.finish(r.id)             # never runs there: the router learns at once (a 400)
                if self.pd:
                    r.state, r.reason = INFEASIBLE, target.reason
                if self.sessions and r.followers:
                    self._abandon(h, r)
            if h.state == "wait" or h.state == "new" and self.looping:
                woken.append(h)
            elif h.asleep:                        # sleeping through steady steps: up after this instant
                h.asleep = False
                self._push(h, self._woken_at(h, r.arrival_s))
            r = reqs[self.idx] if self.idx < n else None
        self._next_T()
        for h in dict.fromkeys(woken):            # once each, in routing order
            self._wake(h, t)
        if self.T == math.inf:
            for h in sorted(self.waiting, key=lambda h: h.index):
                if h.clock.final:
                    self.to_wake.append((h, t))

    def _next_T(self) -> None:
        """The router's next decision: the next arrival, or a session's turn released for its time."""
        reqs = self.requests
        t = reqs[self.idx].arrival_s if self.idx < len(reqs) else math.inf
        self.T = min(t, self.timers[0][0]) if self.timers else t

    # -- sessions ------------------------------------------------------------------------------------------------
    def _done(self, h, r) -> None:
        """A request completed on h: with sessions, each turn after it is released for completion + its pause."""
        h.ledger.finish(r.id, r.completion_s)
        if r.followers:
            c = r.completion_s
            for f in r.followers:
                f.arrival_s = c + f.think_s       # the single replica's timer: the same float add
                heapq.heappush(self.timers, (f.arrival_s, c, self.timer_seq, f))
                self.timer_seq += 1
            self._next_T()

    def _dropped(self, h, r) -> None:
        """A request dropped mid-run as infeasible on h: its load leaves the count; a session ends there."""
        h.ledger.finish(r.id, h._sim.view.now)
        if self.sessions and r.followers:
            self._abandon(h, r)

    def _abandon(self, h, r) -> None:
        """Turn r could not run: the turns after it are never sent; they join h's infeasible requests (as one
        replica marks them), so the tables still hold every turn."""
        stack = list(r.followers)
        sim = h.sim
        while stack:
            f = stack.pop()
            f.state = INFEASIBLE
            f.reason = "an earlier turn of its session could not run (the session ends there)"
            sim.all_requests.append(f)
            sim.infeasible.append(f)
            self.turns_left -= 1
            self.session_stats["abandoned"] += 1
            stack.extend(f.followers or ())
        if self.turns_left == 0 and self.T == math.inf:
            for w in sorted(self.waiting, key=lambda w: w.index):
                self.to_wake.append((w, w.sim.view.now))

    # -- disaggregation ------------------------------------------------------------------------------------------
    def _prefill_done(self, h, r_p) -> None:
        """A prefill replica finished a prompt (its KV stays there): hand the request to a decode replica."""
        h.ledger.finish(r_p.id)
        origin = self.origin_of[r_p.id]
        t = r_p.completion_s
        if self.spec.first_token == "prefill" and origin.output_tokens == 1:   # its only token came from the prefill
            from sim.metrics import finalize_request
            r = copy.copy(origin)
            r.state, r.generated, r.cached = "done", 1, r.prompt_tokens
            r.first_scheduled_s, r.first_token_s, r.completion_s = r_p.first_scheduled_s, t, t
            r.token_times, r.hit_tokens = [t], r_p.hit_tokens
            finalize_request(r, False)
            self.handoffs[origin.id] = Handoff(origin, r_p, h, h, t, t, t, t, r)
            self._releaser(h, r_p)()            # nothing to send: the KV is freed as at any completion
            return
        self.read_time = self.decode_router.reported_at(t)
        d = self.decode[checked_pick(self.decode_router, origin, self.decode, t, 'cluster.disaggregation.decode_router')]
        d.ledger.send(origin.id, origin.prompt_tokens + origin.output_tokens)
        ho = Handoff(origin, r_p, h, d, t)
        self.handoffs[origin.id] = ho
        d.pending.append(ho)
        self.pending_total += 1
        self._reserve(d, t)

    def _reserve(self, d, t: float) -> None:
        """Reserve KV on decode replica d for its waiting handoffs, first come first served, and start their
        transfers (over the sending replica's link, one transfer at a time)."""
        spec = self.spec
        while d.pending:
            ho = d.pending[0]
            o, r_p, src = ho.origin, ho.prefill, ho.src
            prefill_first = spec.first_token == "prefill"
            kv_tokens = o.prompt_tokens if prefill_first else o.prompt_tokens - 1
            r_d = Request(o.id, t, o.prompt_tokens, o.output_tokens, cls=o.cls, prefix=o.prefix,
                          predicted_output_tokens=o.predicted_output_tokens, slo_ttft_s=o.slo_ttft_s,
                          slo_tbt_s=o.slo_tbt_s)
            if not d.sim._feasible(r_d):              # can never run there: give the prefill its KV back
                d.pending.popleft()
                self.pending_total -= 1
                d.ledger.finish(o.id)
                ho.infeasible = r_d.reason
                o.state, o.reason = INFEASIBLE, f"decode pool: {r_d.reason}"
                src.clock.add_release(t, self._releaser(src, r_p))
                if src.state == "wait":
                    self.to_wake.append((src, t))
                continue
            # the decode replica admits it by its own policy's rule (Orca reserves max_model_len, others the
            # prompt or less): at least the KV that arrives
            need = max(kv_tokens, d.sim.policy.admission_tokens(r_d))
            if not d.sim.memory.reserve(r_d, need, admission=True):
                return                                 # back-pressure: wait for room
            d.pending.popleft()
            self.pending_total -= 1
            ho.reserved_s = t
            xfer = self.link_transfer(kv_tokens, src.gpus, d.gpus)
            start = max(t, src.link_free)
            wire = xfer - spec.link.latency
            if spec.layerwise and start == ho.done_s:   # KV streamed layer by layer as the prefill computed it
                wire = max(wire / self.layers, wire - (ho.done_s - r_p.first_scheduled_s))
            src.link_free = start + wire
            ho.sent_s, ho.arrived_s = start, start + wire + spec.link.latency
            # the request joins d's running set when its KV is there, as a decode: its next step reads that KV
            # and produces its next token (decode mode: the first, from the last prompt token)
            r_d.arrival_s = ho.arrived_s
            r_d.cached = r_d.input_tokens = kv_tokens
            r_d.first_scheduled_s = r_p.first_scheduled_s
            r_d.hit_tokens = r_p.hit_tokens
            if prefill_first:                          # DistServe: the prefill's token was streamed at once
                r_d.generated = 1
                r_d.first_token_s = r_p.completion_s
                r_d.token_times = [r_p.completion_s]
            ho.decode = r_d
            sim = d.sim
            sim.all_requests.append(r_d)
            pos = bisect.bisect_right(sim.requests, (r_d.arrival_s, r_d.id), lo=d.clock.arrived,
                                      key=lambda q: (q.arrival_s, q.id))
            sim.requests.insert(pos, r_d)
            d.clock.preloaded.add(r_d.id)
            src.clock.add_release(ho.arrived_s, self._releaser(src, r_p))
            for h in (d, src):
                if h.state == "wait" or h.state == "new":
                    self.to_wake.append((h, t))

    def _releaser(self, h, r_p):
        def release():
            h.sim.held_kv -= r_p.blocks
            h.sim.memory.free(r_p)
        return release

    def link_transfer(self, tokens: int, src_gpus: int, dst_gpus: int) -> float:
        return self.spec.link.transfer_s(tokens * self.kv_bytes_per_token, min(src_gpus, dst_gpus))


def run_cluster(scn: Scenario, requests=None):
    from sim.cluster.results import cluster_result
    import time
    t0 = time.perf_counter()
    run = Cluster(scn, copy.deepcopy(requests) if requests is not None else None).run()
    return cluster_result(scn, run, time.perf_counter() - t0)
