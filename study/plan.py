"""`servesim plan`: the fewest GPUs (and, disaggregated, the prefill:decode split) that meet an SLO attainment
target at a given request rate.

The scenario's `cluster` section says how replicas are built and routed (a plain scenario is one replica group);
its `workload.rate` is set to --rate. For a colocated cluster the search is over the replica count: doubling
until the target is met, then bisecting (attainment is taken as non-decreasing in replicas). Disaggregated, every
prefill:decode split of a replica total is tried and the total is searched the same way; the best split of the
smallest total that meets the target wins. Every evaluation runs the same seeds, so the arrivals and lengths are
the same at every size (common random numbers), and a size meets the target only if every seed does. Evaluations
run on the sweep executors (--jobs, --dask)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from costmodels.errors import UserError
from sim.paths import output_dir
from sim.scenario.config import load_scenario, scenario_from_dict


def evaluate(raw: dict, source: str, layout: tuple, rate: float, seed: int, metric: str) -> dict:
    """One run: `layout` is (replicas,) or (prefill, decode). Module-level for worker processes."""
    from sim.cluster.runner import run_scenario
    raw = dict(raw)
    raw["seed"] = seed
    raw["workload"] = {**(raw.get("workload") or {}), "rate": float(rate)}
    cluster = dict(raw.get("cluster") or {})
    if len(layout) == 1:
        groups = cluster.get("replicas", 1)
        if isinstance(groups, list):
            if len(groups) != 1:
                raise UserError("plan: a cluster of several replica groups has no single count to search; give "
                                "cluster.replicas as a count or one group")
            cluster["replicas"] = [{**groups[0], "count": layout[0]}] if isinstance(groups[0], dict) else layout[0]
        else:
            cluster["replicas"] = layout[0]
    else:
        dis = dict(cluster["disaggregation"])
        for pool, n in zip(("prefill", "decode"), layout):
            dis[pool] = {**dis[pool], "count": n} if isinstance(dis.get(pool), dict) else n
        cluster["disaggregation"] = dis
    raw["cluster"] = cluster
    res = run_scenario(scenario_from_dict(raw, source=source))
    s = res.summary
    v = s.get(metric)
    if v is None:
        raise UserError(f"plan --metric {metric!r}: not a run metric; available: "
                        f"{', '.join(k for k in s if k.startswith('slo_attainment'))}")
    return {"layout": list(layout), "seed": seed, "attainment": 0.0 if v != v else float(v),
            "gpus": int(s["gpus"]), "goodput_rps": s.get("goodput_rps"), "ttft_p99": s.get("ttft_p99"),
            "tpot_mean": s.get("tpot_mean")}


class Planner:
    def __init__(self, raw: dict, source: str, rate: float, target: float, seeds, metric: str = "slo_attainment",
                 max_replicas: int = 256, jobs: int = 1, dask: str | None = None):
        if not rate > 0:
            raise UserError(f"plan --rate: must be > 0 requests/s, got {rate!r}")
        if not 0 < target <= 1:
            raise UserError(f"plan --slo-attainment: must be in (0, 1], got {target!r}")
        if max_replicas < 1:
            raise UserError(f"plan --max-replicas: must be >= 1, got {max_replicas!r}")
        self.raw, self.source, self.rate, self.target = raw, source, rate, target
        self.seeds, self.metric, self.max, self.jobs, self.dask = list(seeds), metric, max_replicas, jobs, dask
        self.disaggregated = bool((raw.get("cluster") or {}).get("disaggregation"))
        self.rows: list = []
        self.cache: dict = {}

    def _run(self, layouts) -> None:
        from study.executors import run_tasks
        todo = [(evaluate, (self.raw, self.source, lay, self.rate, s, self.metric), (lay, s))
                for lay in layouts for s in self.seeds if (lay, s) not in self.cache]
        for tag, rec in run_tasks(todo, jobs=self.jobs, dask=self.dask):
            self.cache[tag] = rec
            self.rows.append(rec)

    def meets(self, layout) -> bool:
        return all(self.cache[(layout, s)]["attainment"] >= self.target for s in self.seeds)

    def worst(self, layout) -> float:
        return min(self.cache[(layout, s)]["attainment"] for s in self.seeds)

    def best_at(self, n: int):
        """The layout of n replicas that meets the target (or comes closest), and whether it meets it."""
        layouts = [(n,)] if not self.disaggregated else [(p, n - p) for p in range(1, n)]
        self._run(layouts)
        best = max(layouts, key=lambda lay: (self.meets(lay), self.worst(lay), -lay[0]))
        return best, self.meets(best)

    def search(self) -> dict:
        lo = 2 if self.disaggregated else 1
        if self.max < lo:
            raise UserError("plan --max-replicas: a disaggregated cluster needs at least 2 replicas")
        n, last_fail = lo, lo - 1
        while True:                                   # double until the target is met
            layout, ok = self.best_at(n)
            if ok:
                break
            last_fail = n
            if n >= self.max:
                return self._answer(None, n)
            n = min(2 * n, self.max)
        hi, best = n, layout
        while hi - last_fail > 1:                     # bisect between the last miss and the first hit
            mid = (hi + last_fail) // 2
            layout, ok = self.best_at(mid)
            if ok:
                hi, best = mid, layout
            else:
                last_fail = mid
        return self._answer(best, hi)

    def _answer(self, layout, n) -> dict:
        evals = pd.DataFrame(self.rows)
        out = {"rate_rps": self.rate, "target": self.target, "metric": self.metric, "seeds": self.seeds,
               "disaggregated": self.disaggregated, "evaluations": int(len(evals))}
        if layout is None:
            out.update(status="at_max", replicas=None, gpus=None,
                       note=f"no layout of up to {n} replicas meets the target; raise --max-replicas")
            return out
        recs = [self.cache[(layout, s)] for s in self.seeds]
        out.update(status="ok", replicas=int(sum(layout)), gpus=int(recs[0]["gpus"]),
                   worst_attainment=float(min(r["attainment"] for r in recs)))
        if self.disaggregated:
            out.update(prefill=int(layout[0]), decode=int(layout[1]))
        return out


def cmd_plan(args) -> int:
    scn = load_scenario(args.scenario, args.set)
    if args.out:
        output_dir(args.out, create=False)      # fail before the search, not after
    raw = scn.to_dict()
    from sim.options import int_list
    seeds = int_list(args.seeds, "plan --seeds", minimum=0) if args.seeds else [scn.seed]
    planner = Planner(raw, str(args.scenario), args.rate, args.slo_attainment, seeds, args.metric,
                      args.max_replicas, args.jobs, args.dask)
    ans = planner.search()
    evals = pd.DataFrame(planner.rows)
    if len(evals):
        show = evals.assign(layout=evals["layout"].map(lambda lay: ":".join(map(str, lay))))
        from sim.metrics.units import with_units
        print(with_units(show[["layout", "seed", "gpus", "attainment", "ttft_p99", "tpot_mean"]])
              .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if ans["status"] == "ok":
        split = f" ({ans['prefill']} prefill : {ans['decode']} decode)" if ans["disaggregated"] else ""
        print(f"plan: {ans['replicas']} replicas{split}, {ans['gpus']} GPUs meet {ans['metric']} >= {ans['target']} at "
              f"{ans['rate_rps']:g} req/s (worst seed {ans['worst_attainment']:.3f}; {ans['evaluations']} runs)")
    else:
        print(f"plan: {ans['note']}")
    if args.out:
        out = output_dir(args.out)
        evals.to_csv(out / "evaluations.csv", index=False)
        (out / "plan.json").write_text(json.dumps(ans, indent=1))
        print(f"wrote {out / 'plan.json'}, {out / 'evaluations.csv'}")
    return 0 if ans["status"] == "ok" else 1


def register(sub) -> None:
    p = sub.add_parser("plan", help="fewest GPUs (and prefill:decode split) meeting an SLO attainment target")
    p.add_argument("scenario")
    p.add_argument("--rate", type=float, required=True, help="request rate to serve (sets workload.rate)")
    p.add_argument("--slo-attainment", type=float, default=0.9, help="target fraction of requests meeting the SLO")
    p.add_argument("--metric", default="slo_attainment", help="summary metric to hold to the target")
    p.add_argument("--seeds", default=None, help="comma-separated seeds; every one must meet the target")
    p.add_argument("--max-replicas", type=int, default=256)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--dask", default=None, help="run the evaluations on a Dask cluster (address or 'local')")
    p.add_argument("--set", action="append", default=[], help="override a scenario field, KEY=VALUE")
    p.add_argument("--out", help="folder for plan.json and evaluations.csv")
    p.set_defaults(func=cmd_plan)


if __name__ == "__main__":
    sys.exit(0)
