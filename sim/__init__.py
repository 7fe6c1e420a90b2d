"""The simulator, in rooms: kv (paged KV memory), engine (the replica loop), metrics, scenario (YAML → a built
replica), cluster (runs) and the `servesim` CLI. The tools built on it (sweeps, capacity, regression, plots,
findings) are the top-level package `study`.

The names below are the public face; they load on first use, so importing a low room (sim.errors, sim.paths,
sim.kv) does not pull in the engine or the study tools."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Scenario": "sim.scenario.config", "load_scenario": "sim.scenario.config",
    "scenario_from_dict": "sim.scenario.config",
    "Simulation": "sim.engine", "ReplicaView": "sim.engine",
    "KVCacheManager": "sim.kv", "SimResult": "sim.metrics", "SLO": "sim.metrics", "Request": "sim.engine",
    "build_simulation": "sim.scenario.build", "run_scenario": "sim.cluster.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
