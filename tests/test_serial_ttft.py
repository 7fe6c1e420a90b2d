"""InferMax F4.7-3: the serial TTFT toy example (prefill, decode) times, R_max = 1 so requests run one at a time."""
import pytest

from tests.helpers import TokenCost, run_recorded


@pytest.mark.parametrize("specs, expected_avg_ttft", [
    ([(1, 2), (2, 2)], 5 / 2),   # R1=(1,1) first, R2=(2,1)
    ([(2, 2), (1, 2)], 6 / 2),   # R2=(2,1) first
    ([(1, 2), (1, 3)], 4 / 2),   # R1=(1,1) first, R2=(1,2)
    ([(1, 3), (1, 2)], 5 / 2),   # R2=(1,2) first
])
def test_toy_average_ttft(specs, expected_avg_ttft):
    # prefill time = prompt tokens (1 s each), a decode step = 1 s; serial execution via R_max = 1
    cost = TokenCost(per_prefill_token=1.0, decode_step=1.0, per_batch=0.0)
    res, _ = run_recorded({"name": "vllm", "R_max": 1}, specs, M=100, cost=cost)
    assert res.requests["ttft_s"].mean() == pytest.approx(expected_avg_ttft)


def test_rank_i_picks_the_order_with_lower_average_ttft():
    """Ranking by input size reproduces the better order of the first toy pair whatever the arrival order."""
    cost = TokenCost(per_prefill_token=1.0, decode_step=1.0, per_batch=0.0)
    res, _ = run_recorded({"name": "rank-i", "R_max": 1}, [(2, 2), (1, 2)], M=100, cost=cost)
    assert res.requests["ttft_s"].mean() == pytest.approx(5 / 2)
