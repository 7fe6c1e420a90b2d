"""Plots of sweep, capacity and run tables: metric vs any axis, SLO attainment with capacity, CDFs, run timelines,
and a solver schedule as a Gantt chart."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from costmodels.errors import UserError

FORMATS = ("png", "svg")


def pyplot():
    """matplotlib.pyplot, on the file-only Agg backend unless pyplot was already imported: a notebook has chosen
    its inline backend by then, and switching it would stop the notebook's own figures from showing."""
    import sys

    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, stem, formats=FORMATS) -> list:
    """Write `stem.png` and `stem.svg` (or the given formats); returns the paths."""
    from sim.paths import output_dir
    stem = Path(stem)
    output_dir(stem.parent, "--out")
    paths = []
    for fmt in formats:
        p = stem.parent / f"{stem.name}.{fmt}"          # not with_suffix: names may contain dots
        fig.savefig(p, dpi=130, bbox_inches="tight")
        paths.append(p)
    pyplot().close(fig)
    return paths


# -- reading tables -----------------------------------------------------------------------------------------------
def read_table(path) -> pd.DataFrame:
    path = Path(path)
    if path.is_dir():
        for name in ("results.csv", "evaluations.csv", "requests.csv"):
            if (path / name).exists():
                path = path / name
                break
    if not path.exists():
        raise UserError(f"{path}: no such table (give a results.csv, a sweep/capacity directory, or a run directory)")
    from sim.scenario.yamlio import read_text
    read_text(path, "table")                    # a directory, an empty or binary file: one line
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise UserError(f"{path}: not a readable CSV table ({str(e).splitlines()[0]})") from None
    if df.empty:
        raise UserError(f"{path}: has no rows (columns: {', '.join(map(str, df.columns)) or 'none'}); nothing to plot")
    return df


def results_table(path, kind: str) -> pd.DataFrame:
    """A sweep's results.csv or a capacity search's evaluations.csv; a run's tables or any other file are named as
    what they are, not reported as missing columns or rows."""
    df = read_table(path)
    if not ({"status", "policy"} <= set(df.columns) or {"rate", "policy"} <= set(df.columns)):
        cols = ", ".join(map(str, df.columns[:8])) + (", ..." if len(df.columns) > 8 else "")
        raise UserError(f"{path}: is not a sweep or capacity results table (its columns: {cols}); plot {kind} reads "
                        "the results.csv of `servesim sweep` or the evaluations.csv of `servesim capacity` (a run's "
                        "tables go to plot cdf and plot timeline)")
    return df


def sweep_axes(results_path) -> list:
    """The grid axes of a sweep, from the sweep.yaml written beside its results.csv (empty if absent)."""
    p = Path(results_path)
    manifest = (p if p.is_dir() else p.parent) / "sweep.yaml"
    if not manifest.exists():
        return []
    return list((yaml.safe_load(manifest.read_text()) or {}).get("grid", {}))


def apply_where(df: pd.DataFrame, where) -> pd.DataFrame:
    """Keep rows where each `col=value` holds (values compared as text, so 1000 matches 1000.0 only if written so)."""
    for cond in where or ():
        if "=" not in cond:
            raise UserError(f"--where {cond!r}: expected COLUMN=VALUE")
        col, val = cond.split("=", 1)
        _need_columns(df, [col], "--where")
        keep = df[col].astype(str) == val
        if not keep.any():
            try:
                keep = np.isclose(pd.to_numeric(df[col], errors="coerce"), float(val))
            except ValueError:
                pass
        df = df[keep]
    if df.empty:
        raise UserError(f"--where {' '.join(where)}: no rows left")
    return df


def _need_columns(df, cols, what):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise UserError(f"{what}: no column(s) {', '.join(missing)}; have: {', '.join(map(str, df.columns))}")


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "8", "h", "p")   # "*" marks capacities
LINESTYLES = ("-", "--", "-.", ":")
AXIS_NAMES = {"workload.rate": ("request rate", "req/s"), "rate": ("request rate", "req/s"),
              "memory.M": ("KV capacity M", "tokens"), "M": ("KV capacity M", "tokens")}


def series_style(i: int, n: int) -> dict:
    """Colour, marker and line style of series i of n, all distinct up to 20 series and the (colour, marker,
    line) triple distinct for any n: colours from a perceptually spaced map rather than a 10-colour cycle."""
    import matplotlib
    cmap = matplotlib.colormaps["tab20" if n <= 20 else "turbo"]
    colour = cmap(i % 20) if n <= 20 else cmap(i / max(n - 1, 1))
    return {"color": colour, "marker": MARKERS[i % len(MARKERS)],
            "ls": LINESTYLES[(i // len(MARKERS)) % len(LINESTYLES)]}


def axis_label(name: str) -> str:
    """A column or scenario field as an axis label with its unit, e.g. `ttft_p99 (s)`, `request rate (req/s)`."""
    from sim.metrics.glossary import unit
    if name in AXIS_NAMES:
        what, u = AXIS_NAMES[name]
        return f"{what} ({u})"
    u = unit(name) or unit(name.removesuffix("_s")) or ("s" if name.endswith("_s") else "")
    return f"{name} ({u})" if u else name


def _legend_outside(ax, n: int) -> None:
    """The legend to the right of the axes, so it never covers data; two columns past 15 series."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False,
              ncol=2 if n > 15 else 1)


def _label(keys, values) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{v}" if k == "policy" else f"{k}={v}" for k, v in zip(keys, values))


# -- metric vs an axis ----------------------------------------------------------------------------------------------
def plot_metric(df: pd.DataFrame, x: str, y: str, hue=("policy",), ax=None, logx=False, logy=False):
    """One line per hue combination: the mean over seeds, with a band from the min to the max seed."""
    plt = pyplot()
    hue = [h for h in hue if h != x]
    _need_columns(df, [x, y, *hue], "plot")
    if "status" in df:
        df = df[df["status"] == "ok"]
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4))
    groups = list(df.groupby(hue, sort=False)) if hue else [((), df)]
    for i, (key, g) in enumerate(groups):
        stats = g.groupby(x)[y].agg(["mean", "min", "max", "count"]).sort_index()
        style = series_style(i, len(groups))
        line, = ax.plot(stats.index, stats["mean"], ms=4, lw=1.3, label=_label(hue, key) if hue else y, **style)
        if (stats["count"] > 1).any():
            ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    ax.set_title(f"{y} vs {x}" + (f" by {', '.join(hue)}" if hue else "") + (" (band: min–max over seeds)" if
                 (df.groupby([*hue, x])[y].count() > 1).any() else ""), fontsize=9)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if hue:
        _legend_outside(ax, len(groups))
    return fig or ax.figure


def non_monotone_steps(df: pd.DataFrame, x: str, y: str, hue) -> dict:
    """Per series, the x values where the mean y rises again after falling (attainment should only fall with
    load): {label: [x, ...]}. A capacity search assumes monotonicity; past such a point its answer is the first
    crossing, and a higher rate may pass again."""
    out = {}
    groups = df.groupby(hue, sort=False) if hue else [((), df)]
    for key, g in groups:
        s = g.groupby(x)[y].mean().sort_index()
        v = s.to_numpy(float)
        bumps = [s.index[i] for i in range(1, len(v)) if v[i] > v[i - 1] + 1e-9]
        if bumps:
            out[_label(hue, key) if hue else y] = bumps
    return out


def plot_attainment(df: pd.DataFrame, x: str, y: str = "slo_attainment", capacity: pd.DataFrame | None = None,
                    target: float | None = None, hue=("policy",)):
    """SLO attainment vs rate per policy (seed bands), the target as a dashed line, each capacity point marked."""
    fig = plot_metric(df, x, y, hue=hue)
    ax = fig.axes[0]
    colors = {line.get_label(): line.get_color() for line in ax.get_lines()}
    hue_cols = [h for h in hue if h != x]
    bumps = non_monotone_steps(df[df["status"] == "ok"] if "status" in df else df, x, y, hue_cols)
    for label, xs in bumps.items():
        g = df if not hue_cols else df[[_label(hue_cols, k if isinstance(k, tuple) else (k,)) == label
                                        for k in zip(*(df[h] for h in hue_cols))]]
        ys = g.groupby(x)[y].mean()
        ax.scatter(xs, [ys[v] for v in xs], s=90, facecolors="none", edgecolors="red", lw=1.2, zorder=6)
    if bumps:
        ax.text(0.01, 0.01, "red circles: attainment rises again with load (not monotone); a capacity is the "
                "first crossing", transform=ax.transAxes, fontsize=7, color="red", va="bottom")
    if target is None and capacity is not None and "target_attainment" in capacity:
        target = float(capacity["target_attainment"].iloc[0])
    if target is not None:
        ax.axhline(target, ls="--", color="gray", lw=1, label=f"target {target:g}")
    if capacity is not None:
        _need_columns(capacity, ["policy", "capacity_rps"], "capacity table")
        for pol, g in capacity.groupby("policy", sort=False):
            c = float(g["capacity_rps"].mean())
            ax.axvline(c, color=colors.get(str(pol), "k"), ls=":", lw=1)
            ax.plot([c], [target if target is not None else y_at(df, x, y, pol, c)], marker="*", ms=12,
                    color=colors.get(str(pol), "k"), zorder=5)
            ax.annotate(f"{c:.3g}", (c, target or 0), textcoords="offset points", xytext=(4, -12), fontsize=7)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"SLO attainment vs {x}" + (" with capacity (star)" if capacity is not None else ""), fontsize=9)
    _legend_outside(ax, len(ax.get_lines()))
    return fig


def y_at(df, x, y, pol, xv) -> float:
    g = df[df["policy"] == pol].groupby(x)[y].mean().sort_index()
    return float(np.interp(xv, g.index.to_numpy(float), g.to_numpy(float)))


# -- distributions and timelines -------------------------------------------------------------------------------------
def plot_cdfs(tables: dict, metrics=("ttft_s", "tbt_p99_s", "e2e_s")):
    """Empirical CDFs, one panel per metric, one line per run (finished requests only)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for i, (label, req) in enumerate(tables.items()):
            _need_columns(req, [m], f"cdf of {label}")
            v = np.sort(req[m].dropna().to_numpy(float))
            style = series_style(i, len(tables))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, color=style["color"],
                        ls=LINESTYLES[i % len(LINESTYLES)])
        ax.set_xlabel(axis_label(m))
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"CDF of {m}", fontsize=9)
        ax.grid(alpha=0.3)
    _legend_outside(axes[0][-1], len(tables))
    return fig


POOL_COLORMAPS = {"serve": "Greens", "prefill": "Blues", "decode": "Oranges"}


def replica_styles(iters: pd.DataFrame) -> dict:
    """replica → (colour, label) for a cluster run's iterations: a shade of its pool's colour (prefill blue, decode
    orange, a plain replica green), so a plot shows which role each line plays."""
    plt = pyplot()
    pools = (iters.groupby("replica")["pool"].first() if "pool" in iters
             else pd.Series("serve", index=sorted(iters["replica"].unique())))
    out = {}
    for pool, reps in pools.groupby(pools):
        cmap = plt.get_cmap(POOL_COLORMAPS.get(pool, "Greys"))
        n = len(reps)
        for k, rep in enumerate(reps.index):
            shade = 0.55 + 0.4 * (k / max(n - 1, 1))      # light to dark, never white
            out[int(rep)] = (cmap(shade), f"replica {int(rep)} ({pool})")
    return dict(sorted(out.items()))


def _pool_legend(ax, styles: dict) -> None:
    """One legend entry per replica when few, else one per pool."""
    from matplotlib.lines import Line2D
    if len(styles) <= 12:
        handles = [Line2D([], [], color=c, lw=1.2, label=lab) for c, lab in styles.values()]
    else:
        seen = {}
        for c, lab in styles.values():
            seen.setdefault(lab.split("(")[-1].rstrip(")"), c)
        handles = [Line2D([], [], color=c, lw=1.2, label=f"{pool} replicas") for pool, c in seen.items()]
    ax.legend(handles=handles, fontsize=7, ncol=2)


def plot_timeline(iters: pd.DataFrame, capacity_tokens=None, title: str = ""):
    """One run over time: batch size, running size, KV use, cumulative evictions/preemptions. A cluster run (its
    iterations carry `replica`) draws one line per replica, coloured by pool; `capacity_tokens` may then map each
    replica to its own M."""
    plt = pyplot()
    _need_columns(iters, ["start_s", "batch_size", "running", "kv_alloc_tokens", "preemptions"], "timeline")
    fig, axes = plt.subplots(4, 1, figsize=(7, 7.5), sharex=True)
    if "replica" in iters:
        styles = replica_styles(iters)
        groups = [(int(rep), g.sort_values("start_s", kind="stable")) for rep, g in iters.groupby("replica")]
    else:
        styles, groups = {}, [(None, iters)]
    for rep, g in groups:
        color, label = styles.get(rep, (None, None))
        t = g["start_s"].to_numpy(float)
        axes[0].plot(t, g["batch_size"], lw=0.8, color=color)
        axes[1].plot(t, g["running"], lw=0.8, color=color, label=None if rep is not None else "running")
        if "waiting" in g and rep is None:
            axes[1].plot(t, g["waiting"], lw=0.8, label="waiting")
        cap = capacity_tokens.get(rep) if isinstance(capacity_tokens, dict) else capacity_tokens
        kv = g["kv_alloc_tokens"].to_numpy(float)
        axes[2].plot(t, kv / cap if cap else kv, lw=0.8, color=color)
        axes[3].plot(t, np.cumsum(g["preemptions"].to_numpy()), lw=0.8, color=color)
    if styles:
        _pool_legend(axes[0], styles)
    elif "waiting" in iters:
        axes[1].legend(fontsize=7)
    axes[0].set_ylabel("batch size")
    axes[1].set_ylabel("running requests" if styles else "requests")
    axes[2].set_ylabel("KV used / M" if capacity_tokens else "KV tokens")
    axes[3].set_ylabel("preemptions (cum.)")
    axes[3].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        axes[0].set_title(title)
    return fig


def plot_replica_load(iters: pd.DataFrame, title: str = ""):
    """A cluster run: running requests and KV use per replica over time (sim/cluster/results.per_replica_load),
    one line per replica coloured by its pool."""
    from sim.cluster.results import per_replica_load
    plt = pyplot()
    _need_columns(iters, ["start_s", "duration_s", "running", "kv_alloc_tokens", "replica"], "replicas")
    load = per_replica_load(iters)
    styles = replica_styles(iters)
    fig, axes = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for rep, g in load.groupby("replica"):
        color, label = styles[int(rep)]
        axes[0].plot(g["t_s"], g["running"], lw=0.8, color=color, label=label)
        axes[1].plot(g["t_s"], g["kv_alloc_tokens"], lw=0.8, color=color)
    axes[0].set_ylabel("running requests")
    axes[1].set_ylabel("KV tokens in use")
    axes[1].set_xlabel("time (s)")
    _pool_legend(axes[0], styles)
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        axes[0].set_title(title)
    return fig


def replica_capacities(run_dir: Path):
    """replica → M from a cluster run's replicas.csv, or None."""
    p = run_dir / "replicas.csv" if run_dir.is_dir() else None
    if p is None or not p.exists():
        return None
    per = pd.read_csv(p)
    return dict(zip(per["replica"].astype(int), per["M"].astype(int))) if {"replica", "M"} <= set(per) else None


def capacity_from_summary(run_dir: Path, iters: pd.DataFrame) -> int | None:
    """M recovered from a run's summary.csv (kv_util_max = max KV allocated / M), when the run dir has one."""
    p = run_dir / "summary.csv" if run_dir.is_dir() else None
    if p is None or not p.exists():
        return None
    s = pd.read_csv(p)
    util = float(s["kv_util_max"].iloc[0]) if "kv_util_max" in s else float("nan")
    peak = float(iters["kv_alloc_tokens"].max()) if len(iters) else 0.0
    return int(round(peak / util)) if util > 0 and peak > 0 else None


# -- CLI ----------------------------------------------------------------------------------------------------------
def _csv_list(text):
    return [s for s in (text or "").split(",") if s]


def cmd_plot(args) -> int:
    kind = args.kind
    if args.target is not None and not 0 < args.target <= 1:        # (1.5 or -1 drew a line off the scale)
        raise UserError(f"--target: an attainment target must be in (0, 1], got {args.target:g}")
    if args.capacity_tokens is not None and args.capacity_tokens < 1:  # (0 fell back to the run's M)
        raise UserError(f"--capacity-tokens: must be >= 1 (KV tokens, M), got {args.capacity_tokens}")
    if kind in ("metric", "attainment"):
        if len(args.inputs) != 1:
            raise UserError(f"plot {kind}: give one results table (results.csv, a sweep or capacity directory)")
        df = apply_where(results_table(args.inputs[0], kind), args.where)
        if "rate" in df.columns and args.x == "workload.rate" and "workload.rate" not in df.columns:
            df = df.rename(columns={"rate": "workload.rate"})   # a capacity evaluations.csv
        hue = _csv_list(args.hue) if args.hue else ["policy"] + [a for a in sweep_axes(args.inputs[0])
                                                                  if a not in (args.x, "seed", "policy.name")
                                                                  and df.get(a, pd.Series()).nunique() > 1]
        if kind == "metric":
            fig = plot_metric(df, args.x, args.y or "tps", hue=hue, logx=args.logx, logy=args.logy)
        else:
            cap = None
            if args.capacity:
                cap = read_table(Path(args.capacity) / "capacity.csv" if Path(args.capacity).is_dir()
                                 else args.capacity)
            fig = plot_attainment(df, args.x, args.y or "slo_attainment", capacity=cap, target=args.target, hue=hue)
            if args.logx:
                fig.axes[0].set_xscale("log")
        default = Path(args.inputs[0]) if Path(args.inputs[0]).is_dir() else Path(args.inputs[0]).parent
        what = (args.y or "tps") if kind == "metric" else "slo"
        stem = args.out or default / f"{kind}_{what}_vs_{args.x.replace('.', '_')}"
    elif kind == "cdf":
        tables = {}
        for d in args.inputs:
            p = Path(d)
            req = read_table(p / "requests.csv" if p.is_dir() else p)
            tables[p.name if p.is_dir() else p.stem] = apply_where(req, args.where) if args.where else req
        fig = plot_cdfs(tables, _csv_list(args.metrics))
        stem = args.out or Path(args.inputs[0]) / "cdf"
    elif kind == "timeline":
        if len(args.inputs) != 1:
            raise UserError("plot timeline: give one run directory (written by `servesim run --out DIR`)")
        p = Path(args.inputs[0])
        iters = read_table(p / "iterations.csv" if p.is_dir() else p)
        cap = args.capacity_tokens or (replica_capacities(p) if "replica" in iters else
                                       capacity_from_summary(p, iters))
        fig = plot_timeline(iters, cap, title=p.name)
        stem = args.out or (p if p.is_dir() else p.parent) / "timeline"
    elif kind == "replicas":
        if len(args.inputs) != 1:
            raise UserError("plot replicas: give one cluster run directory (written by `servesim run --out DIR`)")
        p = Path(args.inputs[0])
        iters = read_table(p / "iterations.csv" if p.is_dir() else p)
        if "replica" not in iters.columns:
            raise UserError(f"plot replicas: {p} is not a cluster run (its iterations have no replica column)")
        fig = plot_replica_load(iters, title=p.name)
        stem = args.out or (p if p.is_dir() else p.parent) / "replicas"
    else:  # pragma: no cover - argparse restricts kind
        raise UserError(f"plot: unknown kind {kind!r}")
    paths = save_figure(fig, stem, _csv_list(args.formats))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("plot", help="plots (PNG + SVG) of sweep, capacity and run tables",
                       description="metric: a metric vs any axis, one line per policy, seed bands. attainment: SLO "
                                   "attainment vs rate with the capacity point. cdf: TTFT/TBT/e2e CDFs of runs. "
                                   "timeline: one run's batch size, running size, KV use and evictions over time. "
                                   "replicas: a cluster run's load and KV use per replica over time.")
    p.add_argument("kind", choices=("metric", "attainment", "cdf", "timeline", "replicas"))
    p.add_argument("inputs", nargs="+", help="results.csv / sweep or capacity dir (metric, attainment); run dirs "
                                             "with requests.csv (cdf) or iterations.csv (timeline)")
    p.add_argument("--x", default="workload.rate", help="x axis column (default workload.rate)")
    p.add_argument("--y", help="metric column (default: tps for metric, slo_attainment for attainment)")
    p.add_argument("--hue", help="comma list of columns, one line per combination (default policy + varying axes)")
    p.add_argument("--where", action="append", default=[], metavar="COL=VALUE", help="keep only matching rows")
    p.add_argument("--capacity", help="capacity.csv (or its directory) to mark capacity points on an attainment plot")
    p.add_argument("--target", type=float, help="attainment target line")
    p.add_argument("--metrics", default="ttft_s,tbt_p99_s,e2e_s", help="cdf panels (request-table columns)")
    p.add_argument("--capacity-tokens", type=int, help="timeline: M, to show KV use as a fraction")
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    p.add_argument("--formats", default="png,svg", help="comma list of file formats (default png,svg)")
    p.add_argument("--out", help="output path without extension")
    p.set_defaults(func=cmd_plot)


def plot_gantt(res, inst, path) -> None:
    """An optimal schedule (solver result `res` on instance `inst`) as a Gantt chart: one row per request, one bar per batch it is in: prefill/refill chunks, decode steps, and evictions."""
    plt = pyplot()
    traj = res.trajectory
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.45 * inst.n))
    for j, step in enumerate(res.schedule.steps, start=1):
        t0, dt = traj.start_ms[j - 1], traj.batch_ms[j - 1]
        for i, c in step.tokens.items():
            decode = traj.values[("d", i, j)] == 1
            ax.barh(i, dt, left=t0, color="tab:blue" if decode else "tab:orange", edgecolor="white", linewidth=0.5)
            if not decode:
                ax.text(t0 + dt / 2, i, str(c), ha="center", va="center", fontsize=7)
        for i in step.evict:
            ax.plot(t0, i, marker="x", color="tab:red", markersize=9)
    ax.set_yticks(range(inst.n))
    ax.set_yticklabels([f"r{i} (I={inst.prompt[i]}, O={inst.output[i]})" for i in range(inst.n)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{res.status} {res.objective} = {res.incumbent_s * 1e3:.3f} ms "
                 f"(orange: prefill/refill tokens, blue: decode, x: eviction)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
