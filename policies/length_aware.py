"""Helpers shared by the length-prediction policies: reference latencies from the cost model, JCT SLOs."""
from __future__ import annotations

from costmodels.base import BatchShape

# Request states as sim.request names them (policies sit below sim and do not import it).
WAITING, RUNNING, SWAPPED = "waiting", "running", "swapped"


def prefill_time_s(costmodel, prompt_tokens: int) -> float:
    """One prompt prefilled alone (EconoServe's t_p, ALISE's T_pre)."""
    return costmodel.batch_time(BatchShape(prefill_tokens=[int(prompt_tokens)], prefill_context=[0]))


def decode_step_time_s(costmodel, batch: int = 32, context: int = 512) -> float:
    """One decode iteration of `batch` requests each reading `context` KV tokens (EconoServe's t_g)."""
    return costmodel.batch_time(BatchShape(decode_context=[int(context)] * int(batch)))


def jct_slo_s(costmodel, prompt_tokens: int, output_tokens: int, slo_scale: float = 2.0,
              ref_batch: int = 32, ref_context: int = 512) -> float:
    """EconoServe's per-request JCT SLO = SLO_scale · (t_p + t_g · l_g) (spec econoserve §2.7, ambiguity 2)."""
    return slo_scale * (prefill_time_s(costmodel, prompt_tokens)
                        + decode_step_time_s(costmodel, ref_batch, ref_context) * output_tokens)


def target_forward_size(costmodel, tolerance: float = 0.05, max_tokens: int = 8192) -> int:
    """TFS: the smallest forward size whose token throughput is within `tolerance` of the saturated one
    (the knee of throughput vs forward size, as EconoServe profiles it)."""
    def tput(n):
        return n / costmodel.batch_time(BatchShape(prefill_tokens=[n], prefill_context=[0]))
    best = max(tput(n) for n in range(256, max_tokens + 1, 256))
    for n in range(64, max_tokens + 1, 64):
        if tput(n) >= (1 - tolerance) * best:
            return n
    return max_tokens
