"""Each 2026-engine example fires its own mechanism, and the run's summary counts it."""
import pytest

from sim.cluster.runner import run_scenario
from sim.paths import REPO_ROOT
from sim.scenario.config import load_scenario

CASES = [
    ("speculative.yaml", ("workload.num_requests=200",), ("spec_steps", "spec_drafts_accepted", "spec_freed_blocks")),
    ("sglang-radix.yaml", (), ("radix_evicted_leaves", "policy_sglang_lpm_sorts", "policy_sglang_lpm_fallbacks",
                               "policy_sglang_retractions")),
    ("multi-lora.yaml", ("workload.num_requests=200",), ("lora_loads_from_disk", "lora_skipped_admissions",
                                                          "lora_load_time_s")),
    ("agentic-sessions.yaml", ("workload.conversations=20",), ("session_turns_released",)),
]


@pytest.mark.parametrize("name, overrides, counters", CASES)
def test_example_fires_its_mechanism(name, overrides, counters):
    s = run_scenario(load_scenario(REPO_ROOT / "examples" / name, list(overrides))).summary
    assert s["completed"] == s["requests"] - s["infeasible"]
    for c in counters:
        assert s[c] > 0, f"{name}: {c} = {s[c]}"
