"""Shape claims on several seeds (ES-16's U-shaped padding sweep, AL-13's slow-then-sharp latency rise), judged on
hand-made curves by the CI rule: a shape holds only when it holds on the seeds beyond the tie."""
from study.findings.alise import knee_shape, rise_steps
from study.findings.econoserve import u_shape

UNDER = [[80, 60, 40, 20]] * 2 + [[82, 61, 39, 18]]          # under-provisioned share falls on every seed


def test_a_u_on_every_seed_holds():
    jct = [[100, 70, 75, 95], [104, 72, 74, 96], [98, 69, 76, 93]]
    k, margin, falls, ok, why = u_shape(jct, UNDER)
    assert (k, ok, why) == (1, True, "") and margin.mean > 0.3 and falls.mean > 0.5


def test_a_minimum_at_an_end_is_not_a_u():
    jct = [[60, 70, 80, 95], [61, 72, 81, 96], [59, 69, 79, 93]]     # rising: the best padding is none
    k, _, _, ok, why = u_shape(jct, UNDER)
    assert k == 0 and ok is False and why == ""


def test_a_dip_that_one_seed_contradicts_is_untestable():
    jct = [[100, 60, 70, 110], [60, 70, 75, 80], [64, 62, 70, 90]]   # seed 1 is lowest at no padding
    k, margin, _, ok, why = u_shape(jct, UNDER)
    assert k == 1 and why and "spans zero" in why


def test_rise_steps_reads_first_and_largest_growth():
    first, top = rise_steps([[1.0, 1.1, 1.3, 4.0], [2.0, 2.4, 2.6, 5.2]])
    assert [round(v, 3) for v in first] == [1.1, 1.2] and [round(v, 3) for v in top] == [3.077, 2.0]


def test_knee_shape_needs_a_slow_start_and_a_sharp_rise_on_the_seeds():
    slow, sharp = [1.05, 1.08, 1.04], [4.0, 5.1, 3.6]
    assert knee_shape([slow], [sharp]) == (True, "")
    gradual = [1.6, 1.65, 1.7]                       # the largest step never explodes: the claim fails
    assert knee_shape([slow], [gradual])[0] is False
    steep_start = [1.7, 1.8, 1.9]                    # latency jumps from the first step: no slow phase
    assert knee_shape([steep_start], [sharp])[0] is False
    mixed = [1.2, 2.6, 2.1]                          # explodes on two seeds of three: CI spans 2x
    ok, why = knee_shape([slow], [mixed])
    assert ok is True and "spans zero" in why
