"""`servesim plan`: the cheapest fleet that meets an SLO attainment target at a given request rate, with the
interval the answer rests on, over GPU kind × tensor parallelism × replicas × (co-located | prefill:decode ratio)
× router.

A configuration is (gpu, tp, mode, router); its size is searched like this: one size is a layout of replicas
((n,) co-located, (k·p, k·d) for a P:D ratio p:d, or every split of n for the scenario's own disaggregation). A
size meets the target when the lower end of its 95 % interval does (study/intervals.py: bootstrap over the seeds
and each seed's requests). The size is bracketed by doubling (or halving, from a start that meets) and then
bisected, attainment taken as non-decreasing in replicas; when doubling twice in a row adds less than 0.002 to the
attainment and change the served share (completions per second over arrivals per second) by less than 0.01, the
search stops: more replicas change nothing (the SLO is out of reach of this configuration). Every
evaluation of one configuration runs the same seeds (common random numbers).

With more than one configuration, a single replica's capacity at the target (study.capacity.search_capacity) is
found first for each (gpu, tp), so each configuration starts near rate / capacity replicas, and configurations whose
estimate costs more than --prune times the cheapest estimate are not searched (they are listed as pruned). The
answer is the cheapest size that meets the target ($/hour = GPUs × each GPU's price, sim/metrics/economics.py);
every evaluated size is a point of the cost-vs-attainment Pareto frontier (plan.csv, frontier.png).

Exit status: 0 when a configuration meets the target, 1 when none does (a line on stderr names the limiting SLO
target and the best attainment reached), 2 on bad input."""
from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from sim.options import jobs_count
from sim.paths import output_dir
from sim.scenario.config import load_scenario, scenario_from_dict
from study.intervals import Interval, attainment_interval, mean_interval, parse_seeds, seeds_needed

FLAT_GAIN = 0.002          # two doublings that add less attainment than this ...
FLAT_SERVED = 0.01         # ... and change the served share less than this: more replicas do not help
SLO_TARGETS = ("ttft_s", "tbt_p99_s", "tpot_s", "e2e_s", "normalized_latency_s")


@dataclass(frozen=True)
class Config:
    """One fleet design: GPU kind, tensor-parallel degree, mode ('colocated', 'P:D' ratio, or 'scenario' for the
    scenario's own disaggregation with every split searched) and router."""
    gpu: str
    tp: int
    mode: str
    router: str | None
    usd_per_gpu_hour: float | None = None     # the price the runs are costed at (None: the scenario's or table's)

    @property
    def label(self) -> str:
        return f"{self.gpu} tp{self.tp} {self.mode}" + (f" {self.router}" if self.router else "")

    @property
    def ratio(self):
        if self.mode in ("colocated", "scenario"):
            return None
        p, d = self.mode.split(":")
        return int(p), int(d)

    def layouts(self, n: int) -> list:
        """The layouts of size n: (n,) co-located; (n·p, n·d) for a ratio; every (p, n − p) for 'scenario'."""
        if self.mode == "colocated":
            return [(n,)]
        if self.mode == "scenario":
            return [(p, n - p) for p in range(1, n)]
        p, d = self.ratio
        return [(n * p, n * d)]

    def min_size(self) -> int:
        return 2 if self.mode == "scenario" else 1


def configured(raw: dict, cfg: Config, layout: tuple, rate: float, seed: int) -> dict:
    """The scenario of one evaluation: `cfg`'s GPU, tp and router, `layout`'s replicas, the rate and the seed."""
    raw = dict(raw)
    raw["seed"] = seed
    raw["workload"] = {**(raw.get("workload") or {}), "rate": float(rate)}
    raw["hardware"] = {**(raw.get("hardware") or {}), "gpu": cfg.gpu, "tp": cfg.tp}
    if cfg.usd_per_gpu_hour is not None:
        raw["hardware"]["usd_per_gpu_hour"] = cfg.usd_per_gpu_hour
    cluster = dict(raw.get("cluster") or {})
    if len(layout) == 1:
        cluster.pop("disaggregation", None)
        groups = cluster.get("replicas", 1)
        if isinstance(groups, list):
            if len(groups) != 1:
                raise UserError("plan: a cluster of several replica groups has no single count to search; give "
                                "cluster.replicas as a count or one group")
            cluster["replicas"] = [{**groups[0], "count": layout[0]}] if isinstance(groups[0], dict) else layout[0]
        else:
            cluster["replicas"] = layout[0]
        if cfg.router:
            cluster["router"] = cfg.router
    else:
        cluster.pop("replicas", None)
        dis = dict(cluster.get("disaggregation") or {"link": "infiniband-ndr", "first_token": "decode"})
        for pool, n in zip(("prefill", "decode"), layout):
            dis[pool] = {**dis[pool], "count": n} if isinstance(dis.get(pool), dict) else n
        if cfg.router:
            dis["decode_router"] = cfg.router
        cluster["disaggregation"] = dis
    raw["cluster"] = cluster
    return raw


def evaluate(raw: dict, source: str, cfg: Config, layout: tuple, rate: float, seed: int, metric: str) -> dict:
    """One run. Module-level for worker processes. Returns the met/total request counts the interval needs, the
    cost figures, and each SLO target's pass share (which target limits attainment)."""
    import time
    from sim.cluster.runner import run_scenario
    cpu0 = time.process_time()
    scn = scenario_from_dict(configured(raw, cfg, layout, rate, seed), source=source)
    res = run_scenario(scn)
    s = res.summary
    if s.get(metric) is None:
        raise UserError(f"plan --metric {metric!r}: not a run metric; available: "
                        f"{', '.join(k for k in s if k.startswith('slo_attainment'))}")
    req = res.requests
    if metric != "slo_attainment":
        req = req[req["cls"] == metric[len("slo_attainment_"):]]
    att = req["slo_attained"].to_numpy(float)
    has = ~np.isnan(att)
    rec = {"config": cfg.label, "gpu": cfg.gpu, "tp": cfg.tp, "mode": cfg.mode, "router": cfg.router or "",
           "layout": ":".join(map(str, layout)), "seed": seed, "met": int(att[has].sum()), "n": int(has.sum()),
           "attainment": float(att[has].mean()) if has.any() else 0.0, "gpus": int(s.get("gpus", cfg.tp)),
           "usd_per_hour": s.get("cost_usd", math.nan) / s["makespan_s"] * 3600 if s.get("makespan_s") else math.nan,
           "usd_per_million_tokens": s.get("usd_per_million_tokens"), "joules_per_token": s.get("joules_per_token"),
           "ttft_p99": s.get("ttft_p99"), "tpot_mean": s.get("tpot_mean"),
           "served_share": served_share(res.requests, s), "wall_s": s.get("wall_s"),
           "cpu_s": time.process_time() - cpu0}
    rec.update(target_shares(scn, req))
    return rec


def served_share(req: pd.DataFrame, s: dict) -> float:
    """Completed requests per second over arriving requests per second: below 1 the queue grows all run."""
    arr = req["arrival_s"].to_numpy(float)
    span = float(arr.max() - arr.min()) if len(arr) > 1 else 0.0
    got = s.get("request_throughput", math.nan)
    return float(got / ((len(arr) - 1) / span)) if span > 0 and got == got else math.nan


def target_shares(scn, req: pd.DataFrame) -> dict:
    """For each SLO target of the default class: the share of requests that completed within it."""
    slo = scn.slos().get("default")
    out = {}
    if slo is None or not len(req):
        return out
    done = (req["status"] == "done").to_numpy()
    for col in SLO_TARGETS:
        target = getattr(slo, col)
        if target is None:
            continue
        v = req[col].to_numpy(float)
        ok = done & ((v <= target) | (np.isnan(v) & (col in ("tbt_p99_s", "tpot_s"))))
        out[f"within_{col}"] = float(ok.mean())
        fin = v[done & ~np.isnan(v)]
        out[f"median_{col}"] = float(np.median(fin)) if len(fin) else math.nan
        out[f"target_{col}"] = float(target)
    return out


def distinct_counts(records) -> list:
    """(met, n) per seed, seeds whose runs came out identical counted once: a trace replayed behind a deterministic
    router runs the same requests the same way whatever the seed, and a copy is not a second draw."""
    seen, out = set(), []
    for r in records:
        key = (r["met"], r["n"], r.get("ttft_p99"), r.get("tpot_mean"), r.get("usd_per_million_tokens"))
        if key not in seen:
            seen.add(key)
            out.append((r["met"], r["n"]))
    return out


class SizeSearch:
    """The replica-count search of one configuration; `run(tasks)` evaluates [(cfg, layout, seed)]."""

    def __init__(self, planner: "Planner", cfg: Config, start: int | None = None, cap: float = math.inf):
        self.p, self.cfg, self.start, self.cap = planner, cfg, start, cap
        self.cache: dict = {}
        self.rows: list = []
        self.status = "ok"

    def _run(self, layouts) -> None:
        todo = [(lay, s) for lay in layouts for s in self.p.seeds if (lay, s) not in self.cache]
        for (lay, s), rec in self.p.run_batch(self.cfg, todo):
            self.cache[(lay, s)] = rec
            self.rows.append(rec)

    def interval(self, layout) -> Interval:
        return attainment_interval(distinct_counts([self.cache[(layout, s)] for s in self.p.seeds]))

    def meets(self, layout) -> bool:
        return self.interval(layout).lo >= self.p.target

    def served(self, layout) -> float:
        """Mean over seeds of completions per second over arrivals per second (below 1: a queue builds)."""
        return float(np.mean([self.cache[(layout, s)]["served_share"] for s in self.p.seeds]))

    def best_at(self, n: int):
        layouts = self.cfg.layouts(n)
        self._run(layouts)
        best = max(layouts, key=lambda lay: (self.meets(lay), self.interval(lay).lo, -lay[0]))
        return best, self.meets(best)

    def cost(self, n: int) -> float:
        """$/hour of size n (0 when the configuration carries no price: nothing is capped)."""
        return n * sum(self.cfg.ratio or (1,)) * self.cfg.tp * (self.cfg.usd_per_gpu_hour or 0.0)

    def search(self):
        """(layout, size) of the smallest size that meets the target, or (None, last size tried). Sizes dearer than
        `cap` (a configuration already found to meet the target costs that) are not run: status 'capped'."""
        lo = self.cfg.min_size()
        top = self.p.max // sum(self.cfg.ratio or (1,))
        while top >= lo and self.cost(top) > self.cap:
            top -= 1
        if top < lo:
            self.status = "capped" if self.p.max // sum(self.cfg.ratio or (1,)) >= lo else "at_max"
            return None, lo
        n = min(max(self.start or lo, lo), top)
        layout, ok = self.best_at(n)
        if ok:                                          # a start that meets: halve down to a miss
            hi, best, last_fail = n, layout, lo - 1
            while hi > lo:
                m = max(lo, hi // 2)
                layout, ok = self.best_at(m)
                if not ok:
                    last_fail = m
                    break
                hi, best = m, layout
        else:
            last_fail, gains, prev = n, [], (self.interval(layout).mean, self.served(layout))
            while True:                                 # double until the target is met
                if n >= top:
                    self.status = "at_max" if top == self.p.max // sum(self.cfg.ratio or (1,)) else "capped"
                    return None, n
                n = min(2 * n, top)
                layout, ok = self.best_at(n)
                if ok:
                    break
                now = (self.interval(layout).mean, self.served(layout))
                gains.append((now[0] - prev[0], abs(now[1] - prev[1])))
                prev, last_fail = now, n
                if len(gains) >= 2 and all(a < FLAT_GAIN and b < FLAT_SERVED for a, b in gains[-2:]):
                    self.status = "flat"
                    return None, n
            hi, best = n, layout
        while hi - last_fail > 1:                       # bisect between the last miss and the first hit
            mid = (hi + last_fail) // 2
            layout, ok = self.best_at(mid)
            if ok:
                hi, best = mid, layout
            else:
                last_fail = mid
        return best, hi


def search_config(planner_state: dict, cfg: Config, start: int | None, cap: float = math.inf) -> dict:
    """One configuration's whole search in one task (a worker process when several are searched at once)."""
    planner = Planner(**planner_state)
    s = SizeSearch(planner, cfg, start, cap)
    layout, n = s.search()
    return {"rows": [dict(r, search_status=s.status) for r in s.rows], "status": s.status,
            "cost": s.cost(n) if layout is not None else math.inf}


class Planner:
    def __init__(self, raw: dict, source: str, rate: float, target: float, seeds, metric: str = "slo_attainment",
                 max_replicas: int = 256, jobs: int = 1, dask: str | None = None):
        if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
            raise UserError(f"plan --rate: must be > 0 requests/s, got {rate!r}")
        if not 0 < target <= 1:
            raise UserError(f"plan --slo-attainment: must be in (0, 1], got {target!r}")
        if max_replicas < 1:
            raise UserError(f"plan --max-replicas: must be >= 1, got {max_replicas!r}")
        self.raw, self.source, self.rate, self.target = raw, source, rate, target
        self.seeds, self.metric, self.max, self.jobs, self.dask = list(seeds), metric, max_replicas, jobs, dask

    def state(self) -> dict:
        return dict(raw=self.raw, source=self.source, rate=self.rate, target=self.target, seeds=self.seeds,
                    metric=self.metric, max_replicas=self.max)

    def run_batch(self, cfg: Config, todo):
        from study.executors import run_tasks
        tasks = [(evaluate, (self.raw, self.source, cfg, lay, self.rate, s, self.metric), (lay, s))
                 for lay, s in todo]
        yield from run_tasks(tasks, jobs=self.jobs, dask=self.dask)


# -- many configurations -----------------------------------------------------------------------------------------
def first_requests(raw: dict, n: int | None) -> dict:
    """The scenario cut to its first n requests (a trace: max_requests; a generator: num_requests), for the
    single-replica capacity bounds, which only need the workload's shape."""
    if not n:
        return raw
    wl = dict(raw.get("workload") or {})
    if wl.get("kind") == "trace":
        wl["max_requests"] = min(n, wl.get("max_requests") or n)
    elif "num_requests" in wl:
        wl["num_requests"] = min(n, wl["num_requests"])
    return {**raw, "workload": wl}


def single_capacity(raw: dict, source: str, gpu: str, tp: int, target: float, metric: str, seed: int,
                    rate: float, bound_requests: int | None = None) -> float:
    """One replica's capacity (req/s) at the target on this GPU and tp, for the start and the pruning estimate."""
    from study.capacity import attainment_at, search_capacity
    base = configured(first_requests(raw, bound_requests), Config(gpu, tp, "colocated", None), (1,), rate, seed)
    base.pop("cluster", None)
    res = search_capacity(lambda r: attainment_at(base, source, r, metric), target, max(rate / 8, 1e-3),
                          rate_min=rate / 4096, rate_max=rate * 4, rel_tol=0.1)
    return res.capacity_rps


def capacity_task(*args) -> dict:
    """single_capacity with the CPU seconds it took (the plan reports what its phases cost)."""
    import time
    cpu0 = time.process_time()
    cap = single_capacity(*args)
    return {"capacity": cap, "cpu_s": time.process_time() - cpu0}


def plan_configs(planner: Planner, configs: list, prices: dict, prune: float = 1.5, jobs: int = 1,
                 dask=None, log=print, bound_requests: int | None = 2000) -> dict:
    """Search every configuration; returns {'rows': evaluations, 'capacity': per (gpu, tp), 'pruned': [...]}."""
    from study.executors import run_tasks
    caps = {}
    if len(configs) > 1:
        keys = sorted({(c.gpu, c.tp) for c in configs})
        tasks = [(capacity_task, (planner.raw, planner.source, g, tp, planner.target, planner.metric, s,
                                    planner.rate, bound_requests), (g, tp, s))
                 for g, tp in keys for s in planner.seeds]
        got, cap_cpu = {}, 0.0
        for (g, tp, s), out in run_tasks(tasks, jobs=jobs, dask=dask):
            got.setdefault((g, tp), []).append(out["capacity"])
            cap_cpu += out["cpu_s"]
        caps = {k: mean_interval(v).mean for k, v in got.items()}
        for (g, tp), cap in sorted(caps.items()):
            log(f"plan: one {g} tp{tp} replica holds {cap:.3g} req/s at the target", file=sys.stderr)
    else:
        cap_cpu = 0.0
    starts, estimate = {}, {}
    for c in configs:
        cap = caps.get((c.gpu, c.tp))
        if cap is None:
            starts[c] = None
            continue
        units = sum(c.ratio or (1,))
        need = planner.rate / cap if cap > 0 else math.inf
        starts[c] = max(1, int(math.floor(0.75 * need / units))) if math.isfinite(need) else None
        estimate[c] = math.ceil(need) * c.tp * prices[c.gpu] if math.isfinite(need) else math.inf
    pruned = []
    if estimate and prune:
        cheapest = min(estimate.values())
        pruned = [c for c in configs if estimate.get(c, 0) > prune * cheapest]
    todo = sorted((c for c in configs if c not in pruned), key=lambda c: estimate.get(c, 0.0))
    rows, capped = [], []
    if len(todo) == 1:
        s = SizeSearch(planner, todo[0], starts.get(todo[0]))
        s.search()
        rows = [dict(r, search_status=s.status) for r in s.rows]
    else:
        # cheapest estimates first, `jobs` configurations at a time (one per worker, its runs in sequence); a
        # configuration found to meet the target caps the later searches at its cost: no dearer size can win
        inner, cap, width = Planner(**planner.state()), math.inf, max(1, jobs)
        for i in range(0, len(todo), width):
            tasks = [(search_config, (inner.state(), c, starts.get(c), cap), c) for c in todo[i:i + width]]
            for c, out in run_tasks(tasks, jobs=jobs, dask=dask):
                rows += out["rows"]
                cap = min(cap, out["cost"])
                if out["status"] == "capped" and not out["rows"]:
                    capped.append(c)
            log(f"plan: {min(i + width, len(todo))}/{len(todo)} configurations searched; cheapest meeting so far "
                f"${cap:.2f}/h" if cap < math.inf else f"plan: {min(i + width, len(todo))}/{len(todo)} "
                f"configurations searched; none meets yet", file=sys.stderr)
    return {"rows": rows, "capacity": caps, "pruned": [(c, estimate[c]) for c in pruned], "capped": capped,
            "capacity_cpu_s": cap_cpu}


def summarize_points(rows: list, target: float) -> pd.DataFrame:
    """One row per evaluated (configuration, layout): GPUs, $/hour, attainment mean and interval, meets."""
    ev = pd.DataFrame(rows)
    out = []
    for (label, layout), g in ev.groupby(["config", "layout"], sort=False):
        iv = attainment_interval(distinct_counts(g.to_dict("records")))
        first = g.iloc[0]
        out.append({"config": label, "gpu": first["gpu"], "tp": int(first["tp"]), "mode": first["mode"],
                    "router": first["router"], "layout": layout, "gpus": int(first["gpus"]),
                    "usd_per_hour": float(first["usd_per_hour"]), "attainment": iv.mean, "attainment_lo": iv.lo,
                    "attainment_hi": iv.hi, "seeds": iv.n, "meets": bool(iv.lo >= target),
                    "usd_per_million_tokens": float(g["usd_per_million_tokens"].mean()),
                    "joules_per_token": float(g["joules_per_token"].mean()),
                    "search_status": first.get("search_status", "ok")})
    pts = pd.DataFrame(out)
    pts = pts.sort_values(["usd_per_hour", "gpus", "attainment_lo"], ascending=[True, True, False],
                          kind="stable").reset_index(drop=True)
    pts["frontier"] = pareto(pts["usd_per_hour"].to_numpy(float), pts["attainment"].to_numpy(float))
    return pts


def pareto(cost: np.ndarray, value: np.ndarray) -> np.ndarray:
    """True where no other point costs no more and attains strictly more, or costs less and attains as much."""
    keep = np.ones(len(cost), dtype=bool)
    for i in range(len(cost)):
        dominated = ((cost <= cost[i]) & (value > value[i])) | ((cost < cost[i]) & (value >= value[i]))
        keep[i] = not dominated.any()
    return keep


def cheapest(points: pd.DataFrame):
    ok = points[points["meets"]]
    if not len(ok):
        return None
    return ok.sort_values(["usd_per_hour", "gpus", "attainment_lo"], ascending=[True, True, False],
                          kind="stable").iloc[0]


def plot_frontier(points: pd.DataFrame, target: float, best, stem) -> list:
    from study.plots import pyplot, save_figure
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, g in points.groupby("config", sort=False):
        ax.errorbar(g["usd_per_hour"], g["attainment"], yerr=[g["attainment"] - g["attainment_lo"],
                                                             g["attainment_hi"] - g["attainment"]],
                    fmt="o", ms=4, capsize=2, label=label, alpha=0.8)
    f = points[points["frontier"]].sort_values("usd_per_hour")
    ax.step(f["usd_per_hour"], f["attainment"], where="post", color="k", lw=1, label="Pareto frontier")
    ax.axhline(target, ls="--", color="grey", lw=1)
    if best is not None:
        ax.plot([best["usd_per_hour"]], [best["attainment"]], "*", ms=14, color="gold", mec="k",
                label=f"cheapest meeting: {best['config']} {best['layout']}")
    ax.set_xlabel("fleet cost (USD per hour)")
    ax.set_ylabel("SLO attainment (mean, 95% interval)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(fig, stem)


# -- the command ---------------------------------------------------------------------------------------------------
def _csv(text, flag, cast=str) -> list:
    out = []
    for x in str(text).split(","):
        x = x.strip()
        if not x:
            continue
        try:
            out.append(cast(x))
        except ValueError:
            raise UserError(f"{flag}: {x!r} is not allowed; expected {cast.__name__} values separated by commas")
    if not out:
        raise UserError(f"{flag}: no values given")
    return out


def _mode(text: str) -> str:
    t = text.strip().lower()
    if t in ("colocated", "co-located", "none"):
        return "colocated"
    p, sep, d = t.partition(":")
    if sep and p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1:
        g = math.gcd(int(p), int(d))
        return f"{int(p) // g}:{int(d) // g}"
    raise UserError(f"plan --pd: {text!r} is not allowed; give colocated or a prefill:decode ratio such as 1:2")


def _prices(args_prices, gpus, hardware: dict) -> dict:
    """$/GPU-hour per GPU kind searched: --price GPU=USD, then hardware.usd_per_gpu_hour, then the table."""
    from sim.metrics.economics import economics_table
    table = economics_table()["gpus"]
    given = {}
    for item in args_prices or ():
        name, sep, v = str(item).partition("=")
        try:
            usd = float(v)
        except ValueError:
            usd = -1.0
        if not sep or not name.strip() or not usd >= 0 or math.isinf(usd):
            raise UserError(f"plan --price {item!r}: expected GPU=USD with USD >= 0, e.g. --price h100-sxm=2.5")
        given[name.strip()] = usd
    out = {}
    for g in gpus:
        usd = given.get(g)
        if usd is None and hardware.get("usd_per_gpu_hour") is not None and hardware.get("gpu") == g:
            usd = float(hardware["usd_per_gpu_hour"])
        if usd is None:
            usd = table.get(g, {}).get("usd_per_gpu_hour", math.nan)
        if not usd == usd:
            raise UserError(f"plan: GPU {g!r} has no price in profiles/gpu-economics.yaml; give one with "
                            f"--price {g}=USD (or a file in $SERVESIM_GPU_ECONOMICS)")
        out[g] = usd
    return out


def check_rate_driven(raw: dict, source: str) -> None:
    """plan sets workload.rate: an offline workload (every request at t = 0) has no rate to set."""
    wl = raw.get("workload") or {}
    kind = wl.get("kind", "offline")
    probe = dict(raw)
    probe["workload"] = {**wl, "rate": 1.0}
    try:
        from sim.scenario.build import build_section
        build_section(scenario_from_dict(probe, source=source), "workload")
    except UserError as e:
        if "rate" in str(e):
            raise UserError(f"{source}: plan needs a rate-driven workload, and workload.kind {kind!r} takes no "
                            f"rate (an offline workload sends every request at t = 0); use a kind with arrivals, "
                            f"e.g. --set workload.kind=poisson") from None
        raise


def cmd_plan(args) -> int:
    scn = load_scenario(args.scenario, args.set)
    if args.out:
        output_dir(args.out, create=False)      # fail before the search, not after
    raw = scn.to_dict()
    seeds = parse_seeds(args.seeds, "plan --seeds") if args.seeds else [scn.seed]     # option errors first
    if args.bound_requests < 0:                 # (a negative count cut the workload to a negative size)
        raise UserError(f"plan --bound-requests: must be >= 0 (0: all requests), got {args.bound_requests}")
    if args.prune < 0:
        raise UserError(f"plan --prune: must be >= 0 (0: search every configuration), got {args.prune:g}")
    if not scn.slos():
        raise UserError(f"{args.scenario}: plan needs SLO targets, e.g. --set slo.ttft_s=1 --set slo.tpot_s=0.05")
    check_rate_driven(raw, str(args.scenario))
    if not seeds:
        raise UserError("plan --seeds: no seeds given")
    gpus = _csv(args.gpus, "plan --gpus") if args.gpus else [scn.hardware.gpu]
    from costmodels.catalog import GPUS
    for g in gpus:
        if g not in GPUS:
            raise UserError(f"plan --gpus: unknown GPU {g!r}; allowed: {', '.join(GPUS)}")
    tps = _csv(args.tp, "plan --tp", int) if args.tp else [scn.hardware.tp]
    dis = bool((raw.get("cluster") or {}).get("disaggregation"))
    modes = [_mode(m) for m in _csv(args.pd, "plan --pd")] if args.pd else ["scenario" if dis else "colocated"]
    routers = _csv(args.router, "plan --router") if args.router else [None]
    configs = [Config(g, tp, m, r) for g, tp, m, r in itertools.product(gpus, tps, modes, routers)]
    for c in configs:                                     # bad combinations fail here, before anything runs
        scenario_from_dict(configured(raw, c, c.layouts(c.min_size())[0], args.rate, seeds[0]),
                           source=str(args.scenario))
    if len(configs) > 1 or args.price:
        prices = _prices(args.price, gpus, raw.get("hardware") or {})
        configs = [Config(c.gpu, c.tp, c.mode, c.router, prices[c.gpu]) for c in configs]
    else:
        prices = {}
    planner = Planner(raw, str(args.scenario), args.rate, args.slo_attainment, seeds, args.metric,
                      args.max_replicas, args.jobs, args.dask)
    result = plan_configs(planner, configs, prices, prune=args.prune, jobs=args.jobs, dask=args.dask,
                          bound_requests=args.bound_requests)
    if not result["rows"]:
        raise UserError("plan: every configuration was pruned; lower --prune or widen the search")
    points = summarize_points(result["rows"], args.slo_attainment)
    best = cheapest(points)
    _print_points(points)
    for c, est in result["pruned"]:
        print(f"pruned: {c.label} (estimate ${est:.2f}/h > {args.prune:g} x the cheapest estimate)")
    for c in result.get("capped", []):
        print(f"not run: {c.label} (its smallest size costs more than a configuration that meets the target)")
    ans = answer(points, best, args, seeds, result)
    if best is not None:
        split = f" ({best['layout'].replace(':', ' prefill : ', 1)} decode)" if ":" in best["layout"] else ""
        print(f"plan: {best['config']}, {best['layout']} replicas{split}, {best['gpus']} GPUs, "
              f"${best['usd_per_hour']:.2f}/h: {args.metric} {best['attainment']:.3f} "
              f"[{best['attainment_lo']:.3f}, {best['attainment_hi']:.3f}] >= {args.slo_attainment} at "
              f"{args.rate:g} req/s (95% interval, {len(seeds)} seed(s); {ans['evaluations']} runs)")
        if ans["distinct_seeds"] < len(seeds):
            print("plan: every seed gave the same runs (a trace replayed behind a deterministic router): the interval "
                  "is over requests only, and more seeds add nothing")
        else:
            print(f"plan: seeds for a +-0.01 interval at this size: {ans['seeds_for_0.01']}")
    else:
        print(f"servesim: plan: {ans['note']}", file=sys.stderr)
    if args.out:
        out = output_dir(args.out)
        pd.DataFrame(result["rows"]).to_csv(out / "evaluations.csv", index=False)
        points.to_csv(out / "plan.csv", index=False)
        (out / "plan.json").write_text(json.dumps(ans, indent=1, default=str))
        figs = plot_frontier(points, args.slo_attainment, best, out / "frontier")
        print(f"wrote {out / 'plan.json'}, {out / 'plan.csv'}, {out / 'evaluations.csv'}, "
              f"{', '.join(str(p) for p in figs)}")
    return 0 if best is not None else 1


def answer(points: pd.DataFrame, best, args, seeds, result) -> dict:
    """plan.json: the choice with its interval, or why nothing met the target."""
    out = {"rate_rps": args.rate, "target": args.slo_attainment, "metric": args.metric, "seeds": seeds,
           "evaluations": len(result["rows"]), "configurations": int(points["config"].nunique()),
           "pruned": [c.label for c, _ in result["pruned"]], "not_run": [c.label for c in result.get("capped", [])],
           "cpu_s": {"capacity_bounds": result.get("capacity_cpu_s", 0.0),
                     "cluster_runs": float(sum(r.get("cpu_s", 0.0) for r in result["rows"]))}}
    if best is not None:
        iv = Interval(best["attainment"], best["attainment_lo"], best["attainment_hi"], int(best["seeds"]))
        out.update(status="ok", config=best["config"], gpu=best["gpu"], tp=int(best["tp"]), mode=best["mode"],
                   router=best["router"], layout=best["layout"], gpus=int(best["gpus"]),
                   usd_per_hour=float(best["usd_per_hour"]), attainment=iv.mean, attainment_lo=iv.lo,
                   attainment_hi=iv.hi, distinct_seeds=iv.n, **{"seeds_for_0.01": seeds_needed(iv, 0.01)})
        if ":" in best["layout"]:
            p, d = best["layout"].split(":")
            out.update(prefill=int(p), decode=int(d))
        out["replicas"] = int(sum(int(x) for x in best["layout"].split(":")))
        return out
    top = points.sort_values(["attainment", "gpus"], ascending=[False, False]).iloc[0]
    ev = pd.DataFrame(result["rows"])
    ev = ev[(ev["config"] == top["config"]) & (ev["layout"] == top["layout"])]
    within = {c[len("within_"):]: float(ev[c].mean()) for c in ev.columns if c.startswith("within_")}
    limit = min(within, key=within.get) if within else None
    flat = (points["search_status"] == "flat").any()
    why = ("more replicas stopped helping (attainment flat over two doublings)" if flat
           else f"no configuration of up to {args.max_replicas} replicas meets it; raise --max-replicas")
    limit_text = (f"; the limiting target is slo.{limit} = {ev[f'target_{limit}'].iloc[0]:g}: {within[limit]:.1%} "
                  f"of requests meet it there (median {ev[f'median_{limit}'].mean():.3g})" if limit else "")
    out.update(status="flat" if flat else "at_max", replicas=None, gpus=None, best_config=top["config"],
               best_layout=top["layout"], best_attainment=float(top["attainment"]),
               best_attainment_lo=float(top["attainment_lo"]), limiting_target=limit, within=within,
               note=f"{args.metric} >= {args.slo_attainment} is out of reach: {why}. Best reached "
                    f"{top['attainment']:.3f} [{top['attainment_lo']:.3f}, {top['attainment_hi']:.3f}] with "
                    f"{top['config']} at {top['layout']} replicas{limit_text}")
    return out


def _print_points(points: pd.DataFrame) -> None:
    show = points.assign(attainment_95=[f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in
                                        zip(points["attainment"], points["attainment_lo"], points["attainment_hi"])])
    cols = ["config", "layout", "gpus", "usd_per_hour", "attainment_95", "meets", "frontier",
            "usd_per_million_tokens", "joules_per_token"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(show[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def register(sub) -> None:
    p = sub.add_parser("plan", help="cheapest fleet (GPU kind, TP, replicas, P:D split, router) meeting an SLO "
                                    "attainment target, with its 95%% interval and the cost-attainment frontier",
                       description="Exit status: 0 a configuration meets the target; 1 none does (stderr names "
                                   "the limiting SLO target and the best attainment reached); 2 bad input.")
    p.add_argument("scenario")
    p.add_argument("--rate", type=float, required=True, help="request rate to serve (sets workload.rate)")
    p.add_argument("--slo-attainment", type=float, default=0.9,
                   help="target: the lower end of the attainment's 95%% interval must reach it (default 0.9)")
    p.add_argument("--metric", default="slo_attainment", help="summary metric to hold to the target")
    p.add_argument("--seeds", action="append", metavar="S[,S]",
                   help="seeds (comma-separated or a range 0-4); the interval is over seeds and requests")
    p.add_argument("--gpus", metavar="GPU[,GPU]", help="GPU kinds to compare (default: the scenario's)")
    p.add_argument("--tp", metavar="N[,N]", help="tensor-parallel degrees (default: the scenario's)")
    p.add_argument("--pd", metavar="MODE[,MODE]",
                   help="colocated and/or prefill:decode ratios, e.g. colocated,1:1,1:2 (default: the scenario's "
                        "layout; its own disaggregation searches every split)")
    p.add_argument("--router", metavar="NAME[,NAME]", help="routers to compare (default: the scenario's)")
    p.add_argument("--price", action="append", metavar="GPU=USD",
                   help="$/GPU-hour for a GPU kind, over profiles/gpu-economics.yaml")
    p.add_argument("--prune", type=float, default=1.5,
                   help="skip configurations whose capacity-based cost estimate exceeds this many times the "
                        "cheapest estimate (0: search all; default 1.5)")
    p.add_argument("--bound-requests", type=int, default=2000,
                   help="the single-replica capacity bounds run the workload's first N requests (0: all)")
    p.add_argument("--max-replicas", type=int, default=256)
    p.add_argument("--jobs", type=jobs_count, default=1, help="local worker processes (default 1)")
    p.add_argument("--dask", default=None, help="run the evaluations on a Dask cluster (address or 'local')")
    p.add_argument("--set", action="append", default=[], help="override a scenario field, KEY=VALUE")
    p.add_argument("--out", help="folder for plan.json, plan.csv, evaluations.csv and frontier.png/svg")
    p.set_defaults(func=cmd_plan)
