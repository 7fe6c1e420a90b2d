"""User-facing errors of the simulator (one clear line each)."""
from costmodels.errors import UserError


class SimulationStuck(UserError):
    """The run cannot make progress (deadlock or livelock): the message says which requests and why."""
