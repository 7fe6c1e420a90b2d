"""The time of one cohort-only decode step (n decodes reading kv tokens), the cost model's float without a call."""
from __future__ import annotations

from costmodels.base import CostModel
from costmodels.linear import LinearCostModel


class DecodeStepTime:
    """`at(n)` gives (base, sdn, b_d, cpu, a_d) with which a step of n decodes reading kv cached tokens takes
    (base + (a_d * kv + sdn + b_d)) + cpu seconds: the float operations of LinearCostModel.time_from_sums(n, 0, 0,
    0, 0, n, kv) in its order, so the clock is bit for bit the one a call would give. The steady decode loop takes
    tens of steps per request; with the batch size fixed between completions, only `a_d * kv` changes per step.

    `inline` is False for any other cost model (or a subclass that changes how sums become a time); callers then
    call `costmodel.time_from_sums` per step, as before."""

    def __init__(self, costmodel):
        cls = type(costmodel)
        self.costmodel = costmodel
        self.inline = (isinstance(costmodel, LinearCostModel)
                       and cls.time_from_sums is LinearCostModel.time_from_sums
                       and cls.cpu_time is CostModel.cpu_time)
        self._parts = {}                # n -> its parts: a replica's batch sizes are few, and come back

    def at(self, n: int):
        parts = self._parts.get(n)
        if parts is None:
            cm = self.costmodel
            k = cm._k
            base = k["a_o"] * n + k["b_o"] + k["step_a"] * n + k["step_b"] + cm.overhead_s
            parts = self._parts[n] = (base, k["s_d"] * n, k["b_d"], cm.cpu_time(n), k["a_d"])
        return parts

    def __call__(self, n: int, kv: int) -> float:
        """One step's time (either way)."""
        if not self.inline:
            return self.costmodel.time_from_sums(n, 0, 0, 0, 0, n, kv)
        base, sdn, b_d, cpu, a_d = self.at(n)
        return (base + (a_d * kv + sdn + b_d)) + cpu
