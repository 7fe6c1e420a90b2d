"""SLO regression: a canonical scenarios × policies × rates table, compared against a committed baseline with
per-column tolerances; `servesim regress [--update]`."""
from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from sim.scenario.config import scenario_from_dict
from sim.cluster.runner import run_scenario
from sim.paths import REPO_ROOT

DEFAULT_BASELINE = REPO_ROOT / "tests" / "regression" / "baseline.csv"
KEYS = ("scenario", "policy", "rate")

# Two online workloads on one A100-80GB with a tight KV budget so that preemption and queueing matter.
CANONICAL_SCENARIOS = {
    "chat": {
        "seed": 7, "memory": {"M": 20_000, "block_size": 16},
        "workload": {"kind": "poisson", "num_requests": 300, "prompt": {"dist": "uniform", "low": 16, "high": 512},
                     "output": {"dist": "uniform", "low": 16, "high": 384}},
        "slo": {"ttft_s": 0.5, "tbt_p99_s": 0.1},
    },
    "long-prompt": {
        "seed": 11, "memory": {"M": 30_000, "block_size": 16},
        "workload": {"kind": "poisson", "num_requests": 200,
                     "prompt": {"dist": "uniform", "low": 512, "high": 2048},
                     "output": {"dist": "uniform", "low": 16, "high": 256}},
        "slo": {"ttft_s": 1.0, "tbt_p99_s": 0.15},
    },
}
CANONICAL_POLICIES = ("vllm", "sarathi", "vllm-v1", "sarathi-p=c")
CANONICAL_RATES = {"chat": (4.0, 12.0, 24.0), "long-prompt": (1.0, 4.0, 8.0)}


@dataclass(frozen=True)
class Tolerance:
    """A metric moves when |new − old| > abs + rel·|old| (runs are deterministic, so both are tight)."""
    abs: float
    rel: float

    def moved(self, old: float, new: float) -> bool:
        if isinstance(old, float) and math.isnan(old) or isinstance(new, float) and math.isnan(new):
            return not (isinstance(old, float) and math.isnan(old) and isinstance(new, float) and math.isnan(new))
        return abs(new - old) > self.abs + self.rel * abs(old)


# Stated per column; fractions in absolute terms, times and rates relative (1e-3 absorbs float summation order).
TOLERANCES = {
    "slo_attainment": Tolerance(0.005, 0.0),
    "ttft_p50_s": Tolerance(1e-6, 1e-3),
    "ttft_p99_s": Tolerance(1e-6, 1e-3),
    "tbt_p50_s": Tolerance(1e-6, 1e-3),
    "tbt_p99_s": Tolerance(1e-6, 1e-3),
    "tps": Tolerance(0.0, 1e-3),
    "completed": Tolerance(0, 0),
    "evictions": Tolerance(0, 0.02),
}
METRICS = tuple(TOLERANCES)


def scenario_dict(name: str, policy: str, rate: float, costmodel: dict | None = None,
                  policy_knobs: dict | None = None) -> dict:
    raw = copy.deepcopy(CANONICAL_SCENARIOS[name])
    raw["name"] = name
    raw["workload"]["rate"] = rate
    raw["policy"] = {"name": policy, **(policy_knobs or {})}
    raw["sim"] = {"record_iterations": False}
    if costmodel:
        raw["costmodel"] = costmodel
    return raw


def metrics_row(res) -> dict:
    """The regression metrics of one run (TBT: per-request mean gap at p50, per-request p99 gap at p99)."""
    s, req = res.summary, res.requests
    done = req[req["status"] == "done"]
    tbt_mean = done["tbt_mean_s"].dropna().to_numpy()
    tbt_p99 = done["tbt_p99_s"].dropna().to_numpy()
    return {"slo_attainment": s["slo_attainment"], "ttft_p50_s": s["ttft_p50"], "ttft_p99_s": s["ttft_p99"],
            "tbt_p50_s": float(np.percentile(tbt_mean, 50)) if len(tbt_mean) else float("nan"),
            "tbt_p99_s": float(np.percentile(tbt_p99, 99)) if len(tbt_p99) else float("nan"),
            "tps": s["tps"], "completed": s["completed"], "evictions": s["evictions"]}


def compute_table(scenarios=None, policies=None, costmodel: dict | None = None,
                  policy_knobs: dict | None = None) -> pd.DataFrame:
    """Run the canonical grid (or a subset) and return one row per (scenario, policy, rate)."""
    rows = []
    for name in scenarios or CANONICAL_SCENARIOS:
        for policy in policies or CANONICAL_POLICIES:
            for rate in CANONICAL_RATES[name]:
                raw = scenario_dict(name, policy, rate, costmodel, policy_knobs)
                res = run_scenario(scenario_from_dict(raw, source=f"regress:{name}"))
                rows.append({"scenario": name, "policy": policy, "rate": rate, **metrics_row(res)})
    return pd.DataFrame(rows, columns=list(KEYS) + list(METRICS))


def load_baseline(path=DEFAULT_BASELINE) -> pd.DataFrame:
    """The committed table, or one line saying why a file is not one (a CSV of something else was a KeyError)."""
    try:
        table = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a regress baseline ({type(e).__name__}: {str(e).strip()})") from None
    missing = [c for c in (*KEYS, *METRICS) if c not in table.columns]
    if missing:
        raise UserError(f"{path}: not a regress baseline (no column(s) {', '.join(missing)}); write one with "
                        f"`servesim regress --update --baseline PATH` at a new path")
    return table


def compare(baseline: pd.DataFrame, current: pd.DataFrame) -> list[dict]:
    """Every (scenario, policy, rate, metric) that moved beyond its tolerance, plus rows present on one side only.
    Only rows present in `current` are compared against the baseline (a subset run checks its subset)."""
    base = {tuple(r[k] for k in KEYS): r for r in baseline.to_dict("records")}
    diffs = []
    for row in current.to_dict("records"):
        key = tuple(row[k] for k in KEYS)
        old = base.get(key)
        if old is None:
            diffs.append({"scenario": key[0], "policy": key[1], "rate": key[2], "metric": "(row)",
                          "old": "absent", "new": "present", "tolerance": "-"})
            continue
        for m in METRICS:
            tol = TOLERANCES[m]
            if tol.moved(float(old[m]), float(row[m])):
                diffs.append({"scenario": key[0], "policy": key[1], "rate": key[2], "metric": m, "old": old[m],
                              "new": row[m], "tolerance": f"±{tol.abs:g} abs + {tol.rel:g} rel"})
    return diffs


def missing_rows(baseline: pd.DataFrame, current: pd.DataFrame) -> list[tuple]:
    have = {tuple(r[k] for k in KEYS) for r in current.to_dict("records")}
    return [k for k in (tuple(r[k] for k in KEYS) for r in baseline.to_dict("records")) if k not in have]


def _num(v) -> str:
    return f"{v:.6g}" if isinstance(v, (int, float)) else str(v)


def format_diff(diffs: list[dict]) -> str:
    """A readable table: one line per moved number, naming scenario, policy, rate and metric."""
    if not diffs:
        return "no SLO regression: every number is within its tolerance"
    head = ("scenario", "policy", "rate", "metric", "baseline", "now", "change", "tolerance")
    lines = []
    for d in diffs:
        change = ""
        if isinstance(d["old"], (int, float)) and isinstance(d["new"], (int, float)):
            delta = float(d["new"]) - float(d["old"])
            change = f"{delta:+.4g}" + (f" ({100 * delta / abs(float(d['old'])):+.2f}%)" if d["old"] else "")
        lines.append((d["scenario"], d["policy"], _num(d["rate"]), d["metric"], _num(d["old"]), _num(d["new"]),
                      change, d["tolerance"]))
    w = [max(len(h), *(len(str(l[i])) for l in lines)) for i, h in enumerate(head)]
    out = [f"{len(diffs)} number(s) moved beyond tolerance:",
           "  ".join(h.ljust(w[i]) for i, h in enumerate(head))]
    out += ["  ".join(str(v).ljust(w[i]) for i, v in enumerate(l)) for l in lines]
    return "\n".join(out)


def write_baseline(table: pd.DataFrame, path=DEFAULT_BASELINE) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, float_format="%.9g")


def cmd_regress(args) -> int:
    path = Path(args.baseline)
    # the baseline is read before the table is computed: a wrong path is said at once, and --update never
    # overwrites a file that is not a baseline
    if not path.exists():
        if not args.update:
            print(f"servesim: error: no baseline at {path}; create it with `servesim regress --update`",
                  file=sys.stderr)
            return 2
        current = compute_table()
        write_baseline(current, path)
        print(f"wrote a new baseline of {len(current)} rows to {path}")
        return 0
    baseline = load_baseline(path)
    current = compute_table()
    diffs = compare(baseline, current)
    gone = missing_rows(baseline, current)
    print(format_diff(diffs))
    if gone:
        print(f"{len(gone)} baseline row(s) no longer computed: {gone[:5]}")
    if args.update:
        write_baseline(current, path)
        print(f"updated {path} ({len(current)} rows; {len(diffs)} change(s) recorded)")
        return 0
    return 1 if diffs or gone else 0


def register(sub) -> None:
    p = sub.add_parser("regress", help="recompute the canonical SLO table and diff it against the baseline")
    p.add_argument("--update", action="store_true", help="rewrite the baseline on purpose and print what changed")
    p.add_argument("--baseline", default=str(DEFAULT_BASELINE), help="baseline CSV path")
    p.set_defaults(func=cmd_regress)
