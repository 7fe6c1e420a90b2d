"""Capacity search: the highest request rate whose SLO attainment meets a target (effective throughput, goodput)."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from costmodels.errors import UserError
from sim.paths import output_dir
from sim.scenario.config import scenario_from_dict
from study.executors import run_tasks
from study.intervals import parse_seeds
from study.sweep import add_parallel_args, load_sweep_base, set_field, write_table


@dataclass
class CapacityResult:
    """Outcome of one search. The threshold lies in [capacity_rps, bracket_hi) when attainment falls with rate."""
    capacity_rps: float               # highest rate verified to meet the target (0.0 if even rate_min misses)
    bracket_hi: float | None          # lowest rate verified to miss it (None if rate_max still meets it)
    status: str                       # ok | below_min | at_max
    evaluations: list = field(default_factory=list)   # (rate, attainment) in the order they were run


def search_capacity(evaluate, target: float, start: float, *, rate_min: float, rate_max: float,
                    rel_tol: float = 0.02, abs_tol: float = 0.0, growth: float = 2.0,
                    max_evals: int = 60) -> CapacityResult:
    """Bracket the target crossing by multiplying/dividing the rate by `growth`, then bisect.

    Stops when bracket_hi - capacity <= max(abs_tol, rel_tol * bracket_hi): the returned capacity is then within
    that tolerance below the true threshold (for attainment monotone in rate)."""
    if not 0 < rate_min <= rate_max:
        raise UserError(f"capacity: need 0 < rate_min <= rate_max, got {rate_min}, {rate_max}")
    if growth <= 1:
        raise UserError(f"capacity: growth must be > 1, got {growth}")
    evals = []

    def meets(rate):
        if len(evals) >= max_evals:
            raise UserError(f"capacity: no convergence within {max_evals} evaluations; loosen --tol")
        att = float(evaluate(rate))
        evals.append((rate, att))
        return att >= target

    r = min(max(start, rate_min), rate_max)
    if meets(r):
        lo, hi = r, None
        while hi is None:
            nxt = min(lo * growth, rate_max)
            if nxt <= lo:                                   # lo is rate_max and meets the target
                return CapacityResult(lo, None, "at_max", evals)
            if meets(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = None, r
        while lo is None:
            nxt = max(hi / growth, rate_min)
            if nxt >= hi:                                   # hi is rate_min and misses the target
                return CapacityResult(0.0, hi, "below_min", evals)
            if meets(nxt):
                lo = nxt
            else:
                hi = nxt
    while hi - lo > max(abs_tol, rel_tol * hi):
        mid = 0.5 * (lo + hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return CapacityResult(lo, hi, "ok", evals)


# -- the simulated evaluation ------------------------------------------------------------------------------------
def attainment_at(base: dict, source: str, rate: float, metric: str) -> float:
    """SLO attainment of one run of `base` with workload.rate = rate (same seed: arrivals scale with 1/rate)."""
    from sim.cluster.runner import run_scenario
    raw = dict(base)
    raw["workload"] = {**(base.get("workload") or {}), "rate": float(rate)}
    res = run_scenario(scenario_from_dict(raw, source=source))
    if metric not in res.summary:
        have = ", ".join(k for k in res.summary if k.startswith("slo_attainment"))
        raise UserError(f"capacity --metric {metric!r}: not a run metric here; available: {have}")
    v = res.summary[metric]
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def search_task(base: dict, source: str, target: float, metric: str, opts: dict) -> dict:
    """One (policy, seed) search; module-level so that worker processes and Dask can run it."""
    res = search_capacity(lambda r: attainment_at(base, source, r, metric), target, **opts)
    return {"capacity_rps": res.capacity_rps, "bracket_hi": res.bracket_hi, "status": res.status,
            "evaluations": res.evaluations}


def replicas_needed(target_rate: float, capacity_rps: float) -> float:
    """Replicas so that target_rate split evenly (a Poisson stream split at random stays Poisson) fits each one."""
    if capacity_rps <= 0:
        return math.inf
    return math.ceil(target_rate / capacity_rps - 1e-9)


def run_capacity(base: dict, source: str, policies, seeds, target: float, metric: str = "slo_attainment",
                 jobs: int = 1, dask=None, target_rate: float | None = None, **opts):
    """Search every (policy, seed); returns (per-search table, evaluations table, per-policy table)."""
    scn = scenario_from_dict(base, source=source)
    if not scn.slos():
        raise UserError(f"{source}: capacity search needs SLO targets, e.g. slo: {{ttft_s: 1.0, tbt_p99_s: 1.0}} "
                        f"or --set slo.ttft_s=1")
    if not 0 < target <= 1:
        raise UserError(f"--slo-attainment: must be in (0, 1], got {target}")
    tasks = []
    for pol in policies:
        for seed in seeds:
            raw = dict(base)
            raw["policy"] = {**(base.get("policy") or {}), "name": pol}
            raw["seed"] = seed
            scenario_from_dict(raw, source=source)          # bad fields fail here, before anything runs
            tasks.append((search_task, (raw, source, target, metric, opts), (pol, seed)))
    rows, evals = {}, []
    for (pol, seed), out in run_tasks(tasks, jobs=jobs, dask=dask):
        rows[(pol, seed)] = {"policy": pol, "seed": seed, "target_attainment": target, "metric": metric,
                             "capacity_rps": out["capacity_rps"], "bracket_hi_rps": out["bracket_hi"],
                             "status": out["status"], "evaluations": len(out["evaluations"])}
        evals += [{"policy": pol, "seed": seed, "rate": r, metric: a, "meets": a >= target}
                  for r, a in out["evaluations"]]
    table = pd.DataFrame([rows[k] for k in sorted(rows, key=lambda k: (list(policies).index(k[0]), k[1]))])
    ev = pd.DataFrame(evals).sort_values(["policy", "seed", "rate"], kind="stable").reset_index(drop=True)
    per_policy = table.groupby("policy", sort=False).agg(capacity_min_rps=("capacity_rps", "min"),
                                                         capacity_mean_rps=("capacity_rps", "mean"),
                                                         seeds=("seed", "count")).reset_index()
    # the mean's 95 % interval, bootstrap over the seeds (study/intervals.py), and the seeds a +-5 % one needs
    from study.intervals import mean_interval, seeds_needed
    ivs = [mean_interval(table.loc[table["policy"] == pol, "capacity_rps"]) for pol in per_policy["policy"]]
    per_policy["capacity_lo_rps"] = [iv.lo for iv in ivs]
    per_policy["capacity_hi_rps"] = [iv.hi for iv in ivs]
    per_policy["seeds_for_5pct"] = [seeds_needed(iv, 0.05 * iv.mean) if iv.n > 1 else None for iv in ivs]
    if target_rate is not None:
        tp = scn.hardware.tp
        per_policy["target_rate_rps"] = target_rate
        per_policy["replicas_needed"] = [replicas_needed(target_rate, c) for c in per_policy["capacity_min_rps"]]
        per_policy["gpus_needed"] = per_policy["replicas_needed"] * tp
    return table, ev, per_policy


def _policy_names(values) -> list:
    """--policy NAME[,NAME], given once or more: the names in order; an empty item or a name twice is one line."""
    out = []
    for v in values or ():
        for x in str(v).split(","):
            name = x.strip()
            if not name:
                raise UserError(f"--policy: an empty item in {str(v)!r}")
            if name in out:
                raise UserError(f"--policy: {name!r} is given twice")
            out.append(name)
    return out


def cmd_capacity(args) -> int:
    base, source, name = load_sweep_base(args.scenario, args.set)
    scn = scenario_from_dict(base, source=source)
    if args.out:
        output_dir(args.out, create=False)      # fail before the search, not after
    policies = _policy_names(args.policy) or [scn.policy.get("name")]
    seeds = parse_seeds(args.seeds) if args.seeds else [scn.seed]     # ranges and one-line errors as sweep's
    if args.tol < 0 or args.abs_tol < 0 or not (args.tol > 0 or args.abs_tol > 0):
        raise UserError(f"--tol / --abs-tol: must be >= 0 and not both 0, got {args.tol:g} / {args.abs_tol:g}")
    for flag, value in (("--rate-start", args.rate_start), ("--rate-min", args.rate_min),
                        ("--rate-max", args.rate_max), ("--target-rate", args.target_rate)):
        if value is not None and not value > 0:     # (0 fell back to the default without a word)
            raise UserError(f"{flag}: must be > 0 requests/s, got {value:g}")
    if args.max_evals < 1:
        raise UserError(f"--max-evals: must be >= 1, got {args.max_evals}")
    start = args.rate_start or float((scn.workload or {}).get("rate") or 1.0)
    opts = dict(start=start, rate_min=args.rate_min or start / 1024, rate_max=args.rate_max or start * 1024,
                rel_tol=args.tol, abs_tol=args.abs_tol, growth=2.0, max_evals=args.max_evals)
    print(f"capacity {name}: {len(policies)} policies x {len(seeds)} seeds, target {args.metric} >= "
          f"{args.slo_attainment}, tolerance {args.tol:g} relative", file=sys.stderr)
    table, ev, per_policy = run_capacity(base, source, policies, seeds, args.slo_attainment, args.metric,
                                         jobs=args.jobs, dask=args.dask, target_rate=args.target_rate, **opts)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        from sim.metrics.units import with_units
        print(with_units(table.drop(columns=["metric"])).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        print(with_units(per_policy).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    out = output_dir(args.out or Path("out") / "capacity" / name)
    write_table(table, out / "capacity.csv")
    write_table(ev, out / "evaluations.csv")
    write_table(per_policy, out / "per_policy.csv")
    print(f"wrote {out / 'capacity.csv'}, {out / 'evaluations.csv'}, {out / 'per_policy.csv'}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("capacity", help="highest request rate meeting an SLO-attainment target, per policy and seed",
                       description="Bracket and bisect workload.rate until the SLO attainment crosses the target "
                                   "(Apt-Serve's effective throughput, DistServe's goodput). The same seed at every "
                                   "rate keeps the arrival pattern and only rescales its gaps.")
    p.add_argument("scenario", help="scenario YAML with a rate-driven workload (e.g. poisson) and slo: targets")
    p.add_argument("--policy", action="append", metavar="NAME[,NAME]",
                   help="policies to search (default: the scenario's)")
    p.add_argument("--seeds", action="append", metavar="S[,S]",
                   help="seeds, comma-separated or a range such as 0-4 (default: the scenario's)")
    p.add_argument("--slo-attainment", type=float, default=0.9, help="attainment target in (0, 1] (default 0.9)")
    p.add_argument("--metric", default="slo_attainment",
                   help="which attainment: slo_attainment (all requests) or slo_attainment_<class>")
    p.add_argument("--tol", type=float, default=0.02, help="relative tolerance on the rate (default 0.02)")
    p.add_argument("--abs-tol", type=float, default=0.0, help="absolute tolerance in requests/s (default 0)")
    p.add_argument("--rate-start", type=float, help="first rate tried (default: workload.rate, else 1)")
    p.add_argument("--rate-min", type=float, help="lowest rate tried (default start/1024)")
    p.add_argument("--rate-max", type=float, help="highest rate tried (default start*1024)")
    p.add_argument("--max-evals", type=int, default=60, help="give up after this many runs per search")
    p.add_argument("--target-rate", type=float,
                   help="also report replicas/GPUs needed to serve this total rate at the target attainment")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario field")
    p.add_argument("--out", help="directory for capacity.csv / evaluations.csv (default out/capacity/<name>)")
    add_parallel_args(p)
    p.set_defaults(func=cmd_capacity)
