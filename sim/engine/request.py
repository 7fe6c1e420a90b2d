"""Per-request state: the InferMax state machine (phase by m ≥ I, refill after eviction) and its timestamps."""
from __future__ import annotations

WAITING, RUNNING, SWAPPED, DONE, INFEASIBLE = "waiting", "running", "swapped", "done", "infeasible"


class Request:
    """One request. `input_tokens` (I) grows on decode-phase eviction; `cached` (m) is its KV on the GPU."""

    __slots__ = ("id", "arrival_s", "prompt_tokens", "output_tokens", "cls", "predicted_output_tokens",
                 "slo_ttft_s", "slo_tbt_s", "input_tokens", "cached", "generated", "state", "blocks",
                 "swap_blocks", "sched_stamp", "first_scheduled_s", "first_token_s", "completion_s",
                 "last_token_s", "token_times", "spans", "evictions", "swaps", "evicted_tokens", "reason", "meta",
                 "tbt", "cohort", "prefix", "chain", "hit", "hit_tokens", "after", "think_s", "followers", "adapter",
                 "seq")

    def __init__(self, id, arrival_s, prompt_tokens, output_tokens, cls="default", predicted_output_tokens=None,
                 slo_ttft_s=None, slo_tbt_s=None, prefix=None):
        self.id = int(id)
        self.arrival_s = float(arrival_s)
        self.prompt_tokens = int(prompt_tokens)      # I0
        self.output_tokens = int(output_tokens)      # O
        self.cls = cls
        self.predicted_output_tokens = int(predicted_output_tokens if predicted_output_tokens is not None
                                           else output_tokens)
        self.slo_ttft_s = slo_ttft_s
        self.slo_tbt_s = slo_tbt_s
        self.input_tokens = self.prompt_tokens      # I
        self.cached = 0                             # m
        self.generated = 0
        self.state = WAITING
        self.blocks = 0                             # GPU KV blocks held
        self.swap_blocks = 0                        # CPU blocks held while swapped
        self.sched_stamp = -1                       # iteration in which it was last placed/preempted
        self.first_scheduled_s = None
        self.first_token_s = None
        self.completion_s = None
        self.last_token_s = None
        self.token_times = []
        self.spans = None                           # token times deferred by speculative windows (metrics/tokens.py)
        self.evictions = 0
        self.swaps = 0
        self.evicted_tokens = 0                     # KV tokens thrown away by recompute preemption
        self.reason = None
        self.meta = None                            # free slot for policies (predictions, class data)
        self.tbt = None                             # (mean, p99, max) inter-token gap, set at completion
        self.cohort = None                          # step it joined the engine's decode cohort (sim/engine/cohort.py)
        self.prefix = prefix                        # shared prompt content: ((key, tokens), ...) from the workload
        self.chain = None                           # its KV block identities, built on demand (sim/kv/prefix_cache.py)
        self.hit = None                             # a prefix-cache lookup not yet taken by admission
        self.hit_tokens = -1                        # prompt tokens found cached at its first admission (-1: none)
        self.after = None                           # a session's turn: the turn it follows (arrives think_s after
        self.think_s = 0.0                          # that one completes; sim/engine/sessions.py)
        self.followers = None                       # the turns that follow this one
        self.adapter = -1                           # multi-LoRA: the adapter it runs with (-1: the base model)
        self.seq = -1                               # its place in a replica's request list (rows retired by it)

    @property
    def on_gpu(self) -> bool:
        return self.state == RUNNING

    @property
    def swapped(self) -> bool:
        return self.state == SWAPPED

    @property
    def is_decode(self) -> bool:
        return self.cached >= self.input_tokens

    @property
    def remaining_output(self) -> int:
        return self.output_tokens - self.generated

    def __repr__(self):
        return (f"Request(id={self.id}, I0={self.prompt_tokens}, O={self.output_tokens}, I={self.input_tokens}, "
                f"m={self.cached}, gen={self.generated}, {self.state})")
