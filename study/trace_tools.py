"""The `servesim trace` subcommands: `stats FILE` summarises a trace, `make SPEC.yaml -o FILE.csv` writes one."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from costmodels.errors import UserError
from sim.paths import output_file


def _columns(pairs) -> dict | None:
    out = {}
    for text in pairs or ():
        if "=" not in text:
            raise UserError(f"--column {text!r}: expected TIDY=SOURCE, e.g. arrival_s=ts")
        k, v = text.split("=", 1)
        out[k.strip()] = v.strip()
    return out or None


def cmd_stats(args) -> int:
    from traces.loaders import load_trace
    from traces.stats import trace_stats
    df = load_trace(args.file, format=args.format, columns=_columns(args.column), time_unit=args.time_unit,
                    skip_bad_rows=args.skip_bad_rows, sort=args.sort, where="trace stats")
    st = trace_stats(df)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    from sim.metrics.units import column_unit
    w = max(map(len, st))
    print(f"{args.file}")
    for k, v in st.items():
        text = f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)
        u = column_unit(k) if text != "nan" else ""
        print(f"  {k:<{w}}  {text:<10}" + (f" {u}" if u else ""))
    return 0


def load_make_spec(path, overrides=()) -> tuple[dict, int]:
    """SPEC.yaml is a workload mapping (with `kind`) or a scenario with `workload:` and `seed:`."""
    from sim.scenario.config import apply_overrides
    p = Path(path)
    from sim.scenario import yamlio
    raw = yamlio.load(yamlio.read_text(p, "spec file"), str(path)) or {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping (a workload spec with kind, or a scenario with workload)")
    raw = apply_overrides(raw, overrides)
    if "workload" in raw:
        return dict(raw["workload"] or {}), _seed(raw.get("seed", 0), f"{path}: seed")
    raw = dict(raw)
    seed = raw.pop("seed", 0)
    return raw, _seed(seed, f"{path}: seed")


def _seed(value, where: str) -> int:
    """A seed as a scenario takes it: an integer >= 0 (numpy's own error was the traceback for -1 or 'x')."""
    from costmodels.values import typed
    value = typed(value, int, where)
    if value < 0:
        raise UserError(f"{where}: expected an integer >= 0, got {value}")
    return value


def cmd_make(args) -> int:
    from traces.registry import build_workload
    from traces.stats import trace_stats
    spec, seed = load_make_spec(args.spec, args.set)
    if args.seed is not None:
        seed = _seed(args.seed, "--seed")
    df = build_workload(spec, np.random.default_rng(seed), f"{args.spec}: workload")
    if "prefix_hashes" in df:  # lists do not fit a CSV cell; keep them as space-separated ids
        df["prefix_hashes"] = [" ".join(map(str, h)) if isinstance(h, (list, tuple)) else h
                               for h in df["prefix_hashes"]]
    if "prefix" in df:         # segments as KEY:TOKENS items (traces/prefix.py), read back by format servesim
        from traces.prefix import format_prefix
        df["prefix"] = [format_prefix(p) for p in df["prefix"]]
    out = output_file(args.out, "-o")
    df.to_csv(out, index=False, float_format="%.6f")
    st = trace_stats(df)
    print(f"wrote {out}: {st['requests']} requests over {st['duration_s']:.4g} s "
          f"({st['rate_rps']:.4g} req/s, inter-arrival CV {st['interarrival_cv']:.3g})")
    return 0


def register(sub) -> None:
    t = sub.add_parser("trace", help="inspect or generate request traces")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser("stats", help="count, duration, rate, inter-arrival CV and length percentiles of a trace")
    s.add_argument("file")
    s.add_argument("--format", default="auto",
                   help="auto (from the columns), azure, burstgpt, mooncake, vidur, splitwise, servesim, csv, jsonl")
    s.add_argument("--column", action="append", metavar="TIDY=SOURCE",
                   help="column mapping for csv/jsonl, e.g. --column arrival_s=ts --column prompt_tokens=in")
    s.add_argument("--time-unit", default=None, help="s, ms, us, ns or datetime (default: the format's own)")
    s.add_argument("--skip-bad-rows", action="store_true", help="drop malformed rows (count printed) instead of "
                                                                "stopping at the first")
    s.add_argument("--sort", action="store_true", help="sort rows by time instead of rejecting backward timestamps")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.set_defaults(func=cmd_stats)
    m = tsub.add_parser("make", help="write a synthetic (or transformed) trace from a workload spec")
    m.add_argument("spec", help="YAML: a workload spec (kind: ...) or a scenario with a workload section")
    m.add_argument("-o", "--out", required=True,
                   help="CSV file to write (arrival_s, prompt_tokens, output_tokens, ...)")
    m.add_argument("--seed", type=int, default=None, help="override the spec's seed")
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    m.set_defaults(func=cmd_make)
