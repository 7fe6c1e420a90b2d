"""Checks for the numbers and names a user gives (YAML, --set, --grid, CLI options, extension returns): type,
finiteness, range and the limits past which a finite number means nothing physically, each named in one line."""
from __future__ import annotations

import math

from costmodels.errors import UserError

# Past these a finite number is meaningless here, and float time loses its precision long before: arrival times
# are seconds in a double, so a mean gap of 1e9 s (32 years) leaves about a microsecond of resolution.
MAX_GAP_S = 1e9
MIN_RATE_RPS = 1.0 / MAX_GAP_S
MAX_DURATION_S = 1e9
MAX_INT = 2 ** 63 - 1          # numpy's int64: seeds, counts and token totals live there


def is_number(value) -> bool:
    """An int or float, not a bool (YAML's true is not 1 here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value, where: str, what: str = "a number"):
    """`value` as given if it is a finite number; one line naming `where` otherwise."""
    if not is_number(value):
        raise UserError(f"{where}: expected {what}, got {describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: expected {what}, got {value!r} (a finite number is needed; 1e400 and the like "
                        "overflow to inf)")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise UserError(f"{where}: {value} is out of range (|value| <= 2^63 - 1)")
    return value


def rate(value, where: str) -> float:
    """A request rate in requests/s: finite, > 0, and no slower than one request per MAX_GAP_S on average."""
    v = float(finite(value, where, "a rate in requests/s"))
    if not v > 0:
        raise UserError(f"{where}: must be > 0 requests/s, got {value!r}")
    if v < MIN_RATE_RPS:
        raise UserError(f"{where}: {value!r} requests/s means a mean gap over {MAX_GAP_S:.0e} s (32 years), where "
                        f"arrival times lose their precision; the lowest rate allowed is {MIN_RATE_RPS:g} requests/s")
    return v


def seconds(value, where: str, *, allow_zero: bool = False) -> float:
    """A duration in seconds: finite, > 0 (or >= 0), at most MAX_DURATION_S."""
    v = float(finite(value, where, "a duration in seconds"))
    if not (v >= 0 if allow_zero else v > 0):
        raise UserError(f"{where}: must be {'>=' if allow_zero else '>'} 0 seconds, got {value!r}")
    if v > MAX_DURATION_S:
        raise UserError(f"{where}: {value!r} s is beyond the {MAX_DURATION_S:.0e} s (32 years) a run can time")
    return v


def name(value, where: str, allowed=None):
    """A name (policy, workload kind, GPU, ...): a string; one line with the allowed names otherwise."""
    if isinstance(value, str):
        return value
    tail = f"; allowed: {', '.join(sorted(map(str, allowed)))}" if allowed else ""
    raise UserError(f"{where}: expected a name (one string), got {describe(value)}{tail}")


def describe(value) -> str:
    """A value as an error line shows it: its repr, cut short, with its kind when that is the problem."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, list):
        return f"a list {text}"
    if isinstance(value, dict):
        return f"a mapping {text}"
    return text


def typed(value, annotation, where: str, default=None):
    """`value` checked against a dataclass field's annotation (int, float, bool, str, or Optional of one): the
    right kind, finite, within int64; an integral float for an int becomes the int. Other annotations pass as
    given (their owner checks them). None passes where the annotation or the field's default allows it."""
    import types as _types
    import typing
    origin = typing.get_origin(annotation)
    optional = default is None
    if origin is typing.Union or origin is _types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = optional or len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            return value
        annotation = args[0]
    if annotation not in (int, float, bool, str):
        return value
    if value is None:
        if optional:
            return None
        raise UserError(f"{where}: expected {_WHAT[annotation]}, got nothing (null)")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where}: expected true or false, got {describe(value)}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where}: expected a string, got {describe(value)}")
    if annotation is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            if is_number(value) and math.isfinite(value):
                raise UserError(f"{where}: expected an integer, got {value!r}")
        return finite(value, where, "an integer")
    return finite(value, where, "a number")


_WHAT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
