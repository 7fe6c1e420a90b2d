"""Arrival processes and length generators: moments over 100k draws, time-scaling, InferMax mixes, determinism."""
import numpy as np
import pytest

from costmodels.errors import UserError
from traces.arrivals import draw_arrivals, interarrival_cv, mean_rate, scale_to_rate
from traces.lengths import draw_lengths, infermax_mix
from traces.loaders import load_trace

N = 100_000


def _gap_moments(a):
    g = np.diff(np.concatenate(([0.0], a)))
    return g.mean(), g.std() / g.mean()


@pytest.mark.parametrize("spec, mean_gap, cv", [
    ({"process": "poisson", "rate": 4.0}, 0.25, 1.0),
    ({"process": "gamma", "rate": 4.0, "cv": 1.0}, 0.25, 1.0),
    ({"process": "gamma", "rate": 2.0, "cv": 3.0}, 0.5, 3.0),
    ({"process": "gamma", "rate": 10.0, "cv": 0.5}, 0.1, 0.5),
])
def test_interarrival_mean_and_cv_within_5_percent(spec, mean_gap, cv):
    m, c = _gap_moments(draw_arrivals(spec, N, np.random.default_rng(1), "t"))
    assert m == pytest.approx(mean_gap, rel=0.05)
    assert c == pytest.approx(cv, rel=0.05)


def test_constant_and_offline():
    a = draw_arrivals({"process": "constant", "rate": 5}, 11, np.random.default_rng(0), "t")
    assert a.tolist() == pytest.approx([i / 5 for i in range(11)])
    assert not draw_arrivals({"process": "offline"}, 7, np.random.default_rng(0), "t").any()


def test_onoff_bursts_rate_and_silence():
    spec = {"process": "onoff", "rate": 20.0, "on_s": 2.0, "off_s": 8.0}
    a = draw_arrivals(spec, 20_000, np.random.default_rng(3), "t")
    assert np.all((a % 10.0) < 2.0)                       # nothing arrives in the off windows
    assert mean_rate(a) == pytest.approx(20.0 * 2 / 10, rel=0.05)  # duty cycle 20%
    assert interarrival_cv(a) > 1.5                        # burstier than Poisson
    b = draw_arrivals({**spec, "off_rate": 5.0}, 20_000, np.random.default_rng(3), "t")
    assert mean_rate(b) == pytest.approx((20 * 2 + 5 * 8) / 10, rel=0.05)


def test_time_scaling_hits_target_rate_and_keeps_burst_shape(shared_data):
    a = load_trace(shared_data / "traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv")["arrival_s"].to_numpy()
    for target in (0.5, 10.0, 37.0):
        s = scale_to_rate(a, target)
        assert mean_rate(s) == pytest.approx(target, rel=0.01)
        assert interarrival_cv(s) == pytest.approx(interarrival_cv(a), rel=1e-9)
    with pytest.raises(UserError, match="all arrive at once"):
        scale_to_rate(np.zeros(5), 3.0)


def test_unknown_process_and_bad_knobs():
    with pytest.raises(UserError, match="allowed: offline, poisson, gamma"):
        draw_arrivals({"process": "weibull"}, 3, np.random.default_rng(0), "w.arrival")
    with pytest.raises(UserError, match=r"w.arrival.rate: must be > 0 requests/s"):
        draw_arrivals({"process": "poisson", "rate": -1}, 3, np.random.default_rng(0), "w.arrival")
    with pytest.raises(UserError, match="unknown key"):
        draw_arrivals({"process": "poisson", "rate": 1, "cv": 2}, 3, np.random.default_rng(0), "w")


@pytest.mark.parametrize("spec, mean, std", [
    ({"dist": "uniform", "low": 512, "high": 1024}, 768, 147.8),   # BROS BE prompt (spec: 768 / 147.8)
    ({"dist": "normal", "mean": 500, "std": 50}, 500, 50),
    ({"dist": "lognormal", "mean": 300, "std": 250}, 300, 250),
])
def test_length_moments(spec, mean, std):
    x = draw_lengths(spec, N, np.random.default_rng(2), "len")
    assert x.dtype == np.int64 and x.min() >= 1
    assert x.mean() == pytest.approx(mean, rel=0.02)
    assert x.std() == pytest.approx(std, rel=0.05)


def test_lognormal_mu_sigma_matches_bros_sharegpt_fallback():
    # BROS spec: ShareGPT prompt lognormal(4.9844, 0.9184) has mean ≈ 222.76 tokens (Table 2).
    x = draw_lengths({"dist": "lognormal", "mu": 4.9844, "sigma": 0.9184}, N, np.random.default_rng(4), "p")
    assert x.mean() == pytest.approx(222.76, rel=0.03)


def test_zipf_is_bounded_and_heavy_headed():
    x = draw_lengths({"dist": "zipf", "a": 1.2, "low": 1, "high": 1000}, N, np.random.default_rng(5), "z")
    assert x.min() >= 1 and x.max() <= 1000
    k = np.arange(1, 1001.0)
    p = k ** -1.2 / np.sum(k ** -1.2)
    assert np.mean(x == 1) == pytest.approx(p[0], rel=0.03)
    assert np.mean(x == 2) / np.mean(x == 1) == pytest.approx(2 ** -1.2, rel=0.05)


def test_empirical_resamples_trace_values(shared_data):
    spec = {"dist": "empirical", "column": "output_tokens",
            "trace": {"path": str(shared_data / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")}}
    x = draw_lengths(spec, N, np.random.default_rng(6), "o")
    assert np.median(x) == pytest.approx(129, abs=3) and x.max() <= 1000
    v = draw_lengths({"dist": "empirical", "values": [3, 7]}, 1000, np.random.default_rng(0), "o")
    assert set(v.tolist()) == {3, 7}


def test_length_errors_name_the_field():
    with pytest.raises(UserError, match=r"workload.prompt.dist: unknown length distribution 'pareto'"):
        draw_lengths({"dist": "pareto"}, 3, np.random.default_rng(0), "workload.prompt")
    with pytest.raises(UserError, match="1 <= low <= high"):
        draw_lengths({"dist": "uniform", "low": 9, "high": 3}, 3, np.random.default_rng(0), "p")


def test_infermax_mix_counts_sizes_and_shuffle():
    p, o, t = infermax_mix(["LILO", "SILO"], 1000, np.random.default_rng(0), "w")
    assert (t == "LILO").sum() == 500 and (t == "SILO").sum() == 500
    assert set(p[t == "LILO"]) == {512, 1024} and set(p[t == "SILO"]) == {8, 16}
    assert set(o) == {512, 1024}
    assert 0 < (t[:500] == "LILO").sum() < 500            # shuffled, not blocked
    p, o, t = infermax_mix(["SISO", "LISO"], 10, np.random.default_rng(0), "w", weights=[3, 1])
    assert (t == "SISO").sum() == 8 and set(o) <= {8, 16}  # 7.5 / 2.5 rounds by largest remainder


def test_same_seed_same_draws():
    spec = {"process": "gamma", "rate": 3, "cv": 4}
    a = draw_arrivals(spec, 1000, np.random.default_rng(9), "t")
    b = draw_arrivals(spec, 1000, np.random.default_rng(9), "t")
    assert np.array_equal(a, b)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=200), st.floats(0.01, 1e3))
def test_scaling_property_rate_and_gap_ratios(times, target):
    a = np.sort(np.asarray(times))
    if a[-1] - a[0] < 1e-6:
        return
    s = scale_to_rate(a, target)
    assert mean_rate(s) == pytest.approx(target, rel=1e-6)
    g, h = np.diff(a), np.diff(s)
    assert np.allclose(h * (a[-1] - a[0]), g * (s[-1] - s[0]), rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["poisson", "gamma", "constant", "onoff", "offline"]), st.integers(1, 300),
       st.integers(0, 2 ** 32))
def test_every_process_gives_n_sorted_nonnegative_arrivals(process, n, seed):
    spec = {"process": process}
    if process != "offline":
        spec["rate"] = 3.0
    if process == "onoff":
        spec.update(on_s=1.0, off_s=2.0)
    a = draw_arrivals(spec, n, np.random.default_rng(seed), "t")
    assert len(a) == n and (a >= 0).all() and (np.diff(a) >= 0).all()
