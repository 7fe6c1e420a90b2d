"""Multi-LoRA: max_loras skips, adapter load stalls from disk and host, the slots' memory, bad input."""
import pytest

from costmodels import get_gpu, get_model
from costmodels.errors import UserError
from policies import build_policy
from sim.engine import Simulation
from sim.engine.lora import LoRA, LoRAConfig, adapter_bytes, lora_config
from sim.kv.paged import KVCacheManager
from sim.scenario.build import build_simulation
from sim.scenario.config import scenario_from_dict
from tests.helpers import TokenCost, make_requests

MODEL, GPU = get_model("llama-3.1-8b"), get_gpu("h100-sxm")


def test_hand_worked_load_stall_and_max_loras_skip():
    reqs = make_requests([(8, 2), (8, 2)])
    lora = LoRA(LoRAConfig(adapters=2, max_loras=1, disk_gb_per_s=2.0), MODEL, GPU, 1, seed=0)
    sim = Simulation(reqs, build_policy({"name": "vllm-v1"}), TokenCost(per_prefill_token=0.25, decode_step=0.5),
                     KVCacheManager(100, 1), lora=lora, keep_token_times=True)
    reqs[0].adapter, reqs[1].adapter = 0, 1
    res = sim.run()
    nbytes = adapter_bytes(MODEL, 16)
    from_disk = nbytes / 2e9 + GPU.pcie_latency_s + nbytes / GPU.pcie_bytes_per_s

    def gemm(tokens):
        return max(tokens * lora.flops_per_token / GPU.peak_flops, nbytes / GPU.hbm_bytes_per_s)
    # request 1's adapter would be a second one: it waits until request 0 is done (max_loras = 1)
    t1 = 3.0 + from_disk + gemm(8)                 # prefill 8 tokens (1 + 2 s) after loading adapter 0 from disk
    t2 = t1 + 1.5 + gemm(1)                        # its decode: the adapter is in its slot
    assert reqs[0].token_times == pytest.approx([t1, t2])
    assert reqs[1].first_scheduled_s == pytest.approx(t2)
    t3 = t2 + 3.0 + from_disk + gemm(8)            # adapter 1 replaces it (host memory holds one: from disk)
    assert reqs[1].token_times[0] == pytest.approx(t3)
    s = res.summary
    assert (s["lora_loads_from_disk"], s["lora_loads_from_host"]) == (2, 0)
    assert s["lora_skipped_admissions"] == 2        # request 1 skipped in both of request 0's steps
    assert s["lora_load_time_s"] == pytest.approx(2 * from_disk)


def _scn(**lora):
    cfg = {"adapters": 16, "popularity": 1.0, "max_loras": 2, "max_cpu_loras": 12}
    cfg.update(lora)
    return scenario_from_dict({
        "name": "l", "seed": 2, "model": {"name": "llama-3.1-8b", "max_model_len": 8192},
        "hardware": {"gpu": "h100-sxm"}, "policy": {"name": "vllm-v1"}, "lora": cfg,
        "workload": {"kind": "poisson", "num_requests": 150, "rate": 6, "prompt": {"dist": "uniform", "low": 100,
                                                                                    "high": 600},
                     "output": {"dist": "uniform", "low": 20, "high": 200}}})


@pytest.mark.parametrize("fast", [True, False])
def test_batches_keep_to_max_loras_and_every_request_completes(fast):
    scn = _scn()
    scn.sim.fast_forward = fast
    sim = build_simulation(scn)
    seen = []
    inner = sim.policy.schedule

    def schedule(view):
        b = inner(view)
        members = {r.adapter for r in view.running if r.cohort is not None} if b.cohort else set()   # the cohort's
        seen.append(len(({r.adapter for r in b.reqs} | members) - {-1}))
        return b
    sim.policy.schedule = schedule
    res = sim.run()
    assert max(seen) == 2
    req = res.requests
    assert (req["status"] == "done").all() and (req["generated_tokens"] == req["output_tokens"]).all()
    s = res.summary
    assert s["lora_skipped_admissions"] > 0 and s["lora_loads_from_disk"] > 0 and s["lora_loads_from_host"] > 0
    again = build_simulation(_scn()).run()
    assert again.requests.equals(res.requests) and again.iterations.equals(res.iterations)


def test_adapter_slots_come_out_of_a_derived_m():
    plain = build_simulation(scenario_from_dict({**_scn().to_dict(), "lora": {}})).memory_breakdown
    with_slots = build_simulation(_scn(max_loras=4, rank=64)).memory_breakdown
    reserved = 4 * adapter_bytes(MODEL, 64)
    assert with_slots.kv_tokens == int((plain.kv_bytes - reserved) // plain.kv_bytes_per_token)


@pytest.mark.parametrize("section, fragment", [
    ({"rank": 0}, "lora.rank: must be an integer >= 1"),
    ({"max_loras": 0}, "lora.max_loras: must be an integer >= 1"),
    ({"disk_gb_per_s": 0}, "lora.disk_gb_per_s: must be > 0"),
    ({"base_fraction": 1.5}, "lora.base_fraction: must be in [0, 1]"),
    ({"max_loras": 4, "max_cpu_loras": 2}, "lora.max_cpu_loras: must be >= max_loras = 4"),
    ({"adapter": 3}, "lora: unknown key(s) adapter"),
])
def test_bad_lora_sections_are_one_line(section, fragment):
    with pytest.raises(UserError) as e:
        lora_config(section)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_an_adapter_larger_than_the_gpu_is_one_line():
    with pytest.raises(UserError, match="more than the GPU's memory"):
        LoRA(LoRAConfig(rank=200_000, max_loras=1), get_model("llama-3.1-70b"), GPU, 1, seed=0)


def test_a_policy_without_the_max_loras_rule_is_refused():
    scn = _scn()
    scn.policy = {"name": "sglang"}
    with pytest.raises(UserError, match="does not apply max_loras; allowed: .*vllm-v1"):
        build_simulation(scn)


def test_a_disaggregated_cluster_refuses_lora_in_one_line():
    from sim.cluster.runner import run_scenario
    scn = _scn()
    scn.cluster = {"disaggregation": {"prefill": 1, "decode": 1}}
    with pytest.raises(UserError, match="lora: a disaggregated cluster does not run adapters"):
        run_scenario(scn)
