"""Timing one callable without Python in the loop: CUDA-graph replay of many calls, with eager and CPU timers."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

# A replayed graph should run well past launch and event overheads (a few microseconds) but stay short enough that a
# few thousand rows fit in a GPU check of a few minutes.
TARGET_GRAPH_MS = 2.0
MAX_CALLS = 256


@dataclass
class Timed:
    """Per-call milliseconds of `repeats` measurements and how they were taken.
    mode: 'graph' (one CUDA graph of `calls` calls, replayed; per call = graph time / calls), 'eager' (CUDA events
    around one Python call), 'cpu' (wall clock around one call)."""
    per_call_ms: list
    mode: str
    calls: int = 1
    note: str = field(default="")

    @property
    def median(self) -> float:
        return statistics.median(self.per_call_ms)


def calls_per_graph(estimate_ms: float, target_ms: float = TARGET_GRAPH_MS, max_calls: int = MAX_CALLS) -> int:
    """How many calls one graph holds so that a replay lasts about `target_ms` (at least 1, at most `max_calls`)."""
    if not estimate_ms > 0:
        return max_calls
    return int(max(1, min(max_calls, round(target_ms / estimate_ms))))


def per_call_times(graph_ms, calls: int) -> list:
    """Replay times of a graph of `calls` calls → per-call times."""
    if calls < 1:
        raise ValueError("calls must be >= 1")
    return [t / calls for t in graph_ms]


class CpuTimer:
    mode = "cpu"

    def time(self, fn, repeats: int, warmup: int = 2) -> Timed:
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return Timed(ts, "cpu")


class EagerCudaTimer:
    """CUDA events around one Python call: what the first harness measured (launch and dispatch included)."""
    mode = "eager"

    def __init__(self, torch):
        self.torch = torch

    def time(self, fn, repeats: int, warmup: int = 3) -> Timed:
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return Timed(ts, "eager")


class GraphCudaTimer:
    """Captures `calls` back-to-back calls of fn in one CUDA graph and times its replays, as an engine's decode graph
    runs: no Python, no launch gaps beyond the GPU's own. Falls back to eager timing (and says so in `note`) when the
    callable cannot be captured (a host sync, a data-dependent shape)."""
    mode = "graph"

    def __init__(self, torch, target_ms: float = TARGET_GRAPH_MS, max_calls: int = MAX_CALLS):
        self.torch, self.target_ms, self.max_calls = torch, target_ms, max_calls
        self.eager = EagerCudaTimer(torch)
        self.failures = 0

    def time(self, fn, repeats: int, warmup: int = 3) -> Timed:
        torch = self.torch
        est = self.eager.time(fn, 3, warmup=warmup).median    # warms up on the current stream, sizes the graph
        calls = calls_per_graph(est, self.target_ms, self.max_calls)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):      # capture wants allocations warmed on a side stream first
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
        except Exception as e:   # noqa: BLE001 — any capture failure means: time it eager, and record why
            self.failures += 1
            torch.cuda.synchronize()
            t = self.eager.time(fn, repeats, warmup=1)
            t.note = f"graph capture failed ({type(e).__name__}); timed eager"
            return t
        graph.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        del graph
        return Timed(per_call_times(ts, calls), "graph", calls)


def make_timer(torch, device: str, timing: str):
    """timing: 'graph' (default on CUDA), 'eager', or anything on CPU (wall clock)."""
    if device != "cuda" or torch is None:
        return CpuTimer()
    return EagerCudaTimer(torch) if timing == "eager" else GraphCudaTimer(torch)
