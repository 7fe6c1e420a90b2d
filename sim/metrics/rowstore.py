"""Finished requests kept as columns (append-only typed arrays), so a long run holds no Python object per request.

A request's row for the request table is final once it completed and its token times were reduced to TBT
statistics; from then on nothing reads the Request object but the table. A replica that retires rows here (a
cluster replica: sim/cluster/cluster.py) keeps about 130 bytes per finished request instead of about 900, and
request_table joins these columns with the live requests' (elementwise float operations: the same values)."""
from __future__ import annotations

from array import array
from operator import attrgetter

import numpy as np

NAN = float("nan")
INT_FIELDS = ("id", "prompt_tokens", "output_tokens", "predicted_output_tokens", "generated", "evictions", "swaps",
              "evicted_tokens", "hit_tokens")
FLOAT_FIELDS = ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s", "tbt_mean", "tbt_p99", "tbt_max")
OBJECT_FIELDS = ("cls", "state", "reason")


# One finished request's row, read in one C call; rows wait as tuples and go to the typed columns SPILL at a time
# (a transpose by zip), which costs a fraction of appending to nineteen arrays one value at a time. A waiting row
# costs about 510 bytes against about 180 in the columns (tracemalloc), and every replica of a load-aware fleet
# holds its own waiting rows at once: 256 keeps that near 128 MB for 1,000 replicas while a spill's fixed cost
# stays small per row.
_ROW = attrgetter(*INT_FIELDS, "arrival_s", "first_scheduled_s", "first_token_s", "completion_s", "tbt", "cls",
                  "state", "reason")
SPILL = 256


class RequestRows:
    """Append-only columns of retired requests: ints and floats in typed arrays, the few strings (class, status,
    reason) shared through a small table of the distinct values."""

    def __init__(self):
        self.ints = {k: array("q") for k in INT_FIELDS}
        self.floats = {k: array("d") for k in FLOAT_FIELDS}
        self.objects = {k: [] for k in OBJECT_FIELDS}
        self._shared: dict = {}
        self._waiting: list = []          # rows not yet in the columns

    def __len__(self) -> int:
        return len(self.ints["id"]) + len(self._waiting)

    def append(self, r) -> None:
        """Take a finished request's row (its TBT statistics already set)."""
        waiting = self._waiting
        waiting.append(_ROW(r))
        if len(waiting) >= SPILL:
            self._spill()

    def _spill(self) -> None:
        """The waiting rows into the columns, in order (the values append took, None times as NaN)."""
        if not self._waiting:
            return
        cols = list(zip(*self._waiting))
        self._waiting = []
        n = len(INT_FIELDS)
        for name, col in zip(INT_FIELDS, cols):
            self.ints[name].extend(col)
        f = self.floats
        f["arrival_s"].extend(cols[n])
        for name, col in zip(("first_scheduled_s", "first_token_s", "completion_s"), cols[n + 1:n + 4]):
            f[name].extend([NAN if v is None else v for v in col])
        for name, col in zip(("tbt_mean", "tbt_p99", "tbt_max"),
                             zip(*[t or (NAN, NAN, NAN) for t in cols[n + 4]])):
            f[name].extend(col)
        shared = self._shared.setdefault
        o = self.objects
        o["cls"].extend([shared(v, v) for v in cols[n + 5]])
        o["state"].extend([shared(v, v) for v in cols[n + 6]])
        o["reason"].extend([shared(v, v) for v in (v or "" for v in cols[n + 7])])

    def columns(self) -> dict:
        """The request table's raw columns (numpy arrays), in retirement order."""
        self._spill()
        # copies: the arrays may grow again (a view would pin their buffers)
        out = {k: np.array(v, dtype=np.int64) for k, v in self.ints.items()}
        out.update({k: np.array(v, dtype=float) for k, v in self.floats.items()})
        out.update({k: np.array(v, dtype=object) for k, v in self.objects.items()})
        return out
