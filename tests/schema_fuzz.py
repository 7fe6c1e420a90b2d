"""Bad values for every scenario field, generated from the config schema itself (the Scenario dataclasses, each
policy family's and router's Config, the SLO fields, the arrival processes' knobs), and one CLI run per value
that records how it ended: exit code, stderr lines, a traceback or a hang. Shared by tests/test_schema_fuzz.py
(a bounded sample) and benchmarks/schema_fuzz.py (every case)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
import types
import typing
from dataclasses import dataclass

# Certainly invalid for a field of the given kind, as typed after --set KEY=: YAML text.
NOT_A_NUMBER = ("abc", "[1, 2]", "{a: 1}", "[]", "{}", "true")
NON_FINITE = (".nan", ".inf", "-.inf", "1e400", "-1e400")
NOT_A_BOOL = ("abc", "1.5", "[true]", "{a: 1}")
NOT_A_STRING = ("[a, b]", "{a: 1}", "[]", "1e400")
# Suspicious: invalid for most fields, meaningful for some (-1 = vLLM's default, 0 = off, huge = no limit); the
# run must end cleanly either way: exit 0, or exit 2 with one line, never a traceback or a hang.
SUSPICIOUS_NUMBERS = ("-1", "0", "-1e300", "1e300", "1e18", "99999999999999999999", "")

BASE = "workload: {kind: offline, num_requests: 4, prompt: 16, output: 4}\n"
CLUSTER_BASE = BASE + "cluster: {replicas: 2, router: round_robin}\n"


@dataclass
class Case:
    field: str            # the dotted key as the user writes it
    text: str             # the value after KEY=
    kind: str             # int | float | bool | str
    invalid: bool         # True: the run must refuse it (exit 2, one line)
    extra: tuple = ()     # further --set overrides that reach the field (a policy family, a router)
    base: str = BASE


def _kind(typ) -> tuple[str, bool]:
    """(int|float|bool|str|other, optional) of a dataclass field's annotation."""
    if isinstance(typ, str):
        return typ, False
    optional = False
    origin = typing.get_origin(typ)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        optional = len(args) < len(typing.get_args(typ))
        typ = args[0] if len(args) == 1 else object
    for k in (bool, int, float, str):
        if typ is k:
            return k.__name__, optional
    return "other", optional


def _values(kind: str) -> list[tuple[str, bool]]:
    if kind in ("int", "float"):
        return ([(v, True) for v in NOT_A_NUMBER + NON_FINITE] + [(v, False) for v in SUSPICIOUS_NUMBERS]
                + ([("1.5", True)] if kind == "int" else []))
    if kind == "count or groups":
        return ([(v, True) for v in ("abc", "true", "[]") + NON_FINITE] + [(v, False) for v in SUSPICIOUS_NUMBERS]
                + [("1.5", True), ("[1, 2]", False), ("{}", False), ("{a: 1}", True)])
    if kind == "bool":
        return [(v, True) for v in NOT_A_BOOL]
    if kind == "str":
        return [(v, True) for v in NOT_A_STRING] + [("", False), ("no-such-name", False)]
    return []


def _dataclass_fields(cls, prefix: str):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        yield f"{prefix}{f.name}", hints[f.name]


def schema_fields():
    """(dotted key, annotation, extra overrides, base) for every field the schema declares."""
    from policies import POLICIES
    from policies.knobs import families
    from sim.cluster.routers import ROUTERS
    from sim.metrics import SLO
    from sim.scenario.config import Scenario
    for name, typ in _dataclass_fields(Scenario, ""):
        if dataclasses.is_dataclass(typ):
            for sub, t in _dataclass_fields(typ, f"{name}."):
                yield sub, t, (), BASE
        elif name in ("seed", "name"):
            yield name, typ, (), BASE
    for sub, t in _dataclass_fields(SLO, "slo."):
        yield sub, t, (), BASE
    for cls, names in families():
        for knob, t in typing.get_type_hints(cls.Config).items():
            yield f"policy.{knob}", t, (f"policy.name={names[0]}",), BASE
    for rname, (rcls, _) in sorted(ROUTERS.items()):
        for knob, t in typing.get_type_hints(rcls.Config).items():
            yield f"cluster.router.{knob}", t, (f"cluster.router={{name: {rname}}}",), CLUSTER_BASE
    from traces.arrivals import PROCESSES
    for process, (_, keys) in PROCESSES.items():
        for key in keys:
            yield f"workload.{key}", float, (f"workload.kind={process}",), BASE
    yield "workload.num_requests", int, (), BASE
    yield "cluster.replicas", "count or groups", (), CLUSTER_BASE      # a list of groups or one group mapping too
    assert POLICIES


def cases() -> list[Case]:
    out = []
    for key, typ, extra, base in schema_fields():
        kind, optional = _kind(typ)
        for text, invalid in _values(kind):
            if optional and text == "":
                invalid = False
            out.append(Case(key, text, kind, invalid, extra, base))
    return out


@dataclass
class Outcome:
    rc: int | None        # None: it raised (a traceback) or hung
    lines: list
    error: str = ""       # the exception's type and message, or "hang"


class _Hang(Exception):
    pass


def run_case(case: Case, scenario_path, timeout_s: int = 30) -> Outcome:
    """`servesim run SCENARIO --set ... --set FIELD=VALUE` in this process, stdout and stderr captured."""
    from sim.cli import main
    argv = ["run", str(scenario_path)] + [a for e in case.extra for a in ("--set", e)] + \
        ["--set", f"{case.field}={case.text}"]

    def alarm(signum, frame):
        raise _Hang()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout_s)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        return Outcome(rc, err.getvalue().strip().splitlines())
    except _Hang:
        return Outcome(None, err.getvalue().strip().splitlines(), "hang")
    except SystemExit as e:       # argparse
        return Outcome(int(e.code or 0), err.getvalue().strip().splitlines())
    except Exception as e:        # noqa: BLE001 - a traceback is what this looks for
        return Outcome(None, err.getvalue().strip().splitlines(), f"{type(e).__name__}: {e}"[:300])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def verdict(case: Case, out: Outcome) -> str:
    """ok | traceback | hang | exit0-on-invalid | not-one-line."""
    if out.rc is None:
        return "hang" if out.error == "hang" else "traceback"
    errors = [ln for ln in out.lines if not ln.startswith("warning:") and not ln.startswith("servesim: note:")]
    if out.rc == 0:
        return "exit0-on-invalid" if case.invalid else "ok"
    if out.rc != 2 or len(errors) != 1 or not errors[0].startswith("servesim: error:"):
        return "not-one-line"
    return "ok"
