"""Build one replica from a scenario: model, GPU, KV capacity M, cost model, policy, KV manager and workload."""
from __future__ import annotations

import numpy as np

from costmodels import build_costmodel, get_gpu, get_model, kv_capacity_tokens
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


def capacity_tokens(scn: Scenario, model, gpu) -> int:
    m = scn.memory
    if m.M is not None:
        if m.M <= 0:
            raise UserError(f"memory.M: must be a positive number of KV tokens, got {m.M}")
        return int(m.M)
    return kv_capacity_tokens(model, gpu, scn.hardware.gpu_memory_utilization, scn.hardware.tp,
                              m.activation_reserve_gib * GiB, m.kv_dtype)


def scenario_costmodel(scn: Scenario, model, gpu):
    """The scenario's batch-time model for this model and GPU."""
    cm_spec = dict(scn.costmodel)
    if scn.memory.kv_dtype and "kv_dtype" not in cm_spec:   # quantized KV is paid for in swap/dequant time too
        cm_spec["kv_dtype"] = scn.memory.kv_dtype
    return build_costmodel(cm_spec, model, gpu, scn.hardware.tp)


def build_section(scn: Scenario, section: str):
    """Build one free-form section of a scenario (policy, costmodel or workload): where its keys get checked."""
    if section == "policy":
        return build_policy(scn.policy)
    if section == "costmodel":
        return scenario_costmodel(scn, get_model(scn.model.name), get_gpu(scn.hardware.gpu))
    return build_workload(scn.workload, np.random.default_rng(scn.seed))


def requests_from_table(df) -> list:
    cols = df.columns
    cls = df["cls"].to_numpy() if "cls" in cols else None
    pred = df["predicted_output_tokens"].to_numpy() if "predicted_output_tokens" in cols else None
    a, p, o = (df[c].to_numpy() for c in ("arrival_s", "prompt_tokens", "output_tokens"))
    return [Request(i, a[i], p[i], o[i], cls=str(cls[i]) if cls is not None else "default",
                    predicted_output_tokens=None if pred is None else pred[i]) for i in range(len(df))]


def build_simulation(scn: Scenario, requests=None) -> Simulation:
    load_extensions()              # in sweep workers too: a spawned process starts without them
    model = get_model(scn.model.name)
    gpu = get_gpu(scn.hardware.gpu)
    model.check_tp(scn.hardware.tp)
    M = capacity_tokens(scn, model, gpu)
    cm = scenario_costmodel(scn, model, gpu)
    policy = build_policy(scn.policy)
    if requests is None:
        rng = np.random.default_rng(scn.seed)
        requests = requests_from_table(build_workload(scn.workload, rng))
    kv_per_token = model.kv_bytes_per_token(scn.memory.kv_dtype) / scn.hardware.tp
    memory = KVCacheManager(M, scn.memory.block_size, scn.memory.watermark,
                            int(scn.memory.swap_space_gib * GiB / kv_per_token))
    if scn.memory.kv_quant_bits != 16:
        from sim.kv.quant import quantize_kv
        quantize_kv(memory, scn.memory.kv_quant_bits, kv_dtype=scn.memory.kv_dtype)
    s = scn.sim
    sim = Simulation(requests, policy, cm, memory, max_iterations=s.max_iterations,
                     watchdog_iterations=s.watchdog_iterations, keep_token_times=s.keep_token_times,
                     record_iterations=s.record_iterations, fast_forward=s.fast_forward)
    sim.slos = scn.slos()
    return sim
