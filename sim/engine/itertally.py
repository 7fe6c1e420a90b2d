"""Running per-iteration totals for the run summary when the per-iteration table is not kept (long runs)."""
from __future__ import annotations


class IterationTally:
    """Count, sums and maximum of the iteration columns the summary uses; memory stays flat with run length."""
    __slots__ = ("iterations", "batch_size", "running", "kv_alloc_tokens", "kv_alloc_max")

    def __init__(self):
        self.iterations = 0
        self.batch_size = 0
        self.running = 0
        self.kv_alloc_tokens = 0
        self.kv_alloc_max = 0

    def add(self, batch_size: int, running: int, kv_alloc_tokens: int, count: int = 1) -> None:
        """`count` identical iterations (fast-forward passes its stretch in a few calls)."""
        self.iterations += count
        self.batch_size += batch_size * count
        self.running += running * count
        self.kv_alloc_tokens += kv_alloc_tokens * count
        if kv_alloc_tokens > self.kv_alloc_max:
            self.kv_alloc_max = kv_alloc_tokens

    def summary(self, capacity_tokens: int) -> dict:
        n = self.iterations
        if not n:
            return {"iterations": 0}
        return {"iterations": n, "batch_size_mean": self.batch_size / n, "running_mean": self.running / n,
                "kv_util_mean": self.kv_alloc_tokens / n / capacity_tokens,
                "kv_util_max": self.kv_alloc_max / capacity_tokens}
