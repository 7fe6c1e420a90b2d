"""Fleet decisions: intervals (hand-worked and on a known distribution), the energy and cost model (hand-worked),
the configuration planner on a toy catalog with a known answer, and the messages a new user meets."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from costmodels.errors import UserError
from study.intervals import Interval, attainment_interval, mean_interval, parse_seeds, seeds_needed


# -- intervals ------------------------------------------------------------------------------------------------------
def test_two_seed_bootstrap_interval_is_the_two_values():
    # Resampling two values: means a, (a+b)/2, b with probability 1/4, 1/2, 1/4, so the 2.5th and 97.5th
    # percentiles are a and b themselves.
    iv = mean_interval([2.0, 6.0])
    assert (iv.mean, iv.lo, iv.hi, iv.n) == (4.0, 2.0, 6.0, 2)


def test_one_seed_attainment_interval_is_the_binomial_one():
    # 900 of 1000 requests: the request bootstrap is Binomial(1000, 0.9)/1000, sd = sqrt(0.9*0.1/1000) = 0.00949,
    # so the 95 % interval is 0.9 -+ 1.96 * 0.00949 = [0.8814, 0.9186] (normal approximation, to bootstrap noise).
    iv = attainment_interval([(900, 1000)])
    assert iv.mean == 0.9 and iv.n == 1
    assert iv.lo == pytest.approx(0.8814, abs=0.003) and iv.hi == pytest.approx(0.9186, abs=0.003)


def test_attainment_interval_covers_the_true_value_about_95_percent_of_the_time():
    # Known distribution: each seed's attainment p_s ~ Beta(45, 5) (mean 0.9), its 400 requests Bernoulli(p_s).
    rng = np.random.default_rng(7)
    hits, trials = 0, 300
    for t in range(trials):
        p = rng.beta(45, 5, size=8)
        counts = [(int(rng.binomial(400, ps)), 400) for ps in p]
        iv = attainment_interval(counts, reps=1000, seed=t)
        hits += iv.lo <= 0.9 <= iv.hi
    assert 0.87 <= hits / trials <= 0.99          # percentile bootstrap on 8 seeds runs a little narrow


def test_same_inputs_same_interval_and_seeds_needed():
    counts = [(80, 100), (95, 100), (88, 100)]
    assert attainment_interval(counts) == attainment_interval(counts)
    iv = Interval(0.9, 0.86, 0.94, 3)             # half-width 0.04 on 3 seeds; 0.01 needs (0.04/0.01)^2 x 3 = 48
    assert seeds_needed(iv, 0.01) == 48 and seeds_needed(iv, 0.05) == 3


def test_seed_lists_parse_or_fail_in_one_line():
    assert parse_seeds("0,1,2") == [0, 1, 2] and parse_seeds(["0-2", "5"]) == [0, 1, 2, 5]
    for bad in ("a,b", "1,1", "-3", "0-x", "0,,1"):
        with pytest.raises(UserError, match="--seeds"):
            parse_seeds(bad)
    # a backwards range named as such (it used to surface as "--grid 'seed=': no values given")
    with pytest.raises(UserError, match=r"--seeds: the range '3-1' is empty; give its low end first \(such as 1-3\)"):
        parse_seeds("3-1")


# -- energy and cost --------------------------------------------------------------------------------------------------
def test_energy_of_two_iterations_by_hand():
    from sim.metrics.economics import GpuEconomics, economics_summary, replica_energy_j
    e = GpuEconomics("toy", usd_per_gpu_hour=3.0, power_idle_w=100.0, power_peak_w=500.0, compute=1.0, memory=1.0)
    it = pd.DataFrame({"duration_s": [0.5, 0.25], "mfu": [0.1, 0.6], "mbu": [0.2, 0.6]})
    # iteration 1: activity 0.1 + 0.2 = 0.3 -> 100 + 400 * 0.3 = 220 W x 0.5 s = 110 J
    # iteration 2: activity 1.2, capped at 1 -> 500 W x 0.25 s = 125 J
    # held 2 s: 1.25 s idle x 100 W = 125 J; per GPU 360 J, two GPUs 720 J
    assert replica_energy_j(e, 2, it, 2.0) == pytest.approx(720.0)
    s = economics_summary([(e, 2, it)], 2.0, 1000)
    assert s["gpu_hours"] == pytest.approx(2 * 2.0 / 3600)
    assert s["cost_usd"] == pytest.approx(3.0 * 2 * 2.0 / 3600)
    assert s["usd_per_million_tokens"] == pytest.approx(s["cost_usd"] / 1000 * 1e6)
    assert s["joules_per_token"] == pytest.approx(0.72) and s["power_w_mean"] == pytest.approx(360.0)
    assert replica_energy_j(e, 1, it.iloc[:0], 2.0) == pytest.approx(200.0)      # a replica that never ran
    assert math.isnan(replica_energy_j(e, 1, None, 2.0))                        # iterations not recorded


def _small(**over):
    raw = {"name": "f", "seed": 0, "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
           "policy": {"name": "vllm-v1"},
           "workload": {"kind": "poisson", "num_requests": 120, "rate": 6,
                        "prompt": {"dist": "uniform", "low": 64, "high": 800},
                        "output": {"dist": "uniform", "low": 16, "high": 160}},
           "slo": {"ttft_s": 1.0, "tpot_s": 0.05}}
    raw.update(over)
    return raw


def test_run_cost_and_energy_follow_the_table_and_overrides():
    from sim.cluster.runner import run_scenario
    from sim.metrics.economics import economics_table
    from sim.scenario.config import scenario_from_dict
    s = run_scenario(scenario_from_dict(_small(cluster={"replicas": 2}))).summary
    price = economics_table()["gpus"]["a100-80gb"]["usd_per_gpu_hour"]
    assert s["gpu_hours"] == pytest.approx(2 * s["makespan_s"] / 3600)
    assert s["cost_usd"] == pytest.approx(s["gpu_hours"] * price)
    held_j = 2 * s["makespan_s"]
    assert 46 * held_j < s["energy_j"] < 400 * held_j             # between idle and peak for every held second
    hw = {"gpu": "a100-80gb", "usd_per_gpu_hour": 2.0, "power_idle_w": 50.0, "power_peak_w": 50.0}
    t = run_scenario(scenario_from_dict(_small(hardware=hw))).summary
    assert t["cost_usd"] == pytest.approx(2.0 * t["makespan_s"] / 3600)
    assert t["energy_j"] == pytest.approx(50.0 * t["makespan_s"])            # flat power: idle x held time


def test_bad_prices_are_one_line(tmp_path, monkeypatch):
    from sim.metrics.economics import economics_table
    from sim.scenario.config import scenario_from_dict
    with pytest.raises(UserError, match="hardware.usd_per_gpu_hour: must be >= 0"):
        scenario_from_dict(_small(hardware={"gpu": "a100-80gb", "usd_per_gpu_hour": -1}))
    f = tmp_path / "prices.yaml"
    f.write_text(yaml.safe_dump({"gpus": {"h100-sxm": {"usd_per_gpu_hour": "cheap"}}}))
    monkeypatch.setenv("SERVESIM_GPU_ECONOMICS", str(f))
    with pytest.raises(UserError, match=r"gpus.h100-sxm.usd_per_gpu_hour: expected a number"):
        economics_table()
    f.write_text(yaml.safe_dump({"gpus": {"h100-sxm": {"usd_per_gpu_hour": 9.5}}}))
    assert economics_table()["gpus"]["h100-sxm"]["usd_per_gpu_hour"] == 9.5      # the user's file wins


# -- the planner on a toy catalog -------------------------------------------------------------------------------------
TOY_CAP = {("a100-80gb", 1): 3.0, ("h100-sxm", 1): 10.0, ("h100-sxm", 2): 19.0}   # req/s one replica serves


def _toy_runs(monkeypatch):
    """Replace the simulation by a toy: a layout meets 100 % of 1000 requests when its replicas' summed capacity
    covers the rate, else the covered share. Cost = GPUs x the configuration's price."""
    import study.plan as plan

    def run_batch(self, cfg, todo):
        for lay, seed in todo:
            reps = sum(lay)
            share = min(1.0, reps * TOY_CAP[(cfg.gpu, cfg.tp)] / self.rate)
            yield (lay, seed), {"config": cfg.label, "gpu": cfg.gpu, "tp": cfg.tp, "mode": cfg.mode,
                                "router": cfg.router or "", "layout": ":".join(map(str, lay)), "seed": seed,
                                "met": int(round(1000 * share)), "n": 1000, "attainment": share,
                                "gpus": reps * cfg.tp, "usd_per_hour": reps * cfg.tp * cfg.usd_per_gpu_hour,
                                "usd_per_million_tokens": 1.0, "joules_per_token": 1.0, "served_share": share}

    monkeypatch.setattr(plan.Planner, "run_batch", run_batch)
    monkeypatch.setattr(plan, "single_capacity", lambda raw, src, gpu, tp, *a: TOY_CAP[(gpu, tp)])


def test_planner_picks_the_cheapest_configuration_that_meets_the_target(monkeypatch):
    from study.plan import Config, Planner, cheapest, plan_configs, summarize_points
    _toy_runs(monkeypatch)
    # 20 req/s: a100 x 7 = $7.00/h; h100 tp1 x 2 = $6.00/h; h100 tp2 x 2 = 4 GPUs = $12.00/h (one tp2 replica
    # holds 19 < 20). The cheapest that meets is two h100 tp1 replicas.
    prices = {"a100-80gb": 1.0, "h100-sxm": 3.0}
    configs = [Config(g, tp, "colocated", None, prices[g]) for g, tp in TOY_CAP]
    planner = Planner(_small(), "toy", rate=20.0, target=0.99, seeds=[0])
    res = plan_configs(planner, configs, prices, prune=0)
    pts = summarize_points(res["rows"], 0.99)
    best = cheapest(pts)
    assert (best["gpu"], best["tp"], best["layout"], best["usd_per_hour"]) == ("h100-sxm", 1, "2", 6.0)
    # searched cheapest estimate first (h100 tp1: 2 x $3), whose $6/h then caps the others: the a100 runs up to 6
    # replicas ($6, a miss: 6 x 3 = 18 < 20 req/s) and never its dearer 7, h100 tp2 only its one-replica $6 size
    assert pts["usd_per_hour"].max() == 6.0
    assert not pts[pts["gpu"] == "a100-80gb"]["meets"].any()
    assert set(pts[pts["gpu"] == "a100-80gb"]["layout"]) >= {"6"}
    assert list(pts[pts["tp"] == 2]["layout"]) == ["1"]
    assert set(pts[pts["gpu"] == "a100-80gb"]["search_status"]) == {"capped"}
    # frontier: nothing on it is beaten on both cost and attainment
    f = pts[pts["frontier"]]
    for _, r in f.iterrows():
        assert not ((pts["usd_per_hour"] < r["usd_per_hour"]) & (pts["attainment"] >= r["attainment"])).any()
    # pruning by the capacity estimate: a100 needs ceil(20/3) = 7 x $1 = $7 vs h100 tp1's 2 x $3 = $6; at 1.1x the
    # cheapest estimate the a100 is skipped, h100 tp2 (2 x 2 x $3 = $12) too
    res2 = plan_configs(planner, configs, prices, prune=1.1)
    assert {c.label for c, _ in res2["pruned"]} == {"a100-80gb tp1 colocated", "h100-sxm tp2 colocated"}


def test_same_seed_same_plan_table(tmp_path, capsys):
    from sim.cli import main
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_small(cluster={"replicas": 1, "router": "least_tokens"})))
    outs = []
    for k in range(2):
        assert main(["plan", str(p), "--rate", "8", "--seeds", "0,1", "--out", str(tmp_path / f"p{k}")]) == 0
        outs.append((tmp_path / f"p{k}" / "plan.csv").read_text())
    assert outs[0] == outs[1]
    pts = pd.read_csv(tmp_path / "p0" / "plan.csv")
    assert (pts["attainment_lo"] <= pts["attainment"]).all() and (pts["attainment"] <= pts["attainment_hi"]).all()
    chosen = pts[pts["meets"]].sort_values("usd_per_hour").iloc[0]
    assert chosen["attainment_lo"] >= 0.9


# -- messages ---------------------------------------------------------------------------------------------------------
def test_plan_messages_for_a_new_user(tmp_path, capsys):
    from sim.cli import main
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_small(cluster={"replicas": 1})))
    assert main(["plan", str(p), "--rate", "4", "--seeds", "a,b"]) == 2
    assert "--seeds: expected integers" in capsys.readouterr().err
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(_small(workload={"kind": "offline", "num_requests": 10, "prompt": 64,
                                                   "output": 8})))
    assert main(["plan", str(off), "--rate", "4"]) == 2
    assert "plan needs a rate-driven workload" in capsys.readouterr().err
    # TTFT 1 ms is out of reach of any fleet: exit 1, one line on stderr naming the target and what was reached
    assert main(["plan", str(p), "--rate", "4", "--set", "slo.ttft_s=0.001"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of reach" in err[0] and "limiting target is slo.ttft_s = 0.001" in err[0]


def test_run_explains_an_overloaded_fleet(tmp_path, capsys):
    from sim.cli import main
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_small(workload={**_small()["workload"], "rate": 60, "num_requests": 300},
                                       cluster={"replicas": 1})))
    assert main(["run", str(p), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "hint: overloaded: requests arrive at" in err and "servesim plan" in err
    p.write_text(yaml.safe_dump(_small(workload={**_small()["workload"], "rate": 1, "num_requests": 40})))
    assert main(["run", str(p), "--no-progress"]) == 0
    assert "hint: overloaded" not in capsys.readouterr().err


def test_sweep_over_seeds_is_the_seed_rows_mean_and_interval(tmp_path, capsys):
    from sim.cli import main
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_small()))
    assert main(["sweep", str(p), "--grid", "workload.rate=2,6", "--seeds", "0-2", "--out", str(tmp_path / "sw"),
                 "--show", "tps,slo_attainment", "--no-progress"]) == 0
    res = pd.read_csv(tmp_path / "sw" / "results.csv")
    folded = pd.read_csv(tmp_path / "sw" / "over_seeds.csv")
    assert list(folded["seeds"]) == [3, 3]
    for _, r in folded.iterrows():
        rows = res[res["workload.rate"] == r["workload.rate"]]
        assert r["tps"] == pytest.approx(rows["tps"].mean())
        assert r["tps_lo"] >= rows["tps"].min() - 1e-9 and r["tps_hi"] <= rows["tps"].max() + 1e-9
        assert r["slo_attainment_lo"] <= r["slo_attainment"] <= r["slo_attainment_hi"]
    assert "over seeds (mean [95% interval]" in capsys.readouterr().out
    assert main(["sweep", str(p), "--grid", "seed=0,1", "--seeds", "0,1", "--out", str(tmp_path / "x")]) == 2


def test_identical_seeds_count_once():
    from study.plan import distinct_counts
    a = {"met": 90, "n": 100, "ttft_p99": 1.5, "tpot_mean": 0.03, "usd_per_million_tokens": 0.2}
    b = dict(a, met=85, ttft_p99=1.7)
    assert distinct_counts([a, dict(a)]) == [(90, 100)]                 # a trace replay: the same run twice
    assert distinct_counts([a, b]) == [(90, 100), (85, 100)]
    # a duplicated seed would narrow the interval as if twice the requests had been seen
    assert attainment_interval(distinct_counts([a, dict(a)])) == attainment_interval([(90, 100)])
