"""Workloads: trace loaders and synthetic generators, all returning one tidy request table."""
from traces.registry import WORKLOADS, register_workload, build_workload, REQUEST_COLUMNS
from traces import synthetic as _synthetic  # noqa: F401  (registers offline, poisson, gamma, ...)
from traces import workloads as _workloads  # noqa: F401  (registers trace, classes, bros, infermax-mix)
from traces import llm_datasets as _llm_datasets  # noqa: F401  (registers econoserve-* / alise-* workloads)

__all__ = ["WORKLOADS", "register_workload", "build_workload", "REQUEST_COLUMNS"]
from traces import aptbros as _aptbros  # noqa: F401,E402  (registers aptserve-sharegpt / bros-mix)
from traces import shared_prefix as _shared_prefix  # noqa: F401,E402  (registers shared_prefix, multi_turn)
