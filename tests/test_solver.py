"""The optimal-schedule solver on tiny instances: exact re-timing, hand-worked optima, replay, switches, errors."""
import math

import pytest

from costmodels.errors import UserError
from costmodels.linear import LinearCostModel, default_profile_path
from solver.instance import SolverInstance, SolverOptions
from solver.replay import replay
from solver.schedule import InvalidSchedule, Schedule, Step, evaluate
from solver.solve import run_presets, solve


@pytest.fixture(scope="module")
def cm():
    return LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"), features="paper")


# The budget of every solve here: branch-and-bound nodes per HiGHS solve, not seconds, so that a machine half as
# fast gives the same verdicts (these small models end proven well within it).
NODES = 100_000


def inst_of(cm, prompt, output, M, arrival=None, **kw):
    kw.setdefault("time_limit_s", math.inf)
    kw.setdefault("node_limit", NODES)
    kw.setdefault("backend", "highs")          # the MILP's own tests; the exact search has tests_solver_search.py
    kw.setdefault("presets", ["vllm", "vllm-ef", "sarathi", "sarathi-ef"])
    return SolverInstance(list(prompt), list(output), list(arrival or [0.0] * len(prompt)), M,
                          SolverOptions(**kw), cm)


def t_prefill(cm, chunks, decode_kv=()):
    """Batch time straight from the cost model's aggregate formula (seconds)."""
    return cm.time_from_sums(n_tokens=sum(chunks) + len(decode_kv), n_prefill=len(chunks),
                             sum_c2=sum(c * c for c in chunks), sum_ck=0, sum_k_prefill=0,
                             n_decode=len(decode_kv), kv_read=sum(decode_kv))


def test_evaluate_times_each_batch_with_the_cost_model(cm):
    inst = inst_of(cm, [3], [3], 16)
    tr = evaluate(inst, Schedule([Step({0: 2}), Step({0: 1}), Step({0: 1}), Step({0: 1})]))
    want = t_prefill(cm, [2]) + t_prefill(cm, [1]) + t_prefill(cm, [], [4]) + t_prefill(cm, [], [5])
    assert tr.makespan_s == pytest.approx(want, rel=1e-12)
    assert tr.first_token_s[0] == pytest.approx(t_prefill(cm, [2]) + t_prefill(cm, [1]), rel=1e-12)
    assert tr.values[("m", 0, 4)] == 0 and tr.values[("done", 0, 4)] == 1     # memory released at completion


def test_decode_eviction_grows_the_input_and_costs_a_refill(cm):
    inst = inst_of(cm, [2], [3], 16)
    s = Schedule([Step({0: 2}), Step({0: 1}), Step({}, [0]), Step({0: 4})])
    tr = evaluate(inst, s)
    assert tr.values[("I", 0, 3)] == 4          # m = 3 cached + the last generated token
    assert tr.evictions == 1
    assert tr.values[("gc", 0, 4)] == 3 and tr.values[("done", 0, 4)] == 1
    assert tr.makespan_s == pytest.approx(t_prefill(cm, [2]) + t_prefill(cm, [], [3]) + t_prefill(cm, [4]), rel=1e-12)


@pytest.mark.parametrize("steps, rule", [
    ([Step({0: 2, 1: 2})], "exceeds M"),
    ([Step({0: 2}), Step({0: 2})], "must be 1"),
    ([Step({}, [0])], "holds no KV"),
    ([Step({0: 3})], "past its input"),
    ([Step({0: 2})], "unfinished"),
])
def test_evaluate_rejects_each_broken_rule(cm, steps, rule):
    inst = inst_of(cm, [2, 2], [2, 2], 3)
    with pytest.raises(InvalidSchedule, match=rule):
        evaluate(inst, Schedule(steps))


def test_preset_trace_replays_to_the_same_latency(cm):
    inst = inst_of(cm, [4, 4, 4], [3, 3, 3], 9)
    pr = run_presets(inst, ["vllm"])[0]
    assert pr.evictions > 0                      # M = 9 < 3 prompts: vLLM must evict
    tr = evaluate(inst, pr.schedule)
    assert tr.makespan_s == pytest.approx(pr.value_s, rel=1e-12)
    res = replay(inst, pr.schedule)
    assert res.summary["makespan_s"] == pytest.approx(pr.value_s, rel=1e-12)
    assert res.summary["evictions"] == pr.evictions


def test_single_request_optimum_is_whole_prefill_then_decodes(cm):
    inst = inst_of(cm, [4], [3], 64)
    r = solve(inst)
    want = t_prefill(cm, [4]) + t_prefill(cm, [], [5]) + t_prefill(cm, [], [6])
    assert r.status == "optimal"
    assert r.incumbent_s == pytest.approx(want, rel=1e-9)
    assert r.bound_s <= r.incumbent_s * (1 + 1e-6)
    assert r.replay_rel_err <= 1e-6


def test_two_requests_with_room_batch_together(cm):
    inst = inst_of(cm, [2, 2], [2, 2], 64)
    r = solve(inst)
    want = t_prefill(cm, [2, 2]) + t_prefill(cm, [], [3, 3])
    assert r.status == "optimal"
    assert r.incumbent_s == pytest.approx(want, rel=1e-9)
    assert [sorted(s.tokens.items()) for s in r.schedule.steps] == [[(0, 2), (1, 2)], [(0, 1), (1, 1)]]


def test_tight_memory_optimum_beats_or_ties_every_preset_and_replays(cm):
    inst = inst_of(cm, [2, 2, 2], [2, 2, 2], 4)
    r = solve(inst)
    assert r.status == "optimal" and r.gap <= 1e-4
    for p in r.presets:
        assert r.incumbent_s <= p.value_s * (1 + 1e-9), p.name
    assert r.replay_rel_err <= 1e-6
    ef = solve(inst_of(cm, [2, 2, 2], [2, 2, 2], 4, evictions=False))
    assert ef.evictions == 0
    assert r.incumbent_s <= ef.incumbent_s * (1 + 1e-9)     # the eviction-free optimum is a restriction


def test_switches_are_respected_and_only_cost(cm):
    base = solve(inst_of(cm, [3, 1], [3, 3], 64))
    nohy = solve(inst_of(cm, [3, 1], [3, 3], 64, hybrid=False))
    for j, s in enumerate(nohy.schedule.steps, start=1):
        phases = {nohy.trajectory.values[("d", i, j)] for i in s.tokens}
        assert len(phases) == 1                              # never prefill and decode together
    assert nohy.incumbent_s >= base.incumbent_s * (1 - 1e-9)


def test_chunked_prefill_uses_exact_squares(cm):
    # P = 3 forces prompts of 5 to be chunked; no chord is given up front, so the re-solve loop must add them
    inst = inst_of(cm, [5, 5], [2, 2], 64, P=3, exact_square_max=0)
    r = solve(inst)
    assert r.status == "optimal"
    assert r.square.startswith("exact")
    assert any(0 < c < 5 for s in r.schedule.steps for c in s.tokens.values())
    assert r.replay_rel_err <= 1e-6
    assert abs(r.solver_objective_s - r.incumbent_s) <= 1e-6 * r.incumbent_s


def test_online_arrivals_idle_and_replay(cm):
    inst = inst_of(cm, [2, 2], [2, 2], 64, arrival=[0.0, 0.5])
    r = solve(inst)
    assert r.status == "optimal"
    first = r.schedule.steps[0]
    assert set(first.tokens) == {0}                          # request 1 is not there yet
    assert r.trajectory.start_ms[-1] >= 500 - 1e-9
    assert r.replay_rel_err <= 1e-6


@pytest.mark.parametrize("objective", ["sum_completion", "mean_ttft"])
def test_request_level_objectives(cm, objective):
    make = solve(inst_of(cm, [4, 1], [3, 3], 64))
    r = solve(inst_of(cm, [4, 1], [3, 3], 64, objective=objective))
    assert r.status == "optimal" and r.replay_rel_err <= 1e-6
    assert r.incumbent_s <= make.trajectory.objective(r_inst := inst_of(cm, [4, 1], [3, 3], 64), objective) + 1e-12
    assert r_inst.n == 2


def test_goal_constraint_answers_existence(cm):
    yes = solve(inst_of(cm, [2, 2, 2], [2, 2, 2], 4, goal_factor=1.0))
    assert yes.schedule is not None and yes.incumbent_s <= yes.goal_s * (1 + 1e-9)
    no = solve(inst_of(cm, [2, 2, 2], [2, 2, 2], 4, goal_factor=0.5))
    assert no.status == "infeasible" and no.schedule is None


@pytest.mark.slow
def test_a_node_limit_still_returns_incumbent_and_bound(cm):
    """Stopped after one branch-and-bound node per solve (a budget that stops at the same point on any machine).
    Slow: the event packing's root node alone takes ~10 s on a shared 2-core machine."""
    inst = inst_of(cm, [8, 8, 8, 8], [4, 4, 4, 4], 16, node_limit=1)
    r = solve(inst)
    assert math.isfinite(r.bound_s) and r.bound_s <= r.incumbent_s * (1 + 1e-9)
    assert r.schedule is not None                             # at least the warm start
    assert r.incumbent_s <= min(p.value_s for p in r.presets) * (1 + 1e-9)
    assert r.replay_rel_err <= 1e-6


def test_errors_are_one_clear_line(cm):
    with pytest.raises(UserError, match="exceed M"):
        inst_of(cm, [8], [4], 8)
    with pytest.raises(UserError, match="objective"):
        inst_of(cm, [2], [2], 8, objective="throughput")
    try:
        import gurobipy  # noqa: F401
    except Exception:
        with pytest.raises(UserError, match="gurobipy"):
            solve(inst_of(cm, [2], [2], 8, backend="gurobi"))
        r = solve(inst_of(cm, [2], [2], 8))
        assert r.backend == "highs" and "not importable" in r.backend_reason


@pytest.mark.parametrize("prompt, output, M", [([1, 2], [2, 2], 3), ([2, 2], [2, 2], 3), ([3, 2], [2, 2], 4)])
def test_backends_agree(cm, prompt, output, M):
    pytest.importorskip("gurobipy")      # these fit the pip licence's 200-variable limit for quadratic models
    a = solve(inst_of(cm, prompt, output, M, backend="highs"))
    b = solve(inst_of(cm, prompt, output, M, backend="gurobi"))
    assert a.status == b.status == "optimal"
    assert b.backend == "gurobi" and b.square.startswith("exact")
    assert b.incumbent_s == pytest.approx(a.incumbent_s, rel=1e-6)
    assert b.replay_rel_err <= 1e-6


def test_cli_optimal_prints_value_bound_and_presets(tmp_path, capsys):
    from sim.cli import main
    rc = main(["optimal", "examples/optimal-infermax-4.5.yaml", "--set", "workload.prompt=2", "--set", "memory.M=5",
               "--set", "workload.num_requests=2", "--time-limit", "10", "--schedule-out", str(tmp_path / "s.json"),
               "--plot", str(tmp_path / "g.png"), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "optimal value" in out and "bound" in out and "vllm-ef" in out
    assert Schedule.from_json((tmp_path / "s.json").read_text()).steps
    assert (tmp_path / "g.png").stat().st_size > 0


def test_cli_reports_user_errors_without_traceback(capsys):
    from sim.cli import main
    rc = main(["optimal", "examples/optimal-infermax-4.5.yaml", "--set", "solver.bogus=1"])
    assert rc == 2
    assert "bogus" in capsys.readouterr().err


def test_too_short_horizon_is_reported_infeasible(cm):
    from solver.report import format_result
    inst = inst_of(cm, [2, 2], [3, 3], 64, horizon=2, presets=[])
    r = solve(inst)
    assert r.status == "infeasible" and r.schedule is None
    assert "no schedule finishes every request within J = 2" in format_result(r, inst)


def test_oversized_model_is_refused_in_one_line(cm):
    inst = inst_of(cm, [2] * 50, [2] * 50, 10_000, horizon=1000, presets=[])
    with pytest.raises(UserError, match="too large"):
        solve(inst)


def test_hopelessly_large_instance_is_refused_before_the_presets_run(cm, monkeypatch):
    """1,024 requests of 128 output tokens need at least 128 batches: refused at once, not after checking every
    preset's schedule variable by variable (which used to run for minutes)."""
    import solver.solve as solve_mod
    monkeypatch.setattr(solve_mod, "run_presets", lambda *a, **k: pytest.fail("presets ran"))
    inst = inst_of(cm, [16] * 1024, [128] * 1024, 100_000)
    with pytest.raises(UserError, match="1024 requests × at least 128 batch slots is too large"):
        solve(inst)
