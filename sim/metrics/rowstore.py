"""Finished requests kept as columns (append-only typed arrays), so a long run holds no Python object per request.

A request's row for the request table is final once it completed and its token times were reduced to TBT
statistics; from then on nothing reads the Request object but the table. A replica that retires rows here (a
cluster replica: sim/cluster/cluster.py) keeps about 130 bytes per finished request instead of about 900, and
request_table joins these columns with the live requests' (elementwise float operations: the same values)."""
from __future__ import annotations

from array import array

import numpy as np

NAN = float("nan")
INT_FIELDS = ("id", "prompt_tokens", "output_tokens", "predicted_output_tokens", "generated", "evictions", "swaps",
              "evicted_tokens", "hit_tokens")
FLOAT_FIELDS = ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s", "tbt_mean", "tbt_p99", "tbt_max")
OBJECT_FIELDS = ("cls", "state", "reason")


class RequestRows:
    """Append-only columns of retired requests: ints and floats in typed arrays, the few strings (class, status,
    reason) shared through a small table of the distinct values."""

    def __init__(self):
        self.ints = {k: array("q") for k in INT_FIELDS}
        self.floats = {k: array("d") for k in FLOAT_FIELDS}
        self.objects = {k: [] for k in OBJECT_FIELDS}
        self._shared: dict = {}

    def __len__(self) -> int:
        return len(self.ints["id"])

    def append(self, r) -> None:
        """Take a finished request's row (its TBT statistics already set)."""
        i, f, o, shared = self.ints, self.floats, self.objects, self._shared
        i["id"].append(r.id)
        i["prompt_tokens"].append(r.prompt_tokens)
        i["output_tokens"].append(r.output_tokens)
        i["predicted_output_tokens"].append(r.predicted_output_tokens)
        i["generated"].append(r.generated)
        i["evictions"].append(r.evictions)
        i["swaps"].append(r.swaps)
        i["evicted_tokens"].append(r.evicted_tokens)
        i["hit_tokens"].append(r.hit_tokens)
        f["arrival_s"].append(r.arrival_s)
        for name in ("first_scheduled_s", "first_token_s", "completion_s"):
            v = getattr(r, name)
            f[name].append(NAN if v is None else v)
        mean, p99, top = r.tbt or (NAN, NAN, NAN)
        f["tbt_mean"].append(mean)
        f["tbt_p99"].append(p99)
        f["tbt_max"].append(top)
        for name, v in (("cls", r.cls), ("state", r.state), ("reason", r.reason or "")):
            o[name].append(shared.setdefault(v, v))

    def columns(self) -> dict:
        """The request table's raw columns (numpy arrays), in retirement order."""
        # copies: the arrays may grow again (a view would pin their buffers)
        out = {k: np.array(v, dtype=np.int64) for k, v in self.ints.items()}
        out.update({k: np.array(v, dtype=float) for k, v in self.floats.items()})
        out.update({k: np.array(v, dtype=object) for k, v in self.objects.items()})
        return out
