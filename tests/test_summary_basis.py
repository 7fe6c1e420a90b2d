"""`servesim run` names what its figures rest on: cost model kind and file, overheads preset, KV capacity, prefix hits."""
from __future__ import annotations

import pandas as pd
import yaml

from sim.cli import main
from sim.paths import REPO_ROOT

SMALL = {"name": "basis", "model": {"name": "llama-2-7b"}, "hardware": {"gpu": "a100-80gb"},
         "workload": {"kind": "offline", "num_requests": 12, "prompt": 200, "output": 8}}


def _run(tmp_path, raw, *extra):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), *extra]) == 0
    return pd.read_csv(out / "summary.csv").iloc[0]


def _printed(text: str) -> dict:
    rows = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if line.startswith("  ") and len(parts) == 2:
            rows[parts[0]] = parts[1].strip()
    return rows


def test_default_cost_model_is_named_with_its_file_and_overheads(tmp_path, capsys):
    row = _run(tmp_path, SMALL)
    out = capsys.readouterr().out
    shown = _printed(out)
    assert row["costmodel_kind"] == "profiled (auto)" == shown["costmodel_kind"]
    assert row["costmodel_file"] == "profiles/a100-80gb/llama-2-7b-profiled.yaml" == shown["costmodel_file"]
    assert (REPO_ROOT / row["costmodel_file"]).is_file()
    assert row["overheads"] == "vllm" == shown["overheads"]
    # the capacity is the M the run had (the title line names the same number)
    assert f"M={int(row['kv_capacity_tokens'])} tokens" in out.splitlines()[0]
    assert shown["kv_capacity_tokens"] == f"{int(row['kv_capacity_tokens'])}     tokens"
    assert "prefix_hit_rate" not in row              # prefix caching off for this policy


def test_other_kinds_files_and_no_overheads(tmp_path, capsys):
    raw = {**SMALL, "memory": {"M": 5000}, "costmodel": {"kind": "roofline"}}
    row = _run(tmp_path, raw)
    assert (row["costmodel_kind"], row["costmodel_file"], row["overheads"]) == \
        ("roofline", "profiles/roofline-efficiencies.yaml", "none")
    assert row["kv_capacity_tokens"] == 4992                # memory.M in whole blocks of 16
    raw["costmodel"] = {"kind": "linear", "coefficients": {"step_a": 0.01, "b_o": 0.2},
                        "overheads": {"preset": "vllm", "step_s": 0.002}}
    row = _run(tmp_path, raw)
    assert (row["costmodel_kind"], row["costmodel_file"], row["overheads"]) == \
        ("linear", "scenario (costmodel.coefficients)", "vllm with step_s set")
    raw["costmodel"] = {"kind": "linear", "overheads": {"step_s": 0.002}}
    row = _run(tmp_path, raw)
    assert (row["costmodel_file"], row["overheads"]) == ("profiles/a100-80gb/llama-2-7b-linear.yaml", "custom")


def test_prefix_hit_rate_is_printed_and_written_when_caching_is_on(tmp_path, capsys):
    raw = {**SMALL, "memory": {"M": 20000, "prefix_caching": True}, "policy": {"name": "vllm-v1"},
           "workload": {"kind": "shared_prefix", "num_groups": 2, "num_prompts_per_group": 6, "system_prompt_len": 512,
                        "question_len": 32, "output_len": 8, "stages": [{"rate": 4, "duration": 3}]}}
    row = _run(tmp_path, raw)
    shown = _printed(capsys.readouterr().out)
    assert 0 < row["prefix_hit_rate"] < 1
    assert float(shown["prefix_hit_rate"].split()[0]) == float(f"{row['prefix_hit_rate']:.4g}")


def test_a_cluster_sums_capacity_and_names_each_distinct_cost_model(tmp_path, capsys):
    raw = {**SMALL, "memory": {"M": 4000}, "cluster": {"replicas": [
        {"count": 2}, {"count": 1, "costmodel": {"kind": "roofline"}, "memory": {"M": 3000}}]}}
    row = _run(tmp_path, raw)
    assert row["kv_capacity_tokens"] == 2 * 4000 + 2992     # M per replica in whole blocks, summed
    assert row["costmodel_kind"] == "profiled (auto); roofline"
    assert row["overheads"] == "vllm; none"
