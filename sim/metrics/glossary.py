"""What each run-summary column means and its unit (printed by `servesim run`; docs/reference/glossary.md is
generated from it by docs/gen_tables.py)."""
from __future__ import annotations

# name: (unit, meaning). Percentile columns follow their mean's unit: ttft_p99 is the 99th percentile over requests.
GLOSSARY = {
    "requests": ("requests", "requests in the workload"),
    "completed": ("requests", "requests that produced all their output tokens"),
    "infeasible": ("requests", "requests that can never run (longer than the model's context, or their KV cannot "
                               "fit in M); refused up front, as vLLM refuses them"),
    "makespan_s": ("s", "first arrival to last completion"),
    "tps": ("tokens/s", "generated (output) tokens per second of makespan"),
    "request_throughput": ("req/s", "completed requests per second of makespan"),
    "ttft_mean": ("s", "time to first token: arrival to the first output token (plus front-end time when the cost "
                       "model has overheads), mean over completed requests"),
    "ttft_p99": ("s", "99th percentile of TTFT over completed requests"),
    "tpot_mean": ("s/token", "time per output token after the first: (completion − first token) / (output − 1)"),
    "tbt_p99_p99": ("s", "each request's 99th-percentile gap between consecutive tokens, then the 99th percentile of "
                         "that over requests"),
    "e2e_mean": ("s", "end-to-end latency: arrival to the last token"),
    "tbt_p99_mean": ("s", "each request's 99th-percentile gap between consecutive tokens, mean over requests"),
    "normalized_latency_mean": ("s/token", "end-to-end latency divided by the request's output tokens"),
    "queueing_mean": ("s", "arrival to the first time the request was scheduled"),
    "generated_tokens": ("tokens", "output tokens generated over the run"),
    "evicted_tokens": ("tokens", "KV tokens dropped by evictions (computed again later)"),
    "truncated": ("flag", "1 if the run stopped at sim.max_iterations before every request finished"),
    "evictions": ("count", "preemptions that dropped KV (recomputed later)"),
    "swaps": ("count", "preemptions that moved KV to CPU memory"),
    "batch_size_mean": ("requests", "requests per iteration, mean over iterations"),
    "running_mean": ("requests", "requests holding KV on the GPU, mean over iterations"),
    "kv_util_mean": ("fraction of M", "KV tokens allocated over the capacity M, mean over iterations"),
    "kv_util_max": ("fraction of M", "the largest KV allocation over M"),
    "slo_attainment": ("fraction", "share of requests that completed and met every SLO target of their class; "
                                   "'no SLO set' when the scenario sets none"),
    "goodput_rps": ("req/s", "requests meeting their SLO per second of makespan"),
    "iterations": ("count", "engine steps (forward passes)"),
    "replicas": ("count", "replicas in a cluster"),
    "gpus": ("count", "GPUs in a cluster (replicas × tensor-parallel degree)"),
    "gpu_seconds": ("GPU·s", "GPUs × makespan"),
    "goodput_rps_per_gpu": ("req/s per GPU", "goodput divided by the GPUs"),
    "load_imbalance": ("ratio", "busiest replica's busy time over the mean replica's (1 = even)"),
    "kv_transfer_s_mean": ("s", "disaggregated: mean KV transfer time from prefill to decode replica"),
    "kv_transfer_share": ("fraction", "disaggregated: KV transfer time over end-to-end latency, summed"),
    "handoff_wait_s_mean": ("s", "disaggregated: time a finished prefill waited for KV room on a decode replica"),
    "prefix_hit_rate": ("fraction", "prompt blocks found in the prefix cache at admissions (GPU or CPU tier)"),
    "autoscale_ups": ("count", "autoscaling: decisions that added a replica (cluster.autoscale)"),
    "autoscale_downs": ("count", "autoscaling: decisions that removed one (drained, or cancelled while loading)"),
    "replicas_held_mean": ("replicas", "autoscaling: replicas held (loading, serving or draining), mean over the "
                                       "makespan"),
    "replicas_held_max": ("replicas", "autoscaling: the most replicas held at once"),
    "gpu_hours": ("GPU·h", "GPUs held × makespan, in hours (every replica is held from first arrival to last "
                           "completion)"),
    "cost_usd": ("USD", "GPU-hours × each GPU's price per hour (profiles/gpu-economics.yaml or "
                        "hardware.usd_per_gpu_hour); '-' when a GPU has no price"),
    "usd_per_million_tokens": ("USD per 1M tokens", "cost over generated (output) tokens, per million"),
    "energy_j": ("J", "board energy of every held GPU: each iteration at idle + (peak − idle) × min(1, 1.94·MFU + "
                      "0.88·MBU), idle power between iterations (sim/metrics/economics.py)"),
    "joules_per_token": ("J/token", "energy over generated (output) tokens"),
    "power_w_mean": ("W", "energy over makespan: the fleet's mean board power"),
    "costmodel_kind": ("name", "the batch-time model the run used (linear, roofline, profiled; '(auto)': the "
                               "default kind chose it for the GPU and model)"),
    "costmodel_file": ("path", "the fitted file its coefficients came from (profiles/...), or built-in"),
    "overheads": ("name", "the CPU/front-end overheads preset charged (profiles/overheads.yaml), custom, or none"),
    "kv_capacity_tokens": ("tokens", "KV capacity M the run had (a cluster: summed over its replicas)"),
    "wall_s": ("s", "host time the simulation took (not simulated time)"),
    "spec_steps": ("count", "speculative decoding: verify passes that checked at least one draft token"),
    "spec_drafts_proposed": ("tokens", "speculative decoding: draft tokens verified by the target model"),
    "spec_drafts_accepted": ("tokens", "speculative decoding: draft tokens the target accepted"),
    "spec_acceptance": ("fraction", "speculative decoding: accepted over proposed draft tokens"),
    "spec_tokens_per_step": ("tokens", "speculative decoding: output tokens per verify pass (accepted + 1, "
                                       "capped by what the request had left)"),
    "spec_full_steps": ("count", "speculative decoding: verify passes with all k drafts"),
    "spec_full_tokens_per_step": ("tokens", "speculative decoding: output tokens per verify pass with all k drafts "
                                            "(expected (1 - a^(k+1)) / (1 - a) at acceptance rate a)"),
    "spec_freed_blocks": ("blocks", "speculative decoding: KV blocks of rejected draft tokens released"),
    "spec_draft_time_s": ("s", "speculative decoding: time the drafter added to the steps, summed"),
    "radix_evicted_leaves": ("blocks", "SGLang radix cache: cached blocks evicted (least recently used unreferenced "
                                       "leaves)"),
    "radix_cached_blocks": ("blocks", "SGLang radix cache: blocks cached (in use or evictable) at the end"),
    "lora_loads_from_host": ("count", "multi-LoRA: adapters loaded into a GPU slot from host memory"),
    "lora_loads_from_disk": ("count", "multi-LoRA: adapters read from disk (host memory did not hold them), then loaded"),
    "lora_load_time_s": ("s", "multi-LoRA: step time spent loading adapters, summed"),
    "lora_compute_time_s": ("s", "multi-LoRA: step time of the adapters' GEMMs, summed"),
    "lora_skipped_admissions": ("count", "multi-LoRA: times a waiting request was passed over because its adapter "
                                         "would exceed max_loras (once per request per step)"),
    "lora_adapters_per_step": ("count", "multi-LoRA: distinct adapters per step that ran any, mean"),
    "session_turns_released": ("count", "closed-loop sessions: turns sent after the previous turn completed"),
    "session_turns_abandoned": ("count", "closed-loop sessions: turns never sent because an earlier turn of the "
                                         "session could not run"),
    "session_think_s_mean": ("s", "closed-loop sessions: mean pause between a turn's completion and the next turn"),
}


# Families of columns named by a pattern rather than one by one: (pattern, unit, meaning).
PATTERNS = (
    ("`tpot_*`, `tbt_*`, `e2e_*`, `normalized_latency_*`, `queueing_*`", "s (normalized latency: s/token)",
     "the request table's columns of those names, mean and percentiles over completed requests"),
    ("`slo_attainment_<class>`", "fraction", "attainment within one request class"),
    ("`policy_<counter>`", "count", "how often a policy's own mechanism fired (hidden-cache decodes, lent KV blocks, "
                                    "offloads, promotions, ...)"),
    ("`prefix_gpu_hit_tokens`, `prefix_cpu_hit_tokens`, `prefix_disk_hit_tokens`, `prefix_evicted_blocks`, "
     "`prefix_disk_writes`", "tokens / blocks",
     "prefix caching: prompt tokens found in the GPU cache, the CPU tier and the disk tier, cached blocks evicted "
     "from the GPU, blocks the CPU tier demoted to disk"),
)


def unit(name: str) -> str:
    """The unit of a summary column (percentiles and per-class attainments share their base column's)."""
    if name.startswith("slo_attainment_"):
        return GLOSSARY["slo_attainment"][0]
    if name in GLOSSARY:
        return GLOSSARY[name][0]
    base = name.rsplit("_p", 1)[0]
    for key in (base + "_mean", base):
        if key in GLOSSARY:
            return GLOSSARY[key][0]
    return ""
