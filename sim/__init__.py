"""The simulator: SimPy engine, request state, KV memory, metrics, scenarios and the CLI."""
from sim.config import Scenario, load_scenario, scenario_from_dict
from sim.engine import Simulation, ReplicaView
from sim.memory import KVCacheManager
from sim.metrics import SimResult, SLO
from sim.request import Request
from sim.runner import run_scenario, build_simulation

__all__ = ["Scenario", "load_scenario", "scenario_from_dict", "Simulation", "ReplicaView", "KVCacheManager",
           "SimResult", "SLO", "Request", "run_scenario", "build_simulation"]
