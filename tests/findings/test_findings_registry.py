"""The claim machinery itself: verdict logic, magnitude tolerance, missing requirements, and the report writer."""
from study.findings.registry import (DIRECTION_ONLY, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Claim, Outcome, Scale,
                                   evaluate, within)
from study.findings.report import provenance, render_markdown, tally

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


def test_ratio_magnitudes_compare_the_effect_at_every_ratio():
    """One rule: the excess over 1x within ±50% of the paper's excess, for small and large ratios alike."""
    from study.findings.registry import within_ratio
    assert not within_ratio(1.15, 2.3)          # 0.15 against 1.3: the raw ratio would have passed
    assert within_ratio(1.5, 1.9)               # 0.5 against 0.9
    assert not within_ratio(1.0, 1.73)          # no effect is not "1.73x better"
    assert within_ratio(4.0, 4.9) and not within_ratio(2.0, 4.9)


def test_ties_and_saturated_comparisons_are_untestable_not_reproduced():
    from study.findings.registry import UNTESTABLE, untestable_reason
    tie = untestable_reason({"a": 1.000, "b": 1.015})
    assert "tie" in tie
    sat = untestable_reason({"vllm": 0.99, "bros": 1.0}, fraction=True)
    assert "saturated" in sat
    assert untestable_reason({"a": 1.0, "b": 1.2}) == ""
    assert untestable_reason({"a": 0.9, "b": 1.0}, fraction=True) == ""
    out = Outcome("p", "o", True, True, untestable=tie)
    assert out.verdict == UNTESTABLE and "Untestable: " in out.note
    assert Outcome("p", "o", False, untestable=sat).verdict == UNTESTABLE
    results = [evaluate(Claim("U-1", "t", "1", "tie", lambda s: out), TINY)]
    t = tally(results)
    assert t["untestable"] == 1 and t["checked"] == 0 and t["not_run"] == 0


def test_why_notes_carry_no_typed_in_numbers():
    """A why-note explains; the numbers come from the run (the `ours` column and generated notes), so no
    registered why may contain a digit that could go stale."""
    import re
    from study.findings.registry import load_claims
    names = re.compile(r"\b([A-Z]{2}-[A-Z0-9.]+|INT8|FP16)\b")     # claim ids and format names are not figures
    stale = {cid: c.why for cid, c in load_claims().items() if re.search(r"\d", names.sub("", c.why or ""))}
    assert not stale, stale
