"""Predicted output lengths: error models hit their stated error; histogram estimator by hand; presets; padding."""
import numpy as np
import pandas as pd
import pytest

from costmodels.errors import UserError
from traces.predictors import (HistogramEstimator, bucket_accuracy, lognormal_sigma_for_error,
                               mean_relative_error, predict_lengths)

N = 100_000


def _table(rng, n=N):
    # Outputs spread like a chat trace (32..1024 tokens), so rounding to whole tokens barely matters.
    return pd.DataFrame({"arrival_s": np.arange(n) * 0.1, "prompt_tokens": 100,
                         "output_tokens": rng.integers(32, 1025, n)})


@pytest.mark.parametrize("error", [0.034, 0.092, 0.148, 0.3])
@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_noisy_predictor_hits_stated_mean_relative_error(error, dist):
    rng = np.random.default_rng(0)
    df = _table(rng)
    pred = predict_lengths({"kind": "noisy", "error": error, "dist": dist}, df, rng)
    assert mean_relative_error(pred, df["output_tokens"]) == pytest.approx(error, rel=0.10)
    assert pred.min() >= 1


def test_lognormal_sigma_solves_the_closed_form():
    s = lognormal_sigma_for_error(0.092)
    z = np.random.default_rng(1).normal(0, s, 1_000_000)
    assert np.mean(np.abs(np.exp(z) - 1)) == pytest.approx(0.092, rel=0.01)


@pytest.mark.parametrize("preset, acc", [("econoserve-alpaca", 0.775), ("econoserve-sharegpt", 0.732),
                                         ("econoserve-bookcorpus", 0.698)])
def test_bucket_predictor_hits_stated_accuracy(preset, acc):
    rng = np.random.default_rng(2)
    df = _table(rng)
    raw = predict_lengths({"preset": preset, "padding": 0.0}, df, rng)
    assert bucket_accuracy(raw, df["output_tokens"], 128) == pytest.approx(acc, rel=0.10)
    # Wrong predictions land in a neighbouring bucket, never further.
    b_pred, b_true = (raw - 1) // 128, (df["output_tokens"].to_numpy() - 1) // 128
    assert np.abs(b_pred - b_true).max() == 1


def test_alise_presets_and_padding():
    rng = np.random.default_rng(3)
    df = _table(rng)
    for name, err in (("alise-alpaca", 0.034), ("alise-sharegpt", 0.092)):
        pred = predict_lengths({"preset": name}, df, np.random.default_rng(4))
        assert mean_relative_error(pred, df["output_tokens"]) == pytest.approx(err, rel=0.10)
    oracle = predict_lengths({"kind": "oracle", "padding": 0.15}, df, rng)
    assert np.array_equal(oracle, np.ceil(df["output_tokens"].to_numpy() * 1.15 - 1e-9).astype(int))


def test_histogram_estimator_by_hand():
    h = HistogramEstimator(bin_tokens=10, statistic="mean", default=50)
    assert h.estimate() == 50                      # nothing completed yet
    for o in (5, 15, 40):
        h.observe(o)
    assert h.estimate() == 20                      # (5 + 15 + 40) / 3
    assert h.estimate(generated=12) == round((15 + 40) / 2)  # only lengths a 12-token request can still have
    assert h.estimate(generated=45) == 46          # outlived every completed request: at least one more token
    m = HistogramEstimator(bin_tokens=10, statistic="median")
    for o in (5, 15, 25, 35, 95):
        m.observe(o)
    assert m.estimate() == 25                      # the median's bin (20, 30] midpoint
    m.observe(1000)                                # far beyond the initial bins: the histogram grows
    assert HistogramEstimator(statistic="p90").statistic == "p90" and m.estimate() in (25, 35)


def test_histogram_predictor_uses_only_earlier_requests():
    df = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "prompt_tokens": 1, "output_tokens": [10, 30, 50, 70]})
    pred = predict_lengths({"kind": "histogram", "bin_tokens": 1, "default": 99}, df, np.random.default_rng(0))
    assert pred.tolist() == [99, 10, 20, 30]
    lagged = predict_lengths({"kind": "histogram", "bin_tokens": 1, "default": 99, "lag_s": 1.5}, df,
                             np.random.default_rng(0))
    assert lagged.tolist() == [99, 99, 10, 20]


def test_predictor_errors():
    df = _table(np.random.default_rng(0), 10)
    with pytest.raises(UserError, match=r"workload.predictor.kind: unknown predictor 'magic'"):
        predict_lengths({"kind": "magic"}, df, np.random.default_rng(0))
    with pytest.raises(UserError, match="error: expected the mean relative error"):
        predict_lengths({"kind": "noisy", "error": 5}, df, np.random.default_rng(0))
    with pytest.raises(UserError, match="unknown key"):
        predict_lengths({"kind": "oracle", "error": 0.1}, df, np.random.default_rng(0))


def test_histogram_mean_fast_path_matches_the_estimator():
    rng = np.random.default_rng(8)
    arr = np.sort(rng.exponential(1.0, 3000).cumsum())
    arr[100:110] = arr[100]                                  # ties: simultaneous arrivals see the same history
    df = pd.DataFrame({"arrival_s": arr, "prompt_tokens": 1, "output_tokens": rng.integers(1, 700, 3000)})
    fast = predict_lengths({"kind": "histogram", "lag_s": 2.0}, df, rng)
    est, expect, j = HistogramEstimator(default=128), [], 0
    for i in range(len(df)):
        while arr[j] + 2.0 < arr[i]:
            est.observe(int(df["output_tokens"][j]))
            j += 1
        expect.append(est.estimate())
    assert np.abs(fast - np.asarray(expect)).max() <= 1     # rounding of the same mean
