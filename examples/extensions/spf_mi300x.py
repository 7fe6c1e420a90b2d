"""An example servesim extension: a new scheduling policy and a new GPU, registered from outside the package.

    SERVESIM_EXTENSIONS=examples/extensions/spf_mi300x.py servesim run examples/extensions/spf-mi300x.yaml

`spf` is a complete policy written against the policy contract (policies/base.py): it reads the engine's view
and changes state only through the view's actions (reserve, admit, preempt). The engine does the rest: token
generation, completion, KV release, metrics, and the invariants. `mi300x` is a catalog entry from the
datasheet; the roofline cost model prices any catalog model on it with no profiling.
"""
import dataclasses

from costmodels.catalog import GPU, GPUS, GiB
from costmodels.errors import UserError
from policies import Batch, Policy, register_policy
from sim.engine.request import RUNNING

# AMD Instinct MI300X datasheet: 192 GB HBM3 at 5.3 TB/s, 1307 TFLOP/s dense FP16, PCIe Gen5 x16 (64 GB/s each
# way), seven Infinity Fabric links (896 GB/s in all, 448 GB/s each way).
GPUS.setdefault("mi300x", GPU("mi300x", 192 * GiB, 5.3e12, 1307e12, 64e9, 448e9))


class ShortestPromptFirst(Policy):
    """Every running request gets its share first (one decode token, or the rest of its prompt); then waiting
    requests are admitted shortest prompt first, whole prompts only, while the token budget, the running cap
    and KV memory allow. A running request short of KV preempts the newest running request (recompute)."""

    @dataclasses.dataclass
    class Config:
        max_batch_tokens: int = 4096
        max_running: int = 256

        def validate(self, where):
            for name in ("max_batch_tokens", "max_running"):
                if getattr(self, name) < 1:
                    raise UserError(f"{where}.{name}: must be >= 1, got {getattr(self, name)}")

    def infeasible_reason(self, req, capacity_tokens, block_size):
        if req.prompt_tokens > self.config.max_batch_tokens:
            return f"prompt of {req.prompt_tokens} tokens exceeds max_batch_tokens = {self.config.max_batch_tokens}"
        return super().infeasible_reason(req, capacity_tokens, block_size)

    def schedule(self, view) -> Batch:
        batch, budget = Batch(), self.config.max_batch_tokens
        for r in list(view.running):                 # oldest first
            if r.state != RUNNING:                   # preempted earlier in this step
                continue
            prefill = r.cached < r.input_tokens
            c = r.input_tokens - r.cached if prefill else 1
            if c > budget - batch.num_tokens:
                continue
            while not view.reserve(r, r.cached + c):
                victim = view.running[-1]
                view.preempt(victim, mode="recompute", front=True)
                if victim is r:
                    break
            if r.state == RUNNING:
                batch.add(r, c, prefill)
        for r in sorted(view.waiting, key=lambda q: (q.input_tokens, q.arrival_s, q.id)):
            if len(view.running) >= self.config.max_running:
                break
            if r.input_tokens > budget - batch.num_tokens:
                continue
            if not view.admit(r, r.input_tokens):
                break                                # KV full: the rest waits for completions
            batch.add(r, r.input_tokens, True)
        return batch


register_policy("spf", ShortestPromptFirst, "example extension: shortest prompt first, whole prompts, "
                "preempt the newest on KV shortage")
