"""Fit vLLM's KV-capacity reservations (profiles/vllm-memory.yaml) on the KV blocks measured deployments reported:

    python -m study.fit_memory [--train 67,64,62,60] [--write]

Per experiment, what vLLM left out of gpu_memory_utilization × total besides the weights is
`budget − weights − blocks × 16 × KV bytes per token`; costmodels.memory models it as non_torch + activation_scale ×
the forward's per-token intermediates × max_num_batched_tokens + 12 bytes × max_num_seqs × vocab. The two unknowns
are fitted by least squares on the dense training experiments (the same ones the overhead preset was fitted on,
Llama-4-Scout left out: a multimodal checkpoint whose reservations the text-only model does not explain) and the
blocks predicted for every other experiment are reported as held out."""
from __future__ import annotations

import argparse
import datetime as _dt
import sys

import numpy as np
import yaml

from costmodels.catalog import GiB, get_gpu
from costmodels.memory import PARAMS_FILE, SAMPLER_BYTES_PER_LOGIT, forward_activation_bytes, vllm_memory_breakdown
from study.validate import BLOCK, HARDWARE, data_dir, experiment_model, load_experiments

DEFAULT_TRAIN = ("67", "64", "62", "60")


def experiment_terms(row):
    """(model, gpu, measured non-KV reservation bytes, forward activation bytes, sampler bytes) for one row."""
    model, why = experiment_model(row)
    if model is None:
        return None
    gpu = get_gpu(HARDWARE.get(str(row["hardware"]), str(row["hardware"]).lower()))
    tp = int(row["tp"])
    kv = int(row["vllm_kv_blocks_gpu"]) * BLOCK * model.kv_bytes_per_token(None, tp)
    other = gpu.mem_bytes * float(row["gpu_memory_utilization"]) - model.weight_bytes() / tp - kv
    fwd = forward_activation_bytes(model, int(row["max_num_batched_tokens"]), tp)
    sampler = SAMPLER_BYTES_PER_LOGIT * int(row["max_num_seqs"]) * model.vocab
    return model, gpu, other, fwd, sampler


def predicted_blocks(row, params=None) -> int:
    t = experiment_terms(row)
    model, gpu = t[0], t[1]
    b = vllm_memory_breakdown(model, gpu, float(row["gpu_memory_utilization"]), int(row["tp"]),
                              int(row["max_num_batched_tokens"]), int(row["max_num_seqs"]), params=params)
    return int(b.kv_tokens // BLOCK)


def fit(rows) -> dict:
    from scipy.optimize import nnls
    terms = [experiment_terms(r) for r in rows]
    A = np.array([[GiB, t[3]] for t in terms])
    y = np.array([t[2] - t[4] for t in terms])
    (c, a), _ = nnls(A, y)
    return {"non_torch_gib": float(c), "activation_scale": float(a)}


def report(exps, train, params) -> list:
    out = []
    for _, r in exps.iterrows():
        if experiment_terms(r) is None:
            continue
        pred = predicted_blocks(r, params)
        meas = int(r["vllm_kv_blocks_gpu"])
        out.append({"exp": str(r["exp_id"]), "model": r["hf_model"], "tp": int(r["tp"]),
                    "max_num_batched_tokens": int(r["max_num_batched_tokens"]), "measured_blocks": meas,
                    "predicted_blocks": pred, "error_pct": 100.0 * (pred - meas) / meas,
                    "train": str(r["exp_id"]) in train, "multimodal_moe": experiment_terms(r)[0].is_moe})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default=",".join(DEFAULT_TRAIN))
    ap.add_argument("--data")
    ap.add_argument("--write", action="store_true", help=f"write the fit to {PARAMS_FILE.name}")
    args = ap.parse_args(argv)
    train = [t.strip() for t in args.train.split(",")]
    exps, _ = load_experiments(data_dir(args.data))
    rows = [r for _, r in exps.iterrows() if str(r["exp_id"]) in train]
    if len(rows) < 2:
        print(f"fit_memory: --train names {len(rows)} known experiment(s); need at least 2", file=sys.stderr)
        return 2
    params = fit(rows)
    rep = report(exps, train, params)
    for e in rep:
        mark = "*" if e["train"] else " "
        print(f"{e['exp']:>16}{mark} {e['model']:<52} tp{e['tp']} mbt {e['max_num_batched_tokens']:>5}  measured "
              f"{e['measured_blocks']:>6}  predicted {e['predicted_blocks']:>6}  {e['error_pct']:+6.2f}%")
    held = [abs(e["error_pct"]) for e in rep if not e["train"] and not e["multimodal_moe"]]
    scout = [e["error_pct"] for e in rep if e["multimodal_moe"]]
    print(f"fit: {params}; * = trained on\nheld-out dense: median |error| {np.median(held):.2f}%, max "
          f"{max(held):.2f}%" + (f"; Llama-4-Scout (multimodal MoE, not explained): {scout[0]:+.1f}%" if scout else ""))
    if args.write:
        spec = {**{k: round(v, 4) for k, v in params.items()},
                "provenance": {"engine": "vLLM v0.15.1, H100 SXM", "data": "../shared/data/validation/vllm-0.15.1 "
                               "(vllm_kv_blocks_gpu)", "fit_experiments": train,
                               "fitted_by": "python -m study.fit_memory --write (non-negative least squares)",
                               "sampler_bytes_per_logit": SAMPLER_BYTES_PER_LOGIT,
                               "heldout_dense_median_abs_error_pct": round(float(np.median(held)), 2),
                               "heldout_dense_max_abs_error_pct": round(float(max(held)), 2),
                               "not_explained": "Llama-4-Scout FP8 (multimodal MoE): predicted "
                                                f"{scout[0]:.0f}% more KV blocks than vLLM allocated" if scout else "",
                               "date": _dt.date.today().isoformat()}}
        PARAMS_FILE.write_text("# vLLM's KV-cache reservations besides the weights (costmodels.memory).\n"
                               + yaml.safe_dump(spec, sort_keys=False))
        print(f"wrote {PARAMS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
