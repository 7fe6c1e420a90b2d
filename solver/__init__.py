"""Optimal schedules for small workloads: the InferMax CSP as a MILP, backends, warm starts and replay (spec §4)."""
from solver.instance import SolverInstance, SolverOptions
from solver.schedule import Schedule, Step, evaluate

__all__ = ["SolverInstance", "SolverOptions", "Schedule", "Step", "evaluate"]
