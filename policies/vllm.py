"""vLLM v0's scheduler as the engine ran it (vllm/core/scheduler.py, v0.4-0.6): `_schedule_default` and
`_schedule_chunked_prefill`, with v0's defaults. InferMax's model of vLLM (preset `vllm`) is a different system;
vLLM v1 is the unified preset `vllm-v1`.

_schedule_default, one step:
1. With nothing swapped out, admit whole prompts first come first served: stop at the first request that fails
   the block manager's can_allocate (blocks for its whole prompt, leaving the 1% watermark), the token budget
   (max_num_batched_tokens) or max_num_seqs (running requests count).
2. A step that admitted any prompt runs no decodes (the generation stall Sarathi-Serve removes).
3. Otherwise every running request decodes one token, in admission order; one whose next block does not fit
   preempts from the tail of the running queue (or itself, when it is the tail): recompute (blocks freed, the
   request back at the front of the waiting queue) or, with preemption_mode swap, to CPU swap space.
4. If nothing was preempted, swapped requests come back (first come first served, watermark applies) and decode.
_schedule_chunked_prefill: running requests first (decodes one token, unfinished prefills a chunk of the remaining
budget, preempting from the tail as above), then swapped requests if nothing was preempted, then new prompts
chunked to what is left of the budget; every admission still allocates blocks for its whole prompt.

Defaults (EngineArgs of that era): max_num_seqs 256; max_num_batched_tokens max(max_model_len, 2048) without
chunked prefill and 512 with it; block 16 and watermark 0.01 (the scenario's memory section; the preset's
memory.watermark default is 0.01); recompute for single-sequence requests. Prompts longer than
min(max_model_len, max_num_batched_tokens) are refused (infeasible), as v0 ignores them with an error.

Multi-step scheduling (`num_scheduler_steps` n > 1, vLLM 0.6's --num-scheduler-steps, without chunked prefill as
0.6.0 had it): one scheduling decision on decodes runs n forward steps: every request of the decision (running decodes and swap-ins)
decodes in the n − 1 steps that follow, with no admission, swap-in or preemption in between, so a request arriving
meanwhile waits for the window to end. A decision that admits prompts runs one step, as v0 gives prefills no
lookahead slots without chunked prefill. Blocks for the n − 1 lookahead tokens are reserved with the decision (v0's lookahead slots; where they do
not fit the window is one step). The tokens of a window reach the client when it ends (the engine holds them:
Batch.hold_output), and a request whose last token falls inside it completes then. Only the decision's step
pays the engine's per-step CPU time (Batch.scheduled). Not modelled: requests that finish inside a window stop
costing GPU time at once (the engine ran them to the window's end).

Not modelled: delay_factor (0 by default), beam search and n > 1 (always one sequence per request), partial-prefill
limits of the late-v0 chunked scheduler, and v0's abort when swap space runs out (here it recomputes instead)."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.errors import UserError
from policies.base import Batch, Policy, register_policy

_RUNNING, _SWAPPED, _WAITING = "running", "swapped", "waiting"
_RUNNING_STATE = "running"           # Request.state of a request on the GPU (sim/engine/request.py)


@dataclass
class V0Config:
    max_num_seqs: int = 256              # running requests at most
    max_num_batched_tokens: int = 0      # 0: v0's rule (max(max_model_len, 2048); 512 with chunked prefill)
    max_model_len: int = 0               # 0: the served model's context length (vLLM derives it from the model)
    enable_chunked_prefill: bool = False  # decode-first steps with prompts chunked to the budget
    preemption_mode: str = "recompute"   # v0 recomputes single-sequence requests; "swap" forces swapping out
    watermark: float = 0.01              # the block manager's admission watermark (memory.watermark: null uses it)
    prefix_caching: bool = False         # enable_prefix_caching (off by default in v0)
    num_scheduler_steps: int = 1         # forward steps per scheduling decision (vLLM 0.6 multi-step; 1: off)

    def validate(self, where="policy"):
        for k, low in (("max_num_seqs", 1), ("max_model_len", 0)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{where}.{k}: must be an integer >= {low}, got {v!r}")
        v = self.max_num_batched_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UserError(f"{where}.max_num_batched_tokens: must be an integer >= 0 (0: v0's default), got {v!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise UserError(f"{where}.preemption_mode: {self.preemption_mode!r} is not allowed; allowed: recompute, swap")
        if not 0 <= self.watermark < 1:
            raise UserError(f"{where}.watermark: must be in [0, 1), got {self.watermark!r}")
        v = self.num_scheduler_steps
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{where}.num_scheduler_steps: must be an integer >= 1, got {v!r}")
        if v > 1 and self.enable_chunked_prefill:
            raise UserError(f"{where}.num_scheduler_steps: multi-step scheduling runs without chunked prefill here "
                            "(as in vLLM 0.6.0); set enable_chunked_prefill false or num_scheduler_steps 1")


class VLLMv0Scheduler(Policy):
    """vLLM v0: prefill-prioritising whole-prompt admission, or decode-first chunked prefill (see module doc)."""

    name = "vllm-v0"
    Config = V0Config

    def __init__(self, config=None, **knobs):
        super().__init__(config, **knobs)
        self._limits(self.config.max_model_len or 4096)
        self._window: list = []          # multi-step: the requests of the current decision
        self._steps_left = 0             # ... and the forward steps it still runs after this one
        self.windows = 0                 # decisions that ran more than one step

    def _limits(self, max_model_len: int) -> None:
        c = self.config
        chunk_default = 512 if c.enable_chunked_prefill else max(max_model_len, 2048)
        self.budget = c.max_num_batched_tokens or chunk_default
        self.prompt_limit = max_model_len if c.enable_chunked_prefill else min(max_model_len, self.budget)

    def prepare(self, costmodel) -> None:
        """max_model_len 0 takes the served model's context, as vLLM does (and with it v0's token budget)."""
        model = getattr(costmodel, "model", None)
        if not self.config.max_model_len and model is not None:
            self._limits(model.max_context)

    def watermark_default(self) -> float:
        return self.config.watermark

    def profile_batch(self):
        return self.budget, self.config.max_num_seqs

    def infeasible_reason(self, req, capacity_tokens, block_size):
        why = super().infeasible_reason(req, capacity_tokens, block_size)
        if why:
            return why
        if req.prompt_tokens > self.prompt_limit:
            return (f"prompt longer than vLLM v0's prompt limit min(max_model_len, max_num_batched_tokens) = "
                    f"{self.prompt_limit} (ignored with an error)")
        return None

    # -- steady decode: the engine may fast-forward ---------------------------------------------------------
    def steady_decode(self, view, after_full_decode):
        """Only decodes run, and a queued request stays blocked: its cause (KV, budget, max_num_seqs) persists while
        KV only shrinks and nothing completes; a swapped request would come back only after a step without
        preemption, which a steady stretch is, so none may be swapped."""
        if view.swapped or len(view.running) > self.budget or self.config.num_scheduler_steps > 1:
            return False
        if view.waiting and not after_full_decode:
            return False
        return all(r.cached >= r.input_tokens for r in view.running)

    # -- one step ------------------------------------------------------------------------------------------
    def schedule(self, view) -> Batch:
        if self.config.num_scheduler_steps > 1:
            return self._multi_step(view)
        return self._decide(view)

    def _multi_step(self, view) -> Batch:
        """A step of a multi-step window: the decision's requests decode again; or a new decision."""
        if self._steps_left:
            self._steps_left -= 1
            batch = Batch()
            for r in self._window:
                if r.state == _RUNNING_STATE and r.cached >= r.input_tokens:
                    batch.add(r, 1, False)      # blocks were reserved with the decision (lookahead)
            batch.scheduled = False
            batch.hold_output = self._steps_left > 0 and bool(batch.reqs)
            return batch
        batch = self._decide(view)
        if not batch.reqs or batch.num_prefill_tokens:
            return batch                        # v0 runs a step with prompts as a single step (no lookahead slots)
        extra = self.config.num_scheduler_steps - 1
        grown = [r for r, c in zip(batch.reqs, batch.tokens) if view.reserve(r, r.cached + c + extra)]
        if len(grown) == len(batch.reqs):       # lookahead slots for every request: a window of n steps
            self._window = list(batch.reqs)
            self._steps_left = extra
            batch.hold_output = True
            self.windows += 1
        return batch

    def _decide(self, view) -> Batch:
        batch = Batch()
        st = {"tokens": 0, "seqs": len(view.running), "preempted": False}
        if self.config.enable_chunked_prefill:
            self._running(view, batch, st, chunking=True)
            if not st["preempted"]:
                self._swapped(view, batch, st)
            self._prefills(view, batch, st, chunking=True)
            return batch
        if not view.swapped:
            self._prefills(view, batch, st, chunking=False)
        if not batch.reqs:
            self._running(view, batch, st, chunking=False)
            if not st["preempted"]:
                self._swapped(view, batch, st)
        return batch

    def _prefills(self, view, batch, st, chunking):
        """_schedule_prefills: whole prompts (or their first chunk), first come first served, stop at the first
        that does not fit."""
        while view.waiting:
            r = view.waiting[0]
            if view.prefix_caching and r.state == _WAITING:
                view.lookup_prefix(r)
            need = r.input_tokens - r.cached
            left = self.budget - st["tokens"]
            c = min(need, left) if chunking else need
            if c <= 0 or (not chunking and need > left) or st["seqs"] + 1 > self.config.max_num_seqs:
                return
            # can_allocate: blocks for the whole prompt, leaving the watermark (admit applies it)
            if not view.admit(r, max(r.input_tokens, r.cached + c)):
                return
            r.sched_stamp = view.iteration
            batch.add(r, c, True)
            st["tokens"] += c
            st["seqs"] += 1

    def _running(self, view, batch, st, chunking):
        """_schedule_running: every running request in admission order; one that cannot grow preempts the tail."""
        stamp = view.iteration
        i = 0
        while i < len(view.running):
            r = view.running[i]
            if r.sched_stamp == stamp:
                i += 1
                continue
            decode = r.cached >= r.input_tokens
            left = self.budget - st["tokens"]
            if decode:
                c = 1 if left >= 1 else 0
            else:
                c = min(r.input_tokens - r.cached, left) if chunking else 0
            if c <= 0:
                i += 1
                continue
            placed = True
            while not view.reserve(r, r.cached + c):
                victim = self._tail(view, stamp)
                self._preempt(view, victim, stamp, st)
                if victim is r:
                    placed = False
                    break
            if not placed:
                continue                # r left the running list: index i now names the next one
            r.sched_stamp = stamp
            batch.add(r, c, not decode)
            st["tokens"] += c
            i += 1

    def _swapped(self, view, batch, st):
        """_schedule_swapped: swapped requests come back first come first served while blocks (and the
        watermark) allow; they decode in this step."""
        while view.swapped:
            r = view.swapped[0]
            decode = r.cached >= r.input_tokens
            c = 1 if decode else min(r.input_tokens - r.cached, self.budget - st["tokens"])
            if c <= 0 or st["tokens"] + c > self.budget or st["seqs"] + 1 > self.config.max_num_seqs:
                return
            if not view.swap_in(r, r.cached + c):
                return
            r.sched_stamp = view.iteration
            batch.add(r, c, not decode)
            st["tokens"] += c
            st["seqs"] += 1

    @staticmethod
    def _tail(view, stamp):
        for r in reversed(view.running):
            if r.sched_stamp != stamp:
                return r
        return None

    def _preempt(self, view, r, stamp, st):
        view.preempt(r, mode=self.config.preemption_mode, front=True)
        r.sched_stamp = stamp
        st["preempted"] = True
        st["seqs"] -= 1


register_policy("vllm-v0", VLLMv0Scheduler, "vLLM v0 as the engine ran it: whole-prompt FCFS admission with the 1% "
                "watermark, prefill-only steps, tail preemption (recompute), swapped before waiting; "
                "max_num_seqs=256, max_num_batched_tokens=max(max_model_len, 2048)")
register_policy("vllm-v0-chunked", VLLMv0Scheduler, "vLLM v0 with enable_chunked_prefill: running first, then "
                "swapped, then new prompts chunked to the remaining budget (max_num_batched_tokens=512)",
                enable_chunked_prefill=True)
