"""SERVESIM_EXTENSIONS: a policy and a GPU written outside the package run like built-in ones, and a broken
extension is one line naming it."""
import numpy as np
import pytest

from costmodels.errors import UserError
from policies import POLICIES
from sim.cli import main
from sim.scenario.config import scenario_from_dict
from sim.scenario.extensions import load_extensions
from sim.paths import REPO_ROOT
from sim.cluster.runner import run_scenario

EXAMPLE = str(REPO_ROOT / "examples" / "extensions" / "spf_mi300x.py")
SCENARIO = {"seed": 3, "model": {"name": "llama-2-13b"}, "hardware": {"gpu": "mi300x"},
            "costmodel": {"kind": "roofline"}, "memory": {"M": 6000, "block_size": 16},
            "policy": {"name": "spf", "max_batch_tokens": 2048},
            "workload": {"kind": "poisson", "num_requests": 300, "rate": 40,
                         "prompt": {"dist": "uniform", "low": 16, "high": 1024},
                         "output": {"dist": "uniform", "low": 1, "high": 300}}}


@pytest.fixture(scope="module")
def example():
    load_extensions(EXAMPLE)
    return run_scenario(scenario_from_dict(SCENARIO))


def test_example_policy_on_example_gpu_keeps_the_invariants(example):
    req, it = example.requests, example.iterations
    assert (req["status"] == "done").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()           # exactly O tokens each
    assert it["kv_alloc_tokens"].max() <= example.capacity_tokens            # KV never above M
    assert example.summary["evictions"] > 0                                  # M = 6000 made it preempt
    again = run_scenario(scenario_from_dict(SCENARIO))
    assert again.requests.equals(req) and again.iterations.equals(it)        # same seed, same tables


def test_example_policy_admits_shortest_prompt_first(example):
    """Offline, with room for one prompt per step: admissions come in ascending prompt order."""
    raw = {**SCENARIO, "memory": {"M": 100_000, "block_size": 16}, "policy": {"name": "spf", "max_batch_tokens": 1100},
           "workload": {"kind": "offline", "num_requests": 40, "prompt": {"dist": "uniform", "low": 600, "high": 1000},
                        "output": 4}}
    req = run_scenario(scenario_from_dict(raw)).requests.sort_values("first_scheduled_s", kind="stable")
    assert np.all(np.diff(req["prompt_tokens"].to_numpy()) >= 0)


def test_cli_loads_extensions_named_in_the_environment(tmp_path, monkeypatch, capsys):
    ext = tmp_path / "env_only_ext.py"
    ext.write_text("from policies import register_policy\nfrom policies.unified import UnifiedScheduler\n"
                   "register_policy('env-only-preset', UnifiedScheduler, 'loaded from SERVESIM_EXTENSIONS', "
                   "order='decode_first', C=512, P=256)\n")
    monkeypatch.setenv("SERVESIM_EXTENSIONS", f"{EXAMPLE}, {ext}")
    try:
        assert main(["policies"]) == 0
    finally:
        POLICIES.pop("env-only-preset", None)     # other tests compare against the built-in registry
    out = capsys.readouterr().out
    assert "env-only-preset" in out and "spf " in out


def test_broken_extensions_are_one_line(tmp_path):
    with pytest.raises(UserError, match=r"SERVESIM_EXTENSIONS: .*nope.py: file does not exist"):
        load_extensions(str(tmp_path / "nope.py"))
    bad = tmp_path / "bad_ext.py"
    bad.write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(UserError, match=r"cannot load .*bad_ext.py.*RuntimeError: boom \(bad_ext.py:2\)"):
        load_extensions(str(bad))
    with pytest.raises(UserError, match=r"cannot load 'no_such_module_xyz': ModuleNotFoundError"):
        load_extensions("no_such_module_xyz")
