"""Sweeps: expand a grid of scenario fields into points, run them (processes or Dask), keep one file per point."""
from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from costmodels.errors import UserError
from sim.options import jobs_count
from sim.scenario.config import apply_overrides, read_yaml_mapping, scenario_from_dict
from sim.scenario.config import set_field as scenario_set_field
from study.executors import run_tasks

# Leading columns of a results table; the axes and the run metrics follow.
ID_COLUMNS = ("point", "key", "status", "error", "policy", "seed")


@dataclass
class Axis:
    """One grid dimension: a dotted scenario field (the names `--set` uses) and its values."""
    key: str
    values: list


@dataclass
class SweepSpec:
    """A base scenario (raw YAML mapping), fixed overrides, and the axes whose product is the grid."""
    name: str
    base: dict
    source: str
    axes: list = field(default_factory=list)
    fixed: dict = field(default_factory=dict)
    set_keys: list = field(default_factory=list)    # the --set keys (already applied to base)


@dataclass
class Point:
    """One run of the grid: its position, its axis values, its fully resolved scenario and that scenario's hash."""
    index: int
    values: dict
    raw: dict
    key: str


# -- parsing ----------------------------------------------------------------------------------------------------
def parse_value(text: str):
    """A grid value from the command line, read as `--set` and scenario files read it (sim.scenario.yamlio)."""
    from sim.scenario.yamlio import scalar
    return scalar(text)


def parse_grid_arg(text: str) -> Axis:
    """`key=v1,v2,...` or `key=[yaml, flow, list]` (for values that contain commas, such as mappings)."""
    if "=" not in text:
        raise UserError(f"--grid {text!r}: expected KEY=V1,V2,... with a dotted scenario key, e.g. workload.rate=1,2,4")
    key, rhs = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise UserError(f"--grid {text!r}: the key must be a dotted scenario field such as memory.M")
    rhs = rhs.strip()
    if rhs.startswith("["):
        from sim.scenario.yamlio import load
        values = load(rhs, f"--grid {text!r}")
        if not isinstance(values, list):
            raise UserError(f"--grid {text!r}: a value starting with [ must be a YAML list")
    else:
        values = [parse_value(v) for v in rhs.split(",") if v.strip() != ""]
    if not values:
        raise UserError(f"--grid {text!r}: no values given")
    return Axis(key, list(values))


def set_field(raw: dict, key: str, value, where: str) -> None:
    """Set a dotted field in a raw scenario mapping, creating sections on the way, exactly as `--set` does (vLLM's
    names included: a grid over policy.max_num_seqs replaces the base's R_max)."""
    from sim.scenario.config import lift_aliases
    lifted = lift_aliases(raw)
    if lifted is not raw:                       # top-level vLLM names moved into their sections
        raw.clear()
        raw.update(lifted)
    scenario_set_field(raw, key.split("."), copy.deepcopy(value), f"{where}: {key!r}")


def _read_yaml(path: Path) -> dict:
    return read_yaml_mapping(path)


SWEEP_KEYS = ("name", "scenario", "set", "grid")


def load_sweep(path, grid_args=(), set_args=()) -> SweepSpec:
    """A scenario YAML (grid from --grid) or a sweep YAML (`scenario:` path or mapping, `set:`, `grid:`)."""
    path = Path(path)
    raw = _read_yaml(path)
    if "grid" in raw:                                   # a sweep file
        bad = sorted(set(raw) - set(SWEEP_KEYS))
        if bad:
            raise UserError(f"{path}: unknown key(s) {', '.join(bad)} in a sweep file; allowed: {', '.join(SWEEP_KEYS)}")
        scn = raw.get("scenario")
        if isinstance(scn, str):
            from sim.paths import resolve_user_path
            scn_path = resolve_user_path(scn, path.parent)
            base, source = _read_yaml(scn_path), str(scn_path)
        elif isinstance(scn, dict):
            base, source = scn, str(path)
        else:
            raise UserError(f"{path}: scenario: expected a scenario file path or an inline scenario mapping")
        grid = raw.get("grid") or {}
        if not isinstance(grid, dict):
            raise UserError(f"{path}: grid: expected a mapping of dotted field -> list of values")
        axes = []
        for k, vals in grid.items():
            vals = vals if isinstance(vals, list) else [vals]
            if not vals:
                raise UserError(f"{path}: grid.{k}: empty list of values")
            axes.append(Axis(str(k), vals))
        fixed = raw.get("set") or {}
        if not isinstance(fixed, dict):
            raise UserError(f"{path}: set: expected a mapping of dotted field -> value")
        name = raw.get("name") or path.stem
    else:
        base, source, axes, fixed, name = raw, str(path), [], {}, raw.get("name") or path.stem
    spec = SweepSpec(str(name), base, source, axes, dict(fixed))
    cli_keys = set()
    for text in grid_args or ():
        ax = parse_grid_arg(text)
        if ax.key in cli_keys:
            raise UserError(f"--grid {ax.key}: given twice; list all its values in one --grid {ax.key}=V1,V2,...")
        cli_keys.add(ax.key)
        keys = [a.key for a in spec.axes]
        if ax.key in keys:                              # replace the file's axis in place, keeping the order
            spec.axes[keys.index(ax.key)] = ax
        else:
            spec.axes.append(ax)
    if set_args:
        # --set goes through the scenario's own override parser, then becomes part of the base.
        spec.base = apply_overrides(spec.base, set_args)
        spec.set_keys = [t.split("=", 1)[0].strip() for t in set_args]
    if not spec.axes:
        raise UserError(f"{path}: no grid axes; give --grid KEY=V1,V2 or a `grid:` mapping in a sweep file")
    return spec


def load_sweep_base(path, set_args=()) -> tuple:
    """A plain scenario file with --set applied: (raw mapping, source, name), for commands that vary one field."""
    path = Path(path)
    raw = _read_yaml(path)
    if "grid" in raw:
        raise UserError(f"{path}: this is a sweep file (it has grid:); give a scenario file here")
    return apply_overrides(raw, set_args), str(path), str(raw.get("name") or path.stem)


# -- points -----------------------------------------------------------------------------------------------------
def _canonical(obj):
    """JSON-ready form where 2 and 2.0 hash alike (the simulator treats them alike)."""
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2 ** 53:
        return int(obj)
    return obj


def scenario_key(resolved: dict) -> str:
    """Identity of a run: a hash of the fully resolved scenario (seed included)."""
    text = json.dumps(_canonical(resolved), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def expand(spec: SweepSpec) -> list:
    """Every point of the grid, in row-major order of the axes; each scenario is validated before anything runs."""
    points = []
    seen = {}
    first = None
    for i, combo in enumerate(itertools.product(*(a.values for a in spec.axes))):
        raw = copy.deepcopy(spec.base)
        for k, v in spec.fixed.items():
            set_field(raw, str(k), v, f"{spec.name}: set")
        values = {}
        for ax, v in zip(spec.axes, combo):
            set_field(raw, ax.key, v, f"{spec.name}: grid axis")
            values[ax.key] = v
        try:
            scn = scenario_from_dict(raw, source=spec.source)
        except UserError as e:
            where = ", ".join(f"{k}={v}" for k, v in values.items())
            raise UserError(f"{spec.source}: grid point {where}: {e}") from None
        first = first or scn
        resolved = scn.to_dict()
        key = scenario_key(resolved)
        if key in seen:
            raise UserError(f"{spec.name}: grid points {seen[key]} and {i} resolve to the same scenario; "
                            f"remove the duplicate value")
        seen[key] = i
        points.append(Point(i, values, resolved, key))
    if first is not None:
        _check_free_form_keys(spec, first)
    return points


FREE_FORM = ("policy", "costmodel", "workload")      # sections whose keys are checked only where they are built
_UNKNOWN_KEYS = re.compile(r"unknown (?:key|knob)\(s\) (.+?)(?:;| for |$)")


def _check_free_form_keys(spec: SweepSpec, scn) -> None:
    """A misspelt grid axis or --set key inside policy, costmodel or workload would otherwise fail every point one
    by one: build the sections the keys touch for the first point, and stop before anything runs if a section
    rejects one of those keys as unknown (other errors stay per point)."""
    from sim.scenario.build import build_section
    keys = [a.key for a in spec.axes] + [str(k) for k in spec.fixed] + list(spec.set_keys)
    for section in FREE_FORM:
        leaves = {k.rsplit(".", 1)[-1] for k in keys if k.split(".", 1)[0] == section and "." in k}
        if not leaves:
            continue
        try:
            build_section(scn, section)
        except UserError as e:
            named = _UNKNOWN_KEYS.search(str(e))
            if named and leaves & {x.strip() for x in named.group(1).split(",")}:
                raise UserError(f"{spec.source}: {e}") from None


def check_points(spec: SweepSpec, points: list) -> None:
    """Build every point (its replicas and its workload) before the first run; one line naming the first invalid
    point and how many there are. Points that differ only in seed (or only in workload) share one check."""
    from sim.cluster.runner import check_scenario
    from sim.scenario.build import build_section
    seen_build, seen_workload, bad = {}, {}, []
    for pt in points:
        scn = scenario_from_dict(pt.raw, source=spec.source)
        rest = {k: v for k, v in pt.raw.items() if k not in ("seed", "workload", "name")}
        checks = ((seen_build, json.dumps(_canonical(rest), sort_keys=True, default=str),
                   lambda: check_scenario(scn, requests=[])),
                  (seen_workload, json.dumps(_canonical(pt.raw.get("workload")), sort_keys=True, default=str),
                   lambda: build_section(scn, "workload")))
        for seen, key, check in checks:
            if key not in seen:
                try:
                    check()
                    seen[key] = ""
                except UserError as e:
                    seen[key] = str(e)
            if seen[key]:
                bad.append((pt, seen[key]))
                break
    if bad:
        pt, why = bad[0]
        where = ", ".join(f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in pt.values.items())
        more = f" ({len(bad)} of {len(points)} points are invalid; nothing was run)" if len(bad) > 1 else \
            " (nothing was run)"
        raise UserError(f"{spec.source}: grid point {pt.index} ({where}): {why}{more}")


# -- one run ----------------------------------------------------------------------------------------------------
def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None                          # JSON has no NaN/inf; the table shows an empty cell
    if hasattr(v, "item"):
        return v.item()
    return v


def run_point(resolved: dict, source: str, keep_dir: str | None = None) -> dict:
    """Run one resolved scenario; never raises: a failure comes back as status=error with its message."""
    from sim.cluster.runner import run_scenario
    t0 = time.perf_counter()
    row = {"status": "ok", "error": ""}
    try:
        scn = scenario_from_dict(resolved, source=source)
        res = run_scenario(scn)
        row.update({k: _plain(v) for k, v in res.summary.items()})
        row["M"] = int(res.capacity_tokens)
        if keep_dir:
            res.write(keep_dir)
    except Exception as e:  # a point's failure is data, not the end of the sweep
        row = {"status": "error", "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    if row["status"] == "error":
        row["wall_s"] = time.perf_counter() - t0
    return row


# -- the store: one JSON file per finished point ------------------------------------------------------------------
class PointStore:
    """`OUT/points/<key>.json`, written atomically (temp file + rename), so a crash never leaves half a row."""

    def __init__(self, out_dir):
        self.out = Path(out_dir)
        self.dir = self.out / "points"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str):
        p = self.path(key)
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except (json.JSONDecodeError, OSError):
            return None                     # unreadable = not done; it will be rerun

    def write(self, key: str, record: dict) -> None:
        tmp = self.dir / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, allow_nan=False, default=str))
        os.replace(tmp, self.path(key))


def _record(point: Point, row: dict) -> dict:
    return {"key": point.key, "values": point.values, "seed": point.raw.get("seed"),
            "policy": (point.raw.get("policy") or {}).get("name"), "row": row}


def results_table(points, records: dict, axes) -> pd.DataFrame:
    """One row per point in grid order: ids, axis values, then every metric the run produced."""
    rows = []
    for pt in points:
        rec = records.get(pt.key)
        if rec is None:
            continue
        row = {"point": pt.index, "key": pt.key, "status": rec["row"].get("status"), "error": rec["row"].get("error", ""),
               "policy": rec.get("policy"), "seed": rec.get("seed")}
        for ax in axes:
            v = pt.values[ax.key]
            row[ax.key] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
        for k, v in rec["row"].items():
            if k not in row:
                row[k] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in df.columns:
        # Integer metrics stay integers even when error rows leave holes (pandas would make them floats).
        vals = [r[col] for r in rows if r.get(col) is not None]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            df[col] = df[col].astype("Int64")
    if len(df):
        lead = [c for c in ID_COLUMNS if c in df] + [a.key for a in axes if a.key not in ID_COLUMNS]
        # metrics in the order a successful run reports them, even when the first point failed
        ok = next((r for r in rows if r["status"] == "ok"), {})
        rest = [c for c in ok if c not in lead] + [c for c in df.columns if c not in lead and c not in ok]
        df = df[lead + rest]
    return df


@dataclass
class SweepOutcome:
    table: pd.DataFrame
    ran: int
    skipped: int
    errors: int
    interrupted: bool
    out_dir: Path
    wall_s: float


def run_sweep(spec: SweepSpec, out_dir, jobs: int = 1, dask: str | None = None, progress: bool | None = None,
              retry_errors: bool = False, keep_runs: bool = False, on_point=None, points=None) -> SweepOutcome:
    """Run every point not already in the store; write each as it finishes; assemble the results table. `points`:
    the grid already expanded and checked (check_points); else both are done here."""
    t0 = time.perf_counter()
    if points is None:
        points = expand(spec)
        check_points(spec, points)          # an invalid point stops the sweep before the first run
    store = PointStore(out_dir)
    _write_manifest(store.out, spec, len(points))
    records, todo = {}, []
    for pt in points:
        rec = store.load(pt.key)
        if rec is not None and not (retry_errors and rec["row"].get("status") == "error"):
            records[pt.key] = rec
        else:
            todo.append(pt)
    skipped = len(points) - len(todo)
    runs_dir = store.out / "runs"
    tasks = [(run_point, (pt.raw, spec.source, str(runs_dir / pt.key) if keep_runs else None), pt) for pt in todo]
    ran = errors = 0
    interrupted = False
    from study.progress import progress_bar
    bar = progress_bar(total=len(points), initial=skipped, desc=spec.name, unit="run", enabled=progress)
    try:
        for pt, row in run_tasks(tasks, jobs=jobs, dask=dask):
            rec = _record(pt, row)
            store.write(pt.key, rec)
            records[pt.key] = rec
            ran += 1
            errors += row.get("status") == "error"
            bar.update(1)
            if errors:
                bar.set_postfix(errors=errors, refresh=False)
            if on_point is not None:
                on_point(pt, row)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        table = results_table(points, records, spec.axes)
        write_table(table, store.out / "results.csv")
    if interrupted:
        raise SweepInterrupted(SweepOutcome(table, ran, skipped, errors, True, store.out, time.perf_counter() - t0))
    return SweepOutcome(table, ran, skipped, errors, False, store.out, time.perf_counter() - t0)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C mid-sweep: the finished points are stored and the partial table written; rerun to finish."""

    def __init__(self, outcome: SweepOutcome):
        super().__init__("sweep interrupted")
        self.outcome = outcome


def write_table(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def _write_manifest(out: Path, spec: SweepSpec, n: int) -> None:
    doc = {"name": spec.name, "source": spec.source, "points": n, "set": spec.fixed,
           "grid": {a.key: a.values for a in spec.axes}, "base": spec.base}
    (out / "sweep.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


# -- CLI --------------------------------------------------------------------------------------------------------
def add_parallel_args(p) -> None:
    p.add_argument("--jobs", "-j", type=jobs_count, default=1, help="local worker processes (default 1)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: a scheduler address, or 'local' for a "
                                                       "LocalCluster with --jobs workers (needs servesim[dask])")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar with ETA (default: on when stderr is a terminal)")


def cmd_sweep(args) -> int:
    if args.seeds:                                 # --seeds 0-4: the seed axis, folded into intervals after the run
        from study.intervals import parse_seeds
        if any(g.split("=", 1)[0].strip() == "seed" for g in args.grid):
            raise UserError("--seeds and --grid seed=...: give the seeds once")
        args.grid = list(args.grid) + ["seed=" + ",".join(map(str, parse_seeds(args.seeds)))]
    spec = load_sweep(args.sweep, args.grid, args.set)
    from sim.paths import output_dir
    out = output_dir(args.out or Path("out") / "sweeps" / spec.name)
    points = expand(spec)
    check_points(spec, points)          # before anything is printed or run: an invalid point is the one line
    n = len(points)
    print(f"sweep {spec.name}: {n} points over {', '.join(f'{a.key}({len(a.values)})' for a in spec.axes)} "
          f"-> {out}", file=sys.stderr)
    try:
        res = run_sweep(spec, out, jobs=args.jobs, dask=args.dask, progress=args.progress,
                        retry_errors=args.retry_errors, keep_runs=args.keep_runs, points=points)
    except SweepInterrupted as e:
        o = e.outcome
        print(f"servesim: sweep interrupted; {len(o.table)}/{n} points stored in {o.out_dir}; "
              f"rerun the same command to finish", file=sys.stderr)
        return 130
    print(f"{res.ran} run, {res.skipped} already done, {res.errors} error(s) in {res.wall_s:.1f} s; "
          f"table: {res.out_dir / 'results.csv'}")
    _show(res.table, spec, args.show)
    _show_over_seeds(res.table, spec, args.show, res.out_dir)
    if res.errors or (len(res.table) and (res.table["status"] == "error").any()):
        bad = res.table[res.table["status"] == "error"]
        for _, r in bad.head(5).iterrows():
            print(f"  error at point {r['point']}: {r['error']}", file=sys.stderr)
        return 1                            # some points failed while running: not a clean sweep
    return 0


SHOW_DEFAULT = "tps,ttft_p50,ttft_p99,tpot_p99,slo_attainment,evictions"
SHOW_MAX_ROWS = 60


def _show(table: pd.DataFrame, spec: SweepSpec, show: str) -> None:
    """Print the axes and a few metrics of every point (up to SHOW_MAX_ROWS rows) so a small sweep needs no
    second command; --show picks the metric columns, --show none prints nothing."""
    if show == "none" or not len(table):
        return
    cols = [c.strip() for c in show.split(",") if c.strip()]
    unknown = [c for c in cols if c not in table.columns]
    if unknown:
        raise UserError(f"--show: no column(s) {', '.join(unknown)}; have: {', '.join(table.columns)}")
    axes = [a.key for a in spec.axes if a.key in table.columns]
    view = table[axes + cols].head(SHOW_MAX_ROWS)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        from sim.metrics.units import with_units
        print(with_units(view).to_string(index=False))
    if len(table) > SHOW_MAX_ROWS:
        print(f"... {len(table) - SHOW_MAX_ROWS} more rows in results.csv")


def _show_over_seeds(table: pd.DataFrame, spec: SweepSpec, show: str, out: Path) -> None:
    """With seed among the axes: every metric shown, folded over the seeds into a mean and a 95 % interval
    (study/intervals.py), printed and written to over_seeds.csv."""
    axes = [a.key for a in spec.axes]
    if "seed" not in axes or not len(table) or "seed" not in table:
        return
    from study.intervals import over_seeds
    cols = [c.strip() for c in (SHOW_DEFAULT if show == "none" else show).split(",") if c.strip()]
    folded = over_seeds(table, [a for a in axes if a != "seed" and a in table], cols)
    write_table(folded, out / "over_seeds.csv")
    if show == "none":
        return
    view = folded[[c for c in folded.columns if not c.endswith(("_lo", "_hi"))]].copy()
    for c in cols:
        if f"{c}_lo" in folded:
            view[c] = [f"{m:.4g} [{lo:.4g}, {hi:.4g}]" for m, lo, hi in
                       zip(folded[c], folded[f"{c}_lo"], folded[f"{c}_hi"])]
    print(f"over seeds (mean [95% interval]; {out / 'over_seeds.csv'}):")
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(view.head(SHOW_MAX_ROWS).to_string(index=False))


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of scenarios (rate x M x policy x seed ...) into one results table",
                       description="Run every combination of --grid values; one row per run in OUT/results.csv. "
                                   "Finished points are kept in OUT/points/, so rerunning skips them.")
    p.add_argument("sweep", help="a scenario YAML (axes from --grid) or a sweep YAML with scenario/set/grid")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="an axis: any dotted scenario field, e.g. --grid workload.rate=1,2,4 --grid seed=0,1,2; one "
                        "--grid per field (a second one for the same field is an error); it replaces a sweep file's "
                        "axis of that field")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed override for every point")
    p.add_argument("--seeds", action="append", metavar="S[,S]",
                   help="a seed axis (comma-separated or a range 0-4); the shown metrics are then also folded over "
                        "the seeds into a mean and a 95%% interval (over_seeds.csv)")
    p.add_argument("--out", help="results directory (default out/sweeps/<name>)")
    p.add_argument("--retry-errors", action="store_true", help="rerun points stored with an error")
    p.add_argument("--show", default=SHOW_DEFAULT, metavar="COL[,COL]",
                   help=f"metric columns printed per point after the sweep (default {SHOW_DEFAULT}; 'none' for none)")
    p.add_argument("--keep-runs", action="store_true",
                   help="also write each point's requests/iterations tables to OUT/runs/<key>/ (for CDF/timeline plots)")
    add_parallel_args(p)
    p.set_defaults(func=cmd_sweep)
