"""Autoscaling a co-located pool: a policy adds and removes replicas while the run goes on.

`cluster.replicas` is the pool's largest size; `cluster.autoscale` says how many start and how many may serve:
  min, max (default: the pool), initial (default: min)        replicas that serve at once
  policy: outstanding | kv | schedule
    outstanding  mean requests sent to a serving replica and not yet finished (the router's ledger: queued +
                 running); above up_at adds replicas, enough to bring it to up_at at the present load
                 (Kubernetes' HPA rule: ceil(serving x metric / up_at)), below down_at removes one
    kv           mean KV-cache use of the serving replicas (fraction), the same two thresholds
    schedule     [[t_s, replicas], ...]: from each t_s on, that many replicas serve (a day's plan)
  interval_s     seconds between two looks at the metric (default 10), decided at the first arrival after
  cooldown_s     no action within this long of the previous one (default 60)
  start_s        fixed start of a new replica: container, engine, graph capture (default 30)
  load_gbps      GB/s from host or disk to each GPU for the weights (default 5): a new replica serves from
                 decision + start_s + weight bytes per GPU / load_gbps on
A removed replica drains: it gets no new request, finishes what it has, and is released at its last completion
(a scale-up that finds a draining replica takes it back at once). A replica's GPUs are held, and paid, from the
decision that adds it (the load is paid time) to its release; sim/cluster/results.py turns the held intervals into
GPU-hours, cost and idle energy. Decisions happen at arrival instants, so the run is the same for the same seed."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodels.errors import UserError
from sim.errors import known_keys

KEYS = ("min", "max", "initial", "policy", "up_at", "down_at", "interval_s", "cooldown_s", "start_s", "load_gbps",
        "schedule")
POLICIES = ("outstanding", "kv", "schedule")


@dataclass
class AutoscaleSpec:
    min: int
    max: int
    initial: int
    policy: str
    up_at: float = math.inf
    down_at: float = -math.inf
    interval_s: float = 10.0
    cooldown_s: float = 60.0
    start_s: float = 30.0
    load_gbps: float = 5.0
    schedule: list = field(default_factory=list)


def _num(raw, key, where, default, low=0.0, integer=False):
    v = raw.get(key, default)
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not v >= low or (not integer and math.isinf(v) and default != v):
        kind = "an integer" if integer else "a number"
        raise UserError(f"{where}.{key}: must be {kind} >= {low:g}, got {v!r}")
    return v


def parse_autoscale(raw, pool_size: int, where: str = "cluster.autoscale") -> AutoscaleSpec:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with policy, min, max, ...")
    known_keys(raw, KEYS, where)
    policy = raw.get("policy", "outstanding")
    if policy not in POLICIES:
        raise UserError(f"{where}.policy: {policy!r} is not allowed; allowed: {', '.join(POLICIES)}")
    lo = _num(raw, "min", where, 1, 1, integer=True)
    hi = _num(raw, "max", where, pool_size, 1, integer=True)
    if not lo <= hi <= pool_size:
        raise UserError(f"{where}: need min <= max <= cluster.replicas ({pool_size}), got min {lo}, max {hi}")
    init = _num(raw, "initial", where, lo, 1, integer=True)
    if not lo <= init <= hi:
        raise UserError(f"{where}.initial: must be between min {lo} and max {hi}, got {init}")
    spec = AutoscaleSpec(lo, hi, init, policy, interval_s=_num(raw, "interval_s", where, 10.0),
                         cooldown_s=_num(raw, "cooldown_s", where, 60.0), start_s=_num(raw, "start_s", where, 30.0),
                         load_gbps=_num(raw, "load_gbps", where, 5.0, 1e-9))
    if policy == "schedule":
        sched = raw.get("schedule")
        if not isinstance(sched, list) or not sched or not all(
                isinstance(s, list) and len(s) == 2 and isinstance(s[0], (int, float)) and not isinstance(s[1], bool)
                and isinstance(s[1], int) for s in sched):
            raise UserError(f"{where}.schedule: expected a list of [t_s, replicas] pairs, e.g. [[0, 2], [3600, 4]]")
        for t, n in sched:
            if not lo <= n <= hi:
                raise UserError(f"{where}.schedule: {n} replicas at t = {t} s is outside min {lo} .. max {hi}")
        spec.schedule = sorted((float(t), int(n)) for t, n in sched)
    else:
        for key in ("up_at", "down_at"):
            if key not in raw:
                raise UserError(f"{where}.{key}: needed by policy {policy} (the metric's level that adds / "
                                f"removes a replica)")
        spec.up_at, spec.down_at = _num(raw, "up_at", where, None), _num(raw, "down_at", where, None)
        if not spec.down_at < spec.up_at:
            raise UserError(f"{where}: down_at ({spec.down_at}) must be below up_at ({spec.up_at})")
    return spec


class Autoscaler:
    """The pool's serving set over time. `serving(t)` (called at each arrival instant, before routing) applies the
    policy and returns the replicas the router may pick; `close(end)` releases what is still held."""

    def __init__(self, spec: AutoscaleSpec, pool: list, weight_bytes_per_gpu: float):
        self.spec, self.pool = spec, pool
        self.load_s = spec.start_s + weight_bytes_per_gpu / (spec.load_gbps * 1e9)
        self.serve: list = []                 # serving, in the order they joined
        self.loading: list = []               # (ready_s, handle)
        self.draining: list = []
        self.held: dict = {h.index: [] for h in pool}    # replica → [[acquired_s, released_s or None], ...]
        self.events: list = []                # (t, action, replica, the metric's value, when it serves)
        self.last_look = -math.inf
        self.last_action = -math.inf
        self.started = False
        self.ups = self.downs = 0

    @property
    def reads_state(self) -> bool:
        return self.spec.policy == "kv"

    def _acquire(self, h, t, ready):
        self.held[h.index].append([t, None])
        self.events.append((t, "acquire", h.index, math.nan, ready))

    def serving(self, t: float) -> list:
        if not self.started:                  # the first arrival: the initial replicas, already loaded
            self.started = True
            for h in self.pool[:self.spec.initial]:
                self._acquire(h, t, t)
                self.serve.append(h)
                self.events.append((t, "serve", h.index, math.nan, t))
            self.last_look = t
        for ready, h in [x for x in self.loading if x[0] <= t]:
            self.loading.remove((ready, h))
            self.serve.append(h)
            self.events.append((ready, "serve", h.index, math.nan, ready))
        self._release_drained(t)
        if t - self.last_look >= self.spec.interval_s:
            self.last_look = t
            self._decide(t)
        return self.serve

    def _metric(self) -> float:
        if self.spec.policy == "kv":
            return sum(h.kv_usage for h in self.serve) / len(self.serve)
        return sum(h.outstanding_requests for h in self.serve) / len(self.serve)

    def _decide(self, t: float) -> None:
        provisioned = len(self.serve) + len(self.loading)
        if self.spec.policy == "schedule":
            want = next((n for s, n in reversed(self.spec.schedule) if s <= t - self._t0()), self.spec.initial)
            value = float(want)
        else:
            value = self._metric()
            if value > self.spec.up_at:       # Kubernetes' HPA rule: enough replicas to bring the metric to up_at
                want = max(provisioned + 1, math.ceil(len(self.serve) * value / self.spec.up_at))
            else:
                want = provisioned - 1 if value < self.spec.down_at else provisioned
            if want != provisioned and t - self.last_action < self.spec.cooldown_s:
                return
        want = min(max(want, self.spec.min), self.spec.max)
        while provisioned < want:
            self._up(t, value)
            provisioned += 1
        while provisioned > want and (self.loading or len(self.serve) > self.spec.min):
            self._down(t, value)
            provisioned -= 1

    def _t0(self) -> float:
        return self.events[0][0] if self.events else 0.0

    def _up(self, t, value) -> None:
        self.ups += 1
        self.last_action = t
        if self.draining:                     # still held and loaded: it serves again at once
            h = self.draining.pop()
            self.serve.append(h)
            self.events.append((t, "undrain", h.index, value, t))
            return
        busy = {h.index for h in self.serve} | {h.index for _, h in self.loading}
        h = next(h for h in self.pool if h.index not in busy and not self._held_now(h))
        ready = t + self.load_s
        self._acquire(h, t, ready)
        self.loading.append((ready, h))
        self.events.append((t, "up", h.index, value, ready))

    def _held_now(self, h) -> bool:
        return bool(self.held[h.index]) and self.held[h.index][-1][1] is None

    def _down(self, t, value) -> None:
        self.downs += 1
        self.last_action = t
        if self.loading:                      # a replica still loading is cancelled first (its GPUs paid so far)
            _, h = self.loading.pop()
            self.events.append((t, "cancel", h.index, value, math.nan))
            self._release(h, t)
            return
        h = min(reversed(self.serve), key=lambda h: h.outstanding_requests)   # the least loaded, latest on ties
        self.serve.remove(h)
        self.draining.append(h)
        self.events.append((t, "down", h.index, value, math.nan))

    def _release_drained(self, t: float) -> None:
        for h in list(self.draining):
            if h.outstanding_requests == 0:
                self.draining.remove(h)
                self._release(h, max(self._last_completion(h), self._drained_at(h)))

    def _drained_at(self, h) -> float:
        return max(e[0] for e in self.events if e[2] == h.index and e[1] == "down")

    @staticmethod
    def _last_completion(h) -> float:
        if not h.built:
            return -math.inf
        return max((r.completion_s for r in h.sim.all_requests if r.completion_s is not None), default=-math.inf)

    def _release(self, h, t: float) -> None:
        self.held[h.index][-1][1] = t
        self.events.append((t, "release", h.index, math.nan, math.nan))

    def close(self, end: float) -> None:
        """After the run: drained replicas leave at their last completion, the rest at the run's end."""
        for h in self.draining:
            self._release(h, max(self._last_completion(h), self._drained_at(h)))
        self.draining = []
        for idx, spans in self.held.items():
            if spans and spans[-1][1] is None:
                spans[-1][1] = end
                self.events.append((end, "release", idx, math.nan, math.nan))

    def held_s(self, index: int) -> float:
        return sum(b - a for a, b in self.held[index])
