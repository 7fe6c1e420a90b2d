"""Synthetic workloads: an arrival process (offline, Poisson, Gamma, constant, on/off) times length generators."""
from __future__ import annotations

import pandas as pd

from costmodels.errors import UserError
from traces.arrivals import PROCESSES, draw_arrivals
from traces.lengths import draw_lengths  # noqa: F401  (re-exported: older code imports it from here)
from traces.registry import register_workload

LENGTH_KEYS = ("num_requests", "prompt", "output", "lengths_from", "cls")


def _check_keys(spec, allowed, where):
    bad = set(spec) - set(allowed)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: kind, predictor, "
                        f"{', '.join(allowed)}")


def requests_table(arrivals, spec, rng, where) -> pd.DataFrame:
    """Lengths for the given arrivals: `prompt`/`output` generators, or (prompt, output) pairs resampled jointly
    from a trace (`lengths_from`), which keeps the trace's input/output correlation."""
    n = len(arrivals)
    if spec.get("lengths_from") is not None:
        if "prompt" in spec or "output" in spec:
            raise UserError(f"{where}: give either lengths_from or prompt/output, not both")
        from traces.loaders import load_trace
        src = spec["lengths_from"]
        if not isinstance(src, dict):
            raise UserError(f"{where}.lengths_from: expected a mapping like {{path: FILE, format: azure}}")
        trace = load_trace(where=f"{where}.lengths_from", **src)
        pick = rng.integers(0, len(trace), size=n)
        prompt, output = (trace[c].to_numpy()[pick] for c in ("prompt_tokens", "output_tokens"))
    else:
        prompt = draw_lengths(spec.get("prompt", 128), n, rng, f"{where}.prompt")
        output = draw_lengths(spec.get("output", 128), n, rng, f"{where}.output")
    df = pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompt, "output_tokens": output})
    if spec.get("cls") is not None:
        df["cls"] = str(spec["cls"])
    return df


MAX_REQUESTS = 10 ** 9     # a request table row costs ~100 bytes; past this no machine holds the run


def _count(spec, where, default, key: str = "num_requests"):
    n = spec.get(key, default)
    if isinstance(n, float) and n.is_integer() and abs(n) <= MAX_REQUESTS:
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"{where}.{key}: expected an integer >= 1, got {n!r}")
    if n > MAX_REQUESTS:
        raise UserError(f"{where}.{key}: {n} requests is more than the {MAX_REQUESTS:.0e} a run can hold")
    return n


@register_workload("synthetic")
def synthetic(spec, rng, where):
    """`arrival: {process: ..., knobs}` plus lengths; the general form of the per-process kinds below."""
    _check_keys(spec, LENGTH_KEYS + ("arrival",), where)
    n = _count(spec, where, 1000)
    arrivals = draw_arrivals(spec.get("arrival") or {"process": "poisson", "rate": 1.0}, n, rng, f"{where}.arrival")
    return requests_table(arrivals, spec, rng, where)


def _process_kind(process: str, default_n: int):
    keys = PROCESSES[process][1]

    def build(spec, rng, where):
        _check_keys(spec, LENGTH_KEYS + keys, where)
        n = _count(spec, where, default_n)
        arrivals = draw_arrivals({"process": process, **{k: spec[k] for k in keys if k in spec}}, n, rng, where)
        return requests_table(arrivals, spec, rng, where)
    build.__doc__ = f"{process} arrivals ({PROCESSES[process][0].__doc__.splitlines()[0]}) with generated lengths."
    return build


# `kind: poisson` with rate, prompt, output (and the other processes the same way, knobs at the top level).
for _name in PROCESSES:
    register_workload(_name)(_process_kind(_name, 1024 if _name == "offline" else 1000))
