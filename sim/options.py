"""Command-line option values checked like scenario values: every int/float option of every subcommand is finite,
within int64, and named in one line when it is not; lists of integers (seeds) the same way."""
from __future__ import annotations

import argparse
import math

from costmodels.errors import UserError
from costmodels.values import MAX_INT


def _number_type(option: str, kind):
    what = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise UserError(f"{option}: expected {what}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise UserError(f"{option}: expected a finite number, got {text!r}")
        if kind is int and abs(value) > MAX_INT:
            raise UserError(f"{option}: {text} is out of range (|value| <= 2^63 - 1)")
        return value
    parse.__name__ = kind.__name__       # argparse names the type in its own messages
    return parse


def jobs_count(text: str) -> int:
    """The type of every --jobs (worker processes): an integer >= 1; 0 or a negative count is one line, not a
    silent serial run."""
    try:
        n = int(text)
    except ValueError:
        raise UserError(f"--jobs: expected an integer, got {text!r}") from None
    if n < 1:
        raise UserError(f"--jobs: must be >= 1 (worker processes), got {n}")
    return n


def check_numeric_options(parser: argparse.ArgumentParser) -> None:
    """Give every `type=int` / `type=float` option of `parser` and its subcommands a checked type."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                check_numeric_options(sub)
        elif action.type in (int, float):
            option = max(action.option_strings, key=len) if action.option_strings else action.dest   # --jobs, not -j
            action.type = _number_type(option, action.type)


def int_list(text, option: str, minimum: int | None = None) -> list:
    """`1,2,3` as integers; one line naming the option and the bad item otherwise."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise UserError(f"{option}: expected comma-separated integers, got {text!r}")
    out = []
    for x in items:
        if not x:
            raise UserError(f"{option}: empty item in {text!r}; expected comma-separated integers such as 0,1,2")
        try:
            v = int(x)
        except ValueError:
            raise UserError(f"{option}: {x!r} is not an integer; expected comma-separated integers such as 0,1,2") \
                from None
        if minimum is not None and v < minimum:
            raise UserError(f"{option}: {v} is below {minimum}")
        if abs(v) > MAX_INT:
            raise UserError(f"{option}: {v} is out of range (|value| <= 2^63 - 1)")
        out.append(v)
    return out
