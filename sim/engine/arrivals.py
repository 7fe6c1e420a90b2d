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


class SessionClock(ArrivalClock):
    """ArrivalClock for closed-loop sessions: the first turns' arrivals process, plus one timer per later turn.

    Under SimPy a completed turn starts a process for each follower that sleeps its think time and then queues it
    (sim/engine/sessions.py). Such a timer is created while the replica commits the step that completed the turn
    at C, after the replica's next timeout (created at C too, when the loop goes straight on), so it is processed
    before the replica resumes at e, its iteration begun at s, iff its time t < e, or t == e and C < s. Timers and
    the first turns' events are taken in SimPy's order: time, then creation."""

    def __init__(self, requests, waiting, sessions):
        self.sessions = sessions
        self.timers = []                    # heap of (time, created, sequence, request)
        self.seq = 0
        self.index = 0                      # first turns queued so far
        self.static_time = math.inf
        super().__init__(requests, waiting)

    @property
    def has_next(self) -> bool:
        return self.index < len(self.requests) or bool(self.timers)

    def add(self, r, now: float) -> None:
        """Turn r's predecessor completed at `now`: it arrives after its think time (SimPy: now + think_s)."""
        import heapq
        heapq.heappush(self.timers, (now + r.think_s, now, self.seq, r))
        self.seq += 1
        self._refresh()

    def _refresh(self) -> None:
        t = self.timers[0][0] if self.timers else math.inf
        self.time = min(self.static_time, t)

    def _timer_first(self) -> bool:
        """Is the next event a timer (else the first turns' process)? Ties in time: the one created earlier."""
        if not self.timers:
            return False
        t, created = self.timers[0][:2]
        return t < self.static_time or (t == self.static_time and created < self.static_created)

    def due(self, s: float, e: float) -> bool:
        if self._timer_first():
            t, created = self.timers[0][:2]
            return t < e or (t == e and created < s)
        t = self.static_time
        return t < e or (t == e and (self.static_created < s or (self.static_created == s and self.static_first)))

    def deliver_until(self, s: float, e: float) -> None:
        while self.due(s, e):
            if self._timer_first():
                self._fire()
            else:
                self._deliver(before_replica=self.static_time != s)

    def wake(self) -> float:
        """The idle replica resumes after the first event at t and every other already scheduled at t (SimPy
        processes those before the resumption the first one triggers), in their order."""
        t = self.time
        static_pending = self.static_time == t
        while True:
            if self.timers and self.timers[0][0] == t and (not static_pending or self._timer_first()):
                self._fire()
            elif static_pending:
                self._deliver(before_replica=True)
                static_pending = False
            else:
                return t

    def _fire(self) -> None:
        import heapq
        t, _, _, r = heapq.heappop(self.timers)
        r.arrival_s = t
        self.waiting.append(r)
        self.sessions.arrived_turn(r)
        self.arrived += 1
        self._refresh()

    def _deliver(self, before_replica: bool) -> None:
        reqs, i, n = self.requests, self.index, len(self.requests)
        now = self.static_time
        while True:
            t = reqs[i].arrival_s
            while i < n and reqs[i].arrival_s <= t:
                self.waiting.append(reqs[i])
                i += 1
            if i >= n or reqs[i].arrival_s > now:
                break
        self.arrived += i - self.index
        self.index = i
        self._schedule(now, before_replica)

    def _schedule(self, now: float, before_replica: bool) -> None:
        if self.index >= len(self.requests):
            self.static_time = math.inf
        else:
            t = self.requests[self.index].arrival_s
            self.static_time = now + (t - now) if t > now else now
            self.static_created, self.static_first = now, before_replica
        self._refresh()
