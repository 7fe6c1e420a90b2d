"""One optimal-schedule solve end to end: presets → horizon and warm start → MILP → exact re-timing → replay."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from costmodels.errors import UserError
from solver import formulation
from solver.backends import BACKENDS, BackendUnavailable, choose_backend
from solver.replay import replay, run_policy
from solver.schedule import InvalidSchedule, Schedule, Step, evaluate

REPLAY_RTOL = 1e-6
PROVEN_GAP = 1e-6            # a relative gap this small counts as proven optimal (the solvers' own tolerance)
SEARCH_SHARE = 0.5           # backend auto: share of the time limit the exact search may use before the MILP
PACKING_SHARE = 0.25         # share of the time limit the event packing (solver.packing) may use before the MILP
EVENT_BOUND_SHARE = 0.15     # share of the time limit the event relaxation's bound (solver.packing) may use
MAX_CELLS = 20_000          # requests × batch slots beyond which the MILP is refused up front


@dataclass
class PresetRun:
    name: str
    value_s: float                 # the objective of the preset's schedule, as the simulator measured it
    iterations: int
    evictions: int
    schedule: Schedule | None
    csp_valid: bool                # the schedule satisfies this CSP's constraints (so it can seed it)
    why_not: str = ""


@dataclass
class OptimalResult:
    objective: str
    backend: str
    backend_reason: str
    status: str
    incumbent_s: float             # exact value of the best schedule found (re-timed with the cost model)
    bound_s: float                 # best proven lower bound (over schedules of at most `horizon` batches)
    gap: float
    solve_time_s: float
    model_size: dict
    square: str
    horizon: int
    schedule: Schedule | None
    trajectory: object = None
    presets: list = field(default_factory=list)
    warm_start: str = ""
    replay_value_s: float = math.nan
    replay_rel_err: float = math.nan
    goal_s: float | None = None
    notes: list = field(default_factory=list)
    solver_objective_s: float = math.nan
    bound_source: str = ""         # which bound bound_s is: exact search, the MILP's, or the analytic one

    @property
    def proven(self) -> str:
        """One line saying what is proven about the returned schedule."""
        if self.goal_s is not None:
            return "feasibility question (see goal)"
        if not math.isfinite(self.incumbent_s):
            return "no schedule"
        if math.isfinite(self.gap) and self.gap <= PROVEN_GAP:
            return f"proven optimal (by the {self.bound_source})"
        if math.isfinite(self.gap):
            return f"incumbent, within {100 * self.gap:.2f}% of optimal (the {self.bound_source} bound)"
        return "incumbent, no bound"

    @property
    def evictions(self) -> int:
        return self.trajectory.evictions if self.trajectory is not None else 0

    @property
    def best_preset(self):
        ok = [p for p in self.presets if math.isfinite(p.value_s)]
        return min(ok, key=lambda p: p.value_s) if ok else None

    def summary(self) -> dict:
        return {"objective": self.objective, "backend": self.backend, "status": self.status,
                "proven": self.proven, "bound_source": self.bound_source,
                "incumbent_s": self.incumbent_s, "bound_s": self.bound_s, "gap": self.gap,
                "solve_time_s": self.solve_time_s, "horizon": self.horizon, "evictions": self.evictions,
                "square": self.square, "warm_start": self.warm_start, "replay_value_s": self.replay_value_s,
                "replay_rel_err": self.replay_rel_err, **{f"model_{k}": v for k, v in self.model_size.items()},
                "presets": {p.name: p.value_s for p in self.presets}, "notes": self.notes}


def objective_from_sim(res, name: str) -> float:
    req = res.requests
    if name == "makespan":
        return float(res.summary["makespan_s"])
    if name == "sum_completion":
        return float(req["e2e_s"].sum())
    return float(req["ttft_s"].mean())


def run_presets(inst, names) -> list:
    """Each preset in the simulator (token-granular memory, the solver's cost model), with its batch trace."""
    from policies import build_policy
    out = []
    for name in names:
        try:
            pol = build_policy({"name": name}, where=f"solver.presets[{name}]")
            res, sched = run_policy(inst, pol, record=True)
        except UserError as e:
            out.append(PresetRun(name, math.nan, 0, 0, None, False, str(e)))
            continue
        except Exception as e:     # a preset that livelocks or is stuck on this instance: report, don't abort
            out.append(PresetRun(name, math.nan, 0, 0, None, False, f"{type(e).__name__}: {e}"))
            continue
        pr = PresetRun(name, objective_from_sim(res, inst.options.objective), len(sched),
                       int(res.summary["evictions"]), sched, True)
        try:
            evaluate(inst, sched)
        except InvalidSchedule as e:
            pr.csp_valid, pr.why_not = False, str(e)
        out.append(pr)
    return out


def sufficient_horizon(inst, presets, cap_s: float | None = None) -> int | None:
    """Offline makespan / Σ completion: the objective is at least the sum of batch times, which is at least
    (#batches)·base + the unavoidable work, so no schedule with more than (best − work)/base batches beats the
    best preset. With this J the bound holds over all schedules, not only those of J batches."""
    if inst.online or inst.options.objective == "mean_ttft":
        return None
    vals = [p.value_s for p in presets if p.csp_valid and math.isfinite(p.value_s)]
    if cap_s is not None:
        vals.append(cap_s)
    if not vals:
        return None
    return max(int((min(vals) * 1e3 - unavoidable_ms(inst)) / inst.terms.base * (1 + 1e-9)), 1)


def unavoidable_ms(inst) -> float:
    """Cost every schedule pays besides the per-batch bias: I0+O−1 processed tokens per request, one prefill
    batch, and for each later token t either a decode step reading I0+t−1 KV or a refill that re-processes at
    least the I0+t−2 evicted tokens — whichever is cheaper under the coefficients."""
    T = inst.terms
    tok = sum(inst.peak(i) for i in range(inst.n))
    later = sum(min(T.kv * (inst.prompt[i] + t - 1), T.tok * (inst.prompt[i] + t - 2))
                for i in range(inst.n) for t in range(2, inst.output[i] + 1))
    return T.tok * tok + T.pbase + later


def default_horizon(inst, presets) -> int:
    safe = sufficient_horizon(inst, presets)
    if safe is not None:
        return safe
    lens = [len(p.schedule) for p in presets if p.schedule is not None and p.csp_valid]
    if lens:
        return max(lens)
    # no preset fits this CSP: serving requests one at a time (chunks of P, then O−1 decodes) always fits
    return sum(inst.output[i] - 1 + -(-inst.prompt[i] // inst.P_eff) for i in range(inst.n))


def chunk_hints(inst) -> dict:
    """Natural prefill chunk sizes per request: the prompt and refills after a decode eviction (I0 … I0+O−1)."""
    return {i: list(range(inst.prompt[i], inst.prompt[i] + min(inst.output[i], 64))) for i in range(inst.n)}


def extract(model, x, inst, J) -> Schedule:
    V = model.index
    steps = []
    for j in range(1, J + 1):
        tokens = {i: int(round(x[V[("c", i, j)]])) for i in range(inst.n) if round(x[V[("c", i, j)]]) > 0}
        evict = [i for i in range(inst.n) if x[V[("e", i, j)]] > 0.5]
        steps.append(Step(tokens, evict))
    # evictions in an otherwise empty slot belong to the next batch that runs
    merged, carry = [], []
    for s in steps:
        if not s.tokens:
            carry += s.evict
            continue
        merged.append(Step(s.tokens, carry + s.evict))
        carry = []
    return Schedule(merged)


def _refuse_if_too_large(inst, J: int, at_least: str = "") -> None:
    if inst.n * J > MAX_CELLS:
        raise UserError(f"solver: {inst.n} requests × {at_least}{J} batch slots is too large for an exact model "
                        f"(limit {MAX_CELLS} request-slots, about {25 * MAX_CELLS} variables); use fewer requests "
                        f"or set solver.horizon")


def solve(inst, presets: list | None = None, log=None) -> OptimalResult:
    opt = inst.options
    t_start = time.perf_counter()
    notes = []
    # Every schedule needs at least max(O) batches (one token per request per batch): refuse a hopeless size
    # before the presets run, whose schedules would be checked variable by variable.
    _refuse_if_too_large(inst, opt.horizon or max(inst.output, default=0), "" if opt.horizon else "at least ")
    if presets is None:
        presets = run_presets(inst, opt.presets)
    for p in presets:
        if p.schedule is None:
            notes.append(f"preset {p.name} not run: {p.why_not}")
    goal_ms = None
    goal_s = None
    if opt.goal_factor > 0:
        ref = [p for p in presets if math.isfinite(p.value_s)]
        if not ref:
            raise UserError("solver.goal_factor: needs at least one preset value to scale; none ran")
        goal_s = opt.goal_factor * min(p.value_s for p in ref)
        goal_ms = goal_s * 1e3
    ok_presets = [p for p in presets if p.csp_valid and p.schedule is not None]
    best_any = min(ok_presets, key=lambda p: p.value_s) if ok_presets else None
    serial_bound_s = math.nan
    if goal_ms is None and opt.backend in ("auto", "serial"):
        from solver.serial import applies as serial_applies, solve_serial
        yes, why_serial = serial_applies(inst)
        if yes:
            budget = opt.time_limit_s if opt.backend == "serial" else SEARCH_SHARE * opt.time_limit_s
            sr = solve_serial(inst, PROVEN_GAP, budget, opt.node_limit)
            notes += [f"skeleton decomposition: {note}" for note in sr.notes]
            notes.append(f"skeleton decomposition: {sr.status} in {sr.time_s:.2f} s")
            if sr.status == "optimal" or opt.backend == "serial":
                return _finish(inst, presets, sr.schedule, "serial", f"skeleton decomposition ({why_serial})",
                               sr.status, sr.time_s, {}, "QP per skeleton", 0, notes, "skeleton QPs",
                               sr.bound_ms / 1e3, "")
            # not proven (evicting may pay): its bound stays valid, its schedule seeds what follows
            serial_bound_s = sr.bound_ms / 1e3
            if sr.schedule is not None:
                presets = presets + [PresetRun("eviction-free optimum (skeleton QPs)", sr.value_ms / 1e3,
                                               len(sr.schedule), 0, sr.schedule, True)]
                ok_presets = [p for p in presets if p.csp_valid and p.schedule is not None]
                best_any = min(ok_presets, key=lambda p: p.value_s)
        elif opt.backend == "serial":
            raise UserError(f"solver.backend: the skeleton decomposition does not apply here: {why_serial}")
    search_bound_s = math.nan
    if goal_ms is None and opt.backend in ("auto", "search"):
        from solver.search import applies, search
        yes, why_search = applies(inst, auto=opt.backend == "auto")
        if yes:
            budget = opt.time_limit_s if opt.backend == "search" else SEARCH_SHARE * opt.time_limit_s
            upper = best_any.value_s * 1e3 if best_any is not None else math.inf
            sr = search(inst, upper_ms=upper, time_limit_s=budget, **({"node_limit": opt.node_limit}
                                                                        if opt.node_limit else {}))
            notes.append(f"exact search: {sr.status} after {sr.expanded} states in {sr.time_s:.2f} s")
            if sr.status == "optimal" or (sr.status == "no_better" and best_any is not None):
                sched = sr.schedule if sr.status == "optimal" else best_any.schedule
                return _finish(inst, presets, sched, "search", f"exact A* search ({why_search})", "optimal",
                               sr.time_s, {}, "exact enumeration", 0, notes, "exact search", sr.bound_ms / 1e3,
                               best_any.name if sr.status == "no_better" else "")
            search_bound_s = sr.bound_ms / 1e3
            if opt.backend == "search":
                return _finish(inst, presets, best_any.schedule if best_any else None, "search",
                               f"exact A* search ({why_search})", sr.status, sr.time_s, {}, "exact enumeration", 0,
                               notes, "exact search", search_bound_s, best_any.name if best_any else "")
        elif opt.backend == "search":
            raise UserError(f"solver.backend: the exact search does not apply here: {why_search}; use auto or highs")
        else:
            notes.append(f"exact search skipped: {why_search}")
    if goal_ms is None and not inst.online:
        presets = presets + _event_packing(inst, presets, PACKING_SHARE * opt.time_limit_s, notes)
    safe = sufficient_horizon(inst, presets, goal_s)
    event_bound_s = math.nan
    if goal_ms is None and safe is not None and opt.objective == "makespan":
        event_bound_s = _event_bound(inst, presets, safe, EVENT_BOUND_SHARE * opt.time_limit_s, notes)
    J = opt.horizon or (safe if safe is not None else default_horizon(inst, presets))
    if safe is not None and J >= safe:
        notes.append(f"horizon J = {J} batches is provably enough: the bound holds over all schedules")
    else:
        notes.append(f"horizon J = {J} batches: the bound holds over schedules of at most {J} batches")
    ok = [p for p in presets if p.csp_valid and p.schedule is not None and len(p.schedule) <= J]
    best = min(ok, key=lambda p: p.value_s) if ok else None
    _refuse_if_too_large(inst, J)
    model = formulation.build(inst, J, goal_ms)
    backend, why = choose_backend(opt.backend, model)
    start, warm = None, ""
    if opt.warm_start and best is not None and goal_ms is None:
        start = model.start_vector(evaluate(inst, best.schedule, J).values)
        warm = best.name
    time_left = max(opt.time_limit_s - (time.perf_counter() - t_start), 1.0)
    try:
        br = BACKENDS[backend](model, opt, start, time_left, chunk_hints(inst))
    except BackendUnavailable as e:
        if opt.backend != "auto":
            raise UserError(f"solver.backend: {e}") from None
        notes.append(f"{e}; falling back to HiGHS")
        backend, why = "highs", f"gurobipy could not solve this model ({e}); HiGHS runs instead"
        br = BACKENDS["highs"](model, opt, start, time_left, chunk_hints(inst))
    notes += br.notes
    sched, traj = None, None
    if br.x is not None:
        sched = extract(model, br.x, inst, J)
        try:
            traj = evaluate(inst, sched)
        except InvalidSchedule as e:
            notes.append(f"solver solution failed the exact re-check ({e}); using the warm start instead")
            sched = None
    if sched is None and best is not None and goal_ms is None:
        sched, traj = best.schedule, evaluate(inst, best.schedule)
        notes.append(f"no solver solution; the incumbent is the {best.name} schedule")
    if traj is not None and best is not None and goal_ms is None:
        seed_traj = evaluate(inst, best.schedule)
        if seed_traj.objective(inst, opt.objective) < traj.objective(inst, opt.objective) * (1 - 1e-12):
            notes.append(f"the solver's schedule is worse than the {best.name} warm start; keeping the warm start")
            sched, traj = best.schedule, seed_traj
    inc = traj.objective(inst, opt.objective) if traj is not None else math.nan
    bound = br.bound / 1e3 if math.isfinite(br.bound) else math.nan
    source = f"{backend} MILP"
    if goal_ms is not None:
        bound = math.nan
    elif br.status == "optimal" and math.isfinite(inc):
        bound = min(bound, inc) if math.isfinite(bound) else inc
    if goal_ms is None:
        # the best of the bounds at hand, named: the MILP's, the exact search's (stopped early), the analytic one
        for value, name in ((search_bound_s, "exact search (stopped early)"), (serial_bound_s, "skeleton QPs"),
                            (event_bound_s, "event relaxation"), (analytic_bound_s(inst), "analytic")):
            if math.isfinite(value) and (not math.isfinite(bound) or value > bound):
                bound, source = value, name
    gap = (inc - bound) / inc if math.isfinite(inc) and math.isfinite(bound) and inc > 0 else math.nan
    if math.isfinite(gap) and gap < 0:
        gap = 0.0
    status = "optimal" if math.isfinite(gap) and gap <= PROVEN_GAP and goal_ms is None else br.status
    res = OptimalResult(opt.objective, backend, why, status, inc, bound, gap, br.time_s, model.size(),
                        br.square, J, sched, traj, presets, warm, goal_s=goal_s, notes=notes,
                        solver_objective_s=(br.objective / 1e3 if math.isfinite(br.objective) else math.nan),
                        bound_source=source)
    _check_replay(inst, res)
    return res


def _event_packing(inst, presets, budget_s: float, notes: list) -> list:
    """The event-packing schedule (solver.packing), seeded by the best eviction-free preset, as one more seed for
    the MILP: [] where it cannot run or finds nothing valid."""
    from solver.packing import packing_schedule
    seeds = [p for p in presets if p.csp_valid and p.schedule is not None and p.evictions == 0]
    if not seeds:
        return []
    seed = min(seeds, key=lambda p: p.value_s)
    if inst.n * len(seed.schedule) > MAX_CELLS:
        notes.append(f"event packing skipped: {inst.n} requests × {len(seed.schedule)} batches exceed {MAX_CELLS}")
        return []
    t0 = time.perf_counter()
    J = len(seed.schedule)
    sched = packing_schedule(inst, J, budget_s, seed.schedule)
    if sched is None:
        return []
    left = budget_s - (time.perf_counter() - t0)
    if inst.options.evictions and left > 0.5:
        # time to spare (the eviction-free packing was proven early): let it evict, started from that packing, so
        # never worse; it is a harder model, so it never takes the eviction-free packing's time
        sched = packing_schedule(inst, J, left, sched, evictions=True) or sched
    try:
        traj = evaluate(inst, sched)
    except InvalidSchedule as e:           # a packing the CSP rejects would be a bug here: say so, keep going
        notes.append(f"event packing gave an invalid schedule ({e}); not used")
        return []
    value = traj.objective(inst, inst.options.objective)
    notes.append(f"event packing: {1e3 * value:.3f} ms in {time.perf_counter() - t0:.1f} s ({len(sched)} batches, "
                 f"{traj.evictions} evictions; best eviction-free preset {seed.name}: {1e3 * seed.value_s:.3f} ms)")
    return [PresetRun("event packing", value, len(sched), traj.evictions, sched, True)]


def _event_bound(inst, presets, J: int, budget_s: float, notes: list) -> float:
    """The event relaxation's bound (s) over schedules of at most J batches, which is all that could beat the best
    valid schedule at hand (its value V; sufficient_horizon): so min(bound, V) holds for every schedule."""
    from solver.packing import event_bound_ms
    if inst.n * J > MAX_CELLS:
        return math.nan
    t0 = time.perf_counter()
    bound_ms = event_bound_ms(inst, J, budget_s)
    if not math.isfinite(bound_ms):
        return math.nan
    best = min(p.value_s for p in presets if p.csp_valid and math.isfinite(p.value_s))
    notes.append(f"event relaxation over {J} batches: bound {bound_ms:.3f} ms in {time.perf_counter() - t0:.1f} s")
    return min(bound_ms / 1e3, best)


def analytic_bound_s(inst) -> float:
    """The analytic makespan bound (solver.bounds), for the makespan objective only."""
    if inst.options.objective != "makespan":
        return math.nan
    from solver.bounds import makespan_bound_ms
    return makespan_bound_ms(inst)[0] / 1e3


def _finish(inst, presets, sched, backend, why, status, time_s, size, square, horizon, notes, source, bound_s,
            warm) -> OptimalResult:
    """A result from the exact search (or its bound with a preset's schedule)."""
    opt = inst.options
    traj = evaluate(inst, sched) if sched is not None else None
    inc = traj.objective(inst, opt.objective) if traj is not None else math.nan
    bound = max(bound_s, analytic_bound_s(inst)) if math.isfinite(analytic_bound_s(inst)) else bound_s
    if status == "optimal":
        bound = min(bound, inc)
    elif math.isfinite(analytic_bound_s(inst)) and analytic_bound_s(inst) > bound_s:
        source = "analytic"
    gap = (inc - bound) / inc if math.isfinite(inc) and math.isfinite(bound) and inc > 0 else math.nan
    gap = max(gap, 0.0) if math.isfinite(gap) else gap
    res = OptimalResult(opt.objective, backend, why, status, inc, bound, gap, time_s,
                        size or {"variables": 0, "integer_variables": 0, "constraints": 0, "nonzeros": 0,
                                 "square_terms": 0},
                        square, horizon or (len(sched) if sched else 0), sched, traj, presets, warm, notes=notes,
                        bound_source=source)
    _check_replay(inst, res)
    return res


def _check_replay(inst, res) -> None:
    """Replay the returned schedule in the simulator; its objective must equal the solver's exactly."""
    sched, traj, inc, notes, opt = res.schedule, res.trajectory, res.incumbent_s, res.notes, inst.options
    if sched is not None:
        sim = replay(inst, sched)
        res.replay_value_s = objective_from_sim(sim, opt.objective)
        res.replay_rel_err = abs(res.replay_value_s - inc) / max(abs(inc), 1e-12)
        if sim.summary["completed"] != inst.n or sim.summary["evictions"] != traj.evictions:
            notes.append(f"replay disagrees with the schedule: {sim.summary['completed']}/{inst.n} completed, "
                         f"{sim.summary['evictions']} evictions vs {traj.evictions}")
        if res.replay_rel_err > REPLAY_RTOL:
            notes.append(f"replay differs from the solver's value by {res.replay_rel_err:.2e} (relative)")
