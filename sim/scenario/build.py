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
    reqs = [Request(i, a[i], p[i], o[i], cls=str(cls[i]) if cls is not None else "default",
                    predicted_output_tokens=None if pred is None else pred[i],
                    prefix=None if prefix is None else prefix[i]) for i in range(len(df))]
    if "after" in cols:            # closed-loop sessions: a turn follows the row it names (sim/engine/sessions.py)
        after = df["after"].to_numpy()
        think = df["think_s"].to_numpy() if "think_s" in cols else np.zeros(len(df))
        for i, r in enumerate(reqs):
            if after[i] >= 0:
                r.after, r.think_s = reqs[int(after[i])], float(think[i])
    return reqs


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
        radix = getattr(policy, "radix_cache", False)
        if mem.disk_offload_gib:                          # a disk tier under the CPU tier (sim/kv/tiers.py)
            if not mem.cpu_offload_gib:
                raise UserError("memory.disk_offload_gib: the disk tier sits under the CPU tier; set "
                                "memory.cpu_offload_gib > 0")
            from sim.kv.tiers import TieredPrefixKVManager, TieredRadixKVManager
            block_bytes = kv_per_token * mem.block_size
            cls = TieredRadixKVManager if radix else TieredPrefixKVManager
            return cls(M, mem.block_size, watermark, swap_tokens, cpu_cache_blocks=cpu_blocks,
                       disk_blocks=int(mem.disk_offload_gib * GiB // block_bytes),
                       disk_seconds_per_block=block_bytes * scn.hardware.tp / (mem.disk_gb_per_s * 1e9))
        if radix:                                         # SGLang: the radix tree's eviction (sim/kv/radix.py)
            from sim.kv.radix import RadixKVManager
            return RadixKVManager(M, mem.block_size, watermark, swap_tokens, cpu_cache_blocks=cpu_blocks)
        return PrefixCachingKVManager(M, mem.block_size, watermark, swap_tokens, cpu_cache_blocks=cpu_blocks)
    return KVCacheManager(M, mem.block_size, watermark, swap_tokens)


def with_drafter(scn: Scenario, breakdown, model):
    """The KV space left when a speculative drafter shares the GPU: its weights out, its KV in every token's slot."""
    import dataclasses
    import math
    from sim.engine.speculative import drafter_memory, speculative_config
    cfg = speculative_config(scn.speculative, base=scn.base_dir())
    draft = get_model(cfg.draft_model, "speculative.draft_model") if cfg.method == "draft_model" else None
    weights, per_token = drafter_memory(cfg, model, draft, scn.hardware.tp, scn.memory.kv_dtype)
    if not weights and not per_token:
        return breakdown
    room = breakdown.kv_bytes - weights
    if room <= 0:
        raise UserError(f"speculative: the drafter's weights ({weights / GiB:.1f} GiB per GPU) leave no KV space")
    per = breakdown.kv_bytes_per_token + per_token
    return dataclasses.replace(breakdown, weights=breakdown.weights + weights, kv_bytes_per_token=per,
                               kv_tokens=int(math.floor(room / per)))


def with_reserved(breakdown, nbytes: float, what: str):
    """The KV space left after `nbytes` more of GPU memory per GPU are reserved."""
    import dataclasses
    import math
    room = breakdown.kv_bytes - nbytes
    if room <= 0:
        raise UserError(f"{what}: {nbytes / GiB:.1f} GiB per GPU leave no KV space")
    return dataclasses.replace(breakdown, weights=breakdown.weights + nbytes,
                               kv_tokens=int(math.floor(room / breakdown.kv_bytes_per_token)))


def build_lora(scn: Scenario, policy, model, gpu):
    """The engine's multi-LoRA serving from the scenario's `lora:` section, or None when it is empty."""
    from sim.engine.lora import LoRA, lora_config
    cfg = lora_config(scn.lora)
    if cfg is None:
        return None
    if not getattr(policy, "lora_scheduling", False):
        from policies import POLICIES
        able = sorted(n for n, (cls, _, _) in POLICIES.items() if getattr(cls, "lora_scheduling", False))
        raise UserError(f"lora: policy {scn.policy.get('name')!r} does not apply max_loras; allowed: {', '.join(able)}")
    return LoRA(cfg, model, gpu, scn.hardware.tp, scn.seed if cfg.seed is None else cfg.seed)


def build_speculation(scn: Scenario, policy, target_cm, gpu):
    """The engine's speculative decoding from the scenario's `speculative:` section, or None when it is empty."""
    from sim.engine.speculative import Speculation, speculative_config
    cfg = speculative_config(scn.speculative, base=scn.base_dir())
    if cfg is None:
        return None
    name = scn.policy.get("name")
    if not getattr(policy, "speculative_decoding", False):
        from policies import POLICIES
        able = sorted(n for n, (cls, _, _) in POLICIES.items() if getattr(cls, "speculative_decoding", False))
        raise UserError(f"speculative: policy {name!r} does not schedule draft tokens; allowed: {', '.join(able)}")
    if policy.kv_layout(None, None) is not None:
        raise UserError(f"speculative: policy {name!r} runs on its own KV layout; speculation needs the paged manager")
    draft_cm = None
    if cfg.method == "draft_model":
        draft = get_model(cfg.draft_model, "speculative.draft_model")
        draft.check_tp(scn.hardware.tp)
        # the draft's passes run inside the target's engine step: GPU time only, no second scheduler's overheads
        draft_cm = build_costmodel({"kind": "auto", "overheads": None}, draft, gpu, scn.hardware.tp,
                                   "speculative.draft_model")
    return Speculation(cfg, target_cm, scn.seed if cfg.seed is None else cfg.seed, draft_cm)


def build_simulation(scn: Scenario, requests=None) -> Simulation:
    load_extensions()              # in sweep workers too: a spawned process starts without them
    model = scenario_model(scn)
    gpu = get_gpu(scn.hardware.gpu)
    model.check_tp(scn.hardware.tp)
    cm = scenario_costmodel(scn, model, gpu)
    policy = build_policy(scn.policy)
    breakdown = memory_breakdown(scn, model, gpu, policy, cm)
    if breakdown is not None and scn.speculative:
        breakdown = with_drafter(scn, breakdown, model)
    lora = build_lora(scn, policy, model, gpu)
    if breakdown is not None and lora is not None:      # the adapter slots are reserved before the KV cache
        breakdown = with_reserved(breakdown, lora.reserved_bytes(), "lora")
    M = breakdown.kv_tokens if breakdown is not None else capacity_tokens(scn, model, gpu)
    if requests is None:
        rng = np.random.default_rng(scn.seed)
        requests = requests_from_table(build_workload(scn.workload, rng))
    memory = build_memory(scn, model, policy, M)
    if scn.memory.kv_quant_bits != 16:
        from sim.kv.quant import quantize_kv
        quantize_kv(memory, scn.memory.kv_quant_bits, kv_dtype=scn.memory.kv_dtype)
    s = scn.sim
    speculation = build_speculation(scn, policy, cm, gpu)
    sim = Simulation(requests, policy, cm, memory, max_iterations=s.max_iterations,
                     watchdog_iterations=s.watchdog_iterations, keep_token_times=s.keep_token_times,
                     record_iterations=s.record_iterations, fast_forward=s.fast_forward,
                     max_model_len=scn.model.max_model_len or model.max_context, speculation=speculation,
                     lora=lora)
    sim.slos = scn.slos()
    sim.policy_name = scn.policy.get("name")     # named in a stuck run's message
    sim.memory_breakdown = breakdown
    return sim
