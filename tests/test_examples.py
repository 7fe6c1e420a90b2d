"""The figures quoted in examples/*.yaml header comments are what the code gives: each is run and compared, and the
quote itself must still be in the header (a changed figure fails here until the header says the new one)."""
from __future__ import annotations

import math

import pytest

from sim.cluster.runner import run_scenario
from sim.paths import REPO_ROOT, shared_data_dir
from sim.scenario.config import load_scenario


def header(name: str) -> str:
    lines = []
    for line in (REPO_ROOT / "examples" / name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


def summary(name: str, *overrides):
    return run_scenario(load_scenario(REPO_ROOT / "examples" / name, list(overrides)))


# (example, overrides, quote in the header, summary column, quoted value, tolerance). A "~" figure may be off by
# 10 % (the rounding of a two-digit quote); a plain one by 1 %.
QUOTED = [
    ("alise-alpaca.yaml", (), "mean TTFT ~0.09 s", "ttft_mean", 0.09, 0.1),
    ("aptserve-sharegpt.yaml", (), "SLO attainment ~0.93 for Apt-Serve", "slo_attainment", 0.93, 0.1),
    ("aptserve-sharegpt.yaml", ("policy.name=vllm-v0",), "~0.57 for vLLM v0", "slo_attainment", 0.57, 0.1),
    ("aptserve-sharegpt.yaml", ("workload.rate=1.5",), "1.5 req/s is under it (attainment 1.0)", "slo_attainment",
     1.0, 0.01),
    ("azure-conv-shape.yaml", (), "mean TTFT ~0.26 s", "ttft_mean", 0.26, 0.1),
    ("cluster-plan.yaml", ("cluster.replicas=6",), "are overloaded and reach 0.04", "slo_attainment", 0.04, 0.1),
    ("bros-hybrid.yaml", (), "mean TTFT ~5 s", "ttft_mean", 5.0, 0.1),
    ("econoserve-sharegpt.yaml", (), "mean TTFT ~0.39 s", "ttft_mean", 0.39, 0.1),
    ("econoserve-sharegpt.yaml", (), "KV ~78 % allocated", "kv_util_mean", 0.78, 0.1),
    ("econoserve-sharegpt.yaml", ("workload.rate=3",), "3 req/s is past it (TTFT ~4.5 s)", "ttft_mean", 4.5, 0.1),
    ("infermax-default.yaml", (), "memory-bound (645 evictions)", "evictions", 645, 0.01),
    ("poisson-10k.yaml", (), "~7.4 served", "request_throughput", 7.4, 0.1),
    ("poisson-10k.yaml", (), "mean TTFT ~42 s", "ttft_mean", 42.0, 0.1),
    pytest.param("bros-rt-be.yaml", (), "KV ~98 % used", "kv_util_mean", 0.98, 0.1, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, overrides, quote, column, value, tol", QUOTED)
def test_quoted_figure(name, overrides, quote, column, value, tol):
    assert quote in header(name), f"{name}: the header no longer says {quote!r}"
    got = summary(name, *overrides).summary[column]
    assert math.isclose(got, value, rel_tol=tol), f"{name}: header says {quote!r}, the run gives {column} = {got:.4g}"


@pytest.mark.parametrize("name, quote", [("alise-alpaca.yaml", "no preemptions"),
                                         ("azure-conv-shape.yaml", "no preemptions")])
def test_no_preemptions_where_the_header_says_none(name, quote):
    assert quote in header(name)
    s = summary(name).summary
    assert s["evictions"] == 0 and s["swaps"] == 0


def test_azure_conv_replay_figures():
    if shared_data_dir() is None:
        pytest.skip("../shared/data is absent: the Azure conv trace is not here")
    h = header("azure-conv.yaml")
    assert "mean TTFT ~27 s on one A100" in h and "About 8% of its requests" in h
    s = summary("azure-conv.yaml").summary
    assert math.isclose(s["ttft_mean"], 27, rel_tol=0.1)
    assert math.isclose(s["infeasible"] / s["requests"], 0.08, rel_tol=0.1)     # "about 8 %" rejected


def test_cluster_pd_decode_replicas_share_the_load():
    assert "neither gets more than 55 %" in header("cluster-pd.yaml")
    reps = summary("cluster-pd.yaml").tables["replicas"]
    routed = reps[reps["pool"] == "decode"]["routed"].to_numpy()
    assert len(routed) == 2 and routed.max() <= 0.55 * routed.sum()


def test_cluster_prefix_affinity_hits_more_than_round_robin():
    assert "far more often than round-robin" in header("cluster-prefix.yaml")
    affinity = summary("cluster-prefix.yaml").summary["prefix_hit_rate"]
    rr = summary("cluster-prefix.yaml", "cluster.router=round_robin").summary["prefix_hit_rate"]
    assert affinity > 1.5 * rr, (affinity, rr)
