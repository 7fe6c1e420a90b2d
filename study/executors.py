"""Run independent tasks in this process, in local worker processes, or on a Dask cluster; yield results as they finish."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from costmodels.errors import UserError

DASK_EXTRA = "servesim[dask]"


def run_tasks(tasks, jobs: int = 1, dask: str | None = None):
    """`tasks` is a list of (function, args, tag); yields (tag, result) in completion order.

    Functions must be module-level (picklable) and deterministic, so the results do not depend on where they ran.
    On Ctrl-C, queued tasks are cancelled; only those in flight are lost."""
    if not tasks:
        return
    if dask:
        yield from _run_dask(tasks, jobs, dask)
    elif jobs <= 1:
        for fn, args, tag in tasks:
            yield tag, fn(*args)
    else:
        yield from _run_processes(tasks, jobs)


def _run_processes(tasks, jobs):
    # forkserver: a clean worker even when the parent holds threads (tqdm's monitor), unlike fork.
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                      else "spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx, initializer=watch_parent,
                               initargs=(os.getpid(),))
    try:
        # Keep at most 2*jobs tasks queued so that a Ctrl-C has little to cancel and memory stays flat.
        pending, it = {}, iter(tasks)
        for fn, args, tag in it:
            pending[pool.submit(fn, *args)] = tag
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                tag = pending.pop(fut)
                yield tag, fut.result()
                nxt = next(it, None)
                if nxt is not None:
                    pending[pool.submit(nxt[0], *nxt[1])] = nxt[2]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)     # interrupted: drop the queue, lose only runs in flight
        raise
    pool.shutdown(wait=True)


PARENT_POLL_S = 1.0


def watch_parent(parent_pid: int) -> None:
    """Worker initializer: exit as soon as the sweep's own process is gone. A parent killed with SIGKILL or
    SIGTERM runs no cleanup, and a worker in the middle of a long simulation would otherwise run it to the end
    (and take the next queued task) as an orphan."""
    def poll():
        while True:
            time.sleep(PARENT_POLL_S)
            if not _alive(parent_pid):
                os._exit(1)
    threading.Thread(target=poll, name="servesim-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):   # gone, or the pid now belongs to another user
        return False
    try:                                             # Linux: a killed parent not yet reaped is a zombie
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def dask_client(address: str, jobs: int):
    """A distributed.Client for an address, or a LocalCluster of `jobs` single-threaded worker processes."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise UserError(f"--dask needs the Dask distributed scheduler: pip install '{DASK_EXTRA}'") from None
    if address == "local":
        cluster = LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True,
                               dashboard_address=None)
        return Client(cluster), cluster
    try:
        return Client(address, timeout=30), None
    except OSError as e:
        raise UserError(f"--dask {address}: cannot reach the Dask scheduler ({e})") from None


def _run_dask(tasks, jobs, address):
    client, cluster = dask_client(address, jobs)      # first: a missing extra is reported before anything else
    from distributed import as_completed
    try:
        futures = {}
        for fn, args, tag in tasks:
            futures[client.submit(fn, *args, pure=False)] = tag
        for fut in as_completed(list(futures)):
            yield futures[fut], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
