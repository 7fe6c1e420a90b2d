"""Fit the `vllm` overheads preset (profiles/overheads.yaml) on a named subset of the measured vLLM deployments:

    python -m study.fit_overheads [--train 67,64,62,60,17]

By default eight parameters: the CPU time per iteration (step_s; per_seq_s stays 0: fitting it too overfits the
five experiments, measured by the held-out errors), the per-request front-end time (frontend_s plus
frontend_per_token_s × its prompt plus frontend_steps × the request's first step), and four
factors for how vLLM's runtime differs from kernels profiled one by one (kernel_overhead_scale on every kernel's
fixed time: CUDA graphs; decode_attention_scale on decode attention's KV-read time: its attention backend on H100,
for which no kernel profile is shared; allreduce_per_byte_scale on the custom all-reduce's per-byte time, whose
published line was measured without CUDA graphs; moe_gemm_scale on the routed experts' grouped GEMMs: vLLM's
fused MoE kernel, which only the Llama-4-Scout experiment in the training set exercises) are fitted by least squares on the relative errors of mean e2e latency,
mean TTFT and mean ITL of the training experiments only, everything else in the cost model fixed (roofline v2 /
profiled with the shipped efficiencies). `servesim validate` then reports the other experiments as held out. The default training set has
one experiment per model family and every tensor-parallel degree (Llama-2-7B TP1, Qwen2.5-7B TP1, Mistral-Nemo
TP2, Llama-3.1-70B TP4, Llama-4-Scout FP8 TP2); Yi-34B is never trained on.

Per host: `--base vllm --preset vllm-a100-80gb --params step_s --train ...` refits only the named parameters on
one GPU class's runs, the rest taken from the base preset, and writes the result as its own preset (validate uses
`vllm-<gpu>` for that GPU's experiments where it exists). `--loo` fits once per training run on the others and
prints each run's error from the fit that did not see it (nothing is written but the JSON of --out).

`--loo-all` is true leave-one-out over the folder: each run predicted by a refit of the preset's parameters on
every other run (Gauss-Newton with one Jacobian from the preset's values, `chord_refits`: a full fit per fold costs
hours on two cores); medians per group (dense, MoE, each TP, each GPU) over all of them. `--loo` with the default
five training runs refits on four: eight parameters on twelve errors, which does not generalise (a fold without
Llama-2-7B's long contexts drives decode_attention_scale to its bound)."""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

import numpy as np
import yaml

from sim.paths import REPO_ROOT
from study.validate import data_dir, load_experiments, run_experiment

DEFAULT_TRAIN = ("67", "64", "62", "60", "17")
# name: (scale of the search variable, start, lower, upper)
PARAMS = {"step_s": (1e-3, 0.6, 0, 50), "per_seq_s": (1e-5, 1.6, 0, 100), "frontend_s": (1e-2, 1.6, 0, 20),
          "frontend_per_token_s": (1e-5, 1.0, 0, 100),
          "frontend_steps": (1.0, 0.5, 0, 4.0), "kernel_overhead_scale": (1.0, 0.3, 0, 1.0),
          "decode_attention_scale": (1.0, 1.7, 0.5, 3.0), "allreduce_per_byte_scale": (1.0, 0.5, 0.0, 1.0),
          "moe_gemm_scale": (1.0, 1.0, 0.5, 2.0)}
DEFAULT_FIT = ("step_s", "frontend_s", "frontend_per_token_s", "frontend_steps", "kernel_overhead_scale",
               "decode_attention_scale", "allreduce_per_byte_scale", "moe_gemm_scale")


def objective(x, rows, workloads, jobs, names, base=None):
    over = {k: float(max(v, 0.0) * PARAMS[k][0]) for k, v in zip(names, x)}
    if base:
        over = {"preset": base, **over}
    if jobs > 1:
        from study.executors import run_tasks
        recs = [r for _, r in run_tasks([(run_experiment, (row, workloads, over), i) for i, row in enumerate(rows)],
                                        jobs=jobs)]
    else:
        recs = [run_experiment(row, workloads, over) for row in rows]
    res = []
    for r in recs:
        for k in ("e2e_mean", "ttft_mean", "itl_mean"):
            res.append((r["predicted_ms"][k] - r["measured_ms"][k]) / r["measured_ms"][k])
    return np.array(res)


def fit(rows, workloads, names, jobs, base=None, neutral_start=False):
    """Least squares on the relative errors of mean e2e, TTFT and ITL of `rows`; returns (fitted, residuals).
    A refit starts from the shipped values where they exist; a leave-one-out fit (neutral_start) from PARAMS'
    starts, since the shipped values were fitted on the run it holds out (a parameter no training run moves, such
    as moe_gemm_scale without an MoE run, would otherwise keep the held-out run's value)."""
    from scipy.optimize import least_squares
    from costmodels.base import overhead_presets
    start = {} if neutral_start else overhead_presets().get(base or "vllm", {})
    x0 = [min(max(start.get(k, PARAMS[k][1] * PARAMS[k][0]) / PARAMS[k][0], PARAMS[k][2]), PARAMS[k][3])
          for k in names]
    lo, hi = [PARAMS[k][2] for k in names], [PARAMS[k][3] for k in names]
    r = least_squares(objective, x0=x0, args=(rows, workloads, jobs, names, base), bounds=(lo, hi), diff_step=0.05,
                      max_nfev=50, verbose=0)
    return {k: float(v * PARAMS[k][0]) for k, v in zip(names, r.x)}, r.fun


def leave_one_out(rows, workloads, names, jobs, base=None) -> list:
    """Each run predicted by a fit on the other runs: the held-out records."""
    from study.validate import run_experiment
    out = []
    for i, row in enumerate(rows):
        fitted, _ = fit(rows[:i] + rows[i + 1:], workloads, names, jobs, base, neutral_start=True)
        rec = run_experiment(row, workloads, {"preset": base, **fitted} if base else fitted)
        rec["fitted_without_it"] = fitted
        print(f"{rec['exp_id']:>6} {rec['model'][:36]:<36} tp{rec['tp']} fit {fitted}: APE e2e "
              f"{rec['ape_pct']['e2e_mean']:.1f} TTFT {rec['ape_pct']['ttft_mean']:.1f} ITL "
              f"{rec['ape_pct']['itl_mean']:.1f}", flush=True)
        out.append(rec)
    return out


def _residuals(rows, workloads, over, jobs) -> np.ndarray:
    """Relative errors (e2e, TTFT, ITL means) of `rows` simulated with the overheads `over`, one row per run."""
    from study.executors import run_tasks
    tasks = [(run_experiment, (row, workloads, over), i) for i, row in enumerate(rows)]
    recs = dict(run_tasks(tasks, jobs=jobs))
    return np.array([[(recs[i]["predicted_ms"][k] - recs[i]["measured_ms"][k]) / recs[i]["measured_ms"][k]
                      for k in ("e2e_mean", "ttft_mean", "itl_mean")] for i in range(len(rows))])


def chord_refits(rows, workloads, names, jobs, point: dict, steps: int = 2, log=None, check: bool = True) -> list:
    """For each run of `rows`, a least-squares fit of `names` on the other runs, by Gauss-Newton with one Jacobian
    (the chord method): the Jacobian of every run's relative errors is taken once at `point` (forward differences
    of 5% of each parameter's scale, as `fit` takes them), then each held-out fold solves the bounded linear
    problem on its own runs and re-simulates them `steps` times. A parameter none of the fold's runs moves (zero
    column: moe_gemm_scale without an MoE run) is set to its neutral start (PARAMS), never kept at `point`, which
    was fitted with the held-out run. Cost: (len(names) + 1 + folds·steps) simulations per run instead of a full
    fit per fold. Returns one dict per run: the fold's parameters and its training RMS at `point`, as the last
    linear step expects it, and (check) as simulated with the fold's parameters."""
    from scipy.optimize import lsq_linear
    scale = np.array([PARAMS[k][0] for k in names])
    x0 = np.array([point[k] for k in names]) / scale
    lo, hi = np.array([PARAMS[k][2] for k in names]), np.array([PARAMS[k][3] for k in names])
    r0 = _residuals(rows, workloads, point, jobs)                        # runs x 3
    jac = np.zeros(r0.shape + (len(names),))
    for j, k in enumerate(names):
        h = 0.05 * max(abs(x0[j]), PARAMS[k][1])
        over = {**point, k: float((x0[j] + h) * scale[j])}
        jac[:, :, j] = (_residuals(rows, workloads, over, jobs) - r0) / h
        if log:
            print(f"jacobian column {k} done", file=log, flush=True)
    out = []
    for i in range(len(rows)):
        keep = [m for m in range(len(rows)) if m != i]
        J = jac[keep].reshape(-1, len(names))
        moved = np.abs(J).max(axis=0) > 1e-9
        x = x0.copy()
        x[~moved] = [PARAMS[k][1] for k, mv in zip(names, moved) if not mv]
        fold = [rows[m] for m in keep]
        r = r0[keep].reshape(-1) if moved.all() else None
        rms0 = float(np.sqrt(np.mean(r0[keep] ** 2)))
        for _ in range(steps):
            if r is None:
                r = _residuals(fold, workloads, dict(zip(names, map(float, x * scale))), jobs).reshape(-1)
            sol = lsq_linear(J[:, moved], -r, bounds=(lo[moved] - x[moved], hi[moved] - x[moved]))
            x[moved] = x[moved] + sol.x
            lin = float(np.sqrt(np.mean((r + J[:, moved] @ sol.x) ** 2)))
            r = None
        fitted = dict(zip(names, map(float, x * scale)))
        rms = float(np.sqrt(np.mean(_residuals(fold, workloads, fitted, jobs) ** 2))) if check else None
        out.append({"fitted": fitted, "train": [str(r["exp_id"]) for r in fold], "train_rms_at_point": rms0,
                     "train_rms_linear": lin, "train_rms_after": rms})
        if log:
            print(f"fold without {rows[i]['exp_id']}: training RMS {rms0:.4f} -> {lin:.4f} (linear)"
                  + (f", {rms:.4f} (simulated)" if check else ""), file=log, flush=True)
    return out


def leave_all_out(exps, workloads, jobs, preset="vllm", steps=2, log=None) -> list:
    """True leave-one-out over the folder (module docstring, --loo-all): each run predicted by a refit of the
    preset's fitted parameters on every other run (chord_refits from the preset's values)."""
    from costmodels.base import overhead_presets
    shipped = overhead_presets()[preset]
    names = list(shipped.get("provenance", {}).get("fitted_parameters", DEFAULT_FIT))
    rows = [r for _, r in exps.iterrows()]
    point = {k: float(shipped[k]) for k in names}
    folds = chord_refits(rows, workloads, names, jobs, point, steps, log, check=False)
    from study.executors import run_tasks
    tasks = [(run_experiment, (row, workloads, fold["fitted"]), i) for i, (row, fold) in enumerate(zip(rows, folds))]
    recs = dict(run_tasks(tasks, jobs=jobs))
    out = []
    for i, fold in enumerate(folds):
        rec = recs[i]
        rec["predicted_by"] = f"refit of {', '.join(names)} on the {len(fold['train'])} other runs"
        rec["fitted_without_it"] = fold
        out.append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default=",".join(DEFAULT_TRAIN))
    ap.add_argument("--data")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--params", default=",".join(DEFAULT_FIT), help=f"parameters to fit, of {', '.join(PARAMS)}")
    ap.add_argument("--base", help="preset the unfitted parameters come from (default: none, zeros)")
    ap.add_argument("--preset", default="vllm", help="name to write the fit under (default: vllm); --loo-all: the "
                    "preset whose values and fitted parameters the folds start from")
    ap.add_argument("--loo", action="store_true", help="leave-one-out errors only; writes nothing but --out")
    ap.add_argument("--loo-all", action="store_true", help="true leave-one-out: each run of the folder predicted by a "
                    "refit on all the others (chord method from the shipped preset); writes only --out")
    ap.add_argument("--steps", type=int, default=2, help="--loo-all: Gauss-Newton steps per fold (default 2)")
    ap.add_argument("--out", help="JSON of the leave-one-out records and medians")
    args = ap.parse_args(argv)
    train = [t.strip() for t in args.train.split(",")]
    exps, workloads = load_experiments(data_dir(args.data))
    rows = [r for _, r in exps.iterrows() if str(r["exp_id"]) in train]
    names = [p.strip() for p in args.params.split(",")]
    bad = set(names) - set(PARAMS)
    if bad:
        raise SystemExit(f"--params: unknown {', '.join(sorted(bad))}; allowed: {', '.join(PARAMS)}")
    if args.loo_all:
        import json
        from study.validate import format_report, summarize
        if args.steps < 1:
            raise SystemExit(f"--steps: must be at least 1, got {args.steps}")
        recs = leave_all_out(exps, workloads, args.jobs, preset=args.preset, steps=args.steps, log=sys.stderr)
        result = {"experiments": recs, "summary": summarize(recs, fitted=[]), "fit_experiments": [],
                  "kv": "measured"}
        print(format_report(result).replace("groups below: held-out experiments only",
                                            "every experiment held out (--loo-all)"))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
        return 0
    if args.loo:
        import json
        recs = leave_one_out(rows, workloads, names, args.jobs, args.base)
        med = {k: round(float(np.median([r["ape_pct"][k] for r in recs])), 2) for k in ("e2e_mean", "ttft_mean",
                                                                                       "itl_mean")}
        print(f"leave-one-out median APE % over {len(recs)} runs: {med}")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"params": names, "base": args.base, "train": train,
                                                  "records": recs, "median_ape_pct": med}, indent=1))
        return 0
    fitted, resid = fit(rows, workloads, names, args.jobs, args.base)
    path = REPO_ROOT / "profiles" / "overheads.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else {}
    doc.setdefault("presets", {})       # other presets (e.g. vllm-0.5-eager) are kept
    from costmodels.base import OVERHEAD_KEYS
    base = {k: v for k, v in doc["presets"].get(args.base, {}).items() if k in OVERHEAD_KEYS} if args.base else {}
    gpus = sorted({str(r["hardware"]) for r in rows})
    doc["presets"].update({args.preset: {**base, **{k: float(f"{v:.6g}") for k, v in fitted.items()}, "provenance": {
        "engine": f"vLLM v0.15.1 (OpenAI server, inference-perf client), {', '.join(gpus)}",
        "data": str(args.data or "../shared/data/validation/vllm-0.15.1") + " (experiments.csv, workloads.yaml)",
        **({"base_preset": args.base} if args.base else {}),
        "fit_experiments": train,
        "fitted_parameters": names,
        "fitted_by": "python -m study.fit_overheads (least squares on relative errors of mean e2e, TTFT, ITL)",
        "train_rms_rel_error": round(float(np.sqrt(np.mean(resid ** 2))), 4),
        "date": _dt.date.today().isoformat()}}})
    path.write_text("# CPU and front-end overheads of real engines (costmodels.base.Overheads), per preset.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    print(yaml.safe_dump(doc["presets"][args.preset], sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
