"""The disk tier under the CPU tier: demotion, promotion on a hit, the read time, capacities, bad input."""
import pytest

from costmodels.errors import UserError
from sim.engine.request import Request
from sim.kv.tiers import TieredPrefixKVManager
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict


def _cached(mem, rid, key, t):
    """A finished request whose 8-token shared prompt (two blocks of 4) went through the GPU."""
    r = Request(rid, 0.0, 8, 1, prefix=((key, 8),))
    mem.lookup(r)
    assert mem.admit(r, 8)
    mem.register(r, 8)
    mem.clock = t
    r.cached, r.completion_s = 8, t
    mem.free(r)
    return r


def test_cpu_evictions_go_to_disk_and_a_hit_promotes_them():
    mem = TieredPrefixKVManager(16, block_size=4, cpu_cache_blocks=2, disk_blocks=8, disk_seconds_per_block=0.5)
    a = _cached(mem, 0, "a", 1.0)
    _cached(mem, 1, "b", 2.0)                     # b's two blocks push a's out of the CPU tier, onto disk
    assert set(mem.disk) == set(a.chain[0][:2]) and len(mem.cpu) == 2
    for k in range(2, 4):                         # evict a's blocks from the GPU too (fill it with fresh prompts)
        _cached(mem, k, f"x{k}", 3.0)
    again = Request(9, 0.0, 9, 1, prefix=(("a", 8),))
    assert mem.lookup(again) == 8 and mem.disk_pending[9] == 2      # found on disk, not on the GPU or CPU
    probe = Request(10, 0.0, 9, 1, prefix=(("a", 8),))
    mem.lookup(probe)                             # a lookup that lapses moves nothing
    assert set(a.chain[0][:2]) <= set(mem.disk)
    assert mem.admit(again, 9)
    assert mem.disk_load_s == 2 * 0.5 and mem.loaded_tokens == 8
    assert not set(a.chain[0][:2]) & set(mem.disk)      # promoted: one tier holds a block
    assert len(mem.cpu) <= 2 and len(mem.disk) <= 8
    s = mem.stats()
    assert s["prefix_disk_hit_tokens"] == 8 and s["prefix_disk_writes"] >= 2


def _scn(**memory):
    m = {"M": 30000, "cpu_offload_gib": 2, "disk_offload_gib": 50, "disk_gb_per_s": 20}
    m.update(memory)
    return scenario_from_dict({
        "name": "d", "seed": 0, "model": {"name": "llama-3.1-8b", "max_model_len": 8192},
        "hardware": {"gpu": "h100-sxm"}, "memory": m, "policy": {"name": "vllm-v1"},
        "workload": {"kind": "shared_prefix", "num_groups": 60, "num_prompts_per_group": 5, "system_prompt_len": 2000,
                     "question_len": 100, "output_len": 50, "stages": [{"rate": 8, "duration": 40}]}})


def test_disk_hits_in_a_run_cost_their_read_time_and_paths_agree():
    fast = build_simulation(_scn()).run()
    s = fast.summary
    assert s["prefix_disk_hit_tokens"] > 0 and s["prefix_disk_writes"] > 0
    scn = _scn()
    scn.sim.fast_forward = False
    plain = build_simulation(scn).run()
    assert fast.requests.equals(plain.requests) and fast.iterations.equals(plain.iterations)
    slow = build_simulation(_scn(disk_gb_per_s=0.5)).run().summary
    assert slow["prefix_disk_hit_tokens"] > 0 and slow["ttft_mean"] > s["ttft_mean"]
    none = build_simulation(_scn(disk_offload_gib=0)).run().summary
    assert s["prefix_hit_rate"] > none["prefix_hit_rate"]


@pytest.mark.parametrize("memory, fragment", [
    ({"disk_gb_per_s": 0}, "memory.disk_gb_per_s: must be > 0"),
    ({"disk_offload_gib": -1}, "memory.disk_offload_gib: must be >= 0"),
    ({"cpu_offload_gib": 0}, "the disk tier sits under the CPU tier"),
])
def test_bad_disk_tiers_are_one_line(memory, fragment):
    with pytest.raises(UserError) as e:
        build_simulation(_scn(**memory))
    assert fragment in str(e.value) and "\n" not in str(e.value)
