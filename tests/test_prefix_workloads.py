"""Prefix-structured workloads: inference-perf's shared_prefix with constant load stages, Mooncake hash ids,
multi-turn chat, and their bad input (one line each)."""
import numpy as np
import pytest

from costmodels.errors import UserError
from sim.cluster.runner import run_scenario
from sim.scenario.config import scenario_from_dict
from traces import build_workload

SP = {"kind": "shared_prefix", "num_groups": 3, "num_prompts_per_group": 4, "system_prompt_len": 100,
      "question_len": 60, "output_len": 20, "stages": [{"rate": 2.0, "duration": 10}, {"rate": 5.0, "duration": 4}]}


def _wl(spec, seed=0):
    return build_workload(spec, np.random.default_rng(seed))


def test_constant_stages_send_rate_times_duration_and_fill_each_stage():
    df = _wl(SP)
    a = df["arrival_s"].to_numpy()
    assert len(df) == 2 * 10 + 5 * 4
    assert np.all(np.diff(a) >= 0)
    first, second = a[:20], a[20:]
    assert first.max() == pytest.approx(10.0) and (first > 0).all()          # rescaled to end at the stage's end
    assert second.min() > 10.0 and second.max() == pytest.approx(14.0)


def test_users_cycle_and_repeat_their_prompt():
    """Request i goes to user i mod (groups × users); with history `repeat` a returning user sends the same prompt,
    made of its group's system prompt and its own question (plus the chat template)."""
    df = _wl({**SP, "template_tokens": 5})
    users = 12
    assert (df["prompt_tokens"] == 100 + 60 + 5).all()
    stage1 = df.iloc[:20]
    sess = stage1["session"].to_numpy()
    assert len(set(sess[:users])) == users and (sess[users:] == sess[:20 - users]).all()
    for _, row in stage1.iterrows():
        (sys_key, sys_len), (q_key, q_len) = row["prefix"]
        assert sys_len == 100 and q_len == 65
        assert sys_key[1] == row["session"] // 4                 # the user's group's system prompt
        assert q_key[1] == row["session"]


def test_grow_history_appends_answers_and_stays_within_max_model_len():
    """inference-perf's session: each turn is the last prompt + its answer + the question again, trimmed from the
    oldest turn to fit max_model_len − output_len − 200."""
    df = _wl({**SP, "history": "grow", "max_model_len": 800, "stages": [{"rate": 4, "duration": 20}]})
    by_user = df.groupby("session")["prompt_tokens"].apply(list)
    for v in by_user:
        assert v[0] == 160
        assert all(b - a in (20 + 60, 0) or b < a for a, b in zip(v, v[1:]))   # grows by answer + question, or trims
    assert any(len(v) > 1 and v[1] == 240 for v in by_user)
    assert df["prompt_tokens"].max() <= 800 - 20 - 200


def test_multi_turn_history_grows_turn_by_turn_and_reuses_earlier_answers():
    df = _wl({"kind": "multi_turn", "conversations": 5, "turns": 4, "system_prompt_len": 50, "user_tokens": 30,
              "output": 40, "think_time_s": 2.0})
    assert len(df) == 20
    for _, g in df.groupby("session"):
        p = g["prompt_tokens"].to_numpy()
        assert p[0] == 80 and (np.diff(p) == 70).all()            # + previous answer (40) + new question (30)
        later = g["prefix"].iloc[-1]
        assert any(k[0][0] == "g" for k in later)                 # earlier answers are named by their row


def test_mooncake_hash_ids_become_block_segments_and_hit_in_the_cache():
    from traces.prefix import prefix_from_hashes
    segs = prefix_from_hashes([7, 8, 9], 1100, 512)
    assert segs == ((("h", 7), 512), (("h", 8), 512), (("h", 9), 76))
    with pytest.raises(UserError, match="row 3: 4 hash ids of 512-token blocks for a prompt of 1100 tokens"):
        prefix_from_hashes([1, 2, 3, 4], 1100, 512, row=3)


def test_caching_turns_repeated_prompts_into_hits_and_lowers_ttft():
    base = {"name": "sp", "memory": {"M": 50000}, "policy": {"name": "vllm-v1"}, "workload": SP}
    on = run_scenario(scenario_from_dict(base))
    off = run_scenario(scenario_from_dict(base, ["memory.prefix_caching=false"]))
    # 12 users: after each user's first request, every full block of its prompt is cached (165 → 160 tokens hit:
    # the last block is always computed, as vLLM recomputes it)
    req = on.requests
    assert (req["prefix_hit_tokens"] <= (160 - 1) // 16 * 16).all()
    assert req["prefix_hit_tokens"].gt(0).sum() >= len(req) - 12
    assert on.summary["ttft_mean"] < off.summary["ttft_mean"]
    assert on.summary["completed"] == off.summary["completed"] == len(req)


@pytest.mark.parametrize("override,message", [
    ({"stages": [{"rate": 0, "duration": 10}]}, r"stages\[0\]\.rate: must be a number > 0, got 0"),
    ({"stages": [{"rate": -1.5, "duration": 10}]}, r"stages\[0\]\.rate: must be a number > 0"),
    ({"stages": [{"rate": 0.01, "duration": 10}]}, "sends no request"),
    ({"stages": [{"rate": 1, "duration": 10, "burst": 2}]}, "expected a mapping with rate and duration"),
    ({"history": "forever"}, "history: 'forever' is not allowed; allowed: repeat, grow"),
    ({"num_groups": 0}, r"num_groups: expected an integer >= 1, got 0"),
    ({"arrival": {"process": "poisson", "rate": 1}}, "give stages .* or arrival \\+ num_requests, not both"),
])
def test_bad_shared_prefix_specs_are_one_line(override, message):
    with pytest.raises(UserError, match=message):
        _wl({**SP, **override})


def test_impossible_prefix_and_unknown_prefix_column_are_one_line(tmp_path):
    from traces.prefix import check_prefix
    import pandas as pd
    df = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [5],
                       "prefix": [((("sys", 1), 8), (("q", 2), 8))]})
    with pytest.raises(UserError, match="row 0: prefix segments cover 16 tokens but the prompt has 10"):
        check_prefix(df, "trace.csv")
    csv = tmp_path / "t.csv"
    csv.write_text("ts,in,out\n0,10,5\n")
    scn = {"memory": {"M": 1000}, "workload": {"kind": "trace", "path": str(csv), "format": "csv",
                                               "columns": {"arrival_s": "ts", "prompt_tokens": "in",
                                                           "output_tokens": "out", "prefix": "segments"}}}
    with pytest.raises(UserError, match="segments"):
        run_scenario(scenario_from_dict(scn))


def test_an_offload_tier_larger_than_host_memory_is_one_line():
    with pytest.raises(UserError, match="cpu_offload_gib.*host_memory_gib"):
        scenario_from_dict({"memory": {"cpu_offload_gib": 64, "prefix_caching": True},
                            "hardware": {"host_memory_gib": 32}})
