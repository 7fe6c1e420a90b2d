"""The `servesim optimal` subcommand: solve a scenario's workload optimally and compare every preset with it."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("optimal", help="optimal schedule (InferMax CSP) for a small workload, vs presets")
    p.add_argument("scenario", help="scenario YAML; its `solver:` section sets defaults")
    p.add_argument("--objective", choices=("makespan", "sum_completion", "mean_ttft"))
    p.add_argument("--backend", choices=("auto", "serial", "search", "highs", "gurobi", "cpsat"),
                   help="auto: the skeleton decomposition (identical requests with 2·I >= M) and the exact A* search "
                        "(offline, few request classes, short prompts) where they apply, then a MILP (Gurobi if "
                        "licensed, else HiGHS); serial/search/highs/gurobi/cpsat force one (cpsat: OR-Tools, an extra)")
    p.add_argument("--time-limit", type=float, metavar="S", help="solver time limit in seconds")
    p.add_argument("--mip-gap", type=float, help="relative MIP gap at which to stop")
    p.add_argument("--threads", type=int)
    p.add_argument("--horizon", type=int, metavar="J", help="batch slots (default: provably enough, or the presets')")
    p.add_argument("--no-evictions", action="store_true", help="eviction-free optimum (e = 0)")
    p.add_argument("--no-hybrid", action="store_true", help="forbid prefill and decode in one batch")
    p.add_argument("--no-chunked", action="store_true", help="forbid chunked prefill")
    p.add_argument("--goal", type=float, metavar="F",
                   help="feasibility: is there a schedule with objective <= F × the best preset's?")
    p.add_argument("--presets", help="comma-separated presets to compare and seed from")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any scenario field")
    p.add_argument("--schedule-out", metavar="PATH", help="write the schedule (JSON: per batch tokens and evictions)")
    p.add_argument("--plot", metavar="PATH", help="write a Gantt-style plot of the schedule (PNG)")
    p.add_argument("--json", metavar="PATH", help="write the result summary as JSON")
    p.set_defaults(func=cmd_optimal)


def cmd_optimal(args) -> int:
    from sim.scenario.config import load_scenario
    from study.plots import plot_gantt
    from solver.report import format_result
    from solver.scenario import instance_from_scenario
    from solver.solve import solve
    scn = load_scenario(args.scenario, args.set)
    over = {}
    for flag, key in (("objective", "objective"), ("backend", "backend"), ("time_limit", "time_limit_s"),
                      ("mip_gap", "mip_gap"), ("threads", "threads"), ("horizon", "horizon"), ("goal", "goal_factor"),
                      ("presets", "presets")):
        v = getattr(args, flag)
        if v is not None:
            over[key] = v
    for flag, key in (("no_evictions", "evictions"), ("no_hybrid", "hybrid"), ("no_chunked", "chunked")):
        if getattr(args, flag):
            over[key] = False
    inst = instance_from_scenario(scn, over)
    res = solve(inst)
    print(format_result(res, inst, scn.name))
    if res.schedule is None:
        print(f"servesim: no schedule to write: status {res.status}", file=sys.stderr)
        return 1 if res.status != "infeasible" or res.goal_s is None else 0
    if args.schedule_out:
        Path(args.schedule_out).write_text(res.schedule.to_json())
        print(f"wrote {args.schedule_out}")
    if args.plot:
        plot_gantt(res, inst, args.plot)
        print(f"wrote {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(res.summary(), indent=2, default=str))
        print(f"wrote {args.json}")
    return 0
