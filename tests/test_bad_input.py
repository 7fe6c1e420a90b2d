"""User mistakes get one clear line naming the field/row and what is allowed; never a traceback or a hang."""
from pathlib import Path
import re
import subprocess
import sys

import pytest

from costmodels.errors import UserError
from sim.scenario.config import load_scenario, scenario_from_dict
from sim.cluster.runner import run_scenario
from tests.helpers import run_recorded


def _run(raw, *overrides):
    return run_scenario(scenario_from_dict(raw, overrides))


def test_unknown_policy_lists_valid_names():
    with pytest.raises(UserError, match=r"policy.name: unknown policy 'vlm'; allowed: .*sarathi.*vllm"):
        _run({"policy": {"name": "vlm"}})


def test_unknown_knob_lists_valid_knobs():
    with pytest.raises(UserError, match=r"unknown knob\(s\) chunk_size for policy 'sarathi'; allowed: .*R_max"):
        _run({"policy": {"name": "sarathi", "chunk_size": 512}})


def test_bad_knob_value():
    with pytest.raises(UserError, match=r"policy.order: 'sideways' is not allowed; allowed: prefill_first"):
        _run({"policy": {"name": "vllm", "order": "sideways"}})


def test_unknown_yaml_key_and_section_key(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("polcy: {name: vllm}\n")
    with pytest.raises(UserError, match=r"s.yaml: unknown key\(s\) polcy; allowed: name, seed, model"):
        load_scenario(p)
    with pytest.raises(UserError, match=r"memory: unknown key\(s\) size; allowed: M, block_size"):
        scenario_from_dict({"memory": {"size": 3}})


def test_wrong_types_and_bad_override():
    with pytest.raises(UserError, match=r"memory.block_size: expected an integer, got 'big'"):
        scenario_from_dict({}, ["memory.block_size=big"])
    with pytest.raises(UserError, match=r"expected KEY=VALUE"):
        scenario_from_dict({}, ["policy.name"])


@pytest.mark.parametrize("override,message", [
    ("seed=-1", "seed: must be an integer >= 0, got -1"),
    ("hardware.gpu_memory_utilization=1.5", "hardware.gpu_memory_utilization: must be in (0, 1], got 1.5"),
    ("memory.swap_space_gib=-1", "memory.swap_space_gib: must be >= 0"),
    ("sim.max_iterations=-1", "sim.max_iterations: must be an integer >= 0"),
    ("sim.watchdog_iterations=0", "sim.watchdog_iterations: must be an integer >= 1"),
    ("slo.ttft_s=-1", "slo.ttft_s: a latency target must be > 0 seconds"),
    ("slo.classes.rt.tpot_s=0", "slo.classes.rt.tpot_s: a latency target must be > 0 seconds"),
])
def test_out_of_range_fields_name_the_field_and_the_range(override, message):
    """These used to run anyway (a negative seed ended in numpy's traceback, a negative SLO counted as missed)."""
    with pytest.raises(UserError, match=re.escape(message)):
        scenario_from_dict({}, [override])


def test_tensor_parallel_degree_must_split_the_model():
    with pytest.raises(UserError, match=r"hardware.tp: tensor-parallel degree 3 is not supported; allowed: 1, 2, 4, 8"):
        _run({"workload": {"kind": "offline", "num_requests": 2, "prompt": 8, "output": 2}}, "hardware.tp=3")


def test_invalid_yaml_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("policy:\n  name: [vllm\n")
    with pytest.raises(UserError, match=r"broken.yaml: line \d+ is not valid YAML"):
        load_scenario(p)


def test_nonpositive_lengths_rejected_with_row():
    with pytest.raises(UserError, match=r"row 0: prompt_tokens = 0; lengths must be integers >= 1"):
        _run({"workload": {"kind": "offline", "num_requests": 3, "prompt": 0, "output": 4}})


def test_request_larger_than_memory_is_reported_infeasible_not_looped():
    res, _ = run_recorded({"name": "vllm"}, [(50, 10), (5, 3), (8, 60)], M=40)
    r = res.requests.set_index("id")
    assert r.loc[0, "status"] == "infeasible" and "exceed KV capacity M = 40" in r.loc[0, "reason"]
    assert r.loc[2, "status"] == "infeasible"         # I+O-1 = 67 > 40: would evict/refill forever
    assert r.loc[1, "status"] == "done" and res.summary["infeasible"] == 2


def test_eviction_free_infeasible_when_peak_exceeds_m():
    res, _ = run_recorded({"name": "vllm-ef"}, [(20, 30)], M=45)
    assert res.requests.status[0] == "infeasible"


def test_cli_prints_one_line_and_exit_2(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("policy: {name: nope}\n")
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(p)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error:") and "allowed:" in lines[0]
    assert "Traceback" not in out.stderr


def test_a_request_the_watermark_can_never_admit_is_refused_up_front():
    """It fits M but not M minus the admission watermark: reported infeasible, and the run goes on (it used to end
    'stuck')."""
    from policies import build_policy
    from sim.engine import Simulation
    from sim.kv.paged import KVCacheManager
    from tests.helpers import TokenCost, make_requests
    pol = build_policy({"name": "vllm"})
    res = Simulation(make_requests([(60, 2), (10, 2)]), pol, TokenCost(), KVCacheManager(100, 1, watermark=0.5)).run()
    r = res.requests.set_index("id")
    assert r.loc[0, "status"] == "infeasible" and "admission watermark" in r.loc[0, "reason"]
    assert r.loc[1, "status"] == "done"


def test_a_policy_that_never_schedules_ends_with_a_clear_stuck_error():
    from policies.base import Batch, Policy
    from sim.engine import Simulation
    from sim.errors import SimulationStuck
    from sim.kv.paged import KVCacheManager
    from tests.helpers import TokenCost, make_requests

    class Idle(Policy):
        def schedule(self, view):
            return Batch()
    sim = Simulation(make_requests([(6, 2)]), Idle(), TokenCost(), KVCacheManager(100, 1))
    with pytest.raises(SimulationStuck, match=r"scheduled nothing and no request is due; 1 waiting"):
        sim.run()


def test_unknown_dequant_mode_is_one_line():
    with pytest.raises(UserError, match=r"costmodel.dequant: 'slow' is not allowed; allowed: fused, separate"):
        _run({"costmodel": {"kind": "linear", "dequant": "slow"}})


def test_every_summary_column_has_a_unit_and_a_glossary_row():
    from sim.cluster.runner import run_scenario
    from sim.metrics.glossary import GLOSSARY, unit
    from sim.scenario.config import load_scenario
    res = run_scenario(load_scenario("examples/azure-conv-shape.yaml", ["workload.num_requests=40"]))
    assert [k for k in res.summary if not unit(k) and not k.startswith("policy_")] == []
    page = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "glossary.md").read_text()
    assert [k for k in GLOSSARY if f"| `{k}` |" not in page] == []
