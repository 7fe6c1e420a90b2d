"""Length predictors: calibrations reproduce the papers' error figures; workloads carry predictions."""
import numpy as np
import pytest

from costmodels.errors import UserError
from policies.predictors import (ECONOSERVE_TARGETS, calibrate_lognormal, error_report, predict_lengths,
                                 provisioning_expectation, provisioning_report)
from traces import build_workload


@pytest.mark.parametrize("dataset", sorted(ECONOSERVE_TARGETS))
def test_econoserve_calibration_reproduces_fig5a(dataset):
    padding, over, under = ECONOSERVE_TARGETS[dataset]
    mu, sigma = calibrate_lognormal(padding, over, under)
    assert provisioning_expectation(mu, sigma, padding) == pytest.approx((over, under), abs=1e-4)
    rng = np.random.default_rng(1)
    true = rng.integers(20, 900, 40000)
    pred = predict_lengths(true, {"kind": "lognormal", "dataset": dataset}, rng)
    rep = provisioning_report(true, np.ceil(pred * (1 + padding)))
    assert rep["over_provision_pct"] == pytest.approx(over * 100, abs=0.6)
    assert rep["under_provision_pct"] == pytest.approx(under * 100, abs=0.8)


def test_more_padding_trades_under_for_over_provisioning():
    rng = np.random.default_rng(2)
    true = rng.integers(20, 900, 20000)
    pred = predict_lengths(true, {"kind": "lognormal", "dataset": "sharegpt"}, rng)
    reps = [provisioning_report(true, np.ceil(pred * (1 + p))) for p in (0.10, 0.15, 0.20)]
    assert reps[0]["under_provision_pct"] > reps[1]["under_provision_pct"] > reps[2]["under_provision_pct"]
    assert reps[0]["over_provision_pct"] < reps[1]["over_provision_pct"] < reps[2]["over_provision_pct"]


@pytest.mark.parametrize("dataset,mae", [("alpaca", 0.034), ("sharegpt", 0.092)])
def test_alise_relative_error_matches_paper(dataset, mae):
    rng = np.random.default_rng(3)
    true = rng.integers(50, 900, 40000)
    pred = predict_lengths(true, {"kind": "relative", "dataset": dataset}, rng)
    rep = error_report(true, pred)
    assert rep["mean_rel_abs_error"] == pytest.approx(mae, rel=0.08)
    assert abs(rep["mean_rel_bias"]) < 0.01


def test_oracle_is_exact_and_bad_kind_is_one_line_error():
    rng = np.random.default_rng(0)
    assert list(predict_lengths([5, 7], {"kind": "oracle"}, rng)) == [5, 7]
    with pytest.raises(UserError, match="allowed: oracle"):
        predict_lengths([5], {"kind": "psychic"}, rng)
    with pytest.raises(UserError, match="unknown key"):
        predict_lengths([5], {"kind": "relative", "mae": 0.1, "typo": 1}, rng)


def test_dataset_workloads_match_table2_means_and_carry_predictions():
    df = build_workload({"kind": "econoserve-sharegpt", "num_requests": 20000, "rate": 5}, np.random.default_rng(0))
    assert df["output_tokens"].mean() == pytest.approx(337.99, rel=0.05)
    assert df["prompt_tokens"].mean() == pytest.approx(161.31, rel=0.05)
    assert df["output_tokens"].between(19, 991).all()
    assert (df["prompt_tokens"] + df["output_tokens"] <= 4096).all()
    assert df["predicted_output_tokens"].ne(df["output_tokens"]).mean() > 0.9
    gaps = np.diff(df["arrival_s"].to_numpy())
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)
    a = build_workload({"kind": "alise-alpaca", "num_requests": 20000, "rate": 5,
                        "predictor": {"kind": "oracle"}}, np.random.default_rng(0))
    assert (a["predicted_output_tokens"] == a["output_tokens"]).all()
    assert a["output_tokens"].mean() == pytest.approx(58.41, rel=0.05)
