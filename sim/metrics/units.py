"""Units of every column a CLI table prints (run summaries, sweep and capacity tables, plans, replicas, trace
stats): the glossary's for summary columns, these for the rest; `with_units` puts them in a table's header."""
from __future__ import annotations

from sim.metrics.glossary import unit as summary_unit

# Columns outside the run summary: scenario fields used as axes, and the other commands' own columns.
OTHER = {
    "workload.rate": "req/s", "rate": "req/s", "rate_rps": "req/s", "memory.M": "tokens", "M": "tokens",
    "capacity_rps": "req/s", "bracket_hi_rps": "req/s", "capacity_min_rps": "req/s", "capacity_mean_rps": "req/s",
    "target_rate_rps": "req/s", "target_attainment": "fraction", "attainment": "fraction",
    "replicas_needed": "count", "gpus_needed": "count", "evaluations": "count", "seeds": "count",
    "routed": "requests", "utilization": "fraction", "duration_s": "s", "interarrival_cv": "ratio",
    "corr_prompt_output": "ratio", "predicted_mean_relative_error": "fraction", "memory.block_size": "tokens",
    "hardware.tp": "GPUs", "workload.num_requests": "requests", "cluster.replicas": "replicas",
}
# Prefixes: trace stats' length percentiles and per-class counts.
PREFIXES = (("prompt_", "tokens"), ("output_", "tokens"), ("requests_", "requests"), ("slo.", "s"))
NO_UNIT = ("name", "path", "flag")      # names, paths and 0/1 flags carry none worth printing


def column_unit(name: str) -> str:
    """The unit of a printed column, '' when it has none (an id, a name, a policy)."""
    u = summary_unit(name) or OTHER.get(name, "")
    if not u:
        u = next((unit for prefix, unit in PREFIXES if name.startswith(prefix)), "")
    return "" if u in NO_UNIT else u


def with_units(df):
    """The table with `name (unit)` headers where a column has a unit."""
    return df.rename(columns={c: f"{c} ({column_unit(c)})" for c in df.columns if column_unit(str(c))})
