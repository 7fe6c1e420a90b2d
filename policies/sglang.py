"""SGLang's scheduler as the engine runs it (python/sglang/srt/managers/: scheduler.py, schedule_policy.py,
schedule_batch.py; mem_cache/radix_cache.py), on the radix-tree prefix cache (sim/kv/radix.py).

One step:
1. A prefill batch is formed if it can be (get_new_batch_prefill); then the step runs prefills only, and the
   running decodes wait (mixed chunks are off by default). The request whose prompt is being chunked goes first,
   with the next chunk. Waiting requests are then taken in queue order, stopping at the first that does not fit:
   - order: `fcfs` (SGLang's default schedule_policy) leaves the queue as it is; `lpm` sorts it by the longest
     cached prefix first (stable), except when more than 128 requests wait: then it is left unsorted, as SGLang
     turns prefix matching off above that queue length (schedule_policy.py, _determine_active_policy);
   - the budgets (PrefillAdder): rem_total = free + evictable KV tokens minus, for every running request, its
     remaining output (clipped at 4096) times the new-token ratio; a request needs its uncached prompt plus its
     remaining output (clipped) to stay below rem_total; the step's prompt tokens stay within max_prefill_tokens
     (16384; a first request may exceed it) and within chunked_prefill_size, the last admitted prompt being cut to
     what is left of it (it continues as the chunked request next step);
   - no more than max_running_requests run at once.
2. Otherwise every running request decodes one token (1 + drafts with speculative decoding). If their next KV
   slots do not fit (check_decode_mem), requests are retracted (retract_decode): fewest output tokens first (ties:
   the longest prompt), at least one, until the free KV covers retract_decode_steps (20) tokens for each request
   left; their KV is released into the radix cache and they rejoin the end of the waiting queue. The new-token
   ratio becomes min(1, (tokens decoded so far + 20 × requests left) / their output lengths); a step without
   retraction lowers it by (0.7 − 0.7 × 0.14) / 600 down to 0.7 × 0.14, and an idle engine resets it to 0.7.

Defaults, checked against SGLang's public source on 2026-11-26: chunked_prefill_size by GPU memory as
_handle_gpu_memory_settings picks it (arg_groups/memory_hook.py: 2048 below 20 GiB, 4096 below 60 GiB, 8192 below
160 GiB, else 16384; 4096 for an unknown GPU); max_running_requests from the KV pool, M // 2, capped by the request
pool (model_runner.py: min(max(M / context × 512, 2048), 4096)); the new-token ratio 0.7, its floor factor 0.14,
600 decay steps, retract_decode_steps 20 and the 4096 clip (environ.py: SGLANG_INIT_NEW_TOKEN_RATIO,
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_RETRACT_DECODE_STEPS,
SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION). A request's max_new_tokens is taken to be its output length (benchmarks
send max_tokens = the output length). Not modelled: in-batch prefix de-prioritisation, priority scheduling, the
overlap scheduler, mixed chunks, page sizes other than memory.block_size, SGLang's own pool sizing (a derived M
follows vLLM's profiling rule at the chunk size and 1024 sequences; give memory.M to match a deployment)."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy

_RUNNING, _WAITING = "running", "waiting"
SCHEDULE_POLICIES = ("fcfs", "lpm")


@dataclass
class SGLangConfig:
    schedule_policy: str = "fcfs"        # fcfs (SGLang's default) or lpm (longest cached prefix first)
    lpm_queue_limit: int = 128           # above this many waiting requests LPM does not sort (SGLang: fixed 128)
    chunked_prefill_size: int = -1       # -1: ServerArgs' choice by GPU memory; 0: no chunking
    max_prefill_tokens: int = 16384      # prompt tokens per prefill batch
    max_running_requests: int = 0        # 0: from the KV pool (M // 2, capped by the request pool)
    init_new_token_ratio: float = 0.7    # global_config.default_init_new_token_ratio (× schedule_conservativeness 1)
    min_new_token_ratio_factor: float = 0.14   # the ratio's floor as a fraction of its start
    new_token_ratio_decay_steps: int = 600     # decode steps from the start to the floor
    retract_decode_steps: int = 20             # decode tokens per request the KV left after a retraction covers
    clip_max_new_tokens: int = 4096      # CLIP_MAX_NEW_TOKENS_ESTIMATION
    prefix_caching: bool = True          # the radix cache (off: --disable-radix-cache)

    def validate(self, where="policy"):
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise UserError(f"{where}.schedule_policy: {self.schedule_policy!r} is not allowed; allowed: "
                            f"{', '.join(SCHEDULE_POLICIES)}")
        for k, low in (("lpm_queue_limit", 0), ("chunked_prefill_size", -1), ("max_prefill_tokens", 1),
                       ("max_running_requests", 0), ("new_token_ratio_decay_steps", 1), ("retract_decode_steps", 1),
                       ("clip_max_new_tokens", 1)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{where}.{k}: must be an integer >= {low}, got {v!r}")
        for k in ("init_new_token_ratio", "min_new_token_ratio_factor"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise UserError(f"{where}.{k}: must be in [0, 1], got {v!r}")


def chunk_default(gpu_mem_bytes: float | None) -> int:
    """ServerArgs' chunked_prefill_size for a GPU of this memory (4096 when the GPU is unknown): SGLang's
    _handle_gpu_memory_settings (python/sglang/srt/arg_groups/memory_hook.py, earlier in server_args.py) picks 2048
    below 20 GiB, 4096 below 60 GiB (20-35 GiB cards were 2048 before SGLang raised them), 8192 below 160 GiB,
    else 16384."""
    if gpu_mem_bytes is None:
        return 4096
    gib = gpu_mem_bytes / 1024 ** 3
    for limit, size in ((20, 2048), (60, 4096), (160, 8192)):
        if gib < limit:
            return size
    return 16384


class SGLangScheduler(Policy):
    """SGLang: prefill batches first (FCFS or longest prefix match), new-token-ratio admission, decode retraction."""

    name = "sglang"
    Config = SGLangConfig
    speculative_decoding = True         # decodes take view.spec_tokens drafts
    radix_cache = True                  # the engine builds the radix-tree manager when prefix caching is on

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        c = self.config
        self.ratio = c.init_new_token_ratio
        self.min_ratio = c.init_new_token_ratio * c.min_new_token_ratio_factor
        self.decay = (c.init_new_token_ratio - self.min_ratio) / c.new_token_ratio_decay_steps
        self.chunk = c.chunked_prefill_size if c.chunked_prefill_size >= 0 else 8192
        self.context = 4096
        self.max_running = c.max_running_requests or 4096
        self.stats = {"sglang_prefill_steps": 0, "sglang_decode_steps": 0, "sglang_lpm_sorts": 0,
                      "sglang_lpm_fallbacks": 0, "sglang_retractions": 0, "sglang_retracted_requests": 0,
                      "sglang_chunked_prompts": 0}

    def prepare(self, costmodel) -> None:
        gpu, model = getattr(costmodel, "gpu", None), getattr(costmodel, "model", None)
        if self.config.chunked_prefill_size == -1:
            self.chunk = chunk_default(gpu.mem_bytes if gpu is not None else None)
        if model is not None:
            self.context = model.max_context

    def profile_batch(self):
        """What sizes a derived M: vLLM's profiling rule at the chunk size and 1024 sequences (SGLang itself sizes
        its pool by mem_fraction_static; give memory.M to match a deployment)."""
        return (self.chunk or self.config.max_prefill_tokens), self.config.max_running_requests or 1024

    def bind(self, view) -> None:
        if not self.config.max_running_requests:
            M = view.memory.capacity_tokens
            pool = min(max(int(M / self.context * 512), 2048), 4096)
            self.max_running = max(1, min(M // 2, pool))

    def watermark_default(self) -> float:
        return 0.0

    # -- one step ----------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        batch = Batch()
        if view.waiting or any(r.cached < r.input_tokens for r in view.running):
            self._prefill(view, batch)
            if batch.reqs:
                self.stats["sglang_prefill_steps"] += 1
                return batch
        if view.running:
            self._decode(view, batch)
        if batch.reqs:
            self.stats["sglang_decode_steps"] += 1
        elif not view.running:
            self.ratio = self.config.init_new_token_ratio      # idle: the estimate starts over
        return batch

    def _order(self, view) -> None:
        """LPM: the waiting queue sorted by cached prefix, longest first (stable), unless it is too long."""
        if self.config.schedule_policy != "lpm" or not view.prefix_caching:
            return
        if len(view.waiting) > self.config.lpm_queue_limit:
            self.stats["sglang_lpm_fallbacks"] += 1
            return
        ranked = sorted(view.waiting, key=lambda r: -view.lookup_prefix(r))
        view.waiting.clear()
        view.waiting.extend(ranked)
        self.stats["sglang_lpm_sorts"] += 1

    def _prefill(self, view, batch) -> None:
        c, mem = self.config, view.memory
        clip = c.clip_max_new_tokens
        rem_total = mem.free_blocks * mem.block_size - sum(
            min(r.output_tokens - r.generated, clip) * self.ratio for r in view.running)
        rem_input = c.max_prefill_tokens
        rem_chunk = self.chunk or (1 << 40)
        stamp = view.iteration
        for r in view.running:                  # the request being chunked: its next chunk first
            if r.cached < r.input_tokens:
                n = min(r.input_tokens - r.cached, rem_chunk)
                if n <= 0 or not view.reserve(r, r.cached + n):
                    return
                r.sched_stamp = stamp
                batch.add(r, n, True)
                rem_input -= n
                rem_chunk -= n
                rem_total -= n + (min(r.output_tokens - r.generated, clip) if n == r.input_tokens - r.cached else 0)
        if not view.waiting:
            return
        self._order(view)
        running = len(view.running)
        for r in list(view.waiting):
            if rem_total <= 0 or rem_input <= 0 or rem_chunk <= 0 or running >= self.max_running:
                return
            if view.prefix_caching:
                view.lookup_prefix(r)
            extend = r.input_tokens - r.cached
            out = min(r.output_tokens - r.generated, clip)
            if extend + out >= rem_total:
                return                           # NO_TOKEN: the budget says the pool could run short
            if extend > rem_input and batch.reqs:
                return
            if extend <= rem_chunk:
                n = extend
            else:                                # the last one this step: cut to the chunk left, page-aligned
                n = rem_chunk - rem_chunk % mem.block_size if rem_chunk >= mem.block_size else rem_chunk
                out = 0
                self.stats["sglang_chunked_prompts"] += 1
            if n <= 0 or not view.admit(r, r.cached + n):
                return
            r.sched_stamp = stamp
            batch.add(r, n, True)
            running += 1
            rem_total -= n + out
            rem_input -= n
            rem_chunk -= n

    def _decode(self, view, batch) -> None:
        c, mem = self.config, view.memory
        spec = getattr(view, "spec_tokens", 0)

        def tokens(r):             # (no drafts before a request's first token: a P/D decode side's first step)
            return 1 + min(spec, r.output_tokens - r.generated - 1) if spec and r.generated else 1

        decodes = [r for r in view.running if r.cached >= r.input_tokens]
        need = sum(max(0, mem.blocks_for(r.cached + tokens(r)) - r.blocks) for r in decodes)
        if need > mem.free_blocks and len(decodes) > 1:
            self._retract(view, decodes)
            decodes = [r for r in view.running if r.cached >= r.input_tokens]
        else:
            self.ratio = max(self.ratio - self.decay, self.min_ratio)
        stamp = view.iteration
        for r in decodes:
            t = tokens(r)
            if not view.reserve(r, r.cached + t):
                t = 1                            # the drafts do not fit: the plain token only
                if not view.reserve(r, r.cached + 1):
                    view.preempt(r, mode="recompute", front=False)
                    self.stats["sglang_retracted_requests"] += 1
                    continue
            r.sched_stamp = stamp
            batch.add(r, t, False)

    def _retract(self, view, decodes) -> None:
        """retract_decode: fewest output tokens first (ties: longest prompt), at least one, until the free KV covers
        retract_decode_steps tokens for each request left; then the new-token ratio is re-estimated."""
        c, mem = self.config, view.memory
        order = sorted(decodes, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        first = True
        while len(order) > 1 and (first or mem.free_blocks * mem.block_size < c.retract_decode_steps * len(order)):
            first = False
            victim = order.pop()
            view.preempt(victim, mode="recompute", front=False)
            self.stats["sglang_retracted_requests"] += 1
        self.stats["sglang_retractions"] += 1
        decoded = sum(r.generated for r in order)
        budget = sum(r.output_tokens for r in order)
        self.ratio = min(1.0, (decoded + c.retract_decode_steps * len(order)) / budget) if budget else 1.0


register_policy("sglang", SGLangScheduler, "SGLang as the engine runs it: prefill batches first, FCFS, radix-tree "
                "prefix cache (LRU leaf eviction), chunked prefill (by GPU memory), new-token-ratio admission "
                "(0.7 decaying to 0.098), decode retraction (fewest output tokens first)")
register_policy("sglang-lpm", SGLangScheduler, "SGLang with --schedule-policy lpm: the waiting queue sorted by "
                "the longest cached prefix, left unsorted while more than 128 requests wait",
                schedule_policy="lpm")
