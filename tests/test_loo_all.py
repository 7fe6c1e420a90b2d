"""`fit_overheads --loo-all`: every run is predicted by a fit that did not see it."""
import numpy as np
import pandas as pd
import pytest

import study.fit_overheads as fo

# a fake engine: run -> (target step_s in ms, sensitivity of its errors to step_s, does moe_gemm_scale move it)
RUNS = {"a": (1.0, 0.2, False), "b": (2.0, 0.1, False), "c": (4.0, 0.3, False), "m": (3.0, 0.2, True)}


def fake_run(row, workloads, overheads="vllm", kv="measured"):
    """Errors linear in step_s (and in moe_gemm_scale for the MoE run), zero at the run's own target."""
    exp = str(row["exp_id"])
    target, sens, moe = RUNS[exp]
    over = overheads if isinstance(overheads, dict) else {"step_s": 2e-3, "moe_gemm_scale": 1.3}
    err = sens * (over["step_s"] * 1e3 - target) + (0.5 * (over["moe_gemm_scale"] - 1.2) if moe else 0.0)
    meas = {k: 100.0 for k in ("e2e_mean", "ttft_mean", "itl_mean")}
    return {"exp_id": exp, "tp": 1, "measured_ms": meas, "predicted_ms": {k: v * (1 + err) for k, v in meas.items()},
            "over": over}


def test_chord_refit_is_the_least_squares_fit_on_the_other_runs_only(monkeypatch):
    """On errors linear in the parameters the chord refit is the exact least-squares fit of each fold; the fold
    without the only MoE run sets moe_gemm_scale to its neutral start, not the value fitted with that run."""
    monkeypatch.setattr(fo, "run_experiment", fake_run)
    rows = [{"exp_id": x} for x in RUNS]
    names = ["step_s", "moe_gemm_scale"]
    folds = fo.chord_refits(rows, {}, names, jobs=1, point={"step_s": 2e-3, "moe_gemm_scale": 1.3})
    for i, x in enumerate(RUNS):
        fold = folds[i]
        assert x not in fold["train"] and len(fold["train"]) == 3
        others = [k for k in RUNS if k != x]
        if x == "m":                            # no MoE run left: neutral, step_s from the dense runs alone
            assert fold["fitted"]["moe_gemm_scale"] == pytest.approx(fo.PARAMS["moe_gemm_scale"][1])
            w = np.array([RUNS[k][1] for k in others]) ** 2
            best = float(np.sum(w * [RUNS[k][0] for k in others]) / w.sum())
            assert fold["fitted"]["step_s"] * 1e3 == pytest.approx(best, rel=1e-6)
        else:                                   # the MoE run pins moe_gemm_scale; the dense runs pin step_s
            assert fold["fitted"]["moe_gemm_scale"] != pytest.approx(1.3)
        assert fold["train_rms_after"] <= fold["train_rms_at_point"] + 1e-12


def test_loo_all_predicts_every_run_with_the_fold_that_left_it_out(monkeypatch):
    """True leave-one-out: each run of the folder simulated with the parameters of the fold that did not see it."""
    used = {}

    def fake_chord(rows, workloads, names, jobs, point, steps=2, log=None, check=True):
        assert set(names) <= set(point)                             # the preset's fitted parameters, from its values
        return [{"fitted": {"fold_of": str(r["exp_id"])}, "train": [str(o["exp_id"]) for o in rows if o is not r]}
                for r in rows]

    def run(row, workloads, overheads="vllm", kv="measured"):
        used[str(row["exp_id"])] = overheads
        return {"exp_id": str(row["exp_id"]), "tp": 1}

    monkeypatch.setattr(fo, "chord_refits", fake_chord)
    monkeypatch.setattr(fo, "run_experiment", run)
    ids = ["60", "17", "900", "901"]
    recs = fo.leave_all_out(pd.DataFrame({"exp_id": ids}), {}, jobs=1)
    assert [r["exp_id"] for r in recs] == ids
    for r in recs:
        assert used[r["exp_id"]] == {"fold_of": r["exp_id"]}
        assert r["exp_id"] not in r["fitted_without_it"]["train"] and len(r["fitted_without_it"]["train"]) == 3
