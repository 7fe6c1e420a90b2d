"""Speculative decoding in the replica loop: k draft tokens verified per decode step, their cost, KV and acceptance.

What one decode step of a request does with speculation on (vLLM v1 and SGLang run it this way):
- the drafter (a small draft model run k times, an EAGLE/MTP head, or an n-gram lookup on the CPU) has proposed
  k_eff = min(k, remaining output - 1) tokens; the policy schedules the request with 1 + k_eff tokens (they take
  token budget, and KV is reserved for all of them, preempting if it must, as for any chunk);
- the target model verifies them in one forward: the cost model sees a (1 + k_eff)-token chunk at the request's
  context (a chunk of a prefill costs the same way), not a one-token decode;
- j drafts are accepted (the first j, up to the first rejection) and one more token comes from the target, so the
  request gains j + 1 tokens at the step's end (never more than it has left: exact output counts hold); the KV of
  the k_eff - j rejected positions is released (whole blocks past the kept tokens go back to the pool).
Acceptance: a per-request list of accepted counts (`accepted: {request id: [j, ...]}`, or `accepted_file`, a CSV
of request_id, accepted), used step by step while it lasts, then the rate `acceptance_rate` a: each draft token is accepted with probability a given that the ones
before it were, so j = min(G - 1, k_eff) with G geometric(1 - a), and E[j + 1] = (1 - a^(k+1)) / (1 - a).
Every draw comes from one numpy Generator seeded from the scenario (same seed, same tables).

The draft's cost is added to the step's time: a `draft_model` from the catalog runs one pass over the step's
prefill chunks and decodes (one token each) and k - 1 more one-token passes over the decodes, on the same GPU and
tensor-parallel degree, priced by its own cost model without a second engine's CPU overhead; an `eagle` or `mtp`
head costs `draft_fraction` of the target's GPU time for the same passes (default: one decoder layer of the
target, 1 / layers); `ngram` proposes on the CPU at no GPU cost.

Memory: when M is derived from the GPU (memory.M null) the drafter's weights come out of the KV space and each
token's KV slot holds the drafter's KV too (vLLM sizes one block pool for both): a draft model's own weights and
KV per token, an EAGLE/MTP head's one decoder layer (the target's weights and KV per token over its layers); a
memory.M given in the scenario is taken as the target's tokens as it stands.

Fast paths: the decode cohort and the closed-form stretches stay off (a step's tokens depend on its draws, so
no step after the next is known in advance); steady verify steps skip the scheduler instead, bit-identical to
the plain loop (sim/engine/specstretch.py), and uniform ones are worked out a window at a time from the draws
ahead (sim/engine/specwalk.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodels.base import BatchShape
from costmodels.errors import UserError
from sim.errors import known_keys

METHODS = ("draft_model", "eagle", "mtp", "ngram")
PASS_CACHE = 1 << 16        # one-token draft passes' prices kept (cleared when full; a few MB at most)


@dataclass
class SpeculativeConfig:
    """The scenario's `speculative:` section (empty: off)."""
    method: str = "eagle"                 # draft_model | eagle | mtp | ngram
    k: int = 3                            # draft tokens proposed per step (vLLM's num_speculative_tokens)
    acceptance_rate: float | None = None  # probability a draft token is accepted given the ones before it were
    accepted: dict = field(default_factory=dict)   # request id -> accepted drafts per step, used first
    accepted_file: str | None = None      # the same as a CSV: request_id, accepted (one row per verify step, in order)
    draft_model: str | None = None        # method draft_model: a model name in the catalog
    draft_fraction: float | None = None   # eagle/mtp: one head pass / one target pass (null: 1 / target layers)
    seed: int | None = None               # null: the scenario's seed

    def validate(self, where: str = "speculative") -> None:
        if self.method not in METHODS:
            raise UserError(f"{where}.method: {self.method!r} is not allowed; allowed: {', '.join(METHODS)}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise UserError(f"{where}.k: must be an integer >= 1 (draft tokens per step), got {self.k!r}")
        a = self.acceptance_rate
        if a is None:
            raise UserError(f"{where}.acceptance_rate: required, a probability in [0, 1] (each draft token "
                            f"accepted given the previous ones were)")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise UserError(f"{where}.acceptance_rate: must be in [0, 1], got {a!r}")
        if self.method == "draft_model" and not self.draft_model:
            raise UserError(f"{where}.draft_model: method draft_model needs a model name from the catalog")
        if self.method != "draft_model" and self.draft_model:
            raise UserError(f"{where}.draft_model: only method draft_model runs a draft model (method is "
                            f"{self.method!r})")
        f = self.draft_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0):
            raise UserError(f"{where}.draft_fraction: must be in [0, 1] (one head pass / one target pass), got {f!r}")
        if not isinstance(self.accepted, dict):
            raise UserError(f"{where}.accepted: expected a mapping of request id -> list of accepted drafts per step")
        for rid, seq in self.accepted.items():
            if isinstance(rid, bool) or not isinstance(rid, int):
                raise UserError(f"{where}.accepted: keys are request ids (integers), got {rid!r}")
            if not isinstance(seq, list) or any(isinstance(j, bool) or not isinstance(j, int) or not 0 <= j <= self.k
                                                for j in seq):
                raise UserError(f"{where}.accepted.{rid}: must be a list of integers in [0, k = {self.k}], "
                                f"got {seq!r}")


def speculative_config(section: dict, where: str = "speculative", base=None) -> SpeculativeConfig | None:
    """The section as a validated config; None when it is empty (speculation off). `base`: the scenario's folder,
    where a relative accepted_file is looked for first."""
    if not section:
        return None
    known_keys(section, sorted(SpeculativeConfig.__dataclass_fields__), where)
    cfg = SpeculativeConfig(**section)
    if cfg.accepted_file:
        if cfg.accepted:
            raise UserError(f"{where}: give accepted or accepted_file, not both")
        cfg.accepted = read_acceptance_file(cfg.accepted_file, f"{where}.accepted_file", base)
    cfg.validate(where)
    return cfg


def read_acceptance_file(path, where: str, base=None) -> dict:
    """request id -> accepted drafts per verify step, from a CSV with columns request_id and accepted (rows of one
    request in step order). A bad row is named in one line."""
    import csv
    from sim.paths import resolve_user_path
    p = resolve_user_path(path, base)
    try:
        with open(p, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise UserError(f"{where}: cannot read {path}: {e.strerror or e}") from None
    out: dict = {}
    for n, row in enumerate(rows, start=2):         # line 1 is the header
        try:
            rid, j = int(row["request_id"]), int(row["accepted"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{p}: row {n}: expected integer columns request_id and accepted, got {row!r}") from None
        if j < 0:
            raise UserError(f"{p}: row {n}: accepted must be >= 0, got {j}")
        out.setdefault(rid, []).append(j)
    return out


class Speculation:
    """The engine's speculative decoding: draft costs, acceptance draws and the counters a run reports."""

    def __init__(self, cfg: SpeculativeConfig, target_cm, seed: int, draft_cm=None):
        self.cfg = cfg
        self.k = cfg.k
        self.target = target_cm
        self.draft_cm = draft_cm
        if cfg.method in ("eagle", "mtp"):
            layers = getattr(getattr(target_cm, "model", None), "layers", 0)
            self.fraction = cfg.draft_fraction if cfg.draft_fraction is not None else (1.0 / layers if layers else 0.0)
        else:
            self.fraction = 0.0
        self.rate = float(cfg.acceptance_rate)
        self.rng = np.random.default_rng([int(seed), 0x5EC])
        # the rate's draws, a block at a time from the generator, each kept as the tokens of a full verify pass:
        # min(G, k + 1) for a geometric G, whose accepted drafts min(G - 1, k) every pass clips further to its k_eff
        self._draws: list = []
        self._passes: dict = {}                # (decodes, KV read) -> one-token draft pass's seconds (sums models)
        self.walk_prices: dict = {}            # batch size -> uniform steps' pricing (sim/engine/specwalk.py)
        self.walk_kept: dict = {}              # the prices it has worked out, all batch sizes (bounded)
        cm = draft_cm if draft_cm is not None else target_cm
        self.sums = bool(cm.accepts_decode_sums())   # batch_time == time_from_sums of the shape's sums
        self.lists = {rid: list(seq) for rid, seq in cfg.accepted.items()}
        self.used = {}                         # request id -> entries of its list consumed
        # counters
        self.steps = 0                         # verify passes with at least one draft
        self.proposed = 0                      # draft tokens verified
        self.accepted = 0                      # of them accepted
        self.tokens = 0                        # tokens those passes produced (accepted + the target's own)
        self.full_steps = 0                    # passes with all k drafts (the rate's invariant is over these)
        self.full_tokens = 0
        self.freed_blocks = 0                  # KV blocks of rejected drafts released
        self.draft_time_s = 0.0                # time added by drafting

    # -- acceptance -------------------------------------------------------------------------------------------
    def draw(self, rid: int, k_eff: int) -> int:
        """Accepted drafts of one verify pass with k_eff drafts: the request's list while it lasts, else the rate."""
        seq = self.lists.get(rid)
        if seq is not None:
            i = self.used.get(rid, 0)
            if i < len(seq):
                self.used[rid] = i + 1
                return min(seq[i], k_eff)
        a = self.rate
        if a >= 1.0:
            return k_eff
        if a <= 0.0:
            return 0
        if not self._draws:
            self.refill()
        return min(self._draws.pop() - 1, k_eff)

    def _block(self) -> list:
        """The generator's next 4096 draws at the rate as full verify passes' tokens, last first (for pop())."""
        return np.minimum(self.rng.geometric(1.0 - self.rate, size=4096), self.k + 1).tolist()[::-1]

    def refill(self) -> list:
        """The next block of draws (a full verify pass's tokens each), last first (taken with pop())."""
        self._draws = self._block()
        return self._draws

    def more_draws(self) -> None:
        """Put the generator's next block behind the draws left, in place (the order pop() takes them is the one
        refill() would give); sim/engine/specwalk.py reads a window's draws ahead this way."""
        self._draws[:0] = self._block()

    def walk_draws(self, reqs):
        """How uniform steps of `reqs` draw (sim/engine/specwalk.py): 'rate' (fresh draws from the generator), or
        the constant accepted count (k at a rate of 1, 0 at 0); None while one of them still has entries of its
        own list."""
        lists = self.lists
        if lists:
            used = self.used
            for r in reqs:
                seq = lists.get(r.id)
                if seq is not None and used.get(r.id, 0) < len(seq):
                    return None
        a = self.rate
        return self.k if a >= 1.0 else 0 if a <= 0.0 else "rate"

    def rate_only(self) -> bool:
        """Is every draw a fresh geometric one from the generator (no per-request lists, 0 < rate < 1)?"""
        return not self.lists and 0.0 < self.rate < 1.0

    def verified(self, k_eff: int, accepted: int, gained: int) -> None:
        self.steps += 1
        self.proposed += k_eff
        self.accepted += accepted
        self.tokens += gained
        if k_eff == self.k:
            self.full_steps += 1
            self.full_tokens += gained

    def verified_many(self, steps: int, proposed: int, accepted: int, tokens: int, full_steps: int,
                      full_tokens: int, freed_blocks: int) -> None:
        """What `verified` counts, summed over many verify passes at once (the fast paths' stretches and windows),
        plus the rejected drafts' blocks they freed."""
        self.steps += steps
        self.proposed += proposed
        self.accepted += accepted
        self.tokens += tokens
        self.full_steps += full_steps
        self.full_tokens += full_tokens
        self.freed_blocks += freed_blocks

    # -- cost -------------------------------------------------------------------------------------------------
    def _drafter(self, steps: bool):
        """(cost model, scale) pricing the drafter's passes, or None when a step with `steps` passes costs none."""
        if not steps or self.cfg.method == "ngram":
            return None
        if self.draft_cm is not None:
            return self.draft_cm, 1.0
        return (self.target, self.fraction) if self.fraction else None

    def draft_time(self, prefill_tokens, prefill_context, decode_context) -> float:
        """Seconds the drafter adds to a step: one pass over the prefill chunks and the speculating decodes (one
        token each, at context m + 1), then k - 1 one-token passes over the decodes."""
        if self.sums:                  # the cost model prices a batch from its sums: no shapes to build
            return self.draft_time_sums(sum(prefill_tokens), len(prefill_tokens),
                                        sum(c * c for c in prefill_tokens),
                                        sum(c * m for c, m in zip(prefill_tokens, prefill_context)),
                                        sum(prefill_context), len(decode_context), sum(decode_context))
        drafter = self._drafter(decode_context or prefill_tokens)
        if drafter is None:
            return 0.0
        cm, scale = drafter
        n, d = len(prefill_tokens) + len(decode_context), len(decode_context)
        first = BatchShape(prefill_tokens=list(prefill_tokens), prefill_context=list(prefill_context),
                           decode_context=list(decode_context))
        t = cm.batch_time(first) - cm.cpu_time(n)
        if decode_context:
            ctx = np.asarray(decode_context, dtype=np.int64)
            for i in range(1, self.k):
                t += cm.batch_time(BatchShape(decode_context=(ctx + i).tolist())) - cm.cpu_time(d)
        t *= scale
        self.draft_time_s += t
        return t

    def draft_time_sums(self, pt, n_pre, c2, ck, pk, d, kv) -> float:
        """draft_time from the step's integer sums (a sums-only drafter): its prefill chunks' tokens, count, Σc²,
        Σc·m and Σm; its speculating decodes' count and Σ(m + 1)."""
        drafter = self._drafter(d or n_pre)
        if drafter is None:
            return 0.0
        return self._sums_time(drafter[0], drafter[1], pt, n_pre, c2, ck, pk, d, kv)

    def _sums_time(self, cm, scale, pt, n_pre, c2, ck, pk, d, kv) -> float:
        """The drafter's passes priced from the batch's integer sums (a sums-only cost model). A one-token pass
        over d decodes reading kv tokens is looked up by (d, kv) once priced: successive steps' passes repeat
        most of them (a step's passes read kv, kv + d, ..., and the next step starts d x tokens gained later),
        and a sums-only model's time is a function of the sums alone (accepts_decode_sums), so the floats are
        the ones the call would return."""
        passes = self._passes
        if n_pre:
            t = cm.time_from_sums(pt + d, n_pre, c2, ck, pk, d, kv) - cm.cpu_time(n_pre + d)
        else:
            t = passes.get((d, kv))
            if t is None:
                t = passes[(d, kv)] = cm.time_from_sums(d, 0, 0, 0, 0, d, kv) - cm.cpu_time(d)
        for i in range(1, self.k if d else 1):
            x = passes.get((d, kv + i * d))
            if x is None:
                if len(passes) >= PASS_CACHE:
                    passes.clear()
                x = passes[(d, kv + i * d)] = cm.time_from_sums(d, 0, 0, 0, 0, d, kv + i * d) - cm.cpu_time(d)
            t += x
        t *= scale
        self.draft_time_s += t
        return t

    def stats(self) -> dict:
        """The run summary's speculation counters."""
        return merged_stats([self])


# what merged_stats sums over replicas (a cluster's worker process sends these back: sim/cluster/decompose.py)
COUNTERS = ("steps", "proposed", "accepted", "tokens", "full_steps", "full_tokens", "freed_blocks", "draft_time_s")


def merged_stats(specs) -> dict:
    """Speculation counters summed over replicas (one replica: its own), ratios from the sums."""
    nan = float("nan")
    steps, proposed, accepted, tokens, full_steps, full_tokens, freed, draft = (
        sum(getattr(s, k) for s in specs) for k in COUNTERS)
    return {"spec_steps": steps, "spec_drafts_proposed": proposed, "spec_drafts_accepted": accepted,
            "spec_acceptance": accepted / proposed if proposed else nan,
            "spec_tokens_per_step": tokens / steps if steps else nan,
            "spec_full_steps": full_steps,
            "spec_full_tokens_per_step": full_tokens / full_steps if full_steps else nan,
            "spec_freed_blocks": freed, "spec_draft_time_s": draft}


def drafter_memory(cfg: SpeculativeConfig, target, draft, tp: int, kv_dtype=None) -> tuple[float, float]:
    """(weight bytes, KV bytes per token) per GPU the drafter adds: a draft model's own; an EAGLE/MTP head's one
    decoder layer of the target; nothing for n-gram lookup."""
    if cfg.method == "draft_model":
        return draft.weight_bytes() / tp, draft.kv_bytes_per_token(kv_dtype, tp)
    if cfg.method in ("eagle", "mtp"):
        layers = max(target.layers, 1)
        return target.weight_bytes() / tp / layers, target.kv_bytes_per_token(kv_dtype, tp) / layers
    return 0.0, 0.0


def verify_pass(spec, r, ke: int, fresh: bool, tally: list) -> int:
    """One verify pass of running request `r` with ke drafts, as the plain loop's commit takes it: j accepted drafts
    (the generator's next draw when the rate alone decides (`fresh`: Speculation.rate_only), else
    Speculation.draw) and one token from the target, never past its output. Counts it into `tally`, [passes,
    drafts proposed, accepted, tokens, passes with all k drafts, their tokens], for verified_many; returns the
    tokens gained. (The scheduled step's commit and the steady steps' loop share it.)"""
    if fresh:
        j = (spec._draws or spec.refill()).pop() - 1     # (a full pass's tokens)
        if j > ke:
            j = ke
    else:
        j = spec.draw(r.id, ke)
    left = r.output_tokens - r.generated
    gained = j + 1 if j < left else left
    tally[0] += 1
    tally[1] += ke
    tally[2] += j
    tally[3] += gained
    if ke == spec.k:
        tally[4] += 1
        tally[5] += gained
    return gained


def expected_tokens_per_step(a: float, k: int) -> float:
    """E[j + 1] for k drafts at rate a: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
