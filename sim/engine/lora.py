"""Multi-LoRA serving: an adapter per request, at most max_loras distinct adapters per batch, GPU slots loaded from
host memory or disk, and the adapters' extra GEMMs in every step.

What vLLM does (v1 scheduler and its LoRA worker manager), as modelled here:
- requests name an adapter (drawn here from `adapters` with Zipf popularity `popularity`, or none with
  probability `base_fraction`); the scheduler admits a waiting request only if its adapter is already among the
  running requests' adapters or fewer than `max_loras` distinct adapters are running; otherwise it skips the
  request and tries the next one (the policy applies it: policies/unified.py);
- the GPU holds `max_loras` adapter slots of rank `rank` (max_lora_rank), reserved up front: with M derived from
  the GPU the slots come out of the KV space; host memory caches `max_cpu_loras` adapters (default max_loras),
  least recently used out;
- a step whose batch names an adapter not in a GPU slot loads it first (least recently used slot out): from host
  memory over PCIe, or, if host memory does not hold it, from disk at `disk_gb_per_s` and then over PCIe; the
  load is added to the step's time (vLLM activates adapters before the forward);
- every step pays the adapters' GEMMs (Punica's shrink and expand on q, k, v, o, gate, up and down of every
  layer): 2 × tokens × rank × Σ(in + out) FLOPs, or reading each distinct adapter's weights once, whichever is
  slower, at the GPU's datasheet peaks (no fitted efficiency).
On the exact fast paths (decode cohort, closed-form stretches) a steady decode step runs the same running set, so
its adapters are constant between admissions and completions: a stretch is taken only when they are all resident
(a step that must load one runs the plain way), its GEMM time is added to every skipped step, and the counters
and LRU orders end as the plain steps would leave them (resident_time, charge_steps)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from costmodels.errors import UserError
from sim.errors import known_keys

GB = 1e9


@dataclass
class LoRAConfig:
    """The scenario's `lora:` section (empty: off)."""
    adapters: int = 8                 # adapters the requests draw from
    popularity: float = 1.0           # Zipf exponent: adapter i drawn with weight 1 / (i + 1)^s (0: uniform)
    base_fraction: float = 0.0        # share of requests on the base model (no adapter)
    rank: int = 16                    # max_lora_rank: the size of each GPU slot
    max_loras: int = 1                # distinct adapters per batch = GPU slots (vLLM's default 1)
    max_cpu_loras: int = 0            # adapters cached in host memory (0: max_loras, vLLM's default)
    disk_gb_per_s: float = 2.0        # reading an adapter host memory does not hold (GB/s)
    seed: int | None = None           # null: the scenario's seed

    def validate(self, where: str = "lora") -> None:
        for k, low in (("adapters", 1), ("rank", 1), ("max_loras", 1), ("max_cpu_loras", 0)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{where}.{k}: must be an integer >= {low}, got {v!r}")
        for k, ok, allowed in (("popularity", lambda v: v >= 0, ">= 0"),
                               ("base_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
                               ("disk_gb_per_s", lambda v: v > 0, "> 0 (GB/s)")):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or not ok(v):
                raise UserError(f"{where}.{k}: must be {allowed}, got {v!r}")
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise UserError(f"{where}.max_cpu_loras: must be >= max_loras = {self.max_loras} (or 0), "
                            f"got {self.max_cpu_loras}")


def lora_config(section, where: str = "lora") -> LoRAConfig | None:
    if not section:
        return None
    known_keys(section, sorted(LoRAConfig.__dataclass_fields__), where)
    cfg = LoRAConfig(**section)
    cfg.validate(where)
    return cfg


def adapter_dims(model) -> int:
    """Σ(in + out) over the LoRA-targeted projections of one layer (q, k, v, o, gate, up, down)."""
    h = model.hidden
    d = model.head_dim or h // model.heads
    q, kv, f = model.heads * d, model.kv_heads * d, model.ffn
    return (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h)


def adapter_bytes(model, rank: int, tp: int = 1) -> float:
    """One adapter's weights on one GPU (16-bit A and B matrices of every targeted projection, every layer)."""
    return 2.0 * rank * adapter_dims(model) * model.layers / tp


def _weights(cfg: LoRAConfig) -> np.ndarray:
    w = 1.0 / np.arange(1, cfg.adapters + 1, dtype=float) ** cfg.popularity
    return w / w.sum()


def _draw(rng, cfg: LoRAConfig, weights, requests) -> None:
    reqs = sorted(requests, key=lambda r: r.id)
    n = len(reqs)
    base = rng.random(n) < cfg.base_fraction
    pick = rng.choice(len(weights), size=n, p=weights)
    for r, b, a in zip(reqs, base, pick):
        r.adapter = -1 if b else int(a)


def assign_adapters(cfg: LoRAConfig, seed: int, requests) -> None:
    """Each request's adapter, drawn as one replica's LoRA.assign draws them (a cluster draws over its workload)."""
    _draw(np.random.default_rng([int(seed), 0x10A]), cfg, _weights(cfg), requests)


class LoRA:
    """Adapters per request, GPU slots and the host cache, and what loading and running them costs."""

    def __init__(self, cfg: LoRAConfig, model, gpu, tp: int, seed: int):
        self.cfg = cfg
        self.max_loras = cfg.max_loras
        self.gpu, self.tp = gpu, tp
        self.bytes = adapter_bytes(model, cfg.rank, tp)                 # per GPU, one slot
        self.flops_per_token = 2.0 * cfg.rank * adapter_dims(model) * model.layers / tp   # shrink + expand MACs x 2
        if gpu is not None and self.bytes * cfg.max_loras >= gpu.mem_bytes:
            raise UserError(f"lora: {cfg.max_loras} slot(s) of rank {cfg.rank} for {model.name} take "
                            f"{self.bytes * cfg.max_loras / 2**30:.1f} GiB per GPU, more than the GPU's memory")
        self.rng = np.random.default_rng([int(seed), 0x10A])
        self.weights = _weights(cfg)
        self.slots: OrderedDict = OrderedDict()      # adapters on the GPU, least recently used first
        self.host: OrderedDict = OrderedDict()       # adapters in host memory
        self.host_capacity = cfg.max_cpu_loras or cfg.max_loras
        # counters
        self.loads_from_host = 0
        self.loads_from_disk = 0
        self.load_time_s = 0.0
        self.compute_time_s = 0.0
        self.skipped = 0                             # admissions a scheduler skipped for max_loras
        self.steps = 0
        self.adapters_in_steps = 0

    def assign(self, requests) -> None:
        """Draw each request's adapter (-1: the base model), in id order."""
        _draw(self.rng, self.cfg, self.weights, requests)

    def _load(self, a: int) -> float:
        """Seconds to bring adapter a into a GPU slot (host copy, or disk then host)."""
        t = 0.0
        if a in self.host:
            self.host.move_to_end(a)
            self.loads_from_host += 1
        else:
            t += self.bytes * self.tp / (self.cfg.disk_gb_per_s * GB)
            if len(self.host) >= self.host_capacity:
                self.host.popitem(last=False)
            self.host[a] = None
            self.loads_from_disk += 1
        if self.gpu is not None:
            t += self.gpu.pcie_latency_s + self.bytes / self.gpu.pcie_bytes_per_s
        return t

    def step_time(self, batch) -> float:
        """Seconds a step's adapters add: loads of those not in a GPU slot, then their GEMMs."""
        active = {r.adapter for r in batch.reqs if r.adapter >= 0}
        tokens = sum(c for r, c in zip(batch.reqs, batch.tokens) if r.adapter >= 0)
        return self.charge(active, tokens)

    def charge(self, active: set, tokens: int) -> float:
        """step_time for a step whose requests name the adapters `active`, with `tokens` tokens on adapters."""
        if not active:
            return 0.0
        if len(active) > self.max_loras:
            raise RuntimeError(f"a batch with {len(active)} adapters exceeds max_loras = {self.max_loras}")
        slots, t = self.slots, 0.0
        host = self.host
        for a in sorted(active):
            if a in slots:
                slots.move_to_end(a)
                if a in host:                        # every activation refreshes the host cache's order too
                    host.move_to_end(a)
                continue
            while len(slots) >= self.max_loras:
                for old in slots:
                    if old not in active:
                        del slots[old]
                        break
            t += self._load(a)
            slots[a] = None
        self.load_time_s += t
        compute = self._compute(active, tokens)
        self.compute_time_s += compute
        self.steps += 1
        self.adapters_in_steps += len(active)
        return t + compute

    def _compute(self, active, tokens) -> float:
        if self.gpu is None:
            return 0.0
        return max(tokens * self.flops_per_token / self.gpu.peak_flops,
                   len(active) * self.bytes / self.gpu.hbm_bytes_per_s)

    # -- the exact fast paths: steady decode steps repeat one step's adapter set ---------------------------------
    def resident_time(self, active: set, tokens: int):
        """What charge() would return, changing nothing, when every adapter in `active` is in a GPU slot (no load);
        None when one is not (the plain step loads it)."""
        if not active:
            return 0.0
        slots = self.slots
        for a in active:
            if a not in slots:
                return None
        return self._compute(active, tokens)

    def charge_steps(self, active: set, compute: float, k: int) -> None:
        """Record k steps with the resident adapters `active`, each costing `compute`, as k charge() calls would:
        the LRU orders after one such step stay put after the next, and the time is summed step by step."""
        if not active or k <= 0:
            return
        slots, host = self.slots, self.host
        for a in sorted(active):
            slots.move_to_end(a)
            if a in host:
                host.move_to_end(a)
        total = self.compute_time_s
        for _ in range(k):
            total += compute
        self.compute_time_s = total
        self.steps += k
        self.adapters_in_steps += len(active) * k

    def reserved_bytes(self) -> float:
        """GPU memory the adapter slots take (per GPU)."""
        return self.bytes * self.max_loras

    def stats(self) -> dict:
        return merged_lora_stats([self])


def merged_lora_stats(loras) -> dict:
    """The LoRA counters summed over replicas (one replica: its own), the mean adapters per step from the sums."""
    nan = float("nan")
    steps = sum(x.steps for x in loras)
    return {"lora_loads_from_host": sum(x.loads_from_host for x in loras),
            "lora_loads_from_disk": sum(x.loads_from_disk for x in loras),
            "lora_load_time_s": sum(x.load_time_s for x in loras),
            "lora_compute_time_s": sum(x.compute_time_s for x in loras),
            "lora_skipped_admissions": sum(x.skipped for x in loras),
            "lora_adapters_per_step": sum(x.adapters_in_steps for x in loras) / steps if steps else nan}
