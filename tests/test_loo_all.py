"""`fit_overheads --loo-all`: every run is predicted by a fit that did not see it."""
import pandas as pd

import study.fit_overheads as fo


def test_loo_all_never_predicts_a_run_with_a_fit_that_saw_it(monkeypatch):
    """The preset's training runs are each refitted without themselves; the other runs use the preset as shipped."""
    from costmodels.base import overhead_presets
    train = [str(x) for x in overhead_presets()["vllm"]["provenance"]["fit_experiments"]]
    ids = train + ["900", "901"]
    exps = pd.DataFrame({"exp_id": ids})
    seen_by_fit = {}

    def fake_fit(rows, workloads, names, jobs, base=None, neutral_start=False):
        assert neutral_start                                        # never starts from the shipped fit
        key = tuple(sorted(str(r["exp_id"]) for r in rows))
        return {"step_s": 1e-3 * len(seen_by_fit), "_rows": key}, None

    def fake_run(row, workloads, overheads="vllm", kv="measured"):
        exp = str(row["exp_id"])
        seen_by_fit[exp] = overheads
        return {"exp_id": exp, "tp": 1}

    monkeypatch.setattr(fo, "fit", fake_fit)
    monkeypatch.setattr(fo, "run_experiment", fake_run)
    recs = fo.leave_all_out(exps, {}, jobs=1)
    assert [r["exp_id"] for r in recs] == ids                       # folder order, every run once
    for x in train:
        rows = seen_by_fit[x]["_rows"]
        assert x not in rows and set(rows) == set(train) - {x}      # refitted on the other training runs only
    assert seen_by_fit["900"] == "vllm" and seen_by_fit["901"] == "vllm"   # never seen by the shipped fit
    assert all("predicted_by" in r for r in recs)
