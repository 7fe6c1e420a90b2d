"""Closed-loop sessions: a turn arrives when the turn before it completes plus its think (or tool) time.

An agent or a chat user sends turn i + 1 only after reading turn i's answer: its arrival is turn i's completion
plus a pause, so it depends on how fast the engine served turn i. A workload marks a turn with the request it
follows (`after`) and the pause (`think_s`); only first turns are in the arrival stream. When a turn completes the
engine starts a timer (a SimPy process) for each of its followers, which then joins the waiting queue with that
time as its arrival (TTFT and end-to-end latency count from it). Its prompt re-sends the history, so with prefix
caching the earlier turns' blocks are hit if they are still cached.

A turn that can never run (its history grew past max_model_len or M) ends its session: the turns after it are
marked infeasible too. On the exact fast paths there is no SimPy: a SessionClock (sim/engine/arrivals.py) keeps the
timers in SimPy's order, and a steady stretch stops at the completion of a turn that has a follower (its release is
an arrival the stretch must not run past)."""
from __future__ import annotations

from sim.engine.request import INFEASIBLE


class Sessions:
    """The engine's closed-loop turns: first turns, timers for the rest, and their counters."""

    def __init__(self, sim):
        self.sim = sim
        self.env = None                       # the SimPy environment, set when the plain loop starts
        self.clock = None                     # ... or the SessionClock, on the fast paths
        self.released = 0                     # turns that arrived after their predecessor completed
        self.think_total_s = 0.0
        self.abandoned = 0                    # turns never sent: an earlier turn of their session could not run
        for r in sim.all_requests:
            r.followers = None
        for r in sim.all_requests:
            if r.after is not None:
                prev = r.after
                prev.followers = [r] if prev.followers is None else prev.followers + [r]
        feasible = {id(r) for r in sim.requests}
        for r in list(sim.all_requests):
            if r.state == INFEASIBLE and r.followers:
                self._drop_followers(r, feasible)
        sim.requests = [r for r in sim.requests if r.state != INFEASIBLE]
        self.first_turns = [r for r in sim.requests if r.after is None]

    def _drop_followers(self, r, feasible) -> int:
        dropped = 0
        stack = list(r.followers or ())
        while stack:
            f = stack.pop()
            if f.state == INFEASIBLE:
                continue
            f.state = INFEASIBLE
            f.reason = "an earlier turn of its session could not run (the session ends there)"
            self.sim.infeasible.append(f)
            dropped += 1
            stack.extend(f.followers or ())
        self.abandoned += dropped
        return dropped

    def release(self, r, now: float) -> None:
        """`r` completed at `now`: its followers arrive after their think time (a follower refused from the start,
        its history past max_model_len or M, is never sent: it stays infeasible, and the turns after it too)."""
        if self.clock is not None:
            for f in r.followers:
                if f.state != INFEASIBLE:
                    self.clock.add(f, now)
            return
        for f in r.followers:
            if f.state != INFEASIBLE:
                self.env.process(self._arrive(f, now))

    def _arrive(self, f, now):
        yield self.env.timeout(f.think_s)
        sim = self.sim
        f.arrival_s = self.env.now             # now + think_s, as the timer's event time
        sim.view.waiting.append(f)
        self.arrived_turn(f)
        sim.arrived += 1
        if sim._idle is not None and not sim._idle.triggered:
            sim._idle.succeed()

    def arrived_turn(self, f) -> None:
        """A follower joined the waiting queue."""
        self.released += 1
        self.think_total_s += f.think_s

    def abandon(self, r) -> None:
        """`r` was dropped mid-run: the turns after it are never sent (they count as done for the loop)."""
        self.sim.completed += self._drop_followers(r, None)

    def stats(self) -> dict:
        return {"session_turns_released": self.released, "session_turns_abandoned": self.abandoned,
                "session_think_s_mean": self.think_total_s / self.released if self.released else float("nan")}
