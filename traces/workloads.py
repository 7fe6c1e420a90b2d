"""Workload kinds built on the loaders and generators: trace replay, InferMax mixes, request classes, BROS RT+BE."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from traces.arrivals import draw_arrivals, scale_to_rate
from traces.lengths import INFERMAX_L, INFERMAX_S, infermax_mix
from traces.loaders import FORMATS, load_trace
from traces.registry import build_workload, register_workload
from traces.synthetic import _check_keys, _count, requests_table

LOADER_KEYS = ("path", "format", "columns", "time_unit", "skip_bad_rows", "sort", "model", "log_type",
               "keep_failed")


@register_workload("trace")
def trace(spec, rng, where):
    """Replay a trace file with its own timestamps, optionally windowed, time-scaled to `rate`, or re-timed by an
    arrival process (`arrival`) that keeps the trace's lengths."""
    _check_keys(spec, LOADER_KEYS + ("start_s", "duration_s", "max_requests", "rate", "arrival", "cls",
                                     "hash_block_tokens"), where)
    df = load_trace(where=where, **{k: spec[k] for k in LOADER_KEYS if k in spec})
    if "prefix_hashes" in df and "prefix" not in df:    # content named per block (Mooncake): segments
        from traces.prefix import prefix_from_hashes
        bt = spec.get("hash_block_tokens", 512)
        if isinstance(bt, bool) or not isinstance(bt, int) or bt < 1:
            raise UserError(f"{where}.hash_block_tokens: expected an integer >= 1, got {bt!r}")
        df["prefix"] = [prefix_from_hashes(h, p, bt, f"{where}: prefix_hashes", i)
                        for i, (h, p) in enumerate(zip(df["prefix_hashes"], df["prompt_tokens"]))]
    start = float(spec.get("start_s", 0.0))
    if start or spec.get("duration_s") is not None:
        end = start + float(spec["duration_s"]) if spec.get("duration_s") is not None else np.inf
        df = df[(df["arrival_s"] >= start) & (df["arrival_s"] < end)].reset_index(drop=True)
        if not len(df):
            raise UserError(f"{where}: no requests in the window start_s={start} duration_s={spec.get('duration_s')}")
        df["arrival_s"] -= df["arrival_s"].iloc[0]
    if spec.get("max_requests") is not None:
        df = df.iloc[: _count(spec, where, 1, "max_requests")].copy()
    if spec.get("rate") is not None and spec.get("arrival") is not None:
        raise UserError(f"{where}: give either rate (time-scale the trace) or arrival (replace its timing), not both")
    if spec.get("rate") is not None:
        df["arrival_s"] = scale_to_rate(df["arrival_s"].to_numpy(), float(spec["rate"]), f"{where}.rate")
    elif spec.get("arrival") is not None:
        df["arrival_s"] = draw_arrivals(spec["arrival"], len(df), rng, f"{where}.arrival")
    if spec.get("cls") is not None:
        df["cls"] = str(spec["cls"])
    return df


def _format_kind(fmt: str):
    def build(spec, rng, where):
        if spec.get("format", fmt) != fmt:
            raise UserError(f"{where}.format: kind {fmt} reads format {fmt}; use kind: trace for another")
        return trace({**spec, "format": fmt}, rng, where)
    build.__doc__ = f"`kind: {fmt}` is `kind: trace` with `format: {fmt}`."
    return build


# Every loader is nameable directly: `kind: azure`, `kind: burstgpt`, `kind: mooncake`, ...
for _fmt in FORMATS:
    register_workload(_fmt)(_format_kind(_fmt))


@register_workload("infermax-mix")
def infermax(spec, rng, where):
    """InferMax §4.7: two (or more) of SISO/SILO/LISO/LILO, shuffled; offline unless `arrival` says otherwise.
    The type becomes the request class, so per-type metrics come for free."""
    _check_keys(spec, ("types", "num_requests", "weights", "short", "long", "arrival", "label_class"), where)
    n = _count(spec, where, 1024)
    arrivals = draw_arrivals(spec.get("arrival") or {"process": "offline"}, n, rng, f"{where}.arrival")
    prompt, output, labels = infermax_mix(spec.get("types"), n, rng, where, spec.get("weights"),
                                          spec.get("short", INFERMAX_S), spec.get("long", INFERMAX_L))
    df = pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompt, "output_tokens": output})
    if spec.get("label_class", True):
        df["cls"] = labels
    return df


def _sub_rng(rng, name: str) -> np.random.Generator:
    """An independent stream per class, so adding a class never changes another class's draws."""
    ss = getattr(rng.bit_generator, "seed_seq", None)
    if ss is None:  # a generator built without a SeedSequence: fall back to a draw from it
        return np.random.default_rng([int(rng.integers(2 ** 63)), *map(ord, name)])
    return np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, *map(ord, name))))


def merge_classes(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = [df.assign(cls=name) for name, df in parts.items()]
    df = pd.concat(frames, ignore_index=True)
    if "predicted_output_tokens" in df:
        # Classes without a predictor are known exactly, which is what a Request assumes when none is given.
        df["predicted_output_tokens"] = (df["predicted_output_tokens"].fillna(df["output_tokens"])
                                         .astype(np.int64))
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


@register_workload("classes")
def classes(spec, rng, where):
    """Several request classes, each any workload (with its own predictor if wanted), merged by arrival time;
    the class name goes in `cls`, and `slo.classes.NAME` gives its SLOs."""
    _check_keys(spec, ("classes",), where)
    cl = spec.get("classes")
    if not isinstance(cl, dict) or not cl:
        raise UserError(f"{where}.classes: expected a mapping of class name -> workload spec")
    parts = {}
    for name, sub in cl.items():
        if not isinstance(sub, dict):
            raise UserError(f"{where}.classes.{name}: expected a workload mapping with a kind")
        parts[str(name)] = build_workload(sub, _sub_rng(rng, str(name)), f"{where}.classes.{name}")
    return merge_classes(parts)


# BROS §7.1: ShareGPT-like RT lengths (lognormal fallback matching its Table 2 moments) and FlexGen-style BE.
BROS_RT_DEFAULT = {"prompt": {"dist": "lognormal", "mu": 4.9844, "sigma": 0.9184},
                   "output": {"dist": "lognormal", "mu": 5.0387, "sigma": 0.9152}}
BROS_BE_KEYS = ("batch_size", "num_batches", "period_s", "start_s", "prompt", "output")


def best_effort_batches(spec, rng, where) -> pd.DataFrame:
    """Batch-API style BE jobs: `num_batches` batches of `batch_size`, one every `period_s` from `start_s`.
    BROS submits the next batch when the previous completes (closed loop); a request table cannot see
    completions, so the period stands in for it (choose it near the batch's service time)."""
    _check_keys(spec, BROS_BE_KEYS, where)
    size = _count({"num_requests": spec.get("batch_size", 64)}, f"{where}.batch_size", 64)
    nb = _count({"num_requests": spec.get("num_batches", 1)}, f"{where}.num_batches", 1)
    period = float(spec.get("period_s", 60.0))
    arrivals = float(spec.get("start_s", 0.0)) + np.repeat(np.arange(nb) * period, size)
    lengths = {"prompt": spec.get("prompt", {"dist": "uniform", "low": 512, "high": 1024}),
               "output": spec.get("output", {"dist": "uniform", "low": 32, "high": 128})}
    return requests_table(arrivals, lengths, rng, where)


@register_workload("bros")
def bros(spec, rng, where):
    """Real-time requests (`rt`: any workload; default Poisson at `rt_rate` with ShareGPT-like lengths) plus
    best-effort batches (`be`), classes 'rt' and 'be' (pair with slo.classes.rt: {preset: bros})."""
    _check_keys(spec, ("rt", "rt_rate", "num_rt", "be"), where)
    rt = spec.get("rt")
    if rt is None:
        if spec.get("rt_rate") is None:
            raise UserError(f"{where}: give rt (a workload spec) or rt_rate (Poisson, ShareGPT-like lengths)")
        rt = {"kind": "poisson", "rate": spec["rt_rate"], "num_requests": spec.get("num_rt", 1000),
              **BROS_RT_DEFAULT}
    parts = {"rt": build_workload(rt, _sub_rng(rng, "rt"), f"{where}.rt"),
             "be": best_effort_batches(dict(spec.get("be") or {}), _sub_rng(rng, "be"), f"{where}.be")}
    return merge_classes(parts)
