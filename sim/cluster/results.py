"""A cluster run's tables: one row per request (where it ran, its KV transfer), per iteration (with the replica), per
replica, and the cluster summary (GPUs, GPU-seconds, goodput per GPU, load imbalance, KV-transfer share)."""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from sim.cluster.counts import infeasible_counts
from sim.metrics import SimResult, request_table, summarize

NAN = float("nan")


def _merged_requests(run):
    """Disaggregated: each request's life as the client sees it (arrival, the prefill's queueing, the decode
    side's tokens), plus where it ran and its transfer."""
    reqs, extra = [], []
    for o in run.origin:
        ho = run.handoffs.get(o.id)
        if ho is not None and ho.decode is not None:
            r = ho.decode
            r.arrival_s = o.arrival_s            # the decode replica's queue saw the transfer's end; the client this
            reqs.append(r)
            extra.append((ho.src.index, ho.dst.index, ho.arrived_s - ho.sent_s, ho.reserved_s - ho.done_s))
            continue
        r = copy.copy(o)                        # never reached a decode replica: the prefill side's state
        if ho is not None:
            r.state = "infeasible" if ho.infeasible else "waiting"
            r.reason = f"decode pool: {ho.infeasible}" if ho.infeasible else None
        reqs.append(r)
        extra.append((ho.src.index if ho else -1, ho.dst.index if ho else -1, NAN, NAN))
    return reqs, extra


def _result(h) -> SimResult:
    """A replica's tables; its retired rows (sim/metrics/rowstore.py) are in them now and are let go at once, so
    the columns of every replica are not held twice while the cluster's table is built."""
    res = h.sim.result()
    h.sim.release_rows()
    return res


def cluster_result(scn, run, wall_s: float) -> SimResult:
    replicas = run.replicas
    built = [h for h in replicas if h.built]       # a replica never needed was never built: idle tables
    results = [h.result if h.result is not None else _result(h) if h.built else h.group.idle_result()
               for h in replicas]
    slos = scn.slos()
    if run.spec.disaggregated:
        reqs, extra = _merged_requests(run)
        dec = next(h for h in replicas if h.pool == "decode")
        req = request_table(reqs, slos, dec.group.overheads)
        ex = np.array(extra, dtype=float).reshape(-1, 4)
        req["prefill_replica"] = ex[:, 0].astype(np.int64)
        req["decode_replica"] = ex[:, 1].astype(np.int64)
        req["kv_transfer_s"] = ex[:, 2]
        req["handoff_wait_s"] = ex[:, 3]
    else:
        parts, part = [], None
        for h, res in zip(replicas, results):
            if h.built:                            # the cluster table takes the rows over from the replicas'
                part, res.requests = res.requests, None
                part["replica"] = np.full(len(part), h.index, dtype=np.int64)
                parts.append(part)
        part = None
        req = merge_tables(parts) if parts else pd.DataFrame()
    it_parts = [res.iterations.assign(replica=h.index, pool=h.pool) for h, res in zip(replicas, results)
                if h.built and len(res.iterations)]
    if it_parts:
        it = pd.concat(it_parts, ignore_index=True)
    else:
        from sim.engine.loop import ITER_COLUMNS
        it = pd.DataFrame(columns=[*ITER_COLUMNS, "replica", "pool"])
    capacity = sum(res.capacity_tokens for res in results)
    summ = summarize(req, pd.DataFrame(), capacity, any(h.sim.truncated for h in built))
    summ.pop("iterations", None)
    per = replica_table(replicas, results, summ.get("makespan_s", NAN))
    gpus = int(per["gpus"].sum())
    makespan = summ.get("makespan_s", NAN)
    summ["replicas"] = len(replicas)
    summ["gpus"] = gpus
    summ["gpu_seconds"] = gpus * makespan if makespan == makespan else NAN
    summ["goodput_rps_per_gpu"] = summ["goodput_rps"] / gpus if gpus else NAN
    summ["iterations"] = int(per["iterations"].sum())
    busy = per["busy_s"].to_numpy(float)
    work = per["routed_tokens"].to_numpy(float)
    summ["load_imbalance"] = (float(busy.max() / busy.mean()) if len(busy) and np.isfinite(busy).all()
                              and busy.mean() > 0 else float(work.max() / work.mean()) if work.mean() > 0 else NAN)
    summ["kv_util_mean"] = float(per["kv_util_mean"].mean())
    if run.spec.disaggregated:
        done = req[req["status"] == "done"]
        summ["kv_transfer_s_mean"] = float(done["kv_transfer_s"].mean()) if len(done) else NAN
        summ["handoff_wait_s_mean"] = float(done["handoff_wait_s"].mean()) if len(done) else NAN
        summ["kv_transfer_share"] = (float(done["kv_transfer_s"].sum() / done["e2e_s"].sum())
                                     if len(done) and done["e2e_s"].sum() > 0 else NAN)
    caches = [h.sim.memory for h in built if hasattr(h.sim.memory, "stats")]
    if caches:                                     # prefix caching, over the whole cluster
        q = sum(m.query_blocks for m in caches)
        hits = sum(m.hit_blocks + m.cpu_hit_blocks for m in caches)
        summ["prefix_hit_rate"] = hits / q if q else NAN
        for k in ("prefix_gpu_hit_tokens", "prefix_cpu_hit_tokens", "prefix_evicted_blocks"):
            summ[k] = int(sum(m.stats()[k] for m in caches))
    specs = [h.sim.speculation for h in built if getattr(h.sim, "speculation", None) is not None]
    if specs:                                      # speculative decoding, over the whole cluster
        from sim.engine.speculative import merged_stats
        summ.update(merged_stats(specs))
    loras = [h.sim.lora for h in built if getattr(h.sim, "lora", None) is not None]
    if loras:                                      # multi-LoRA, over the whole cluster
        from sim.engine.lora import merged_lora_stats
        summ.update(merged_lora_stats(loras))
    turns = getattr(run, "sessions", None)
    if turns is not None:                          # closed-loop sessions: the cluster released the turns
        summ["session_turns_released"] = turns["released"]
        summ["session_turns_abandoned"] = turns["abandoned"]
        summ["session_think_s_mean"] = turns["think_s"] / turns["released"] if turns["released"] else NAN
    scaler = getattr(run, "scaler", None)
    if scaler is not None:
        t0 = req["arrival_s"].min() if len(req) else 0.0
        scaler.close(t0 + makespan if makespan == makespan else t0)
        held = {h.index: scaler.held_s(h.index) for h in replicas}
        summ["gpu_seconds"] = float(sum(held[h.index] * h.gpus for h in replicas))
        summ["goodput_rps_per_gpu"] = (summ["goodput_rps"] * makespan / summ["gpu_seconds"]
                                       if summ["gpu_seconds"] > 0 else NAN)      # per GPU held on average
        summ["autoscale_ups"], summ["autoscale_downs"] = scaler.ups, scaler.downs
        summ["replicas_held_mean"] = (sum(held.values()) / makespan if makespan == makespan and makespan > 0
                                      else NAN)
        summ["replicas_held_max"] = _most_held(scaler)
    else:
        held = None
    summ.update(_economics(replicas, it, summ, held))
    summ["wall_s"] = wall_s
    infeasible = [r for h in built for r in h.sim.infeasible]
    caps = [res.capacity_tokens for res in results]
    meta = {"scenario": scn.name, "policy": scn.policy.get("name"), "M": capacity, "wall_s": wall_s,
            "costmodel": "; ".join(sorted({h.group.costmodel_text for h in replicas} - {""})),
            "infeasible_ids": sorted({r.id for r in infeasible}), "infeasible_reasons": infeasible_counts(infeasible),
            "memory": {"M": capacity, "replicas": caps},
            "memory_text": f"KV M per replica: {_runs(caps)} tokens",
            "cluster": {"replicas": len(replicas), "gpus": gpus,
                        "pools": sorted({h.pool for h in replicas})}}
    out = SimResult(req, it, summ, capacity, meta)
    if held is not None:
        per["held_s"] = [held[h.index] for h in replicas]
        out.tables["scaling"] = pd.DataFrame(scaler.events, columns=["t_s", "action", "replica", "metric",
                                                                       "serves_from_s"])
    out.tables["replicas"] = per
    return out


def merge_tables(parts: list) -> pd.DataFrame:
    """The replicas' request tables as one, sorted by (arrival_s, id) with ties in replica order (what a stable
    sort of their concatenation gives), built one column at a time: each column's pieces are let go as it is
    made, so the peak is about one table, not the two or three of a concat and a sort (gigabytes at 10M rows).
    The pieces are taken out of the frames first (request_table keeps each column apart), as plain arrays:
    deleting columns from a pandas frame costs about a millisecond each. Empties `parts`."""
    names = list(parts[0].columns)
    pieces = []
    for i, part in enumerate(parts):
        pieces.append({name: part[name].array for name in names})
        parts[i] = part = None
    parts.clear()
    arrival = np.concatenate([np.asarray(d["arrival_s"]) for d in pieces])
    ids = np.concatenate([np.asarray(d["id"]) for d in pieces])
    order = np.lexsort((ids, arrival))              # stable: equal keys keep their concatenation order
    arrival = ids = None
    cols = {}
    for name in names:
        col = [d.pop(name) for d in pieces]
        if all(isinstance(x, pd.arrays.NumpyExtensionArray) for x in col):
            cols[name] = np.concatenate([np.asarray(x) for x in col])[order]
        else:                                       # strings (pandas' own arrays)
            cols[name] = pd.concat([pd.Series(x, copy=False) for x in col], ignore_index=True).array.take(order)
        col = None
        _give_back()
    return pd.DataFrame(cols, copy=False)


def _give_back() -> None:
    """Hand the pages of freed pieces back to the system (glibc): pieces below malloc's mmap threshold (a replica's
    column of a few thousand rows) are freed inside the heap, where they would still count towards the peak
    while the merged columns (mmapped) grow; elsewhere a no-op."""
    global _trim
    if _trim is None:
        try:
            import ctypes
            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None


def _most_held(scaler) -> int:
    """The most replicas held at once (acquired and not yet released)."""
    marks = sorted([(a, 1) for spans in scaler.held.values() for a, _ in spans] +
                   [(b, -1) for spans in scaler.held.values() for _, b in spans], key=lambda m: (m[0], m[1]))
    most = now = 0
    for _, d in marks:
        now += d
        most = max(most, now)
    return most


def _economics(replicas, it, summ, held=None) -> dict:
    """GPU-hours, cost and energy over every replica, each held for the makespan or, autoscaled, for its own held
    time (sim/metrics/economics.py)."""
    from sim.metrics.economics import economics_summary, gpu_economics
    by_replica = dict(tuple(it.groupby("replica", sort=False))) if len(it) else {}
    empty = it.iloc[:0]
    econ, parts = {}, []
    for h in replicas:
        hw = h.scn.hardware
        k = (hw.gpu, hw.usd_per_gpu_hour, hw.power_idle_w, hw.power_peak_w)
        if k not in econ:
            econ[k] = gpu_economics(hw)
        rows = by_replica.get(h.index, empty) if h.scn.sim.record_iterations else None
        parts.append((econ[k], h.gpus, rows) if held is None else (econ[k], h.gpus, rows, held[h.index]))
    return economics_summary(parts, summ.get("makespan_s", NAN), summ.get("generated_tokens", 0))


def _runs(values) -> str:
    """'a, b, c' with repeats folded: 20,000 equal replicas read '20000 x 99000', not 20,000 numbers."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        out.append(f"{j - i + 1} x {values[i]}" if j > i else str(values[i]))
        i = j + 1
    return ", ".join(out)


def replica_table(replicas, results, makespan: float) -> pd.DataFrame:
    rows = []
    for h, res in zip(replicas, results):
        s, it = res.summary, res.iterations
        busy = float(it["duration_s"].sum()) if len(it) else NAN
        rows.append({"replica": h.index, "pool": h.pool, "gpu": h.scn.hardware.gpu, "gpus": h.gpus,
                     "model": h.scn.model.name if not h.scn.model.config else h.scn.model.config,
                     "policy": h.scn.policy.get("name"), "M": res.capacity_tokens, "routed": h.routed,
                     "routed_tokens": h.routed_tokens, "completed": s.get("completed", 0),
                     "outstanding_end": h.ledger.outstanding_requests,
                     "outstanding_tokens_end": h.ledger.outstanding_tokens,
                     "iterations": s.get("iterations", 0), "busy_s": busy,
                     "utilization": busy / makespan if makespan and makespan == makespan and busy == busy else NAN,
                     "tps": s.get("tps", NAN), "ttft_p99": s.get("ttft_p99", NAN),
                     "kv_util_mean": s.get("kv_util_mean", NAN), "preemptions": s.get("evictions", 0)})
    return pd.DataFrame(rows)


def per_replica_load(iterations: pd.DataFrame, bins: int = 200) -> pd.DataFrame:
    """Running requests and KV tokens in use per replica over time: duration-weighted means in `bins` time bins
    (the per-replica load plot)."""
    cols = ["t_s", "replica", "running", "kv_alloc_tokens"]
    if not len(iterations):
        return pd.DataFrame(columns=cols)
    end = float((iterations["start_s"] + iterations["duration_s"]).max())
    width = max(end / bins, 1e-6)
    w = iterations["duration_s"].to_numpy(float)
    df = pd.DataFrame({"t_s": (iterations["start_s"] // width) * width, "replica": iterations["replica"], "w": w,
                       "running": iterations["running"] * w, "kv_alloc_tokens": iterations["kv_alloc_tokens"] * w})
    g = df.groupby(["t_s", "replica"], as_index=False)[["w", "running", "kv_alloc_tokens"]].sum()
    for c in ("running", "kv_alloc_tokens"):
        g[c] = g[c] / g["w"].where(g["w"] > 0, 1.0)
    return g[cols]
