"""Build one replica from a scenario: model, GPU, KV capacity M, cost model, policy, KV manager and workload."""
from __future__ import annotations

import numpy as np

from costmodels import build_costmodel, get_gpu, get_model
from costmodels.memory import fixed_reserve_breakdown, vllm_memory_breakdown
from costmodels.catalog import GiB
from costmodels.errors import UserError
from policies import build_policy
from sim.scenario.config import Scenario
from sim.engine import Simulation
from sim.scenario.extensions import load_extensions
from sim.kv.paged import KVCacheManager
from sim.metrics import SimResult
from sim.engine.request import Request
from traces import build_workload


def memory_breakdown(scn: Scenario, model, gpu, policy=None, costmodel=None):
    """How GPU memory splits into weights, reservations and KV (costmodels.memory), or None when memory.M is given.
    With memory.activation_reserve_gib null the reservations are vLLM's, for the policy's largest step."""
    m, hw = scn.memory, scn.hardware
    if m.M is not None:
        return None
    if m.activation_reserve_gib is not None:
        return fixed_reserve_breakdown(model, gpu, hw.gpu_memory_utilization, hw.tp, m.activation_reserve_gib * GiB,
                                       m.kv_dtype)
    policy = policy or build_policy(scn.policy)
    policy.prepare(costmodel if costmodel is not None else scenario_costmodel(scn, model, gpu))
    tokens, seqs = policy.profile_batch()
    return vllm_memory_breakdown(model, gpu, hw.gpu_memory_utilization, hw.tp, tokens, seqs, m.kv_dtype)


def capacity_tokens(scn: Scenario, model, gpu, policy=None, costmodel=None) -> int:
    m = scn.memory
    if m.M is not None:
        if m.M <= 0:
            raise UserError(f"memory.M: must be a positive number of KV tokens, got {m.M}")
        tp = scn.hardware.tp
        if model is not None and gpu is not None and model.weight_bytes() / tp > gpu.mem_bytes:
            # a given M skips vLLM's arithmetic, not physics: the weights must still fit beside it
            raise UserError(f"memory.M: {model.name}'s weights ({model.weight_bytes() / tp / GiB:.1f} GiB per GPU at "
                            f"tp={tp}) do not fit in {gpu.name}'s {gpu.mem_bytes / GiB:.0f} GiB; raise hardware.tp or "
                            "pick a larger GPU")
        return int(m.M)
    return memory_breakdown(scn, model, gpu, policy, costmodel).kv_tokens


def scenario_costmodel(scn: Scenario, model, gpu):
    """The scenario's batch-time model for this model and GPU."""
    cm_spec = dict(scn.costmodel)
    if scn.memory.kv_dtype and "kv_dtype" not in cm_spec:   # quantized KV is paid for in swap/dequant time too
        cm_spec["kv_dtype"] = scn.memory.kv_dtype
    return build_costmodel(cm_spec, model, gpu, scn.hardware.tp)


def scenario_model(scn: Scenario):
    """The scenario's model: a catalog entry by name, or read from a local config.json; dtype overrides its
    weight precision."""
    from costmodels.catalog import load_model_config, with_dtype
    from sim.paths import resolve_user_path
    m = scn.model
    if m.config:
        spec = load_model_config(resolve_user_path(m.config, scn.base_dir()), name=None if m.name == "llama-2-7b"
                                 else m.name)
    else:
        spec = get_model(m.name)
    return with_dtype(spec, m.dtype) if m.dtype else spec


def build_section(scn: Scenario, section: str):
    """Build one free-form section of a scenario (policy, costmodel or workload): where its keys get checked."""
    if section == "policy":
        return build_policy(scn.policy)
    if section == "costmodel":
        return scenario_costmodel(scn, scenario_model(scn), get_gpu(scn.hardware.gpu))
    return build_workload(scn.workload, np.random.default_rng(scn.seed))


def requests_from_table(df) -> list:
    cols = df.columns
    cls = df["cls"].to_numpy() if "cls" in cols else None
    pred = df["predicted_output_tokens"].to_numpy() if "predicted_output_tokens" in cols else None
    prefix = df["prefix"].to_numpy() if "prefix" in cols else None
    a, p, o = (df[c].to_numpy() for c in ("arrival_s", "prompt_tokens", "output_tokens"))
    return [Request(i, a[i], p[i], o[i], cls=str(cls[i]) if cls is not None else "default",
                    predicted_output_tokens=None if pred is None else pred[i],
                    prefix=None if prefix is None else prefix[i]) for i in range(len(df))]


def build_memory(scn: Scenario, model, policy, M: int):
    """The replica's KV manager: paged, with prefix caching (and a CPU tier) when the scenario or the policy's
    engine turns it on."""
    mem = scn.memory
    kv_per_token = model.kv_bytes_per_token(mem.kv_dtype, scn.hardware.tp)
    swap_tokens = int(mem.swap_space_gib * GiB / kv_per_token)
    caching = mem.prefix_caching
    own_layout = policy.kv_layout(None, None) is not None
    if caching is None:
        caching = policy.prefix_caching_default() and not own_layout
    elif caching and own_layout:
        raise UserError(f"memory.prefix_caching: policy {scn.policy.get('name')!r} runs on its own KV layout; "
                        "prefix caching needs the paged manager (set it false or leave it null)")
    if mem.cpu_offload_gib and not caching:
        raise UserError("memory.cpu_offload_gib: the CPU tier sits behind the prefix cache; "
                        "set memory.prefix_caching: true")
    watermark = policy.watermark_default() if mem.watermark is None else mem.watermark
    if caching:
        from sim.kv.prefix_cache import PrefixCachingKVManager
        cpu_blocks = int(mem.cpu_offload_gib * GiB // (kv_per_token * mem.block_size))
        return PrefixCachingKVManager(M, mem.block_size, watermark, swap_tokens, cpu_cache_blocks=cpu_blocks)
    return KVCacheManager(M, mem.block_size, watermark, swap_tokens)


def build_simulation(scn: Scenario, requests=None) -> Simulation:
    load_extensions()              # in sweep workers too: a spawned process starts without them
    model = scenario_model(scn)
    gpu = get_gpu(scn.hardware.gpu)
    model.check_tp(scn.hardware.tp)
    cm = scenario_costmodel(scn, model, gpu)
    policy = build_policy(scn.policy)
    breakdown = memory_breakdown(scn, model, gpu, policy, cm)
    M = breakdown.kv_tokens if breakdown is not None else capacity_tokens(scn, model, gpu)
    if requests is None:
        rng = np.random.default_rng(scn.seed)
        requests = requests_from_table(build_workload(scn.workload, rng))
    memory = build_memory(scn, model, policy, M)
    if scn.memory.kv_quant_bits != 16:
        from sim.kv.quant import quantize_kv
        quantize_kv(memory, scn.memory.kv_quant_bits, kv_dtype=scn.memory.kv_dtype)
    s = scn.sim
    sim = Simulation(requests, policy, cm, memory, max_iterations=s.max_iterations,
                     watchdog_iterations=s.watchdog_iterations, keep_token_times=s.keep_token_times,
                     record_iterations=s.record_iterations, fast_forward=s.fast_forward,
                     max_model_len=scn.model.max_model_len or model.max_context)
    sim.slos = scn.slos()
    sim.policy_name = scn.policy.get("name")     # named in a stuck run's message
    sim.memory_breakdown = breakdown
    return sim
