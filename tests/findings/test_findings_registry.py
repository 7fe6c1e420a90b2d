"""The claim machinery itself: verdict logic, magnitude tolerance, missing requirements, and the report writer."""
from sim.study.findings.registry import (DIRECTION_ONLY, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Claim, Outcome, Scale,
                                   evaluate, within)
from sim.study.findings.report import provenance, render_markdown, tally

TINY = Scale("tiny", B=8, m_factor=0.01, I_grid=(16,), O_grid=(4,), M_sweep_I=(16,), rank_B=8)


def test_verdicts_follow_direction_then_magnitude():
    assert Outcome("p", "o", True, True).verdict == REPRODUCED
    assert Outcome("p", "o", True, None).verdict == REPRODUCED
    assert Outcome("p", "o", True, False).verdict == DIRECTION_ONLY
    assert Outcome("p", "o", False, True).verdict == NOT_REPRODUCED
    assert Outcome("p", "o", None).verdict == NOT_RUN


def test_numpy_booleans_are_understood():
    import numpy as np
    assert Outcome("p", "o", np.bool_(True), np.bool_(False)).verdict == DIRECTION_ONLY


def test_magnitude_tolerance_is_relative_fifty_percent():
    assert within(1.49, 1.0) and within(0.51, 1.0)
    assert not within(1.51, 1.0) and not within(0.49, 1.0)
    assert within(6.0, 5.0) and not within(13.0, 5.0)


def test_claim_needing_a_missing_module_is_not_run():
    c = Claim("X-1", "test", "0", "needs a module", lambda s: Outcome("a", "b", True),
              requires=("no_such_module_for_servesim",))
    r = evaluate(c, TINY)
    assert r.outcome.verdict == NOT_RUN and "no_such_module_for_servesim" in r.outcome.note


def test_report_counts_and_rows():
    claims = [Claim("A-1", "t", "1", "up", lambda s: Outcome("2x", "2.2x", True, True)),
              Claim("A-2", "t", "1", "down | pipe", lambda s: Outcome("3x", "1.1x", True, False, "our reason")),
              Claim("A-3", "t", "1", "flip", lambda s: Outcome("<", ">", False))]
    results = [evaluate(c, TINY) for c in claims]
    t = tally(results)
    assert (t["direction_ok"], t["checked"], t["magnitude_ok"], t["magnitude_checked"]) == (2, 3, 1, 2)
    md = render_markdown(results, TINY, {}, "figures", provenance(TINY, 1.0))
    assert "Direction reproduced in **2/3**" in md and "**1/2**" in md
    assert "down \\| pipe" in md and "our reason" in md
    assert md.count("\n| A-") == 3
