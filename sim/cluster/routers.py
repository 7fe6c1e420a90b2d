"""Routers: which replica a request goes to, decided at its arrival from what a real router can see.

A router sees each replica through a ReplicaHandle (sim/cluster/cluster.py): the requests it has sent there and
not yet seen complete (its own bookkeeping, as Envoy's least-request balancer and Dynamo's KV router keep), their
prompt and output tokens, the replica's queue and running counts and KV use (the metrics a vLLM server exports),
and, for cache-aware routing, how many of a request's prompt tokens the replica's prefix cache holds (what llm-d's
and Dynamo's routers track from the KV events replicas publish). Ties go to the lowest replica index, so routing is
deterministic given the scenario's seed. `register_router` adds a router (user extensions too)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from costmodels.errors import UserError

ROUTERS: dict = {}


def register_router(name: str, cls, summary: str, replace: bool = False) -> None:
    """Add a router by name; a name already taken is refused unless replace=True."""
    from costmodels.registry import register
    register(ROUTERS, name, (cls, summary), "router", replace)


class Router:
    """Pick a replica for each request. Knobs are the dataclass `Config`'s fields (like policies)."""

    @dataclass
    class Config:
        pass

    def __init__(self, rng: np.random.Generator, **knobs):
        names = {f.name for f in fields(self.Config)}
        bad = sorted(set(knobs) - names)
        if bad:
            raise UserError(f"cluster.router: unknown knob(s) {', '.join(bad)} for router {self.name!r}; allowed: "
                            f"{', '.join(sorted(names)) or '(none)'}")
        for f in fields(self.Config):
            if f.name in knobs:
                _check_type(self.name, f.name, knobs[f.name], type(f.default))
        self.config = self.Config(**knobs)
        self.rng = rng

    name = "router"
    stateless = False     # True: picks never read replica state, so every request may be placed up front
    # False: picks read only what the router's own ledgers hold (requests and tokens sent, not yet gone), never the
    # replicas' queues, KV or caches; those may then run their exact fast paths ahead of its decisions. An
    # extension that reads more must leave it True (the safe default).
    reads_state = True

    def pick(self, req, replicas, now: float) -> int:    # pragma: no cover - interface
        raise NotImplementedError

    def reported_at(self, t: float) -> float:
        """The time up to which the router knows of completions when it decides at t (ledgers count what left
        before it): t itself unless its knowledge lags (_LoadRouter.report_interval_s)."""
        return t

    def place(self, n: int, replicas: int):
        """A stateless router's next n picks at once (an int array), the values n calls of pick would return;
        None: pick is called per request (sim/cluster/decompose.py)."""
        return None


def _check_type(router: str, knob: str, value, kind) -> None:
    """A knob's value must have its default's type (an integer may stand for a float; a bool is not a number)."""
    ok = (isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
          or kind is float and isinstance(value, int) and not isinstance(value, bool))
    if kind in (int, float, bool, str) and not ok:
        raise UserError(f"cluster.router.{knob}: router {router!r} takes a {kind.__name__} here, got {value!r}")


def checked_pick(router: Router, req, replicas, now: float, where: str) -> int:
    """The router's pick, refused with one line unless it names a replica of the pool (extensions too)."""
    i = router.pick(req, replicas, now)
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(replicas):
        raise UserError(f"{where}: router {router.name!r} picked {i!r} for request {req.id}, but the pool has "
                        f"{len(replicas)} replicas (an index 0..{len(replicas) - 1})")
    return int(i)


def _argmin(values) -> int:
    best, arg = None, 0
    for i, v in enumerate(values):
        if best is None or v < best:
            best, arg = v, i
    return arg


class RoundRobin(Router):
    name = "round_robin"
    reads_state = False
    stateless = True

    def __init__(self, rng, **knobs):
        super().__init__(rng, **knobs)
        self.next = 0

    def pick(self, req, replicas, now):
        i = self.next % len(replicas)
        self.next += 1
        return i

    def place(self, n, replicas):
        picks = (np.arange(self.next, self.next + n, dtype=np.int64)) % replicas
        self.next += n
        return picks


class Random(Router):
    name = "random"
    reads_state = False
    stateless = True

    def pick(self, req, replicas, now):
        return int(self.rng.integers(len(replicas)))

    def place(self, n, replicas):
        # the same draws, in the same order, as n calls of integers(replicas) (tests/test_cluster_workers.py)
        return self.rng.integers(replicas, size=n)


def report_tick(t: float, interval: float) -> float:
    """The last load report at or before t, reports being made every `interval` seconds from 0 (k * interval for
    the largest integer k with k * interval <= t, the product being the float every caller computes)."""
    k = math.floor(t / interval)
    b = k * interval
    return b if b <= t else (k - 1) * interval     # (t / interval rounded up to an integer)


class _LoadRouter(Router):
    """A least-loaded router's one knob: how stale its knowledge of completions is. 0 (the default): it sees a
    request leave the moment it completes, as a proxy that streams the response does. report_interval_s > 0: it
    learns of completions from load reports made every report_interval_s seconds (a metrics scrape), so at a
    decision at t it counts those before the last report, report_tick(t); what it sends itself it counts at once."""

    @dataclass
    class Config:
        report_interval_s: float = 0.0

    def __init__(self, rng, **knobs):
        super().__init__(rng, **knobs)
        r = self.config.report_interval_s
        if not (r >= 0 and math.isfinite(r)):
            raise UserError(f"cluster.router.report_interval_s: must be a finite number of seconds >= 0 (0: exact, "
                            f"the router sees each completion at once), got {r!r}")

    def reported_at(self, t: float) -> float:
        r = self.config.report_interval_s
        return report_tick(t, r) if r else t


class LeastRequests(_LoadRouter):
    """Fewest outstanding requests (sent, not yet complete): Envoy's least_request, vLLM's router default."""
    name = "least_requests"
    reads_state = False

    def pick(self, req, replicas, now):
        loads = [h.outstanding_requests for h in replicas]
        return loads.index(min(loads))                    # the lowest index among the least loaded


class LeastTokens(_LoadRouter):
    """Join the shortest queue by work: fewest outstanding tokens (prompt + output of unfinished requests)."""
    name = "least_tokens"
    reads_state = False

    def pick(self, req, replicas, now):
        loads = [h.outstanding_tokens for h in replicas]
        return loads.index(min(loads))                    # the lowest index among the least loaded


class PowerOfTwo(Router):
    """Two replicas drawn at random, the one with fewer outstanding requests (Mitzenmacher's two choices)."""
    name = "power_of_two"
    reads_state = False

    def pick(self, req, replicas, now):
        n = len(replicas)
        if n == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(n, size=2, replace=False))
        return a if (replicas[a].outstanding_requests, a) <= (replicas[b].outstanding_requests, b) else b


class PrefixAffinity(Router):
    """Cache-aware, balanced against load (Dynamo's KV router cost): for each replica, the prompt blocks it would
    have to compute (not in its prefix cache) times `overlap_weight`, plus the KV blocks it has in use and the
    prompt blocks already queued there; the lowest cost wins."""
    name = "prefix_affinity"

    @dataclass
    class Config:
        overlap_weight: float = 1.0

    def __init__(self, rng, **knobs):
        super().__init__(rng, **knobs)
        if not self.config.overlap_weight >= 0:
            raise UserError(f"cluster.router.overlap_weight: must be >= 0, got {self.config.overlap_weight!r}")

    def pick(self, req, replicas, now):
        w = self.config.overlap_weight
        costs = []
        for h in replicas:
            bs = h.block_size
            new_prefill = -(-(req.prompt_tokens - h.cached_prefix_tokens(req)) // bs)
            costs.append(w * new_prefill + h.kv_blocks_in_use + -(-h.queued_prompt_tokens // bs))
        return _argmin(costs)


def _least_loaded(replicas) -> int:
    loads = [h.outstanding_requests for h in replicas]
    return loads.index(min(loads))


class _AffinityRouter(Router):
    """An affinity router's one knob: how many outstanding requests beyond the least-loaded replica its preferred
    replica may have before the request goes elsewhere."""

    @dataclass
    class Config:
        max_extra: int = 8

    def __init__(self, rng, **knobs):
        super().__init__(rng, **knobs)
        if self.config.max_extra < 0:
            raise UserError(f"cluster.router.max_extra: must be >= 0, got {self.config.max_extra!r}")


class SessionAffinity(_AffinityRouter):
    """Closed-loop sessions: a turn goes to the replica that served the turn before it (its history is cached
    there), unless that replica has `max_extra` or more outstanding requests beyond the least-loaded one; then,
    and for first turns, fewest outstanding requests (least_requests). Reads only its ledgers."""
    name = "session_affinity"
    reads_state = False

    def __init__(self, rng, **knobs):
        super().__init__(rng, **knobs)
        self.home: dict = {}            # request id -> the replica (its index) it was sent to
        self.kept = self.moved = 0      # turns sent to their predecessor's replica / elsewhere (overloaded)

    def pick(self, req, replicas, now):
        best = _least_loaded(replicas)
        i = best
        prev = self.home.pop(req.after.id, None) if getattr(req, "after", None) is not None else None
        if prev is not None:
            at = next((k for k, h in enumerate(replicas) if h.index == prev), None)
            if at is not None and (replicas[at].outstanding_requests
                                   < replicas[best].outstanding_requests + self.config.max_extra):
                i = at
                self.kept += 1
            else:
                self.moved += 1
        if req.followers:
            self.home[req.id] = replicas[i].index
        return i


class LoRAAffinity(_AffinityRouter):
    """Multi-LoRA: a request goes to the least-loaded replica that has its adapter in a GPU slot (no load), unless
    that one has `max_extra` or more outstanding requests beyond the least-loaded replica; otherwise, and for
    base-model requests, fewest outstanding requests. Reads the replicas' adapter slots."""
    name = "lora_affinity"

    def pick(self, req, replicas, now):
        loads = [h.outstanding_requests for h in replicas]
        best = loads.index(min(loads))
        a = getattr(req, "adapter", -1)
        if a < 0:
            return best
        near = [k for k, h in enumerate(replicas) if h.has_adapter(a)]
        if near:
            k = min(near, key=lambda k: (loads[k], k))
            if loads[k] < loads[best] + self.config.max_extra:
                return k
        return best


for _cls, _summary in (
        (RoundRobin, "each replica in turn"),
        (Random, "a replica drawn uniformly (the scenario's seed)"),
        (LeastRequests, "fewest outstanding requests (sent, not complete)"),
        (LeastTokens, "fewest outstanding tokens, prompt + output (join the shortest queue by work)"),
        (PowerOfTwo, "two replicas at random, the one with fewer outstanding requests"),
        (PrefixAffinity, "prefix-cache affinity balanced against KV load (Dynamo/llm-d style)"),
        (SessionAffinity, "a session's turn to the replica holding its history unless overloaded, else least_requests"),
        (LoRAAffinity, "a replica with the request's LoRA adapter resident unless overloaded, else least_requests")):
    register_router(_cls.name, _cls, _summary)


def build_router(spec, rng: np.random.Generator, where: str = "cluster.router") -> Router:
    """A router from `name` or {name: ..., knobs...}."""
    if spec is None:
        spec = "round_robin"
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise UserError(f"{where}: expected a router name or a mapping with `name`, got {spec!r}")
    knobs = dict(spec)
    name = knobs.pop("name")
    if name not in ROUTERS:
        raise UserError(f"{where}: unknown router {name!r}; allowed: {', '.join(sorted(ROUTERS))}")
    return ROUTERS[name][0](rng, **knobs)
