"""vLLM's knob names (policies/vllm_names.py) give the same runs as servesim's, and are refused where they mean nothing."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from costmodels.errors import UserError
from policies import POLICIES, build_policy
from policies.vllm_names import POLICY_ALIASES, SECTION_ALIASES, policy_aliases
from sim.cli import main
from sim.cluster.runner import run_scenario
from sim.scenario.config import scenario_from_dict

BASE = {"name": "names", "seed": 3, "hardware": {"gpu": "a100-80gb"},
        "workload": {"kind": "poisson", "rate": 40, "num_requests": 60,
                     "prompt": {"dist": "uniform", "low": 100, "high": 900}, "output": {"dist": "uniform", "low": 5,
                                                                                          "high": 60}}}
# Values away from every default, so a name that were ignored would change the tables.
INTERNAL = {"policy": {"name": "sarathi", "R_max": 6, "C": 768, "P": 768, "chunked": True},
            "memory": {"block_size": 32, "swap_space_gib": 1.5, "prefix_caching": False},
            "hardware": {"gpu": "a100-80gb", "gpu_memory_utilization": 0.31},
            "model": {"max_model_len": 2048}}
VLLM_IN_SECTIONS = {"policy": {"name": "sarathi", "max_num_seqs": 6, "max_num_batched_tokens": 768,
                               "enable_chunked_prefill": True},
                    "memory": {"block_size": 32, "swap_space": 1.5, "enable_prefix_caching": False},
                    "hardware": {"gpu": "a100-80gb", "gpu_memory_utilization": 0.31},
                    "model": {"max_model_len": 2048}}
VLLM_FLAT = {"policy": {"name": "sarathi"}, "max_num_seqs": 6, "max_num_batched_tokens": 768,
             "enable_chunked_prefill": True, "block_size": 32, "swap_space": 1.5, "enable_prefix_caching": False,
             "gpu_memory_utilization": 0.31, "max_model_len": 2048}


def _tables(extra, overrides=()):
    res = run_scenario(scenario_from_dict({**BASE, **extra}, overrides))
    return res, res.requests.reset_index(drop=True), res.iterations.reset_index(drop=True)


def test_vllm_names_give_the_same_tables_as_servesims():
    ref, req, it = _tables(INTERNAL)
    assert ref.summary["completed"] == 60
    assert it["running"].max() <= 6 and (it["prefill_tokens"] + it["decode_tokens"]).max() <= 768
    for form in (VLLM_IN_SECTIONS, VLLM_FLAT):
        res, r2, i2 = _tables(form)
        pd.testing.assert_frame_equal(req, r2)
        pd.testing.assert_frame_equal(it, i2)
        assert res.capacity_tokens == ref.capacity_tokens
    # the knobs matter: without them the run differs (so the equality above is not trivially true)
    plain, preq, _ = _tables({"policy": {"name": "sarathi"}})
    assert plain.capacity_tokens != ref.capacity_tokens and not preq.equals(req)


def test_cli_set_accepts_vllm_names_and_they_override_the_files_value(tmp_path, capsys):
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, **INTERNAL, "policy": {**INTERNAL["policy"], "R_max": 2},
                                   "memory": {**INTERNAL["memory"], "swap_space_gib": 9}}))
    assert main(["run", str(path), "--set", "policy.max_num_seqs=6", "--set", "swap_space=1.5",
                 "--out", str(tmp_path / "a")]) == 0
    path.write_text(yaml.safe_dump({**BASE, **INTERNAL}))
    assert main(["run", str(path), "--out", str(tmp_path / "b")]) == 0
    a = pd.read_csv(tmp_path / "a" / "requests.csv")
    b = pd.read_csv(tmp_path / "b" / "requests.csv")
    pd.testing.assert_frame_equal(a, b)


def test_override_by_one_name_replaces_the_other():
    scn = scenario_from_dict({"policy": {"name": "sarathi", "max_num_batched_tokens": 1000}}, ["policy.P=256"])
    assert scn.policy == {"name": "sarathi", "C": 1000, "P": 256}     # C keeps the alias's value
    scn = scenario_from_dict({"policy": {"name": "sarathi", "R_max": 4}}, ["max_num_seqs=9"])
    assert scn.policy == {"name": "sarathi", "R_max": 9}
    scn = scenario_from_dict({"memory": {"swap_space": 2}}, ["memory.swap_space_gib=3"])
    assert scn.memory.swap_space_gib == 3
    scn = scenario_from_dict({}, ["max_num_seqs=9"])                  # no policy section: the default policy
    assert scn.policy == {"name": "vllm", "R_max": 9}


def test_each_policy_family_maps_or_refuses_each_alias():
    for name, (cls, _, _) in POLICIES.items():
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        mine = policy_aliases(cls)
        for alias in POLICY_ALIASES:
            if alias in mine:
                assert set(mine[alias]) <= fields, (name, alias)
                pol = build_policy({"name": name, alias: 64 if alias != "enable_chunked_prefill" else True})
                assert all(getattr(pol.config, k) == (64 if alias != "enable_chunked_prefill" else True)
                           for k in mine[alias])
            else:
                with pytest.raises(UserError, match=rf"policy.{alias}: policy {name!r} has no knob for vLLM's "
                                                    rf"{alias} \(servesim policies --knobs {name}\)"):
                    build_policy({"name": name, alias: 64})
    # the table names real fields of the scenario
    for alias, (section, field) in SECTION_ALIASES.items():
        assert field in {f.name for f in dataclasses.fields(type(getattr(scenario_from_dict({}), section)))}


@pytest.mark.parametrize("raw, message", [
    ({"policy": {"name": "sarathi", "R_max": 4, "max_num_seqs": 4}},
     r"policy: max_num_seqs and R_max set the same knob .*give one of them"),
    ({"policy": {"name": "vllm-v1", "max_num_batched_tokens": 4, "P": 2}},
     r"policy: max_num_batched_tokens and P set the same knob"),
    ({"memory": {"swap_space": 1, "swap_space_gib": 2}}, r"memory: swap_space and swap_space_gib set the same knob"),
    ({"block_size": 32, "memory": {"block_size": 16}}, r"block_size \(top level\) and memory.block_size set the same"),
    ({"max_num_seqs": 8, "policy": {"name": "sarathi", "R_max": 4}}, r"max_num_seqs \(top level\) and policy.R_max"),
    ({"memory": {"max_num_seqs": 8}}, r"memory.max_num_seqs: vLLM's max_num_seqs is a policy knob: set policy"),
    ({"hardware": {"block_size": 8}}, r"hardware.block_size: vLLM's block_size belongs to memory"),
    ({"policy": {"name": "sarathi", "swap_space": 8}}, r"policy.swap_space: vLLM's swap_space is a scenario field"),
    ({"cluster": {"replicas": [{"count": 1, "memory": {"swap_space": 1, "swap_space_gib": 1}}]}},
     r"cluster.replicas\[0\].memory: swap_space and swap_space_gib"),
])
def test_both_names_or_a_misplaced_name_is_one_line(raw, message):
    with pytest.raises(UserError, match=message):
        scenario_from_dict(raw)


def test_unknown_knobs_point_at_the_alias_table():
    with pytest.raises(UserError, match=r"unknown knob\(s\) max_num_seq for policy 'sarathi'; allowed: .*; vLLM "
                                        r"names: max_num_seqs -> R_max, max_num_batched_tokens -> C, P, "
                                        r"enable_chunked_prefill -> chunked \(servesim policies --knobs sarathi\)"):
        build_policy({"name": "sarathi", "max_num_seq": 4})
    with pytest.raises(UserError, match=r"for policy 'bros'; .*vLLM names: none for this policy"):
        build_policy({"name": "bros", "max_num_seq": 4})
    with pytest.raises(UserError, match=r"memory: unknown key\(s\) swap; .*vLLM names: enable_prefix_caching -> "
                                        r"prefix_caching, swap_space -> swap_space_gib"):
        scenario_from_dict({"memory": {"swap": 4}})
    with pytest.raises(UserError, match=r"unknown key\(s\) max_num_seq; .*vLLM names: .*max_num_seqs -> policy knob"
                                        r".*servesim policies --knobs NAME"):
        scenario_from_dict({"max_num_seq": 4})


def test_cluster_groups_take_vllm_names():
    raw = {"policy": {"name": "sarathi", "R_max": 4}, "cluster": {"replicas": [
        {"count": 1, "policy": {"max_num_seqs": 2}, "memory": {"swap_space": 1}}]}}
    scn = scenario_from_dict(raw)
    group = scn.cluster["replicas"][0]
    assert group["policy"] == {"R_max": 2} and group["memory"] == {"swap_space_gib": 1}


def test_sweep_grid_over_a_vllm_name(tmp_path):
    from study.sweep import expand, load_sweep
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name": "sarathi", "R_max": 4}, "memory": {"M": 20000}}))
    points = expand(load_sweep(path, ["policy.max_num_seqs=2,8"]))
    assert [p.raw["policy"] for p in points] == [{"name": "sarathi", "R_max": 2}, {"name": "sarathi", "R_max": 8}]


def test_knobs_lists_every_knob_with_vllm_name_default_and_meaning(capsys):
    assert main(["policies", "--knobs", "sarathi"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines()[2:] if ln.startswith("  ")}
    cls = POLICIES["sarathi"][0]
    assert set(lines) >= {f.name for f in dataclasses.fields(cls.Config)}
    assert lines["R_max"][1:3] == ["max_num_seqs", "0"]
    assert lines["P"][1:3] == ["max_num_batched_tokens", "512"]          # the preset's value, not the class's 4096
    assert lines["chunked"][1] == "enable_chunked_prefill"
    assert lines["order"][1] == "-" and "group order" in " ".join(lines["order"])
    assert "swap_space -> memory.swap_space_gib" in out
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "R_max [max_num_seqs]" in out and "max_batch [max_num_seqs]" in out
    assert main(["policies", "--knobs", "nope"]) == 2
    assert "--knobs: unknown policy 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("alias, value", [("max_num_seqs", 0), ("max_num_seqs", -1), ("max_num_batched_tokens", 0),
                                          ("max_num_seqs", 2.5), ("max_num_seqs", True)])
def test_vllm_counts_below_one_are_one_line_not_the_knobs_special_values(alias, value):
    """R_max 0 means no limit and -1 v1's default; vLLM's max_num_seqs 0 must not silently become either."""
    for raw in ({"policy": {"name": "sarathi", alias: value}}, {alias: value},
                {"cluster": {"replicas": [{"count": 1, "policy": {alias: value}}]}}):
        with pytest.raises(UserError, match=rf"\.{alias}: {value!r} is not allowed: vLLM's {alias} is an integer "
                                            r">= 1 \(servesim policies --knobs"):
            scenario_from_dict(raw)
    # the knob's own name keeps its meanings
    assert scenario_from_dict({"policy": {"name": "sarathi", "R_max": 0}}).policy["R_max"] == 0
    assert scenario_from_dict({"policy": {"name": "sarathi", alias: 3}}).policy[
        "R_max" if alias == "max_num_seqs" else "C"] == 3


def test_a_null_vllm_count_is_the_presets_default_as_vllms_none_is_the_engines():
    preset = scenario_from_dict({"policy": {"name": "sarathi"}}).policy
    for raw in ({"policy": {"name": "sarathi", "max_num_seqs": None}}, {"policy": {"name": "sarathi"},
                                                                        "max_num_batched_tokens": None}):
        assert scenario_from_dict(raw).policy == preset
    # beside the knob it sets, the null gives way to the knob
    assert scenario_from_dict({"policy": {"name": "sarathi", "R_max": 5, "max_num_seqs": None}}).policy["R_max"] == 5
