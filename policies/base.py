"""The policy contract: read the engine's view, return a Batch; change state only through view actions."""
from __future__ import annotations

import dataclasses
from typing import Any

from costmodels.errors import UserError


class Batch:
    """What runs this iteration: parallel lists of requests and tokens each processes, plus (policies that
    opted in to Policy.decode_cohort) the engine's decode cohort taken whole: its size and Σ(m + 1).
    Multi-step scheduling (one decision, several forward steps): `hold_output` keeps this step's tokens (and
    completions) from the client until a later step that does not hold them; `scheduled` False says no scheduler
    call preceded this step (it repeats the last decision), so the engine charges no per-step CPU time for it."""
    __slots__ = ("reqs", "tokens", "num_tokens", "num_prefill_tokens", "cohort", "cohort_context", "hold_output",
                 "scheduled")

    def __init__(self):
        self.reqs: list = []
        self.tokens: list = []
        self.num_tokens = 0
        self.num_prefill_tokens = 0
        self.cohort = 0                # decode requests of the cohort, one token each (not in reqs)
        self.cohort_context = 0        # Σ(m + 1) over them
        self.hold_output = False       # tokens released at the end of the multi-step window, not now
        self.scheduled = True          # False: a later step of a multi-step window (no scheduler CPU time)

    def add(self, req, tokens: int, is_prefill: bool) -> None:
        self.reqs.append(req)
        self.tokens.append(tokens)
        self.num_tokens += tokens
        if is_prefill:
            self.num_prefill_tokens += tokens

    def __len__(self) -> int:
        return len(self.reqs) + self.cohort


class Policy:
    """Base class. Subclasses declare their knobs as a dataclass `Config` and implement `schedule`.

    The view (built by the engine) offers: now, waiting (deque), running (list, admission order),
    swapped (deque), memory (KV manager), costmodel, iteration, and the actions
    reserve(req, tokens, admission) -> bool, admit(req), preempt(req, mode, front), swap_in(req) -> bool.
    """

    name = "base"
    summary = ""

    @dataclasses.dataclass
    class Config:
        pass

    def __init__(self, config=None, **knobs):
        self.config = config if config is not None else self.make_config(knobs)

    @classmethod
    def make_config(cls, knobs: dict, where: str = "policy", name: str | None = None):
        from policies.vllm_names import policy_hint
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        bad = sorted(set(knobs) - fields)
        if bad:
            raise UserError(f"{where}: unknown knob(s) {', '.join(bad)} for policy {(name or cls.name)!r}; "
                            f"allowed: {', '.join(sorted(fields))}{policy_hint(cls, name or cls.name)}")
        knobs = _typed_knobs(cls.Config, knobs, where)
        cfg = cls.Config(**knobs)
        if hasattr(cfg, "validate"):
            cfg.validate(where)
        return cfg

    # -- hooks --------------------------------------------------------------------------------------------
    def prepare(self, costmodel) -> None:
        """Called once when the simulation is built, before feasibility checks: settle defaults that depend on
        the hardware (vLLM v1 picks its budgets by GPU)."""

    def profile_batch(self) -> tuple[int, int]:
        """(tokens, sequences) of the largest step this policy may run, after prepare(): what a vLLM-style engine
        profiles to size its KV cache (costmodels.memory). Default: vLLM's small-GPU defaults, 2048 and 256."""
        return 2048, 256

    def bind(self, view) -> None:
        """Called once before the run, with the engine's view."""

    def infeasible_reason(self, req, capacity_tokens: int, block_size: int) -> str | None:
        """Why `req` can never complete under this policy (None if it can)."""
        need = req.prompt_tokens + req.output_tokens - 1
        if -(-need // block_size) * block_size > capacity_tokens:
            return f"prompt + output - 1 tokens exceed KV capacity M = {capacity_tokens}"
        return None

    def admission_tokens(self, req) -> int:
        """KV tokens a request must be able to reserve when it is admitted (the watermark applies to them); the
        engine refuses up front a request that could never be admitted. Default: its whole prompt."""
        return req.prompt_tokens

    def kv_layout(self, memory, costmodel):
        """The KV layout this policy runs on: None keeps the scenario's paged manager; ("name", {knobs}) asks the
        engine for a registered variant of the same capacity (sim/kv/layouts.py: Apt-Serve's hidden cache,
        BROS's bidirectional blocks). Policies never build managers themselves, so they never import sim."""
        return None

    def prefix_caching_default(self) -> bool:
        """Does the engine this policy models turn automatic prefix caching on by default (vLLM v1 does)? The
        scenario's memory.prefix_caching overrides it. A policy that sizes waiting requests' chunks calls
        view.lookup_prefix(req) first to benefit; one that does not still runs correctly, without hits."""
        return bool(getattr(self.config, "prefix_caching", False))

    def watermark_default(self) -> float:
        """The admission watermark of the engine this policy models (vLLM v0: 0.01; InferMax's model: 0), used
        when the scenario leaves memory.watermark null."""
        return float(getattr(self.config, "watermark", 0.0))

    def schedule(self, view) -> Batch:  # pragma: no cover - interface
        raise NotImplementedError

    def steady_decode(self, view, after_full_decode: bool) -> bool:
        """May the engine fast-forward? True promises: while no request arrives or completes and free KV only
        shrinks, every schedule() would run the whole running set, one decode token each, changing nothing
        else (no admission, eviction, swap, or policy state). `after_full_decode` says the iteration just
        committed was exactly such a step with the same queues. The safe default is False."""
        return False

    def decode_cohort(self, view) -> bool:
        """May the engine keep steady running decodes as one cohort (sim/engine/cohort.py, view.cohort)? True promises
        that schedule() reads members only for their phase, and each step either takes the whole cohort (every
        member one decode token, exactly what its per-request path would do) or calls view.cohort.materialize()
        before anything else; that it iterates view.loose (running minus members, in running order) where it
        would iterate view.running; and that on_commit does not read members. The safe default is False."""
        return False

    def on_commit(self, view, batch: Batch, batch_time_s: float) -> None:
        """Called after a batch's tokens are committed (policies that learn from completions use it)."""


def _typed_knobs(config_cls, knobs: dict, where: str) -> dict:
    """Each knob checked against its Config field's type (costmodels.values.typed): a list, a mapping, text or a
    non-finite number where a number belongs is one line naming policy.KNOB, before the policy reads it."""
    import typing
    from costmodels.values import typed
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:           # an extension's Config with annotations that do not resolve: its validate() checks
        return knobs
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    return {k: typed(v, hints[k], f"{where}.{k}", defaults.get(k)) if k in hints else v for k, v in knobs.items()}


POLICIES: dict[str, tuple[type, dict, str]] = {}


def register_policy(name: str, cls: type, summary: str, replace: bool = False, **preset_knobs: Any) -> None:
    """Register a named policy: a class and the knob values that make it this preset. A name already taken is
    refused unless replace=True (then the run says it replaced one)."""
    from costmodels.registry import register
    register(POLICIES, name, (cls, preset_knobs, summary), "policy", replace)


def build_policy(spec: dict, where: str = "policy") -> Policy:
    spec = dict(spec or {})
    name = spec.pop("name", None)
    if name is None:
        raise UserError(f"{where}.name: missing; allowed: {', '.join(sorted(POLICIES))}")
    if name not in POLICIES:
        raise UserError(f"{where}.name: unknown policy {name!r}; allowed: {', '.join(sorted(POLICIES))}")
    cls, preset, _ = POLICIES[name]
    # vLLM's names become this family's knobs before the preset's values are merged under them
    from policies.vllm_names import translate_policy
    knobs = {**preset, **translate_policy(spec, cls, where, name)}
    pol = cls(config=cls.make_config(knobs, where, name))
    pol.name = name
    return pol
