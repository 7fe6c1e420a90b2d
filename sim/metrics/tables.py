"""Run tables: one row per request and per iteration (pandas), SLO attainment and the run summary."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import pandas as pd

from sim.metrics.rowstore import INT_FIELDS

NAN = float("nan")
PCTS = (50, 90, 99)


@dataclass
class SLO:
    """Latency targets for one request class; None disables a target."""
    ttft_s: float | None = None
    tbt_p99_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    normalized_latency_s: float | None = None


def request_columns(requests) -> dict:
    """The request table's raw columns from Request objects (RequestRows.columns' names and dtypes)."""
    reqs = list(requests)

    def col(name, dtype=None):
        return np.array(list(map(attrgetter(name), reqs)), dtype=dtype)

    def times(name):
        return np.array([NAN if v is None else v for v in map(attrgetter(name), reqs)], dtype=float)

    tbt = np.array([r.tbt or (NAN, NAN, NAN) for r in reqs], dtype=float).reshape(-1, 3)
    out = {k: col(k, np.int64) for k in INT_FIELDS}
    out.update({"arrival_s": col("arrival_s", float), "first_scheduled_s": times("first_scheduled_s"),
                "first_token_s": times("first_token_s"), "completion_s": times("completion_s"),
                "tbt_mean": tbt[:, 0], "tbt_p99": tbt[:, 1], "tbt_max": tbt[:, 2],
                "cls": col("cls", object), "state": col("state", object),
                "reason": np.array([r.reason or "" for r in reqs], dtype=object)})
    return out


def request_table(requests, slos: dict | None = None, overheads=None, rows=None) -> pd.DataFrame:
    """One row per request, finished or not (unfinished rows have NaN times). Built column-wise: the same float
    operations as one row at a time (a missing time is NaN, and NaN propagates), at numpy speed. The cost model's
    front-end overheads (costmodels.base.Overheads: frontend_s + frontend_per_token_s × prompt tokens +
    frontend_steps × the request's first step) are added to TTFT and end-to-end latency, as a client measures them;
    the engine-side times (first_token_s, completion_s) stay as the engine saw them. `rows`: requests already
    retired to columns (sim/metrics/rowstore.py), which come first."""
    c = request_columns(requests)
    if rows is not None and len(rows):
        retired = rows.columns()
        c = {k: np.concatenate((retired[k], v)) for k, v in c.items()}

    def col(name, dtype=None):
        v = c[name]
        return v if dtype is None or v.dtype == dtype else v.astype(dtype)

    arrival, out = c["arrival_s"], c["output_tokens"]
    first_sched, first_tok, comp = c["first_scheduled_s"], c["first_token_s"], c["completion_s"]
    e2e = comp - arrival
    ttft = first_tok - arrival
    o = overheads
    if o is not None and (o.frontend_s or o.frontend_steps or o.frontend_per_token_s):
        front = o.frontend_s + o.frontend_per_token_s * col("prompt_tokens", float)
        if o.frontend_steps:
            front = front + o.frontend_steps * (first_tok - first_sched)
        e2e = e2e + front
        ttft = ttft + front
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where((out > 1) & ~np.isnan(comp), (comp - first_tok) / (out - 1), NAN)
        normalized = e2e / out
    df = pd.DataFrame({
        "id": c["id"], "cls": c["cls"], "status": c["state"], "arrival_s": arrival,
        "prompt_tokens": c["prompt_tokens"], "output_tokens": out,
        "predicted_output_tokens": c["predicted_output_tokens"], "generated_tokens": c["generated"],
        "first_scheduled_s": first_sched, "first_token_s": first_tok, "completion_s": comp,
        "ttft_s": ttft, "tpot_s": tpot, "tbt_mean_s": c["tbt_mean"], "tbt_p99_s": c["tbt_p99"],
        "tbt_max_s": c["tbt_max"], "e2e_s": e2e, "normalized_latency_s": normalized, "queueing_s": first_sched - arrival,
        "evictions": c["evictions"], "swaps": c["swaps"],
        "evicted_tokens": c["evicted_tokens"], "prefix_hit_tokens": c["hit_tokens"],
        "reason": c["reason"]}, copy=False)        # one array per column, not consolidated: a cluster merges
    df["slo_attained"] = slo_attained(df, slos or {})  # the replicas' tables column by column (cluster/results.py)
    return df


SLO_COLUMNS = ("ttft_s", "tbt_p99_s", "tpot_s", "e2e_s", "normalized_latency_s")


def slo_attained(df: pd.DataFrame, slos: dict) -> np.ndarray:
    """1.0 when a request completed and meets every target of its class (or of 'default'), 0.0 when it does not,
    NaN when no target applies to it (no SLO set: attainment is not defined, not 100%).

    Gap-based targets (p99 TBT, TPOT) are vacuous for single-token outputs, which have no gaps."""
    done = (df["status"] == "done").to_numpy()
    out = np.full(len(df), NAN)
    if not slos:
        return out
    cls = df["cls"].to_numpy()
    for c in np.unique(cls):
        slo = slos.get(c, slos.get("default"))
        if slo is None or all(getattr(slo, col) is None for col in SLO_COLUMNS):
            continue
        mask = cls == c
        ok = done.copy()
        for col in SLO_COLUMNS:
            target = getattr(slo, col)
            if target is None:
                continue
            v = df[col].to_numpy()
            passes = v <= target
            if col in ("tbt_p99_s", "tpot_s"):
                passes |= np.isnan(v)
            ok &= passes
        out[mask] = ok[mask]
    return out


def iteration_table(iters: dict) -> pd.DataFrame:
    return pd.DataFrame(iters)


def summarize(req: pd.DataFrame, it: pd.DataFrame, capacity_tokens: int, truncated: bool = False,
              tally=None) -> dict:
    """Run-level metrics. Latency = makespan (InferMax A13); TPS = generated tokens / makespan."""
    # the completed rows column by column (a mask, not a copy of the whole table: at 10M rows that is gigabytes)
    done = (req["status"] == "done").to_numpy(bool) if len(req) else np.zeros(0, bool)
    n_done = int(done.sum())
    t0 = req["arrival_s"].min() if len(req) else 0.0
    end = req["completion_s"][done].max() if n_done else NAN
    makespan = end - t0 if n_done else NAN
    gen = int(req["generated_tokens"].sum())
    s = {
        "requests": len(req), "completed": n_done, "infeasible": int((req["status"] == "infeasible").sum()),
        "truncated": bool(truncated), "makespan_s": makespan,
        "tps": gen / makespan if n_done and makespan > 0 else NAN,
        "request_throughput": n_done / makespan if n_done and makespan > 0 else NAN,
        "generated_tokens": gen,
    }
    for col in ("ttft_s", "tpot_s", "tbt_p99_s", "e2e_s", "normalized_latency_s", "queueing_s"):
        v = req[col].to_numpy()[done]
        v = v[~np.isnan(v)]
        base = col[:-2]
        s[f"{base}_mean"] = float(v.mean()) if len(v) else NAN
        for p in PCTS:
            s[f"{base}_p{p}"] = float(np.percentile(v, p)) if len(v) else NAN
    s["evictions"] = int(req["evictions"].sum())
    s["swaps"] = int(req["swaps"].sum())
    s["evicted_tokens"] = int(req["evicted_tokens"].sum())
    s["iterations"] = len(it)
    if tally is not None and not len(it):        # per-iteration table off: the engine's running totals
        s.update(tally.summary(capacity_tokens))
    if len(it):
        s["batch_size_mean"] = float(it["batch_size"].mean())
        s["running_mean"] = float(it["running"].mean())
        s["kv_util_mean"] = float(it["kv_alloc_tokens"].mean() / capacity_tokens)
        s["kv_util_max"] = float(it["kv_alloc_tokens"].max() / capacity_tokens)
    att = req["slo_attained"].to_numpy(float)
    has = ~np.isnan(att)
    s["slo_attainment"] = float(att[has].mean()) if has.any() else NAN      # NaN: no SLO set
    for cls in sorted(req["cls"].unique()):
        if cls != "default":
            sel = (req["cls"] == cls).to_numpy() & has
            s[f"slo_attainment_{cls}"] = float(att[sel].mean()) if sel.any() else NAN
    s["goodput_rps"] = float(att[has].sum() / makespan) if n_done and makespan > 0 and has.any() else NAN
    return s


@dataclass
class SimResult:
    """Everything a run produced: tidy tables and the summary dict."""
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    capacity_tokens: int
    meta: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)     # further tables a run writes (a cluster's per-replica table)

    @classmethod
    def from_simulation(cls, sim, slos=None) -> "SimResult":
        slos = slos if slos is not None else getattr(sim, "slos", None)
        overheads = getattr(sim.costmodel, "overheads", None)
        req = request_table(sim.all_requests, slos, overheads, getattr(sim, "rows", None))
        it = iteration_table(sim.iters)
        # estimated from the finished rows, outside the engine loop (sim/metrics/utilization.py)
        from sim.metrics.utilization import utilization
        it["mfu"], it["mbu"] = utilization(it, sim.costmodel)
        summ = summarize(req, it, sim.memory.capacity_tokens, sim.truncated, getattr(sim, "tally", None))
        if hasattr(sim.memory, "stats"):        # prefix caching: hit rate, GPU/CPU hit tokens, evictions
            summ.update(sim.memory.stats())
        summ.update(mechanism_counters(sim))
        if getattr(sim, "speculation", None) is not None:      # drafts proposed/accepted, tokens per verify pass
            summ.update(sim.speculation.stats())
        if getattr(sim, "lora", None) is not None:             # adapter loads, skipped admissions, GEMM time
            summ.update(sim.lora.stats())
        if getattr(sim, "sessions", None) is not None:         # closed-loop turns released after their pauses
            summ.update(sim.sessions.stats())
        return cls(req, it, summ, sim.memory.capacity_tokens)

    def write(self, out_dir, fmt: str = "csv") -> list:
        from sim.paths import output_dir
        out = output_dir(out_dir)
        paths = []
        for name, df in (("requests", self.requests), ("iterations", self.iterations),
                         ("summary", pd.DataFrame([self.summary])), *self.tables.items()):
            p = out / f"{name}.{'parquet' if fmt == 'parquet' else 'csv'}"
            if fmt == "parquet":
                try:
                    df.to_parquet(p, index=False)
                except ImportError:
                    from costmodels.errors import UserError
                    raise UserError("--format parquet needs pyarrow: pip install pyarrow") from None
            else:
                write_csv(df, p)
            paths.append(p)
        return paths


def write_csv(df: pd.DataFrame, path) -> None:
    """A table as CSV (no index; empty cells for missing values): through pyarrow's C++ writer when it is
    installed, about six times faster than pandas on the run tables, else through pandas."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        df.to_csv(path, index=False)
        return
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        df.to_csv(path, index=False)     # mixed-type object columns: leave them to pandas
        return
    pacsv.write_csv(table, str(path), pacsv.WriteOptions(quoting_style="needed"))


def mechanism_counters(sim) -> dict:
    """How often a policy's own mechanisms fired (its `stats` counters: hidden-cache decodes, lent KV blocks,
    proactive offloads, aging promotions, ...) and a KV layout's (BROS checkpoints), as `policy_<name>`."""
    out = {}
    for k, v in (getattr(sim.policy, "stats", None) or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"policy_{k}"] = v
    for k in ("checkpointed_slots", "restored_slots"):
        if hasattr(sim.memory, k):
            out[f"kv_{k}"] = getattr(sim.memory, k)
    return out


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)
