"""KV layouts by name: a policy asks for one (Policy.kv_layout) and the engine builds it, so policies never import sim.

A layout replaces the scenario's paged manager with one of the same capacity and block size; a user extension adds
its own with register_layout."""
from __future__ import annotations

from costmodels.errors import UserError
from sim.kv.bidirectional import BidirectionalKVManager
from sim.kv.hidden_cache import HybridCacheManager


def _hidden_cache(memory, costmodel, kv_only: bool = False):
    """Apt-Serve's hybrid pool: hidden-state blocks sized by the model's hidden/KV byte ratio (1.0: KV only)."""
    model = getattr(costmodel, "model", None)
    ratio = 1.0 if kv_only or model is None else model.hidden_to_kv_ratio()
    return HybridCacheManager(memory.capacity_tokens, memory.block_size, 0.0, 0, hidden_ratio=ratio)


def _bidirectional(memory, costmodel, bidirectional: bool = True):
    """BROS's blocks filled from both ends (RT left, BE right), lazily checkpointing overwritten BE slots."""
    return BidirectionalKVManager(memory.capacity_tokens, memory.block_size, bidirectional=bidirectional)


KV_LAYOUTS = {"hidden_cache": _hidden_cache, "bidirectional": _bidirectional}


def register_layout(name: str, builder, replace: bool = False) -> None:
    """Add a layout: builder(memory, costmodel, **knobs) returns the manager the policy runs on. A name already
    taken is refused unless replace=True."""
    from costmodels.registry import register
    register(KV_LAYOUTS, name, builder, "layout", replace)


def build_layout(memory, costmodel, spec):
    """The manager a policy's kv_layout() asks for: None keeps `memory`; (name, knobs) builds that layout."""
    if spec is None:
        return memory
    name, knobs = spec
    if name not in KV_LAYOUTS:
        raise UserError(f"policy asks for KV layout {name!r}; known: {', '.join(sorted(KV_LAYOUTS))}")
    return KV_LAYOUTS[name](memory, costmodel, **knobs)
