"""User-facing errors of the simulator (one clear line each)."""
from costmodels.errors import UserError


class SimulationStuck(UserError):
    """The run cannot make progress (deadlock or livelock): the message says which requests and why."""


def known_keys(section: dict, allowed, where: str) -> None:
    """One line for keys of a YAML mapping that are not among `allowed` (listed in the order given)."""
    bad = sorted(set(section) - set(allowed), key=str)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(map(str, bad))}; allowed: {', '.join(allowed)}")
