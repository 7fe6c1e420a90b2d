"""`servesim run --trace-out` writes a Chrome Trace Event file with every iteration and request, time-ordered per track;
the iteration table carries MFU and memory-bandwidth utilization."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.cluster.runner import run_scenario
from sim.scenario.config import scenario_from_dict
from study.trace_export import trace_events

SMALL = {"name": "trace", "seed": 1, "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
         "memory": {"M": 6000}, "policy": {"name": "sarathi"},
         "workload": {"kind": "poisson", "rate": 30, "num_requests": 40,
                      "prompt": {"dist": "uniform", "low": 50, "high": 1500},
                      "output": {"dist": "uniform", "low": 2, "high": 80}}}


def _strict_json(path):
    def no_nan(x):
        raise AssertionError(f"{x} is not JSON")
    return json.loads(path.read_text(), parse_constant=no_nan)


def _check(events, requests: pd.DataFrame, iterations: pd.DataFrame):
    """Every iteration and request present, each track in time order, async pairs balanced and nested."""
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(iterations)
    assert sum(e["args"]["batch_size"] for e in xs) == int(iterations["batch_size"].sum())
    assert sum(e["args"]["prefill_tokens"] for e in xs) == int(iterations["prefill_tokens"].sum())
    tracks = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[("X", e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C":
            tracks[("C", e["pid"], e["name"])].append(e)
        elif e["ph"] in "be":
            tracks[("async", e["pid"], e["cat"], e["id"])].append(e)
    for key, evs in tracks.items():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), key
        if key[0] == "X":                  # one replica runs one iteration at a time
            ends = [e["ts"] + e["dur"] for e in evs]
            assert all(ends[i] <= ts[i + 1] + 1e-3 for i in range(len(evs) - 1)), key
        if key[0] == "async":
            stack = []
            for e in evs:
                if e["ph"] == "b":
                    stack.append(e["name"])
                else:
                    assert stack and stack.pop() == e["name"], key
            assert not stack, key
    outer = [e for e in events if e["ph"] == "b" and e["name"].startswith("request ")]
    assert sorted(e["id"] for e in outer) == sorted(requests["id"].tolist())
    done = requests[requests["status"] == "done"].set_index("id")
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e" and e["name"].startswith("request ")}
    for rid, row in done.iterrows():
        assert ends[rid] == pytest.approx(row["completion_s"] * 1e6, abs=1e-2)
    firsts = {e["id"]: e["ts"] for e in events if e["ph"] == "b" and e["name"] == "decode"}
    for rid, row in done.iterrows():
        assert firsts[rid] == pytest.approx(row["first_token_s"] * 1e6, abs=1e-2)


def test_single_replica_trace_from_the_cli(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    trace = tmp_path / "run.json"
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--trace-out", str(trace)]) == 0
    assert "open it in https://ui.perfetto.dev" in capsys.readouterr().out
    doc = _strict_json(trace)
    req = pd.read_csv(tmp_path / "out" / "requests.csv")
    it = pd.read_csv(tmp_path / "out" / "iterations.csv")
    _check(doc["traceEvents"], req, it)
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {1}
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert counters == {"KV tokens", "queue", "utilization"}
    assert doc["otherData"]["policy"] == "sarathi"
    # the same trace comes from the CSVs alone
    assert trace_events(req, it, "trace") == doc["traceEvents"]


def test_bad_trace_path_fails_before_the_run(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    assert main(["run", str(path), "--trace-out", str(tmp_path)]) == 2
    assert "--trace-out" in capsys.readouterr().err


@pytest.mark.parametrize("cluster", [
    {"replicas": 3, "router": "least_requests"},
    {"disaggregation": {"prefill": 1, "decode": 2}},
])
def test_cluster_trace_has_one_process_per_replica(cluster):
    from study.trace_export import trace_document
    res = run_scenario(scenario_from_dict({**SMALL, "policy": {"name": "vllm-v1"}, "cluster": cluster}))
    doc = json.loads(json.dumps(trace_document(res), allow_nan=False))
    events = doc["traceEvents"]
    _check(events, res.requests, res.iterations)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    replicas = sorted(res.iterations["replica"].unique())
    assert sorted(names) == [r + 1 for r in replicas]
    pools = dict(zip(res.iterations["replica"], res.iterations["pool"]))
    assert all(names[r + 1] == f"replica {r} ({pools[r]})" for r in replicas)
    per = defaultdict(int)
    for e in events:
        if e["ph"] == "X":
            per[e["pid"] - 1] += 1
    assert dict(per) == res.iterations.groupby("replica").size().to_dict()
    if "disaggregation" in cluster:          # requests drawn where they complete, the prefill replica in args
        outer = [e for e in events if e["ph"] == "b" and e["name"].startswith("request ")]
        assert {e["pid"] for e in outer} <= {r + 1 for r in replicas if pools[r] == "decode"}
        assert all("prefill_replica" in e["args"] for e in outer)


def test_unfinished_requests_stay_open_to_the_end_of_the_trace():
    res = run_scenario(scenario_from_dict({**SMALL, "sim": {"max_iterations": 30}}))
    assert res.summary["truncated"] and res.summary["completed"] < 40
    events = trace_events(res.requests, res.iterations)
    _check(events, res.requests, res.iterations)
    end = max(max(e["ts"] + e["dur"] for e in events if e["ph"] == "X"), res.requests["arrival_s"].max() * 1e6)
    open_ones = [e for e in events if e["ph"] == "b" and e["name"].startswith("request ") and
                 e["args"]["status"] != "done"]
    assert open_ones
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e" and e["name"].startswith("request ")}
    assert all(ends[e["id"]] == pytest.approx(end, abs=1e-2) for e in open_ones)


def test_mfu_and_mbu_are_physical_and_tell_prefill_from_decode():
    """Under the roofline model a step cannot beat peak compute or bandwidth, so both stay at or below about 1; a
    long prefill is compute-bound (high MFU) and a one-request decode streams the weights (high MBU, tiny MFU)."""
    raw = {**SMALL, "costmodel": {"kind": "roofline"}, "memory": {"M": 20000}, "policy": {"name": "vllm"},
           "workload": {"kind": "offline", "num_requests": 1, "prompt": 2000, "output": 4}}
    it = run_scenario(scenario_from_dict(raw)).iterations
    assert list(it["prefill_tokens"]) == [2000, 0, 0, 0]
    assert np.all((it["mfu"] > 0) & (it["mfu"] <= 1.0)) and np.all((it["mbu"] > 0) & (it["mbu"] <= 1.05))
    assert it["mfu"].iloc[0] > 0.3 and it["mfu"].iloc[0] > 20 * it["mfu"].iloc[1]
    assert it["mbu"].iloc[1] > 0.5 and it["mfu"].iloc[1] < 0.01
    big = run_scenario(scenario_from_dict({**raw, "workload": {"kind": "offline", "num_requests": 60, "prompt": 300,
                                                               "output": 40}})).iterations
    assert np.all(big["mfu"] <= 1.0) and np.all(big["mbu"] <= 1.05)
