"""Scheduling policies: the InferMax unified family (presets) and the seed systems, behind one registry."""
from policies.base import Batch, Policy, POLICIES, register_policy, build_policy
from policies import unified as _unified  # noqa: F401  (registers the presets)
from policies import vllm as _vllm  # noqa: F401  (registers vllm-v0, vllm-v0-chunked)
from policies import econoserve as _econoserve  # noqa: F401  (registers econoserve and its ablations)
from policies import alise as _alise  # noqa: F401  (registers alise and its memory-policy strawmen)

__all__ = ["Batch", "Policy", "POLICIES", "register_policy", "build_policy"]
from policies import aptserve as _aptserve  # noqa: F401,E402  (registers aptserve, aptserve-kv, -fcfs, -decay, -s)
from policies import bros as _bros  # noqa: F401,E402  (registers bros, bros-nobi, bros-rr)
from policies import sglang as _sglang  # noqa: F401,E402  (registers sglang, sglang-lpm)
