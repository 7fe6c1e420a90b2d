"""A workload's requests made one at a time as the router reaches them, from its table's columns.

A list of Request objects built up front costs about 500 bytes per request before the run starts (10M requests:
5 GB); the cluster reads its requests strictly in arrival order, so it needs only the one it is routing. The
objects made are those requests_from_table (sim/scenario/build.py) makes, in the order the cluster sorts them."""
from __future__ import annotations

import numpy as np

from sim.engine.request import Request


class RequestStream:
    """Indexable like the sorted request list (len, [i]); [i] builds request i on first use and keeps only the
    latest one, which is all the router reads (it reads one request several times, then moves on)."""

    def __init__(self, df):
        cols = df.columns
        arrival = df["arrival_s"].to_numpy()
        ids = np.arange(len(df))
        order = np.lexsort((ids, arrival))        # sorted by (arrival_s, id), as the cluster sorts the list
        self._a = arrival[order]
        self._p = df["prompt_tokens"].to_numpy()[order]
        self._o = df["output_tokens"].to_numpy()[order]
        self._cls = df["cls"].to_numpy()[order] if "cls" in cols else None
        self._pred = df["predicted_output_tokens"].to_numpy()[order] if "predicted_output_tokens" in cols else None
        self._ids = order
        self._at = -1
        self._req = None

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, i: int):
        if i != self._at:
            if not 0 <= i < len(self._ids):
                raise IndexError(i)
            cls, pred = self._cls, self._pred
            self._req = Request(self._ids[i], self._a[i], self._p[i], self._o[i],
                                cls=str(cls[i]) if cls is not None else "default",
                                predicted_output_tokens=None if pred is None else pred[i])
            self._at = i
        return self._req

    def take(self, positions):
        """The requests at these positions (an int array), each made as [i] makes it, without keeping any."""
        cls, pred = self._cls, self._pred
        cols = [self._ids[positions].tolist(), self._a[positions].tolist(), self._p[positions].tolist(),
                self._o[positions].tolist()]
        if cls is None and pred is None:
            for rid, a, p, o in zip(*cols):
                yield Request(rid, a, p, o)
            return
        names = cls[positions].tolist() if cls is not None else ["default"] * len(positions)
        preds = pred[positions].tolist() if pred is not None else [None] * len(positions)
        for rid, a, p, o, c, q in zip(*cols, names, preds):
            yield Request(rid, a, p, o, cls=str(c), predicted_output_tokens=q)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @staticmethod
    def fits(df) -> bool:
        """Can this table stream? Not with shared prompt prefixes (prefix caching binds every request up front)."""
        return "prefix" not in df.columns
