"""Bad values for every scenario field, generated from the config schema (tests/schema_fuzz.py), end in one line
and exit 2 (or, for values some fields accept, a clean run): never a traceback, a hang, or exit 0 on invalid input.
The default run takes a rotating sample that covers every field; benchmarks/schema_fuzz.py runs every case."""
import dataclasses
import typing

import pytest

from tests.schema_fuzz import BASE, CLUSTER_BASE, Case, Outcome, cases, run_case, verdict

SAMPLE_PER_FIELD = 3


@pytest.fixture(scope="module")
def scenario_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    paths = {BASE: d / "base.yaml", CLUSTER_BASE: d / "cluster.yaml"}
    for text, p in paths.items():
        p.write_text(text)
    return paths


def sample() -> list:
    """SAMPLE_PER_FIELD cases per field (and its policy family or router), rotating through the bad values so that
    every kind of value meets some field; every field gets at least one certainly invalid value."""
    by_field: dict = {}
    for c in cases():
        by_field.setdefault((c.field, c.extra), []).append(c)
    out = []
    for i, group in enumerate(by_field.values()):
        invalid = [c for c in group if c.invalid]
        picks = [group[(i + k * 5) % len(group)] for k in range(SAMPLE_PER_FIELD)]
        if invalid and not any(c.invalid for c in picks):
            picks[0] = invalid[i % len(invalid)]
        out += list({id(c): c for c in picks}.values())
    return out


def test_every_field_of_the_schema_gets_bad_values():
    """A field added to a scenario section, a policy family's Config or a router's Config is fuzzed the day it is
    added: the cases come from the dataclasses, not from a list kept by hand."""
    from policies.knobs import families
    from sim.scenario.config import HardwareSection, MemorySection, ModelSection, SimSection
    fuzzed = {c.field for c in cases()}
    for prefix, cls in (("model.", ModelSection), ("hardware.", HardwareSection), ("memory.", MemorySection),
                        ("sim.", SimSection)):
        assert {prefix + f.name for f in dataclasses.fields(cls)} <= fuzzed
    for cls, _ in families():
        numeric = {k for k, t in typing.get_type_hints(cls.Config).items() if t in (int, float, bool)}
        assert {f"policy.{k}" for k in numeric} <= fuzzed
    assert {"seed", "slo.ttft_s", "workload.rate", "cluster.replicas"} <= fuzzed


def test_bad_values_end_in_one_line_and_exit_2(scenario_paths):
    picked = sample()
    assert len({c.field for c in picked}) == len({c.field for c in cases()})     # every field is in the sample
    failures = []
    for c in picked:
        out = run_case(c, scenario_paths[c.base])
        v = verdict(c, out)
        if v != "ok":
            failures.append(f"{c.field}={c.text!r} {list(c.extra)}: {v} {out.error or out.lines[-2:]}")
    assert failures == []


def test_the_verdicts_catch_what_they_look_for(monkeypatch, scenario_paths):
    """The harness must see a traceback, an exit 0 on invalid input and a second line for what they are."""
    bad = Case("memory.swap_space_gib", ".nan", "float", True)
    assert verdict(bad, Outcome(None, [], "TypeError: boom")) == "traceback"
    assert verdict(bad, Outcome(0, [])) == "exit0-on-invalid"
    assert verdict(bad, Outcome(2, ["servesim: error: a", "servesim: error: b"])) == "not-one-line"
    import sim.cli

    def crash(argv):
        raise TypeError("unhashable type: 'list'")
    monkeypatch.setattr(sim.cli, "main", crash)
    out = run_case(bad, scenario_paths[BASE])
    assert out.rc is None and verdict(bad, out) == "traceback" and "unhashable" in out.error
