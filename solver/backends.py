"""MILP backends behind one call: HiGHS (open source, no licence), gurobipy (when importable and licensed) and OR-Tools
CP-SAT (optional extra, Apache-2.0)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

INF = float("inf")
GUROBI_FREE_LIMIT = 200     # the pip gurobipy's size-limited licence: 2000 variables/constraints, 200 with quadratics


@dataclass
class BackendResult:
    backend: str
    status: str                     # optimal | time_limit | infeasible | feasible | error
    x: list | None                  # column values of the best solution found (None if none)
    objective: float                # model objective of x (ms, with offset), nan without a solution
    bound: float                    # best proven lower bound on the model objective (ms), nan if none
    time_s: float
    square: str                     # how q >= c² was enforced
    notes: list = field(default_factory=list)


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (not installed, no licence, model over the licence's size)."""


def gurobi_importable() -> bool:
    try:
        import gurobipy  # noqa: F401
    except Exception:
        return False
    return True


def choose_backend(requested: str, model) -> tuple[str, str]:
    """Which backend runs and why (one line)."""
    if requested == "highs":
        return "highs", "HiGHS requested"
    if requested == "gurobi":
        return "gurobi", "gurobipy requested"
    if requested == "cpsat":
        return "cpsat", "OR-Tools CP-SAT requested"
    if not gurobi_importable():
        return "highs", "gurobipy is not importable; HiGHS (open source, no licence) runs instead"
    size = model.size()
    if size["variables"] > GUROBI_FREE_LIMIT:
        return "gurobi", (f"gurobipy is importable; the model ({size['variables']} variables, {size['constraints']} "
                          f"constraints) exceeds the pip size-limited licence ({GUROBI_FREE_LIMIT} variables with quadratic "
                          f"terms), so a full "
                          f"licence is needed, else HiGHS takes over")
    return "gurobi", "gurobipy is importable and the model fits even its size-limited licence"


def secant_rows(k: int) -> tuple[float, float]:
    """q >= (2k+1)·c − k(k+1): the chord of c² through (k, k²) and (k+1, (k+1)²), exact at both integers."""
    return 2 * k + 1, -k * (k + 1)


def initial_secants(cmax: int, hints, exact_max: int) -> set:
    """All chords when c ranges over few integers (exact); otherwise powers of two plus the natural chunk sizes."""
    if cmax <= exact_max:
        return set(range(cmax))
    ks = {0}
    p = 1
    while p < cmax:
        ks.add(p)
        p *= 2
    for h in hints:
        for k in (h - 1, h):
            if 0 <= k < cmax:
                ks.add(k)
    return ks


def solve_highs(model, opt, start, time_limit_s, hints, node_limit: int = 0) -> BackendResult:
    """HiGHS MILP; c² by chords at integer points, tightened by re-solving with the chord of each violated square
    until every square is exact (then the optimum is the exact MIQP optimum) or the rounds/time run out.
    node_limit (else opt.node_limit; 0 = none) caps the branch-and-bound nodes of each solve: a budget that gives
    the same answer on a slow machine as on a fast one, where a time limit does not. x is None when no solution
    was found within the limits."""
    import highspy
    t0 = time.perf_counter()
    nodes = node_limit or getattr(opt, "node_limit", 0)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if nodes:
        h.setOptionValue("mip_max_nodes", int(nodes))
    h.setOptionValue("mip_rel_gap", float(opt.mip_gap))
    h.setOptionValue("threads", int(max(opt.threads, 1)))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_heuristic_effort", float(opt.heuristic_effort))
    n = model.num_vars
    h.addVars(n, model.lb, model.ub)
    ints = [k for k in range(n) if model.integer[k]]
    if ints:
        h.changeColsIntegrality(len(ints), ints, [highspy.HighsVarType.kInteger] * len(ints))
    h.changeColsCost(n, list(range(n)), model.obj)
    h.changeObjectiveOffset(model.obj_offset)
    _add_rows(h, model.rows)
    chords = {}
    sq_rows = []
    for q, c, cmax, i in model.squares:
        ks = initial_secants(cmax, hints.get(i, ()), opt.exact_square_max)
        chords[(q, c)] = ks
        for k in ks:
            a, b = secant_rows(k)
            sq_rows.append(([q, c], [1.0, -a], b, INF))
    _add_rows(h, sq_rows)
    exact_all = all(len(ks) >= cmax for (_, _, cmax, _), ks in zip(model.squares, chords.values()))
    x_best, notes, rounds = None, [], 0
    status, obj, bound = "error", math.nan, math.nan
    while True:
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0.05:
            status = "time_limit" if x_best is not None or status == "error" else status
            break
        h.setOptionValue("time_limit", float(left))
        if start is not None:
            _set_start(h, highspy, start)
        h.run()
        ms = h.getModelStatus()
        info = h.getInfo()
        has_sol = info.primal_solution_status == 2
        if math.isfinite(info.mip_dual_bound):     # every round's bound is valid; later rounds only add rows
            bound = max(bound, float(info.mip_dual_bound)) if math.isfinite(bound) else float(info.mip_dual_bound)
        if ms == highspy.HighsModelStatus.kInfeasible:
            status = "infeasible"
            break
        if not has_sol:
            status = "time_limit" if ms == highspy.HighsModelStatus.kTimeLimit else _status_name(h, ms)
            break
        x = list(h.getSolution().col_value)
        obj = float(info.objective_function_value)
        status = "optimal" if ms == highspy.HighsModelStatus.kOptimal else (
            "time_limit" if ms == highspy.HighsModelStatus.kTimeLimit else _status_name(h, ms))
        x_best = x
        violated = []
        for q, c, cmax, i in model.squares:
            cv = int(round(x[c]))
            if x[q] < cv * cv - 1e-6 * max(1, cv * cv):
                violated.append((q, c, cv))
        if not violated:
            exact_all = True
            break
        if rounds >= opt.cut_rounds or status != "optimal":
            notes.append(f"{len(violated)} c² term(s) still under-estimated by chords after {rounds} re-solve(s): "
                         f"the bound stays valid, the incumbent is re-timed exactly")
            exact_all = False
            break
        rounds += 1
        new = []
        for q, c, cv in violated:
            for k in (cv - 1, cv):
                if 0 <= k and k not in chords[(q, c)]:
                    chords[(q, c)].add(k)
                    a, b = secant_rows(k)
                    new.append(([q, c], [1.0, -a], b, INF))
        _add_rows(h, new)
        start = _fix_squares(x, model)
    if rounds:
        notes.append(f"{rounds} re-solve(s) added chords for c² values the solution used")
    square = ("exact: c² by chords at every integer chunk size the solution uses (integer c makes them exact)"
              if exact_all else "lower bound: c² by chords (piecewise-linear under-estimate, keeps a valid bound)")
    return BackendResult("highs", status, x_best, obj, bound, time.perf_counter() - t0, square, notes)


def _status_name(h, ms) -> str:
    import highspy
    if ms in (highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kIterationLimit):
        return "node_limit"                 # HiGHS reports mip_max_nodes reached as its solution limit
    return h.modelStatusToString(ms).lower().replace(" ", "_")


def _fix_squares(x, model):
    x = list(x)
    for q, c, _, _ in model.squares:
        cv = round(x[c])
        x[c] = cv
        x[q] = float(cv * cv)
    return x


def _set_start(h, highspy, start):
    sol = highspy.HighsSolution()
    sol.col_value = list(start)
    sol.value_valid = True
    h.setSolution(sol)


def _add_rows(h, rows):
    if not rows:
        return
    starts, idx, val, lo, hi = [], [], [], [], []
    for cols, coefs, l, u in rows:
        starts.append(len(idx))
        idx.extend(cols)
        val.extend(coefs)
        lo.append(l)
        hi.append(u)
    h.addRows(len(rows), lo, hi, len(idx), starts, idx, val)


def solve_gurobi(model, opt, start, time_limit_s, hints) -> BackendResult:
    """gurobipy MIQCP: q >= c² as a convex quadratic constraint, so the square is exact by construction."""
    try:
        import gurobipy as gp
        from gurobipy import GRB
    except Exception as e:  # pragma: no cover - depends on the machine
        raise BackendUnavailable(f"gurobipy is not importable ({e})") from None
    import numpy as np
    import scipy.sparse as sp
    t0 = time.perf_counter()
    try:
        env = gp.Env(params={"OutputFlag": 0})
        m = gp.Model("infermax", env=env)
        n = model.num_vars
        lb = np.array(model.lb)
        ub = np.array([u if math.isfinite(u) else GRB.INFINITY for u in model.ub])
        vt = np.array([GRB.INTEGER if k else GRB.CONTINUOUS for k in model.integer])
        x = m.addMVar(n, lb=lb, ub=ub, vtype=vt, obj=np.array(model.obj))
        m.ObjCon = model.obj_offset
        le, ge, eq = _split_rows(model.rows)
        for rows, sense in ((le, "<"), (ge, ">"), (eq, "=")):
            if rows:
                data, ri, ci, rhs = [], [], [], []
                for r, (cols, coefs, b) in enumerate(rows):
                    ri.extend([r] * len(cols))
                    ci.extend(cols)
                    data.extend(coefs)
                    rhs.append(b)
                A = sp.csr_matrix((data, (ri, ci)), shape=(len(rows), n))
                m.addMConstr(A, x, sense, np.array(rhs))
        cols = x.tolist()
        for q, c, _, _ in model.squares:
            m.addConstr(cols[c] * cols[c] <= cols[q])
        m.Params.TimeLimit = float(time_limit_s)
        m.Params.MIPGap = float(opt.mip_gap)
        m.Params.Threads = int(opt.threads)
        m.Params.Seed = 0
        if start is not None:
            for var, val in zip(cols, start):
                var.Start = val
        m.optimize()
    except gp.GurobiError as e:
        raise BackendUnavailable(f"gurobipy failed: {e} (error {getattr(e, 'errno', '?')})") from None
    st = m.Status
    status = {GRB.OPTIMAL: "optimal", GRB.INFEASIBLE: "infeasible", GRB.TIME_LIMIT: "time_limit",
              GRB.INF_OR_UNBD: "infeasible"}.get(st, f"gurobi_status_{st}")
    has = m.SolCount > 0
    xv = list(x.X) if has else None
    obj = float(m.ObjVal) if has else math.nan
    try:
        bound = float(m.ObjBound)
    except Exception:
        bound = math.nan
    if status == "optimal" and not math.isfinite(bound):
        bound = obj
    return BackendResult("gurobi", status, xv, obj, bound, time.perf_counter() - t0,
                         "exact: q >= c² as a convex quadratic constraint (MIQCP)")


def _split_rows(rows):
    le, ge, eq = [], [], []
    for cols, coefs, lo, hi in rows:
        if lo == hi:
            eq.append((cols, coefs, lo))
            continue
        if math.isfinite(hi):
            le.append((cols, coefs, hi))
        if math.isfinite(lo):
            ge.append((cols, coefs, lo))
    return le, ge, eq


CPSAT_TICKS_PER_MS = 10 ** 8   # CP-SAT needs integer costs: 1e-8 ms ticks keep the Σc² coefficient (~5e-6 ms) to 0.2%


def solve_cpsat(model, opt, start, time_limit_s, hints) -> BackendResult:
    """OR-Tools CP-SAT on the same model: q = c² exactly (a multiplication constraint), every column integer, the
    makespan as Σ batch times with each cost coefficient rounded down to 1e-8 ms (so its bound, divided back, stays
    a valid lower bound; the schedule is re-timed exactly by the caller). Offline makespan only: the time rows are
    dropped and the objective is built from the batch-time terms."""
    try:
        from ortools.sat.python import cp_model
    except Exception as e:
        raise BackendUnavailable(f"OR-Tools is not importable ({e}); pip install 'servesim[cpsat]'") from None
    t0 = time.perf_counter()
    time_rows, cost = _batch_time_rows(model)
    if time_rows is None:
        raise BackendUnavailable("CP-SAT runs offline makespan instances only (time rows it cannot take)")
    m = cp_model.CpModel()
    x = []
    for k in range(model.num_vars):
        lo, hi = model.lb[k], model.ub[k]
        hi = hi if math.isfinite(hi) else 10 ** 9
        x.append(m.NewIntVar(int(math.ceil(lo - 1e-9)), int(math.floor(hi + 1e-9)), model.names[k]))
    for r, (cols, coefs, lo, hi) in enumerate(model.rows):
        if r in time_rows:
            continue
        if any(abs(v - round(v)) > 1e-9 for v in coefs):
            raise BackendUnavailable(f"CP-SAT needs integer rows; row {r} has fractional coefficients")
        expr = sum(int(round(v)) * x[c] for c, v in zip(cols, coefs))
        if math.isfinite(lo):
            m.Add(expr >= int(math.ceil(lo - 1e-9)))
        if math.isfinite(hi):
            m.Add(expr <= int(math.floor(hi + 1e-9)))
    for q, c, _, _ in model.squares:
        m.AddMultiplicationEquality(x[q], [x[c], x[c]])
    ticks = {c: math.floor(CPSAT_TICKS_PER_MS * v) if v > 0 else -math.ceil(-CPSAT_TICKS_PER_MS * v)
             for c, v in cost.items()}
    m.Minimize(sum(t * x[c] for c, t in ticks.items() if t))
    if start is not None:
        for k, v in enumerate(start):
            if model.integer[k] or k in cost:
                m.AddHint(x[k], int(round(v)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(int(opt.threads), 1)
    solver.parameters.random_seed = 0
    st = solver.Solve(m)
    has = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "time_limit",
              cp_model.INFEASIBLE: "infeasible"}.get(st, solver.StatusName(st).lower())
    xv = [float(solver.Value(v)) for v in x] if has else None
    bound = solver.BestObjectiveBound() / CPSAT_TICKS_PER_MS + model.obj_offset
    obj = solver.ObjectiveValue() / CPSAT_TICKS_PER_MS + model.obj_offset if has else math.nan
    # rounding each cost down makes the optimum of the rounded objective a bound, not the optimum itself
    status = "time_limit" if status == "optimal" else status
    return BackendResult("cpsat", status, xv, obj, bound, time.perf_counter() - t0,
                         "exact: q = c² as a CP-SAT multiplication constraint",
                         notes=[f"CP-SAT: {solver.StatusName(st)}, costs rounded down to "
                                f"{1e3 / CPSAT_TICKS_PER_MS:g} µs"])


def _batch_time_rows(model):
    """The rows that define T_j and acc_j and the objective cut on acc, and the objective Σ_j T_j as a cost per
    integer column (ms); None where the model has idle time (online) or an objective other than makespan."""
    names = model.names
    is_time = [n.startswith(("T_", "acc_", "s_")) for n in names]
    if any(n.startswith(("zc_", "zf_")) for n in names):
        return None, None
    if any(is_time[k] and model.ub[k] > 0 for k in range(model.num_vars) if names[k].startswith("s_")):
        return None, None
    rows, cost = set(), {}
    for r, (cols, coefs, lo, hi) in enumerate(model.rows):
        if not any(is_time[c] for c in cols):
            continue
        rows.add(r)
        t_cols = [c for c in cols if names[c].startswith("T_")]
        if len(t_cols) == 1 and lo == hi == 0 and not any(names[c].startswith(("acc_", "s_")) for c in cols):
            sign = dict(zip(cols, coefs))[t_cols[0]]           # T − Σ terms = 0  ⇒  T = Σ (−coef/sign)·x
            for c, v in zip(cols, coefs):
                if c != t_cols[0]:
                    cost[c] = cost.get(c, 0.0) - v / sign
    return rows, cost


BACKENDS = {"highs": solve_highs, "gurobi": solve_gurobi, "cpsat": solve_cpsat}
