"""A run's tables as a Chrome Trace Event Format file (JSON), the format ui.perfetto.dev and chrome://tracing open.

One process per replica (pool in its name). On it:
- every iteration is a complete slice ("X") named by what ran (prefill, decode, mixed), its batch in args;
- every request is an async slice pair ("b"/"e", id = request id) from arrival to completion, with nested slices
  queued (arrival to first scheduled), prefill (to the first token) and decode (to the last), so the first token
  is where prefill ends; a request that never finished ends at the end of the trace, its status in args;
- counters ("C"): KV tokens (allocated, cached), queue (running, waiting) and utilization (mfu, mbu) after each
  iteration.
A disaggregated request is drawn on its decode replica (where it completes), with its prefill replica and KV
transfer in args. Times are microseconds from the start of the run. Works from the tables alone (a SimResult or the
requests/iterations CSVs a run wrote), so it needs nothing from the engine."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

ITERATION_ARGS = ("batch_size", "prefill_tokens", "decode_tokens", "running", "waiting", "kv_alloc_tokens",
                  "kv_cached_tokens", "preemptions", "swap_in_tokens", "swap_out_tokens", "mfu", "mbu")
ITERATIONS_TID = 1


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)           # nanosecond resolution keeps the file small and exact enough


def _plain(v):
    """A JSON-ready scalar: numpy numbers as Python ones, NaN as null (JSON has no NaN)."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def _replica_of(req: pd.DataFrame) -> np.ndarray:
    """The replica each request is drawn on: its decode replica (P/D), its replica (a cluster), else 0."""
    for col in ("decode_replica", "replica"):
        if col in req.columns:
            return req[col].to_numpy(np.int64)
    return np.zeros(len(req), dtype=np.int64)


def _slice_name(prefill: int, decode: int) -> str:
    if prefill and decode:
        return "mixed"
    if prefill:
        return "prefill"
    return "decode" if decode else "other"          # an iteration of swaps or waiting only


def trace_events(requests: pd.DataFrame, iterations: pd.DataFrame, title: str = "servesim") -> list[dict]:
    """The trace's events, in the order the file lists them (per track, time never goes back)."""
    it = iterations
    reps = it["replica"].to_numpy(np.int64) if "replica" in it.columns else np.zeros(len(it), dtype=np.int64)
    pools = it["pool"].astype(str).to_numpy() if "pool" in it.columns else np.full(len(it), "")
    req_reps = _replica_of(requests)
    known = sorted(set(reps.tolist()) | {int(r) for r in req_reps if r >= 0})
    pool_of = {}
    for r, p in zip(reps.tolist(), pools.tolist()):
        pool_of.setdefault(r, p)
    events: list[dict] = []
    cluster = "replica" in it.columns or "replica" in requests.columns or "decode_replica" in requests.columns
    for r in known:
        pid = r + 1
        label = f"replica {r}" + (f" ({pool_of[r]})" if pool_of.get(r) else "") if cluster else title
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": r}})
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": ITERATIONS_TID,
                       "args": {"name": "iterations"}})
    if -1 in req_reps:                       # requests no replica took (refused before routing)
        events.append({"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "not routed"}})

    end_of_run = 0.0
    if len(it):
        order = np.lexsort((it["start_s"].to_numpy(float), reps))   # per replica, in time order
        start = it["start_s"].to_numpy(float)
        dur = it["duration_s"].to_numpy(float)
        end_of_run = float((start + dur).max())
        cols = {k: it[k].to_numpy() for k in ITERATION_ARGS if k in it.columns}
        for i in order:
            pid = int(reps[i]) + 1
            args = {k: _plain(v[i]) for k, v in cols.items()}
            ts, end = _us(start[i]), _us(start[i] + dur[i])
            events.append({"name": _slice_name(args.get("prefill_tokens", 0), args.get("decode_tokens", 0)),
                           "cat": "iteration", "ph": "X", "ts": ts, "dur": round(end - ts, 3), "pid": pid,
                           "tid": ITERATIONS_TID, "args": args})
        for i in order:                      # counters after the iterations: each its own track, in time order
            pid, ts = int(reps[i]) + 1, _us(start[i] + dur[i])
            for name, keys in (("KV tokens", ("kv_alloc_tokens", "kv_cached_tokens")),
                               ("queue", ("running", "waiting")), ("utilization", ("mfu", "mbu"))):
                vals = {k: _plain(cols[k][i]) for k in keys if k in cols}
                vals = {k: v for k, v in vals.items() if v is not None}
                if vals:
                    events.append({"name": name, "ph": "C", "ts": ts, "pid": pid, "args": vals})

    if len(requests):
        end_of_run = max(end_of_run, float(np.nanmax(requests["arrival_s"].to_numpy(float))))
    events.extend(_request_events(requests, req_reps, end_of_run))
    return events


def _request_events(req: pd.DataFrame, req_reps: np.ndarray, end_of_run: float) -> list[dict]:
    out = []
    arrival = req["arrival_s"].to_numpy(float)
    sched = req["first_scheduled_s"].to_numpy(float)
    first = req["first_token_s"].to_numpy(float)
    done = req["completion_s"].to_numpy(float)
    extra = [c for c in ("prefill_replica", "decode_replica", "kv_transfer_s", "handoff_wait_s")
             if c in req.columns]
    info = {c: req[c].to_numpy() for c in ("prompt_tokens", "output_tokens", "generated_tokens", "status", "cls",
                                           "evictions", "swaps", "ttft_s", "e2e_s", *extra) if c in req.columns}
    ids = req["id"].to_numpy()
    for i in range(len(req)):
        pid = int(req_reps[i]) + 1 if req_reps[i] >= 0 else 0
        rid = int(ids[i])
        a = arrival[i]
        z = done[i] if math.isfinite(done[i]) else max(end_of_run, a)    # unfinished: open to the end of the trace
        common = {"cat": "request", "id": rid, "pid": pid, "tid": 0}
        args = {k: _plain(v[i]) for k, v in info.items()}
        out.append({**common, "name": f"request {rid}", "ph": "b", "ts": _us(a), "args": args})
        # nested phases, each closed before the next opens; a phase the request never reached is left out
        marks = [("queued", a, sched[i]), ("prefill", sched[i], first[i]), ("decode", first[i], z)]
        for name, s, e in marks:
            if not (math.isfinite(s) and math.isfinite(e)):
                break
            out.append({**common, "name": name, "ph": "b", "ts": _us(s)})
            out.append({**common, "name": name, "ph": "e", "ts": _us(e)})
        out.append({**common, "name": f"request {rid}", "ph": "e", "ts": _us(z)})
    return out


def trace_document(result, title: str | None = None) -> dict:
    """The whole trace for a SimResult: events plus what run it was."""
    meta = getattr(result, "meta", {}) or {}
    name = title or str(meta.get("scenario") or "servesim")
    doc = {"traceEvents": trace_events(result.requests, result.iterations, name), "displayTimeUnit": "ms",
           "otherData": {"scenario": name, "policy": str(meta.get("policy") or ""),
                         "costmodel": str(meta.get("costmodel") or ""), "time_unit": "microseconds of simulated time"}}
    return doc


def write_trace(result, path, title: str | None = None) -> int:
    """Write the trace to `path`; returns the number of events."""
    doc = trace_document(result, title)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"), allow_nan=False)
    return len(doc["traceEvents"])
