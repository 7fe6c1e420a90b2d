"""Scenario-level workloads: every kind is nameable from YAML, seeds reproduce, classes/SLO presets, the trace CLI."""
import numpy as np
import pandas as pd
import pytest
import yaml

from costmodels.errors import UserError
from sim.cli import main
from sim.scenario.config import load_scenario, scenario_from_dict
from sim.paths import REPO_ROOT
from sim.scenario.build import requests_from_table
from sim.cluster.runner import run_scenario
from traces import WORKLOADS, build_workload
from traces.arrivals import mean_rate

AZ_CONV = "../shared/data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


def _build(spec, seed=0):
    return build_workload(spec, np.random.default_rng(seed))


def test_all_kinds_registered():
    assert {"offline", "poisson", "gamma", "constant", "onoff", "synthetic", "trace", "classes", "bros",
            "infermax-mix", "azure", "burstgpt", "mooncake", "vidur", "splitwise", "servesim"} <= set(WORKLOADS)


def test_original_kinds_keep_their_draws():
    # offline/poisson kept their keys and the order of random draws (arrivals, then prompt, then output).
    df = _build({"kind": "poisson", "num_requests": 50, "rate": 2, "prompt": {"dist": "uniform", "low": 1,
                                                                             "high": 9}, "output": 4})
    rng = np.random.default_rng(0)
    assert np.array_equal(df["arrival_s"], np.cumsum(rng.exponential(0.5, 50)))
    assert np.array_equal(df["prompt_tokens"], rng.integers(1, 10, 50))
    off = _build({"kind": "offline"})
    assert len(off) == 1024 and not off["arrival_s"].any() and set(off["prompt_tokens"]) == {128}


@pytest.mark.parametrize("spec", [
    {"kind": "gamma", "num_requests": 300, "rate": 5, "cv": 4, "prompt": {"dist": "zipf", "a": 1.1, "high": 900},
     "output": {"dist": "lognormal", "mean": 200, "std": 100}},
    {"kind": "synthetic", "num_requests": 300, "arrival": {"process": "onoff", "rate": 9, "on_s": 1, "off_s": 2},
     "prompt": {"dist": "normal", "mean": 400, "std": 30}, "output": 12, "predictor": {"kind": "noisy",
                                                                                        "error": 0.1}},
    {"kind": "infermax-mix", "types": ["LILO", "LISO"], "num_requests": 64},
])
def test_same_seed_reproduces_different_seed_differs(spec):
    a, b, c = _build(spec, 7), _build(spec, 7), _build(spec, 8)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_trace_kind_replay_rate_scaling_window_and_retiming(shared_data):
    base = {"kind": "trace", "path": AZ_CONV}
    df = _build(base)
    assert len(df) == 19366 and df["arrival_s"].iloc[-1] == pytest.approx(3501.7, abs=0.1)
    scaled = _build({**base, "rate": 11.0})
    assert mean_rate(scaled["arrival_s"].to_numpy()) == pytest.approx(11.0, rel=0.01)
    assert scaled["prompt_tokens"].equals(df["prompt_tokens"])
    win = _build({**base, "start_s": 600, "duration_s": 300})
    assert win["arrival_s"].iloc[0] == 0 and win["arrival_s"].iloc[-1] < 300 and 1000 < len(win) < 2500
    pois = _build({**base, "max_requests": 500, "arrival": {"process": "poisson", "rate": 2}})
    assert len(pois) == 500 and pois["output_tokens"].equals(df["output_tokens"].iloc[:500])
    with pytest.raises(UserError, match="either rate .* or arrival"):
        _build({**base, "rate": 2, "arrival": {"process": "offline"}})


def test_synthetic_lengths_from_trace_keep_pairs(shared_data):
    df = _build({"kind": "poisson", "rate": 3, "num_requests": 5000, "lengths_from": {"path": AZ_CONV}})
    trace = _build({"kind": "trace", "path": AZ_CONV})
    pairs = set(zip(trace["prompt_tokens"], trace["output_tokens"]))
    assert all(p in pairs for p in zip(df["prompt_tokens"], df["output_tokens"]))


def test_classes_and_bros():
    df = _build({"kind": "classes", "classes": {
        "gold": {"kind": "poisson", "rate": 1, "num_requests": 20, "prompt": 10, "output": 5},
        "free": {"kind": "constant", "rate": 2, "num_requests": 30, "prompt": 20, "output": 5}}})
    assert df["cls"].value_counts().to_dict() == {"free": 30, "gold": 20}
    assert np.all(np.diff(df["arrival_s"]) >= 0)
    # Adding a class leaves the other classes' draws alone.
    df2 = _build({"kind": "classes", "classes": {
        "gold": {"kind": "poisson", "rate": 1, "num_requests": 20, "prompt": 10, "output": 5}}})
    assert np.array_equal(df[df.cls == "gold"]["arrival_s"], df2["arrival_s"])
    b = _build({"kind": "bros", "rt_rate": 4, "num_rt": 2000, "be": {"batch_size": 500, "num_batches": 3,
                                                                    "period_s": 100}})
    rt, be = b[b.cls == "rt"], b[b.cls == "be"]
    assert len(rt) == 2000 and len(be) == 1500
    assert sorted(set(be["arrival_s"])) == [0, 100, 200]
    assert be["prompt_tokens"].between(512, 1024).all() and be["output_tokens"].between(32, 128).all()
    assert be["prompt_tokens"].mean() == pytest.approx(768, rel=0.02)
    assert rt["prompt_tokens"].mean() == pytest.approx(222.76, rel=0.1)   # BROS Table 2, ShareGPT RT


def test_slo_presets_in_scenarios():
    scn = scenario_from_dict({"slo": {"preset": "aptserve-humaneval-opt-30b",
                                      "classes": {"rt": {"preset": "bros"}, "be": {"e2e_s": 3600}}}})
    slos = scn.slos()
    assert (slos["default"].ttft_s, slos["default"].tbt_p99_s) == (1.0, 0.5)
    assert (slos["rt"].ttft_s, slos["rt"].tpot_s) == (0.4, 0.2)
    eco = scenario_from_dict({"slo": {"preset": "econoserve", "t_p_s": 0.1, "t_g_s": 0.02,
                                      "mean_output_tokens": 100}}).slos()["default"]
    assert eco.normalized_latency_s == pytest.approx(2 * (0.1 / 100 + 0.02))
    with pytest.raises(UserError, match="unknown SLO preset"):
        scenario_from_dict({"slo": {"preset": "nope"}}).slos()


def test_scenario_runs_with_classes_predictor_and_slo_classes():
    scn = scenario_from_dict({
        "memory": {"M": 20000}, "policy": {"name": "sarathi"},
        "workload": {"kind": "bros", "rt_rate": 2, "num_rt": 40, "predictor": {"preset": "alise-sharegpt"},
                     "be": {"batch_size": 10, "num_batches": 1}},
        "slo": {"classes": {"rt": {"preset": "bros"}, "be": {"e2e_s": 600}}}})
    reqs = requests_from_table(build_workload(scn.workload, np.random.default_rng(0)))
    assert {r.cls for r in reqs} == {"rt", "be"}
    assert any(r.predicted_output_tokens != r.output_tokens for r in reqs)
    res = run_scenario(scn)
    long = sum(r.prompt_tokens + r.output_tokens > 4096 for r in reqs)     # Llama-2-7B's context: rejected
    assert res.summary["completed"] == 50 - long and res.summary["infeasible"] == long
    assert "slo_attainment_rt" in res.summary and "slo_attainment_be" in res.summary


def test_example_azure_conv_replays_the_trace(shared_data):
    scn = load_scenario(REPO_ROOT / "examples/azure-conv.yaml")
    df = build_workload(scn.workload, np.random.default_rng(scn.seed))
    assert len(df) == 19366
    assert scn.slos()["default"].ttft_s == 1.0
    short = load_scenario(REPO_ROOT / "examples/azure-conv.yaml", ["workload.max_requests=200"])
    res = run_scenario(short)
    # prompts + outputs beyond Llama-2-7B's 4,096-token context are rejected, as vLLM rejects them
    too_long = int((df.prompt_tokens.iloc[:200] + df.output_tokens.iloc[:200] > 4096).sum())
    assert too_long > 0 and res.summary["completed"] == 200 - too_long
    assert list(res.meta["infeasible_reasons"]) == ["prompt + output tokens exceed max_model_len = 4096 "
                                                     "(rejected, as vLLM does)"]


def test_cli_trace_stats_and_make_roundtrip(shared_data, tmp_path, capsys):
    assert main(["trace", "stats", AZ_CONV]) == 0
    out = capsys.readouterr().out
    assert "19366" in out and "interarrival_cv" in out and "output_p99" in out
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"kind": "gamma", "num_requests": 2000, "rate": 4, "cv": 2, "seed": 5,
                                    "prompt": {"dist": "uniform", "low": 10, "high": 90},
                                    "predictor": {"kind": "noisy", "error": 0.2}}))
    csv = tmp_path / "out" / "t.csv"
    assert main(["trace", "make", str(spec), "-o", str(csv)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["trace", "stats", str(csv), "--json"]) == 0
    import json
    st = json.loads(capsys.readouterr().out)
    assert st["requests"] == 2000 and st["rate_rps"] == pytest.approx(4, rel=0.1)
    assert st["predicted_mean_relative_error"] == pytest.approx(0.2, rel=0.15)
    # The written file replays through the trace kind with identical lengths.
    back = _build({"kind": "trace", "path": str(csv)})
    made = _build({k: v for k, v in yaml.safe_load(spec.read_text()).items() if k != "seed"}, seed=5)
    assert back["prompt_tokens"].equals(made["prompt_tokens"])
    assert back["arrival_s"].to_numpy() == pytest.approx(made["arrival_s"] - made["arrival_s"].iloc[0], abs=1e-5)


def test_cli_reports_bad_rows_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,x,5\n")
    assert main(["trace", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:3: column 'prompt_tokens' = 'x' is not a number" in err and "Traceback" not in err
    assert main(["trace", "stats", str(bad), "--skip-bad-rows"]) == 0
    assert "skipped 1 malformed row(s)" in capsys.readouterr().err


def test_per_class_predictor_others_exact():
    df = _build({"kind": "classes", "classes": {
        "a": {"kind": "poisson", "rate": 1, "num_requests": 200, "output": 300,
              "predictor": {"kind": "noisy", "error": 0.2}},
        "b": {"kind": "poisson", "rate": 1, "num_requests": 50, "output": 40}}})
    a, b = df[df.cls == "a"], df[df.cls == "b"]
    assert (b["predicted_output_tokens"] == 40).all()
    assert (a["predicted_output_tokens"] != 300).mean() > 0.9
    assert len(requests_from_table(df)) == 250


@pytest.mark.parametrize("name, n", [("bros-hybrid.yaml", 2400 + 5 * 256), ("infermax-mix.yaml", 256)])
def test_examples_build(name, n):
    scn = load_scenario(REPO_ROOT / "examples" / name)
    df = build_workload(scn.workload, np.random.default_rng(scn.seed))
    assert len(df) == n and set(df["cls"]) == ({"rt", "be"} if "bros" in name else {"LILO", "SILO"})
    scn.slos()


def test_workload_spec_example_makes_a_bursty_trace(shared_data, tmp_path, capsys):
    out = tmp_path / "g.csv"
    assert main(["trace", "make", str(REPO_ROOT / "examples/workload-gamma-burst.yaml"), "-o", str(out),
                 "--set", "num_requests=20000"]) == 0
    df = pd.read_csv(out)
    gaps = np.diff(df["arrival_s"])
    assert len(df) == 20000 and gaps.std() / gaps.mean() == pytest.approx(5, rel=0.15)
    assert {"predicted_output_tokens"} <= set(df.columns)


def test_loader_named_as_kind(shared_data):
    df = _build({"kind": "azure", "path": AZ_CONV, "max_requests": 100, "rate": 2.0})
    assert len(df) == 100 and mean_rate(df["arrival_s"].to_numpy()) == pytest.approx(2.0, rel=1e-6)
    with pytest.raises(UserError, match="kind azure reads format azure"):
        _build({"kind": "azure", "path": AZ_CONV, "format": "mooncake"})


def test_mooncake_roundtrip_through_trace_make(tmp_path, capsys):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 2000, "input_length": 1100, "output_length": 6, "hash_ids": [1, 2, 3]}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"kind": "mooncake", "path": str(src), "rate": 1.0}))
    out = tmp_path / "t.csv"
    assert main(["trace", "make", str(spec), "-o", str(out)]) == 0
    back = _build({"kind": "trace", "path": str(out)})
    assert [list(h) for h in back["prefix_hashes"]] == [[1, 2], [1, 2, 3]]
    assert back["arrival_s"].tolist() == pytest.approx([0, 2.0])
    # 512-token blocks named by hash id: the second prompt shares its first 1,024 tokens with the first's 600
    assert list(back["prefix"][1]) == [(("h", 1), 512), (("h", 2), 512), (("h", 3), 76)]
    assert list(back["prefix"][0]) == [(("h", 1), 512), (("h", 2), 88)]


def test_mooncake_more_hash_ids_than_blocks_is_one_line(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 700, "output_length": 6, "hash_ids": [1, 2, 3]}\n')
    with pytest.raises(UserError, match="row 0: 3 hash ids of 512-token blocks for a prompt of 700 tokens"):
        _build({"kind": "mooncake", "path": str(src)})
