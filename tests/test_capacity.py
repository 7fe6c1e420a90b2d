"""Capacity search: bracketing + bisection finds known thresholds within tolerance, on functions and on the simulator."""
import math

import numpy as np
import pandas as pd
import pytest

from costmodels.errors import UserError
from study.capacity import attainment_at, replicas_needed, run_capacity, search_capacity
from sim.cli import main
from sim.scenario.config import scenario_from_dict
from sim.cluster.runner import run_scenario


@pytest.mark.parametrize("start", [0.1, 1.0, 3.7, 50.0])
def test_step_threshold_is_bracketed_within_tolerance_from_any_start(start):
    true = 3.7
    res = search_capacity(lambda r: 1.0 if r <= true else 0.4, 0.9, start, rate_min=0.01, rate_max=1000, rel_tol=0.01)
    assert res.status == "ok"
    assert res.capacity_rps <= true < res.bracket_hi
    assert res.bracket_hi - res.capacity_rps <= 0.01 * res.bracket_hi
    assert all(a == (1.0 if r <= true else 0.4) for r, a in res.evaluations)


def test_smooth_attainment_curve_crosses_at_the_analytic_rate():
    # attainment 1 / (1 + (r/5)^4) equals 0.9 at r = 5 * (1/9)^(1/4)
    true = 5 * (1 / 9) ** 0.25
    res = search_capacity(lambda r: 1 / (1 + (r / 5) ** 4), 0.9, 1.0, rate_min=1e-3, rate_max=1e3,
                          rel_tol=0.0, abs_tol=1e-3)
    assert abs(res.capacity_rps - true) <= 1e-3 and res.capacity_rps <= true


def test_limits_are_reported_not_hidden():
    low = search_capacity(lambda r: 0.0, 0.9, 1.0, rate_min=0.25, rate_max=10)
    assert low.status == "below_min" and low.capacity_rps == 0.0 and low.evaluations[-1][0] == 0.25
    high = search_capacity(lambda r: 1.0, 0.9, 1.0, rate_min=0.25, rate_max=10)
    assert high.status == "at_max" and high.capacity_rps == 10 and high.bracket_hi is None
    with pytest.raises(UserError, match="evaluations"):
        search_capacity(lambda r: 1.0 if r < math.pi else 0.0, 0.9, 1.0, rate_min=1e-3, rate_max=1e3,
                        rel_tol=0.0, abs_tol=0.0, max_evals=12)


def test_replicas_for_a_target_rate_divide_the_load():
    assert replicas_needed(10, 3) == 4
    assert replicas_needed(9, 3) == 3
    assert replicas_needed(9, 0) == math.inf


# A simulated case with a known answer: one-token prompts and one-token outputs, so each request is one prefill
# iteration of duration t1 when served alone. With a TTFT target just above t1 and attainment target 1.0, every
# request meets it iff no request arrives while another is being served, i.e. iff every Poisson gap >= t1.
# The same seed at every rate only rescales the gaps (gap_i = e_i / rate), so the capacity is min_i(e_i) / t1.
N = 40
SINGLE = {"name": "single-token", "seed": 3, "memory": {"M": 1000, "block_size": 1}, "policy": {"name": "vllm"},
          "costmodel": {"kind": "linear"},       # no front-end time: TTFT alone is exactly one iteration
          "workload": {"kind": "poisson", "num_requests": N, "rate": 1.0, "prompt": 1, "output": 1}}


def _single_token_time():
    one = {**SINGLE, "workload": {**SINGLE["workload"], "num_requests": 1}}
    return float(run_scenario(scenario_from_dict(one)).requests["ttft_s"].iloc[0])


def test_simulated_capacity_matches_the_min_gap_answer():
    t1 = _single_token_time()
    base = {**SINGLE, "slo": {"ttft_s": t1 * 1.000001}}
    gaps = np.random.default_rng(SINGLE["seed"]).exponential(1.0, size=N)
    true = gaps[1:].min() / t1                      # the first gap only delays the first arrival
    table, ev, _ = run_capacity(base, "test", ["vllm"], [SINGLE["seed"]], 1.0, start=1.0, rate_min=1e-3,
                                rate_max=1e6, rel_tol=0.01)
    row = table.iloc[0]
    assert row["status"] == "ok"
    assert row["capacity_rps"] <= true < row["bracket_hi_rps"]
    assert row["bracket_hi_rps"] - row["capacity_rps"] <= 0.01 * row["bracket_hi_rps"]
    # and the evaluations really are simulated attainments on both sides
    assert attainment_at(base, "test", row["capacity_rps"], "slo_attainment") == 1.0
    assert attainment_at(base, "test", row["bracket_hi_rps"], "slo_attainment") < 1.0
    assert set(ev.columns) >= {"policy", "seed", "rate", "slo_attainment", "meets"}


def test_cli_capacity_per_policy_and_seed_with_gpus(tmp_path, capsys):
    import yaml
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump({**SINGLE, "workload": {**SINGLE["workload"], "num_requests": 12},
                                   "slo": {"ttft_s": 0.05}}))
    rc = main(["capacity", str(scn), "--policy", "vllm,sarathi", "--seeds", "0-1", "--slo-attainment", "0.9",
               "--target-rate", "500", "--tol", "0.05", "--out", str(tmp_path / "cap"), "--no-progress"])
    assert rc == 0
    cap = pd.read_csv(tmp_path / "cap" / "capacity.csv")
    assert list(zip(cap["policy"], cap["seed"])) == [("vllm", 0), ("vllm", 1), ("sarathi", 0), ("sarathi", 1)]
    per = pd.read_csv(tmp_path / "cap" / "per_policy.csv")
    for _, r in per.iterrows():
        assert r["gpus_needed"] == math.ceil(500 / r["capacity_min_rps"] - 1e-9)
        # two seeds: the bootstrap interval of their mean is [smaller, larger] (study/intervals.py, hand-worked)
        two = cap.loc[cap["policy"] == r["policy"], "capacity_rps"]
        assert (r["capacity_lo_rps"], r["capacity_hi_rps"]) == (two.min(), two.max())


def test_capacity_needs_slo_targets():
    with pytest.raises(UserError, match="SLO targets"):
        run_capacity(SINGLE, "test", ["vllm"], [0], 0.9, start=1.0, rate_min=0.1, rate_max=10)


@pytest.mark.parametrize("args,message", [
    (["--seeds", "0,x"], "--seeds: expected integers >= 0 separated by commas (or a range such as 0-4), got 'x'"),
    (["--seeds", "3-1"], "--seeds: the range '3-1' is empty"),
    (["--seeds", "0,,1"], "--seeds: an empty item in '0,,1'"),          # was dropped without a word
    (["--seeds", "1", "--seeds", "1"], "--seeds: a seed is given twice"),  # was searched twice
    (["--policy", "vllm,vllm"], "--policy: 'vllm' is given twice"),
    (["--tol", "-1"], "--tol / --abs-tol: must be >= 0 and not both 0"),
    (["--tol", "0"], "--tol / --abs-tol: must be >= 0 and not both 0")])
def test_cli_capacity_bad_options_are_one_line_before_any_run(tmp_path, capsys, args, message):
    """A non-integer seed used to end in a traceback; a tolerance <= 0 ran 60 simulations before giving up. Seeds
    are read as sweep and plan read them (capacity refused the range 0-4 they accept)."""
    import yaml
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump({**SINGLE, "slo": {"ttft_s": 0.05}}))
    assert main(["capacity", str(scn), "--policy", "vllm", "--no-progress", "--out", str(tmp_path / "c")] + args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
