"""A cluster whose router reads no replica state, run replica by replica, in this process or in worker processes.

Every request is placed first (the router's picks in arrival order, as the interleaved driver would make them);
then each replica that got one is built, given its requests in arrival order and run with the single-replica loop
on its own. Replicas share nothing while they run, so where and in what order they run changes nothing: the
cluster's tables are made from each replica's, in replica order (sim/cluster/results.py). With `cluster.workers`
above 1 the replicas run in a pool of forked processes (concurrent.futures: a worker that dies is an error, not a
hang), a chunk of replicas per task; a worker makes its replicas' requests from the workload's columns it
inherited at the fork (nothing is sent to it but replica indices) and sends back each replica's tables, its router
ledger and what the cluster tables read of its simulation (Finished), as each chunk completes."""
from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import numpy as np

from costmodels.errors import UserError
from sim.cluster.routers import checked_pick

# `auto` runs in worker processes only from this many requests on: below it a pool's start (a fork per worker,
# a few tens of milliseconds) and the tables' trip back would cost about what the second core saves.
AUTO_MIN_REQUESTS = 50_000
# guided chunks: each task takes the replicas left over this many times the workers (at least one), so tasks
# shrink as the run nears its end and the workers finish together (a fixed size left one idle for up to a task)
GUIDED = 4
# and at most about this many requests a chunk: a worker holds its chunk's tables (~300 bytes a request) until
# the chunk is sent back, twice while it is pickled
CHUNK_REQUESTS = 200_000


def parse_workers(value, where: str = "cluster.workers"):
    """`auto` (or 0) or an integer >= 1."""
    if value is None or value == "auto" or (type(value) is int and value == 0):
        return "auto"
    if type(value) is not int or value < 1:
        raise UserError(f"{where}: expected auto (or 0: one worker process per CPU for runs of "
                        f"{AUTO_MIN_REQUESTS:,} requests or more) or an integer >= 1 (1: run in this process), "
                        f"got {value!r}")
    return value


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(knob, requests: int, replicas: int) -> int:
    """How many processes run the replicas: never more than replicas with requests; `auto` uses every CPU for a
    large run in a main process (a sweep's or planner's worker already shares the CPUs with its siblings)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1                     # workers inherit the workload and any registered extensions by forking
    if knob == "auto":
        big = requests >= AUTO_MIN_REQUESTS and multiprocessing.parent_process() is None
        knob = cpu_count() if big else 1
    elif multiprocessing.current_process().daemon:
        return 1                     # a daemonic pool worker may not start processes of its own
    return max(1, min(knob, replicas))


def placements(cluster) -> np.ndarray:
    """Each request's replica (an index into the cluster's replicas), in arrival order: the router's picks."""
    reqs, front, router = cluster.requests, cluster.front, cluster.router
    n = len(reqs)
    if len(front) == 1:              # one replica to choose from
        picks = np.zeros(n, dtype=np.int64)
    else:
        picks = router.place(n, len(front)) if _places_as_it_picks(router) else None
        if picks is not None and n and not 0 <= picks.min() <= picks.max() < len(front):
            raise UserError(f"cluster.router: router {router.name!r} placed a request on replica "
                            f"{picks.min() if picks.min() < 0 else picks.max()}, but the pool has {len(front)} "
                            f"replicas (an index 0..{len(front) - 1})")
        if picks is None:
            picks = np.empty(n, dtype=np.int64)
            for i in range(n):
                r = reqs[i]
                picks[i] = checked_pick(router, r, front, r.arrival_s, "cluster.router")
    index = np.fromiter((h.index for h in front), dtype=np.int64, count=len(front))
    return index[picks]


def _places_as_it_picks(router) -> bool:
    """Is the router's place() its own pick's? A subclass (an extension) that overrides pick but inherits place
    would otherwise be placed by its parent's rule: it is asked request by request instead."""
    cls = type(router)
    place_owner = next(c for c in cls.__mro__ if "place" in c.__dict__)
    pick_owner = next(c for c in cls.__mro__ if "pick" in c.__dict__)
    return place_owner is pick_owner


def guided_chunks(replicas: list, requests: list, workers: int) -> list:
    """The replicas (with requests[j] requests each) cut into consecutive tasks for the pool: each task takes the
    replicas left over GUIDED times the workers, at least one, and CHUNK_REQUESTS requests at most unless a single
    replica has more."""
    chunks, at = [], 0
    while at < len(replicas):
        size = max(1, -(-(len(replicas) - at) // (workers * GUIDED)))
        chunk, held = [], 0
        while at < len(replicas) and len(chunk) < size:
            if chunk and held + requests[at] > CHUNK_REQUESTS:
                break
            chunk.append(replicas[at])
            held += requests[at]
            at += 1
        chunks.append(chunk)
    return chunks


class Decomposed:
    """The placed requests grouped by replica (each group in arrival order) and the per-replica run."""

    def __init__(self, cluster):
        self.cluster = cluster
        where = placements(cluster)
        self.order = np.argsort(where, kind="stable")      # request positions, replica by replica
        counts = np.bincount(where, minlength=len(cluster.replicas))
        self.bounds = np.concatenate(([0], np.cumsum(counts)))
        cluster.idx, cluster.T = len(cluster.requests), math.inf     # every decision made

    def used(self) -> list:
        """The replicas that got requests, in index order."""
        return [i for i in range(len(self.cluster.replicas)) if self.bounds[i + 1] > self.bounds[i]]

    def run_replica(self, i: int) -> None:
        """Build replica i, give it its requests in arrival order (as the router sent them) and run it."""
        c = self.cluster
        h = c.replicas[i]
        sim, ledger, reqs = h.sim, h.ledger, c.requests
        mine = self.order[self.bounds[i]:self.bounds[i + 1]]
        for r in reqs.take(mine) if c.stream else [reqs[k] for k in mine.tolist()]:
            ledger.send(r.id, r.prompt_tokens + r.output_tokens)
            if not sim.add_request(r):
                ledger.finish(r.id)       # never runs there: the router learns at once (a 400)
        h.result = sim.run()
        sim.release_rows()                # (in its tables now)

    def run(self, workers: int) -> None:
        used = self.used()
        if workers <= 1 or len(used) <= 1:
            for i in used:
                self.run_replica(i)
            return
        global _JOB
        chunks = guided_chunks(used, [int(self.bounds[i + 1] - self.bounds[i]) for i in used], workers)
        _JOB = self                       # what the forked workers inherit
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        try:
            pending = {pool.submit(_run_chunk, chunk) for chunk in chunks}
            while pending:                # each chunk's tables as it completes (then let go here)
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    for i, result, ledger, finished in f.result():
                        h = self.cluster.replicas[i]
                        h.result, h.ledger, h._sim = result, ledger, finished
                done = f = None
        except BrokenProcessPool:
            raise UserError(f"cluster.workers: a worker process ended abruptly (out of memory?); run with fewer "
                            f"workers than {workers}, or cluster.workers: 1") from None
        finally:
            _JOB = None
            pool.shutdown(wait=False, cancel_futures=True)    # (an error: the chunks not started never run)


class Finished:
    """What the cluster's tables read of a replica's simulation once it has run (sim/cluster/results.py), without
    the simulation: sent back from a worker process in its place."""

    def __init__(self, sim):
        self.truncated = sim.truncated
        self.infeasible = sim.infeasible
        self.memory = None                # (streamed pools keep no prefix cache, whose counters the tables sum)
        self.lora = None                  # (nor adapters)
        spec = getattr(sim, "speculation", None)
        if spec is not None:
            from sim.engine.speculative import COUNTERS
            spec = SimpleNamespace(**{k: getattr(spec, k) for k in COUNTERS})
        self.speculation = spec


_JOB = None


def _run_chunk(indices) -> list:
    """In a worker: run these replicas; their tables, ledgers and Finished, to the parent."""
    out = []
    for i in indices:
        _JOB.run_replica(i)
        h = _JOB.cluster.replicas[i]
        ledger = h.ledger
        ledger.settle(math.inf)
        out.append((i, h.result, ledger, Finished(h.sim)))
        h.result = h._sim = None          # let the replica go before the next one runs
    return out
