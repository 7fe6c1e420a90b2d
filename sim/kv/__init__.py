"""KV memory of one replica: the paged block manager and the variants research policies run on, by name."""
from sim.kv.paged import KVCacheManager
from sim.kv.layouts import KV_LAYOUTS, build_layout, register_layout

__all__ = ["KVCacheManager", "KV_LAYOUTS", "build_layout", "register_layout"]
