"""Parametrisation shared by the claim test files: which claims run at which scale, with which marks."""
import pytest

from study.findings import FULL, QUICK, evaluate


def claim_params(claims, scale_name: str, *, full_only=(), known: dict | None = None, skip: dict | None = None,
                 slow_anyway=()):
    """pytest params for `claims` at `scale_name` ('quick' or 'full'). A claim runs at the quick scale in the default
    run unless it is in full_only / slow_anyway or not quick; otherwise at the full scale, marked slow. `known`
    (id → reason) become strict expected failures, `skip` (id → reason) skips."""
    known, skip = known or {}, skip or {}
    out = []
    for c in claims:
        marks = []
        if c.id in skip:
            marks.append(pytest.mark.skip(reason=skip[c.id]))
        quick_ok = c.quick and c.id not in full_only and c.id not in slow_anyway
        if scale_name == "quick" and not quick_ok:
            continue
        if scale_name == "full":
            if quick_ok:
                continue
            marks.append(pytest.mark.slow)
        if c.id in known:
            marks.append(pytest.mark.xfail(reason=known[c.id], strict=True))
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


def check_direction(claim, scale):
    r = evaluate(claim, scale)
    if r.outcome.untestable:               # a tie or saturation: this setup cannot tell either way
        pytest.skip(f"{claim.id} untestable here: {r.outcome.untestable}")
    assert r.outcome.direction, f"{claim.id} ({claim.statement}): paper {r.outcome.paper}; ours {r.outcome.ours}"


def direction_tests(claims, **params):
    """The two direction tests of a claim file: every claim at the quick scale (default run) and the rest at the
    full scale (slow); `params` as claim_params. Assign both to module-level names so pytest collects them."""
    @pytest.mark.parametrize("claim", claim_params(claims, "quick", **params))
    def test_claim_direction_quick(claim):
        check_direction(claim, QUICK)

    @pytest.mark.parametrize("claim", claim_params(claims, "full", **params))
    def test_claim_direction_full(claim):
        check_direction(claim, FULL)

    return test_claim_direction_quick, test_claim_direction_full
