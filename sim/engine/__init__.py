"""The replica loop and what it is made of: request state, the policy's view of a replica, and the exact fast
paths (arrival clock, steady decode cohort, closed-form decode stretches). Public face: Simulation, ReplicaView."""
from sim.engine.loop import Simulation
from sim.engine.request import Request
from sim.engine.view import ReplicaView

__all__ = ["Simulation", "ReplicaView", "Request"]
