"""Per-request token-time statistics: TBT mean, p99 and max from a request's token times, numpy's floats exactly."""
from __future__ import annotations

import math
from array import array

import numpy as np

NAN = float("nan")


def finalize_request(r, keep_token_times: bool = False, tail=None) -> None:
    """Reduce a finished request's token times (r.token_times, then the float array `tail` if given: the decode
    cohort's) to its TBT statistics, exactly as numpy's mean and percentile of np.diff would; memory stays flat."""
    if r.spans:
        (_, tail), = unspan([(r, () if tail is None else tail)])
    t = np.array(r.token_times, dtype=float) if tail is None else np.concatenate((r.token_times, tail))
    n = len(t) - 1                         # gaps
    if n > 0:
        gaps = t[1:] - t[:-1]              # np.diff's values, without its overhead
        # Only the top ~1% order statistics are needed (p99's neighbours and the max): a partition, not a sort.
        lo = math.floor((n - 1) * 0.99)
        top = sorted(np.partition(gaps, lo)[lo:].tolist())
        # np.mean is add.reduce divided by the count: the same pairwise sum, the same division.
        r.tbt = (float(np.add.reduce(gaps)) / n, _p99(n, top.__getitem__, lo), top[-1])
    else:
        r.tbt = (NAN, NAN, NAN)
    if keep_token_times:
        if tail is not None:
            r.token_times = t.tolist()
    else:
        r.token_times = [float(t[0]), float(t[-1])] if len(t) else []


def finalize_many(items, keep_token_times: bool = False) -> None:
    """finalize_request for many (request, tail) pairs at once, the same floats: requests with equal token
    counts go through numpy together, row-wise (add.reduce along rows is the same pairwise sum as on one row)."""
    if any(r.spans for r, _ in items):
        items = unspan(items)
    by_count: dict = {}
    for r, tail in items:
        by_count.setdefault(len(r.token_times) + len(tail), []).append((r, tail))
    for m, group in by_count.items():
        if m < 2 or len(group) == 1:
            for r, tail in group:
                finalize_request(r, keep_token_times, tail)
            continue
        t = np.empty((len(group), m))
        for row, (r, tail) in zip(t, group):
            h = len(r.token_times)
            row[:h] = r.token_times
            row[h:] = tail
        n = m - 1
        gaps = t[:, 1:] - t[:, :-1]
        lo = math.floor((n - 1) * 0.99)
        top = np.sort(np.partition(gaps, lo, axis=1)[:, lo:], axis=1)
        # Elementwise numpy float operations are the scalar ones: each row gets finalize_request's floats.
        stats = zip((np.add.reduce(gaps, axis=1) / n).tolist(), _p99(n, lambda i: top[:, i], lo).tolist(),
                    top[:, -1].tolist())
        for (r, _), tbt, times in zip(group, stats, t.tolist() if keep_token_times else t[:, [0, -1]].tolist()):
            r.tbt = tbt
            r.token_times = times


def unspan(items) -> list:
    """(request, tail) pairs as finalize_many takes them, each request's deferred token times written out: a
    speculative window (sim/engine/specwalk.py) leaves a request (at, ends, counts) in r.spans for the times it
    would have appended, ends[s] counts[s] times for each of its steps, at position `at` of r.token_times. Such a
    request's whole times (its own list with the runs put in, then the tail) become its tail, its list empty:
    one np.repeat over them all, the floats the appends would have made."""
    vals, reps, starts, out = [], [], [], []
    spanned = []
    for r, tail in items:
        if not r.spans:
            out.append((r, tail))
            continue
        starts.append(len(reps))
        spanned.append(len(out))
        out.append(r)
        times, done = r.token_times, 0
        for at, ends, counts in r.spans:
            if at > done:                      # times appended one by one before this run
                vals += times[done:at]
                reps += [1] * (at - done)
                done = at
            vals += ends
            reps += counts[:len(ends)]         # (a window's counts may run past the steps it took)
        rest = [*times[done:], *tail]
        vals += rest
        reps += [1] * len(rest)
        r.token_times, r.spans = [], None
    if spanned:
        # (bytes and array unbox in C, without numpy's per-item type discovery; tokens per step are few)
        try:
            reps = np.frombuffer(bytes(reps), np.uint8)
        except ValueError:
            reps = np.frombuffer(array("q", reps), np.int64)
        flat = np.repeat(np.frombuffer(array("d", vals)), reps)
        ends = np.add.reduceat(reps, starts, dtype=np.int64).cumsum().tolist()
        for i, a, b in zip(spanned, [0] + ends, ends):
            out[i] = (out[i], flat[a:b])
    return out


def settle_spans(reqs) -> None:
    """Write deferred token times (Request.spans) into the token_times lists of requests that did not finish."""
    for r in reqs:
        if r.spans:
            (_, t), = unspan([(r, ())])
            r.token_times = t.tolist()


def p99_sorted(x: list) -> float:
    """np.percentile(x, 99) for a sorted list, with numpy's own float steps (same value, ~7x faster per call)."""
    return _p99(len(x), x.__getitem__)


def _p99(n: int, at, first: int = 0) -> float:
    """np.percentile(·, 99) of n values whose i-th smallest is at(i - first).

    numpy's default 'linear' method: virtual index (n-1)·q, then its lerp that counts back from the upper
    neighbour when the fraction is at least one half."""
    virtual = (n - 1) * 0.99
    lo = math.floor(virtual)
    if lo >= n - 1:
        return at(n - 1 - first)
    frac = virtual - lo
    a, b = at(lo - first), at(lo + 1 - first)
    diff = b - a
    return b - diff * (1 - frac) if frac >= 0.5 else a + diff * frac
