"""Issue #28's rules on hand-made cases: one capacity rule (served AND latency), the seed/CI verdict, row stamps."""
import json
import math

import numpy as np
import pytest

from costmodels.errors import UserError
from sim.paths import REPO_ROOT
from study.findings.stamps import code_of, row_stamp
from study.findings.verdicts import (HOLDS, OPPOSITE, UNTESTABLE, combine, seed_effect, served_ratio,
                                     sustainable_rate, sustained)


def _table(rate_in, rate_out, n=400):
    """Arrivals at rate_in; a server that completes one request every 1/rate_out seconds, FIFO."""
    arr = np.arange(n) / rate_in
    done, t = [], 0.0
    for a in arr:
        t = max(t, a) + 1.0 / rate_out
        done.append(t)
    return arr, np.array(done)


def test_a_system_that_keeps_up_serves_everything():
    assert served_ratio(*_table(10, 20)) == pytest.approx(1.0, abs=0.01)


def test_a_system_that_falls_behind_is_not_sustainable_even_if_latency_passes():
    a, c = _table(39, 21.3)
    s = served_ratio(a, c)
    assert s == pytest.approx(21.3 / 39, abs=0.05)
    assert not sustained(s, latency_ok=True)
    # the grid: latencies all pass, but the top rate is not served
    rates, lat = [10, 20, 39], [0.05, 0.08, 0.139]
    served = [1.0, 1.0, s]
    assert sustainable_rate(rates, lat, 0.172) == 39            # latency alone credits it
    r = sustainable_rate(rates, lat, 0.172, served)
    assert 20 <= r < 39 * 0.6


def test_latency_rule_still_applies_and_unfinished_requests_count_as_not_served():
    assert sustainable_rate([1, 2, 3], [0.1, 0.2, 0.4], 0.3, [1, 1, 1]) == pytest.approx(2.5)
    a, c = _table(10, 20)
    c[len(c) // 2:] = np.nan                                   # half never finishes
    assert not sustained(served_ratio(a, c))
    with pytest.raises(UserError):
        served_ratio([0, 1], [1, 2])
    with pytest.raises(UserError):
        sustainable_rate([1, 2], [0.1], 0.3)


def test_ci_rule_holds_opposite_and_untestable():
    assert seed_effect([0.30, 0.35, 0.28]).verdict == HOLDS
    assert seed_effect([-0.30, -0.35, -0.28]).verdict == OPPOSITE
    e = seed_effect([0.4, -3.0, 3.8])                         # AS-9's 0.4 ± 3.4 pp: spans zero
    assert e.verdict == UNTESTABLE and "spans zero" in e.reason
    t = seed_effect([0.01, 0.012, 0.011])                     # consistent but inside the tie threshold
    assert t.verdict == UNTESTABLE and "tie" in t.reason
    assert seed_effect([0.5]).verdict == UNTESTABLE           # one seed: no interval
    assert seed_effect([0.3, 0.3, 0.3], saturated="every system ≥ 98%").verdict == UNTESTABLE
    e = seed_effect([1.0, 2.0, 3.0])
    assert e.mean == 2.0 and e.hi - e.mean == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert combine([seed_effect([1, 1.1, 1.2]), seed_effect([-1, -1.1, -1.2])]) == (False, "")
    assert combine([seed_effect([1, 1.1, 1.2])] * 2) == (True, "")
    assert combine([seed_effect([1, 1.1, 1.2]), seed_effect([0, 0.001, -0.001])])[1]


def test_row_stamps_of_the_committed_report_match_the_code():
    """A row computed before a change to a file it depends on (policy, cost model, claim module) is stale."""
    doc = json.loads((REPO_ROOT / "docs" / "reproduction.json").read_text())
    stale = [c["id"] for c in doc["claims"] if c.get("stamp") != row_stamp(c["paper"])]
    assert not stale, f"stale rows (regenerate with servesim reproduce --update --claims ...): {stale}"


def test_a_stamp_ignores_prose_but_not_code(tmp_path):
    """Docstrings, comments and YAML comments leave a row current; a changed statement or value does not."""
    a, b, c = (tmp_path / f"{k}.py" for k in "abc")
    a.write_text('"""Doc."""\ndef f(x):\n    """Twice."""\n    return x + 1  # why\n')
    b.write_text('"""Other doc."""\n# a comment\ndef f(x):\n    """Other."""\n    return x + 1\n')
    c.write_text('"""Doc."""\ndef f(x):\n    return x + 2\n')
    assert code_of(a) == code_of(b) != code_of(c)
    y1, y2, y3 = (tmp_path / f"{k}.yaml" for k in "xyz")
    y1.write_text("# header\nrate: 2  # req/s\n")
    y2.write_text("rate: 2\n")
    y3.write_text("rate: 3\n")
    assert code_of(y1) == code_of(y2) != code_of(y3)
