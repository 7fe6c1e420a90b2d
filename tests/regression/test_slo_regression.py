"""SLO regression: the canonical table must match the committed baseline within each column's tolerance, and a
changed cost coefficient or policy rule must show up as a diff naming scenario, policy and metric."""
import copy

import pytest
import yaml

from study.regress import (DEFAULT_BASELINE, TOLERANCES, Tolerance, compare, compute_table, format_diff,
                         load_baseline, missing_rows, write_baseline)
from costmodels.linear import default_profile_path


@pytest.fixture(scope="module")
def baseline():
    if not DEFAULT_BASELINE.exists():
        pytest.fail(f"no baseline at {DEFAULT_BASELINE}; create it with `servesim regress --update`")
    return load_baseline()


@pytest.fixture(scope="module")
def current():
    return compute_table()


def test_canonical_table_matches_baseline(baseline, current):
    diffs = compare(baseline, current)
    assert not diffs, "\n" + format_diff(diffs) + "\n(if intended: servesim regress --update)"
    assert not missing_rows(baseline, current)


def test_baseline_covers_the_load_range(baseline):
    """The canonical rates must span easy to overloaded, or the table could not catch SLO regressions."""
    for (scn, pol), g in baseline.groupby(["scenario", "policy"]):
        att = g.sort_values("rate")["slo_attainment"].to_numpy()
        assert att[0] >= 0.95 and att[-1] <= 0.5, f"{scn}/{pol}: attainment over rates {att}"


def _perturbed_costmodel(coef, factor):
    prof = yaml.safe_load(default_profile_path("a100-80gb", "llama-2-7b").read_text())
    c = copy.deepcopy(prof["coefficients"])
    c[coef] *= factor
    return {"kind": "linear", "coefficients": c}


def test_changed_cost_coefficient_fails_with_a_named_diff(baseline):
    # The decode KV-read coefficient 20% higher: slower decodes under load.
    cur = compute_table(scenarios=["chat"], policies=["sarathi"], costmodel=_perturbed_costmodel("a_d", 1.2))
    diffs = compare(baseline, cur)
    assert diffs
    assert {(d["scenario"], d["policy"]) for d in diffs} == {("chat", "sarathi")}
    metrics = {d["metric"] for d in diffs}
    assert {"tps", "tbt_p50_s"} <= metrics
    text = format_diff(diffs)
    assert "chat" in text and "sarathi" in text and "tbt_p50_s" in text and "baseline" in text


def test_changed_policy_rule_fails_and_update_restores_green(baseline, tmp_path):
    # Sarathi with a 256-token prefill budget instead of 512.
    cur = compute_table(scenarios=["long-prompt"], policies=["sarathi"], policy_knobs={"P": 256})
    diffs = compare(baseline, cur)
    assert any(d["metric"] == "ttft_p99_s" and d["policy"] == "sarathi" for d in diffs)
    # `--update` semantics: rewrite, then the same table compares clean.
    path = tmp_path / "baseline.csv"
    write_baseline(cur, path)
    assert compare(load_baseline(path), cur) == []


def test_tolerance_is_per_column_and_handles_nan():
    t = Tolerance(0.005, 0.0)
    assert not t.moved(0.5, 0.504) and t.moved(0.5, 0.506)
    r = Tolerance(0.0, 1e-3)
    assert not r.moved(1000.0, 1000.9) and r.moved(1000.0, 1001.1)
    assert not r.moved(float("nan"), float("nan")) and r.moved(float("nan"), 1.0)
    assert set(TOLERANCES) >= {"slo_attainment", "ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "tps"}


def test_regress_cli_update_then_check(tmp_path, capsys, monkeypatch):
    import study.regress as rg
    small = compute_table(scenarios=["chat"], policies=["vllm"])
    monkeypatch.setattr(rg, "compute_table", lambda: small)
    path = tmp_path / "b.csv"
    from sim.cli import main
    assert main(["regress", "--baseline", str(path)]) == 2          # no baseline yet: a clear error
    assert main(["regress", "--update", "--baseline", str(path)]) == 0
    assert main(["regress", "--baseline", str(path)]) == 0
    assert "no SLO regression" in capsys.readouterr().out
    moved = small.copy()
    moved.loc[0, "slo_attainment"] -= 0.1
    monkeypatch.setattr(rg, "compute_table", lambda: moved)
    assert main(["regress", "--baseline", str(path)]) == 1
    out = capsys.readouterr().out
    assert "chat" in out and "vllm" in out and "slo_attainment" in out
    assert main(["regress", "--update", "--baseline", str(path)]) == 0
    assert "1 change(s) recorded" in capsys.readouterr().out
    assert main(["regress", "--baseline", str(path)]) == 0


def test_regress_refuses_a_file_that_is_not_a_baseline_before_computing(tmp_path, capsys, monkeypatch):
    """A CSV of something else ended in `KeyError: 'scenario'` after the whole table was computed, and --update
    would have overwritten it."""
    import study.regress as rg
    monkeypatch.setattr(rg, "compute_table", lambda: pytest.fail("computed before the baseline was checked"))
    other = tmp_path / "trace.csv"
    other.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    from sim.cli import main
    for update in ([], ["--update"]):
        assert main(["regress", "--baseline", str(other), *update]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"servesim: error: {other}: not a regress baseline (no column(s) scenario, policy, "
                              "rate,") and len(err.splitlines()) == 1, err
    assert other.read_text() == "arrival_s,prompt_tokens,output_tokens\n0,10,5\n"
    (tmp_path / "empty.csv").write_text("")
    assert main(["regress", "--baseline", str(tmp_path / "empty.csv")]) == 2
    assert "not a regress baseline (EmptyDataError" in capsys.readouterr().err
