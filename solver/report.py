"""Human-readable output of a solve: the summary lines and the preset table (the Gantt plot is study.plots)."""
from __future__ import annotations

import math


def _s(v, unit="s"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.6g} {unit}"


def _pct(v):
    if v is None or not math.isfinite(v):
        return "-"
    return f"{100 * v:.2f}%" if abs(v) >= 5e-5 else "0.00%"


def format_result(res, inst, title: str = "") -> str:
    opt = inst.options
    L = []
    L.append(f"{title or 'optimal schedule'}: {inst.n} requests, M = {inst.M} KV tokens, C = {opt.C}, "
             f"P = {inst.P_eff}, R_max = {opt.R_max or 'unlimited'}, hybrid={opt.hybrid}, chunked={opt.chunked}, "
             f"evictions={opt.evictions}, {'online' if inst.online else 'offline'}")
    L.append(f"objective: {res.objective}; cost model: linear, paper features (tokens, Σc² of prefill chunks, "
             f"KV reads of decodes, per-batch biases), identical in solver and replay")
    L.append(f"backend: {res.backend} ({res.backend_reason})")
    sz = res.model_size
    if res.backend == "search":
        L.append(f"status: {res.status}; search {res.solve_time_s:.2f} s over multiset states (no MILP)")
    else:
        L.append(f"status: {res.status}; solve {res.solve_time_s:.2f} s; model {sz['variables']} variables "
                 f"({sz['integer_variables']} integer), {sz['constraints']} constraints; horizon J = {res.horizon}")
    L.append(f"c²: {res.square}")
    if res.goal_s is not None:
        if res.schedule is not None and res.incumbent_s <= res.goal_s * (1 + 1e-9):
            verdict = "EXISTS (schedule re-timed exactly)"
        elif res.status == "infeasible":
            verdict = "DOES NOT EXIST"
        else:
            verdict = f"UNKNOWN ({res.status})"
        L.append(f"goal: a schedule with {res.objective} <= {res.goal_s:.6g} s {verdict}")
    if res.status == "infeasible" and res.goal_s is None:
        L.append(f"infeasible: no schedule finishes every request within J = {res.horizon} batches under these "
                 f"limits (raise solver.horizon or relax C/P/M/R_max)")
    label = "optimal value" if res.status == "optimal" else "best value found"
    L.append(f"{label}: {_s(res.incumbent_s)}   bound: {_s(res.bound_s)} ({res.bound_source or 'none'})   "
             f"gap: {_pct(res.gap)}")
    L.append(f"proven: {res.proven}")
    if res.schedule is not None:
        L.append(f"schedule: {len(res.schedule)} batches, {res.evictions} evictions; warm start: "
                 f"{res.warm_start or 'none'}; replay in the simulator: {_s(res.replay_value_s)} "
                 f"(relative difference {res.replay_rel_err:.1e})")
    if res.presets:
        L.append(f"{'preset':<16} {'value':>12} {'vs optimum':>11} {'batches':>8} {'evictions':>9}")
        ref = res.incumbent_s
        for p in sorted(res.presets, key=lambda p: (not math.isfinite(p.value_s), p.value_s)):
            if not math.isfinite(p.value_s):
                L.append(f"{p.name:<16} {'-':>12} {'-':>11} {'-':>8} {'-':>9}  not run: {p.why_not}")
                continue
            gap = p.value_s / ref - 1 if math.isfinite(ref) and ref > 0 else math.nan
            L.append(f"{p.name:<16} {p.value_s:>12.6g} {_pct(gap):>11} {p.iterations:>8} {p.evictions:>9}")
    for note in res.notes:
        L.append(f"note: {note}")
    return "\n".join(L)
