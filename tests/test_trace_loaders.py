"""Trace loaders: counts and statistics of the shared Azure traces, every public format, and bad-row handling."""
import json

import numpy as np
import pytest

from costmodels.errors import UserError
from traces.arrivals import interarrival_cv, mean_rate
from traces.loaders import load_trace
from traces.stats import trace_stats

AZ = "traces/azure-llm-2023/AzureLLMInferenceTrace_{}.csv"


@pytest.mark.parametrize("name, n, span, rate, cv, prompt_mean, output_median", [
    ("code", 8819, 3436, 2.57, 13.2, 2048, 13),
    ("conv", 19366, 3502, 5.53, 1.09, 1155, 129),
])
def test_azure_2023_counts_and_profile(shared_data, name, n, span, rate, cv, prompt_mean, output_median):
    df = load_trace(shared_data / AZ.format(name), format="azure")
    a = df["arrival_s"].to_numpy()
    assert len(df) == n
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert a[-1] == pytest.approx(span, abs=1)
    assert mean_rate(a) == pytest.approx(rate, abs=0.01)
    assert interarrival_cv(a) == pytest.approx(cv, abs=0.05)
    assert df["prompt_tokens"].mean() == pytest.approx(prompt_mean, abs=1)
    assert df["output_tokens"].median() == output_median


def test_azure_auto_detects_and_stats(shared_data):
    st = trace_stats(load_trace(shared_data / AZ.format("conv")))
    assert st["requests"] == 19366 and st["prompt_max"] == 14050 and st["output_max"] == 1000
    assert st["corr_prompt_output"] == pytest.approx(-0.11, abs=0.01)   # baselines.md §4 profile


def test_repo_relative_shared_path_resolves(shared_data):
    # The example's path is written relative to the repo root; it must resolve from any cwd or worktree.
    df = load_trace("../shared/data/" + AZ.format("code"), format="azure")
    assert len(df) == 8819


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_2024_mixed_timestamp_formats(tmp_path):
    p = _write(tmp_path, "a24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2024-05-10 00:00:00+00:00,10,5\n"
               "2024-05-10 00:00:00.5+00:00,20,6\n"
               "2024-05-10 00:00:01.2500000+00:00,30,7\n"
               "2024-05-10 00:00:03+00:00,40,8\n")
    df = load_trace(p, format="azure")
    assert df["arrival_s"].tolist() == pytest.approx([0, 0.5, 1.25, 3.0])
    assert df["prompt_tokens"].tolist() == [10, 20, 30, 40]


def test_burstgpt_drops_failed_requests_and_counts_them(tmp_path, capsys):
    p = _write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
               "5,ChatGPT,100,20,120,Conversation log\n"
               "7,GPT-4,50,0,50,Conversation log\n"
               "9,GPT-4,60,30,90,API log\n")
    df = load_trace(p, format="burstgpt")
    assert df["arrival_s"].tolist() == [0, 4] and df["output_tokens"].tolist() == [20, 30]
    assert "dropped 1 failed" in capsys.readouterr().err
    assert load_trace(p, format="burstgpt", model="GPT-4")["prompt_tokens"].tolist() == [60]
    with pytest.raises(UserError, match=r"b.csv:3: .*Response tokens"):
        load_trace(p, format="burstgpt", keep_failed=True)


def test_mooncake_jsonl_ms_and_hashes(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]}]
    p = _write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    df = load_trace(p)   # auto-detected from the keys
    assert df["arrival_s"].tolist() == [0, 1.5]
    assert list(df["prefix_hashes"][1]) == [1, 3]


def test_vidur_and_splitwise(tmp_path):
    v = _write(tmp_path, "v.csv", "num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n")
    df = load_trace(v, format="vidur")
    assert df["arrival_s"].tolist() == [0, 0] and df["output_tokens"].tolist() == [10, 20]
    s = _write(tmp_path, "s.csv", "request_id,request_type,application_id,arrival_timestamp,batch_size,"
                                  "prompt_size,token_size\n0,2,0,1.5,1,300,40\n1,2,0,2.0,1,310,41\n")
    df = load_trace(s)
    assert df["arrival_s"].tolist() == [0, 0.5] and df["prompt_tokens"].tolist() == [300, 310]


def test_generic_csv_and_jsonl_with_mapping(tmp_path):
    c = _write(tmp_path, "g.csv", "t_ms,in,out,tier\n0,5,6,gold\n250,7,8,free\n")
    df = load_trace(c, format="csv", time_unit="ms",
                    columns={"arrival_s": "t_ms", "prompt_tokens": "in", "output_tokens": "out", "cls": "tier"})
    assert df["arrival_s"].tolist() == [0, 0.25] and df["cls"].tolist() == ["gold", "free"]
    j = _write(tmp_path, "g.jsonl", '{"at": 1, "p": 3, "o": 4}\n\n{"at": 2, "p": 5, "o": 6}\n')
    df = load_trace(j, format="jsonl", columns={"arrival_s": "at", "prompt_tokens": "p", "output_tokens": "o"})
    assert df["prompt_tokens"].tolist() == [3, 5]
    with pytest.raises(UserError, match="needs a mapping"):
        load_trace(c, format="csv")


BAD_ROWS = [
    ("2,abc,5\n", r"bad.csv:3: column 'ContextTokens' = 'abc' is not a number"),
    ("2,10,-4\n", r"bad.csv:3: column 'GeneratedTokens' = '-4' is below the minimum 1"),
    ("2,10.5,4\n", r"bad.csv:3: column 'ContextTokens' = '10.5' is not an integer"),
    ("0.5,10,4\n", r"bad.csv:3: column 'TIMESTAMP' = '0.5' goes backwards"),
    ("2,,4\n", r"bad.csv:3: column 'ContextTokens' is missing"),
]


@pytest.mark.parametrize("row, message", BAD_ROWS)
def test_malformed_rows_are_rejected_with_file_and_line(tmp_path, row, message):
    p = _write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,5\n" + row + "3,10,5\n")
    with pytest.raises(UserError, match=message):
        load_trace(p, format="csv", columns={"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens",
                                             "output_tokens": "GeneratedTokens"})


def test_skip_bad_rows_only_when_asked_and_prints_count(tmp_path, capsys):
    p = _write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,5\n2,abc,5\n0.5,10,4\n"
                                    "3,10,0\n4,12,6\n")
    cols = {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"}
    df = load_trace(p, format="csv", columns=cols, skip_bad_rows=True)
    assert df["prompt_tokens"].tolist() == [10, 12] and df["arrival_s"].tolist() == [0, 3]
    assert "skipped 3 malformed row(s)" in capsys.readouterr().err


def test_missing_column_and_missing_file(tmp_path):
    p = _write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(UserError, match=r"x.csv: missing column 'GeneratedTokens'"):
        load_trace(p, format="azure")
    with pytest.raises(UserError, match=r"does not exist.*AzurePublicDataset.*--set workload.path"):
        load_trace(tmp_path / "AzureLLMInferenceTrace_conv.csv", format="azure")
    with pytest.raises(UserError, match=r"x.jsonl:2: not valid JSON"):
        load_trace(_write(tmp_path, "x.jsonl", '{"a": 1}\n{oops\n'), format="jsonl",
                   columns={"prompt_tokens": "a", "output_tokens": "a"})


def test_sort_reorders_instead_of_rejecting(tmp_path):
    p = _write(tmp_path, "u.csv", "arrival_s,prompt_tokens,output_tokens\n5,1,1\n2,2,2\n9,3,3\n")
    with pytest.raises(UserError, match=r"u.csv:3: .*goes backwards"):
        load_trace(p)
    df = load_trace(p, sort=True)
    assert df["arrival_s"].tolist() == [0, 3, 7] and df["prompt_tokens"].tolist() == [2, 1, 3]


def test_jsonl_row_missing_a_key(tmp_path):
    p = _write(tmp_path, "k.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                                    '{"timestamp": 10, "output_length": 2}\n')
    with pytest.raises(UserError, match=r"k.jsonl:2: column 'input_length' is missing"):
        load_trace(p, format="mooncake")


def test_mooncake_without_hash_ids(tmp_path):
    p = _write(tmp_path, "n.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    df = load_trace(p, format="mooncake")
    assert "prefix_hashes" not in df and df["prompt_tokens"].tolist() == [5]
