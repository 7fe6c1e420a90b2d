"""Metrics of a run: per-request token statistics, request/iteration tables, the summary, per-class figures."""
from sim.metrics.tokens import finalize_many, finalize_request, p99_sorted, settle_spans
from sim.metrics.tables import NAN, PCTS, SLO, SimResult, is_nan, iteration_table, request_table, slo_attained, summarize

__all__ = ["finalize_many", "finalize_request", "p99_sorted", "settle_spans", "NAN", "PCTS", "SLO", "SimResult",
           "is_nan", "iteration_table", "request_table", "slo_attained", "summarize"]
