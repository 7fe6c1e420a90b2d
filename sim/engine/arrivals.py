"""The arrivals process of the SimPy loop, replayed without SimPy: same event times, same order at ties."""
from __future__ import annotations

import math


class ArrivalClock:
    """Delivers requests to the waiting queue exactly when Simulation._arrivals would under SimPy.

    That process sleeps `t - now` until the next nominal arrival t (so its event lands at now + (t - now),
    not always t) and then queues every request due by t. The replica sees an event at the end e of an
    iteration [s, e] if the event comes first in SimPy's order (time, then creation): if it is earlier than
    e, or at e and created before the replica's timeout for e, which was created at s. An arrival event is
    created when the previous one is processed, at its time C; if C == s the order within that instant
    decides (`first`: it was created before the replica's timeout). Only the fast paths use this clock; the
    plain loop keeps SimPy, and the identity tests hold the two together."""

    cluster = False                         # a replica on its own: every arrival is known from the start
    final = True
    commit_limit = math.inf                 # the fast paths may commit iterations ending before this time
    runs_ahead = False                      # a cluster replica that may sleep through steady steps (Until)

    def __init__(self, requests, waiting):
        self.requests = requests
        self.waiting = waiting
        self.arrived = 0                    # requests queued so far
        self.time = math.inf                # time of the next arrival event (inf: none left)
        self.created = 0.0                  # when that event was created (the previous one's time)
        self.first = True                   # created before a replica timeout created at the same time
        self._schedule(0.0, True)           # both processes start at 0, arrivals first:
        if self.time == 0.0:                # what is due at 0 is queued before the replica's first schedule
            self._deliver(before_replica=True)

    @property
    def has_next(self) -> bool:
        return self.arrived < len(self.requests)

    def synced(self, e: float) -> bool:
        return True

    def due(self, s: float, e: float) -> bool:
        """Is the next arrival event processed before the replica resumes at e, its iteration begun at s?"""
        t = self.time
        return t < e or (t == e and (self.created < s or (self.created == s and self.first)))

    def deliver_until(self, s: float, e: float) -> None:
        """Queue the arrivals SimPy processes before the replica resumes at e (iteration [s, e])."""
        while self.due(s, e):
            # An event still pending at s was processed after the replica resumed there: its successor's
            # timeout comes after the replica's. Otherwise the successor is created before the replica's next.
            self._deliver(before_replica=self.time != s)

    def wake(self) -> float:
        """The replica idles until the next arrival event; returns the time it resumes at (after that event)."""
        t = self.time
        self._deliver(before_replica=True)  # the successor's timeout precedes the replica's next one
        return t

    def _deliver(self, before_replica: bool) -> None:
        """One resumption of the arrivals process: it queues each nominal arrival due by its clock."""
        reqs, i, n = self.requests, self.arrived, len(self.requests)
        now = self.time
        while True:
            t = reqs[i].arrival_s
            while i < n and reqs[i].arrival_s <= t:
                self.waiting.append(reqs[i])
                i += 1
            if i >= n or reqs[i].arrival_s > now:     # else no sleep: the process goes on at once
                break
        self.arrived = i
        self._schedule(now, before_replica)

    def _schedule(self, now: float, before_replica: bool) -> None:
        """The arrivals process at `now`: the time of its next event (at once if that is already due)."""
        if self.arrived >= len(self.requests):
            self.time = math.inf
            return
        t = self.requests[self.arrived].arrival_s
        self.time = now + (t - now) if t > now else now     # SimPy's timeout: now + delay
        self.created, self.first = now, before_replica
