"""Named registries (policies, workloads, cost models, routers, KV layouts): a name is taken once; an extension that
means to replace one says replace=True, and every replacement is recorded so that the run can say so."""
from __future__ import annotations

from costmodels.errors import UserError

# (what, name) of every replacement since start-up, in order; the CLI reports each once
REPLACED: list = []


def register(table: dict, name, value, what: str, replace: bool = False) -> None:
    """table[name] = value, refusing a name already taken unless replace=True."""
    if not isinstance(name, str) or not name:
        raise UserError(f"register_{what}: the name must be a non-empty string, got {name!r}")
    if name in table and not replace:
        raise UserError(f"register_{what}: {what} {name!r} is already registered; pick another name, or pass "
                        f"replace=True to replace it")
    if name in table:
        REPLACED.append((what, name))
    table[name] = value


def take_replacements() -> list:
    """The replacements recorded since the last call (each is reported once)."""
    out = list(REPLACED)
    REPLACED.clear()
    return out
