"""One replica's arrivals inside a cluster: the requests its router has sent so far, delivered as on its own.

The replica loop asks its clock what a lone replica's ArrivalClock answers (the next arrival event's time, which
arrivals are due before it resumes, waking at the next one), with the same SimPy timing and tie order, so a
replica that receives a given list of requests behaves exactly as a single-replica run on that list. What it
cannot know in a cluster is a request the router has not placed yet; so the clock also answers `synced(e)` (have
the router's decisions up to time e all been made?), and its `time` is only a bound (no event for this replica
before it) until the next request is known. The cluster (sim/cluster/cluster.py) makes the replica wait where it
must. Disaggregated prefill replicas also get KV releases: blocks held for a transfer, freed when it ends."""
from __future__ import annotations

import heapq
import math

from sim.engine.arrivals import ArrivalClock


class ReplicaClock(ArrivalClock):
    cluster = True

    def __init__(self, driver, replica, requests, waiting, view=None):
        # not ArrivalClock.__init__: nothing is known yet; the driver places the t = 0 arrivals, then start()
        self.driver, self.replica = driver, replica
        self.requests, self.waiting = requests, waiting
        self.arrived = 0
        self.created, self.first = 0.0, True
        self._from = 0.0                    # the arrivals process's clock when it last ran
        self.releases: list = []            # (time, seq, callback): KV freed when a transfer ends
        self._seq = 0
        self.view = view
        self.preloaded: set = set()         # request ids whose KV arrives with them: they join the running set
        # fixed for the run once the driver is built: plain attributes, read on every step of the fast paths
        self.runs_ahead = driver.runs_ahead
        self._cut = driver.cut_at_decisions

    def start(self) -> None:
        """Both processes start at 0, arrivals first: what is due at 0 is queued before the first schedule."""
        self._schedule(0.0, True)
        if self._own() == 0.0:
            self._deliver(before_replica=True)

    # -- what the replica loop reads ----------------------------------------------------------------------------
    def _own(self) -> float:
        """The next arrival event's time if the request behind it is known (the process slept from `_from`)."""
        if self.arrived < len(self.requests):
            t, now = self.requests[self.arrived].arrival_s, self._from
            return now + (t - now) if t > now else now
        return math.inf

    @property
    def time(self) -> float:
        """No event reaches this replica before this time (exact once synced up to it)."""
        # _own() and the driver's horizon inlined: read before every stretch of steps and every commit
        i, reqs = self.arrived, self.requests
        if i < len(reqs):
            t, now = reqs[i].arrival_s, self._from
            own = now + (t - now) if t > now else now
        else:
            own = math.inf
        if self.releases and self.releases[0][0] < own:
            own = self.releases[0][0]
        driver = self.driver
        bound = driver.horizon(self.replica) if driver.lockstep or driver.to_wake else driver.T
        return own if own <= bound else bound

    @property
    def commit_limit(self) -> float:
        """The exact fast paths commit only iterations that end before this time. A router that reads replica
        state (queues, KV, cached prefixes) must find it as the plain loop's would be at its decision, never a
        stretch still to be applied (behind) nor cohort steps already past it (ahead): the limit is its next
        decision. A router that reads only its ledgers (time-stamped, sim/cluster/ledger.py) sets no limit."""
        return self.driver.horizon(self.replica) if self._cut else math.inf

    # runs_ahead (an attribute set above): may this replica sleep through steady steps? Only where routers read
    # nothing but their ledgers and no replica hands work to another (no disaggregation).

    @property
    def next_decision(self) -> float:
        """When the router next places a request (an arrival's time)."""
        return self.driver.T

    @property
    def has_next(self) -> bool:
        return self.arrived < len(self.requests)

    @property
    def final(self) -> bool:
        return self.driver.final(self.replica)

    def synced(self, e: float) -> bool:
        driver = self.driver
        if e >= driver.T:                   # (the driver's synced, its common case inlined)
            return False
        return driver.synced(self.replica, e) if driver.lockstep else not driver.to_wake

    def due(self, s: float, e: float) -> bool:
        t = self._own()
        return t < e or (t == e and (self.created < s or (self.created == s and self.first)))

    def deliver_until(self, s: float, e: float) -> None:
        self.release_until(e)
        while self.due(s, e):
            self._deliver(before_replica=self._own() != s)

    def next_event(self) -> float:
        """The next known event for an idle replica: an arrival, or KV freed by a finished transfer."""
        return min(self._own(), self.releases[0][0] if self.releases else math.inf)

    def wake(self) -> float:
        """Resume an idle replica at its next event (synced up to it): free what transfers released by then, and
        queue the arrivals due, as the lone replica's clock would."""
        t = self._own()
        if self.releases and self.releases[0][0] < t:
            t = self.releases[0][0]
            self.release_until(t)
            return t
        self.release_until(t)
        self._deliver(before_replica=True)
        return t

    def _deliver(self, before_replica: bool) -> None:
        now = self._own()                   # the event being processed
        reqs, i, n = self.requests, self.arrived, len(self.requests)
        while True:
            t = reqs[i].arrival_s
            while i < n and reqs[i].arrival_s <= t:
                r = reqs[i]
                if r.id in self.preloaded:
                    self.view.enter_running(r)
                else:
                    self.waiting.append(r)
                i += 1
            if i >= n or reqs[i].arrival_s > now:
                break
        self.arrived = i
        self._schedule(now, before_replica)

    def _schedule(self, now: float, before_replica: bool) -> None:
        self._from, self.created, self.first = now, now, before_replica

    # -- KV held for transfers (disaggregated prefill) ------------------------------------------------------------
    def add_release(self, t: float, callback) -> None:
        heapq.heappush(self.releases, (t, self._seq, callback))
        self._seq += 1

    def release_until(self, t: float) -> None:
        while self.releases and self.releases[0][0] <= t:
            _, _, cb = heapq.heappop(self.releases)
            cb()
