"""The SGLang-vs-vLLM published comparison: its figures are well-formed and a tiny run of its setup completes."""
import numpy as np

from benchmarks import sglang_vs_vllm_published as bench


def test_published_table_is_consistent():
    pub = bench.PUBLISHED
    assert bench.SOURCE.startswith("https://github.com/sgl-project/sglang/")
    off = pub["offline"]
    for eng in ("sglang", "vllm"):
        rps, tps = off[eng]["request_throughput"], off[eng]["output_tps"]
        assert 0 < rps < tps
        # Both rows ran the same 5000 prompts, so their output tokens per request must agree.
        assert 150 < tps / rps < 250
    assert abs(off["sglang"]["output_tps"] / off["sglang"]["request_throughput"]
               - off["vllm"]["output_tps"] / off["vllm"]["request_throughput"]) < 1.0
    assert set(pub["online"]) == {4, 8}
    for rate, row in pub["online"].items():
        assert row["num_prompts"] == 300 * rate        # both runs last ~300 s of arrivals
        for eng in ("sglang", "vllm"):
            lat = row[eng]
            assert 0 < lat["ttft_p50_ms"] < lat["e2e_p50_ms"] and 0 < lat["tpot_p50_ms"] < lat["e2e_p50_ms"]


def test_workload_passes_the_benchmark_filter():
    p, o = bench.bench_sharegpt_lengths(4000, np.random.default_rng(0))
    assert (p >= 4).all() and (o >= 4).all() and (p <= 1024).all() and (p + o <= 2048).all()
    # Means near the Llama-3.1 token counts, lowered a little by the filter's truncation.
    assert 0.8 * bench.MEAN_PROMPT < p.mean() < 1.02 * bench.MEAN_PROMPT
    assert 0.85 * bench.MEAN_OUTPUT < o.mean() < 1.05 * bench.MEAN_OUTPUT


def test_tiny_run_of_every_engine():
    raw = bench.collect([1], n_offline=60, online_scale=0.02)
    summ = bench.summarise(raw)
    for eng in bench.ENGINES:
        assert summ["offline"][eng]["request_throughput"]["mean"] > 0
        for rate in (4, 8):
            m = summ["online"][rate][eng]
            assert m["ttft_p50_ms"]["mean"] < m["e2e_p50_ms"]["mean"]
    # Multi-step vLLM holds new prompts until its 10-step window ends, so its TTFT exceeds SGLang's.
    assert summ["online"][8]["ttft_ratio"]["vllm-v0-ms10"]["mean"] > 1.5
