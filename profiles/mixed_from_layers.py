"""What pricing a mixed batch's decodes as the varlen call runs them does to held-out whole iterations, computed from
a profile taken before the harness timed `attn_mixed` rows: its measured mixed-batch layers, less the measured
non-attention sum, stand in for them.   python -m profiles.mixed_from_layers CSV --model M --gpu G"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def derived_mixed_rows(table: pd.DataFrame, model, gpu) -> pd.DataFrame:
    """attn_mixed rows (one varlen call) from the graph-timed layer_forward rows of mixed batches: layer time less the
    profile's own non-attention sum at the batch's token count. Batches also timed as whole iterations are left out,
    so the iterations stay held out."""
    from costmodels.calibrate import fit
    lf = table[(table["op"] == "layer_forward") & (table["prefill"] != "") & (table["decode"] != "")]
    if "timing" in lf:
        lf = lf[lf["timing"].isin(("graph", "cpu"))]
    it = table[table["op"] == "iteration_forward"]
    held = set(zip(it["prefill"], it["decode"]))
    lf = lf[[(p, d) not in held for p, d in zip(lf["prefill"], lf["decode"])]]
    cm = fit("profiled", table, model, gpu)        # only its measured dense table is used here
    other_ms = np.array([1e3 * float(cm.dense_ops_time(int(n))) for n in lf["num_tokens"]])
    out = lf.copy()
    out["op"] = "attn_mixed"
    out["time_ms"] = lf["time_ms"].to_numpy(float) - other_ms
    out["mixed_attention"] = "one-varlen"
    out["kernels_impl"] = "derived: layer_forward less the measured non-attention sum"
    return out[out["time_ms"] > 0]


def iteration_errors(paths, model, gpu, seed: int = 0, mode: str | None = None) -> dict:
    """Held-out whole iterations (graph-replayed; eager ones left out) under calibrate's contiguous-block split: MAPE of all, of the pure-decode
    ones and of the mixed ones, and each mixed iteration's signed error (%). `mode`: only the mixed iterations the
    harness ran that way (column mixed_attention), each priced that way."""
    from costmodels.calibrate import fit, predict_op, refuse_eager, split_contiguous
    from costmodels.profile_data import read_profiles
    table = read_profiles(paths)
    refuse_eager(table)
    train, test = split_contiguous(table, 0.25, seed)
    cm = fit("profiled", train, model, gpu)
    it = test[(test["op"] == "iteration_forward") & (test["timing"] != "eager")]     # graph (cpu on a CPU)
    if mode and "mixed_attention" in it:
        it = it[it["mixed_attention"].isin((mode, ""))]
    y = it["time_ms"].to_numpy(float)
    p = np.array([1e3 * predict_op(cm, r) for _, r in it.iterrows()])
    err = 100 * (p / y - 1)
    mixed = (it["prefill"] != "").to_numpy()
    return {"all": float(np.mean(np.abs(err))), "n": int(len(y)), "pure_decode": float(np.mean(np.abs(err[~mixed]))),
            "mixed": float(np.mean(np.abs(err[mixed]))) if mixed.any() else None,
            "mixed_each": [round(float(e), 1) for e in err[mixed]],
            "in_varlen": getattr(cm, "decode_fit", {}).get("in_varlen")}


def compare(csv, model, gpu, seed: int = 0) -> dict:
    """{'before': errors of the profile as it is, 'after': with the derived attn_mixed rows added, 'derived': n}."""
    from costmodels.profile_data import read_profiles
    before = iteration_errors([csv], model, gpu, seed)
    table = read_profiles([csv])
    rows = derived_mixed_rows(table, model, gpu)
    with tempfile.TemporaryDirectory() as d:
        extra = Path(d) / f"{Path(csv).stem}-attn-mixed-derived.csv"
        rows.drop(columns=["source"], errors="ignore").to_csv(extra, index=False)
        after = iteration_errors([csv, extra], model, gpu, seed)
    return {"before": before, "after": after, "derived": int(len(rows))}


def main(argv=None) -> int:
    from costmodels.catalog import get_gpu, get_model
    ap = argparse.ArgumentParser(prog="python -m profiles.mixed_from_layers", description=__doc__)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--model", nargs="+", required=True, help="one catalog model per CSV")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--seeds", type=int, default=1, help="held-out splits (seeds 0..n-1)")
    args = ap.parse_args(argv)
    if len(args.model) != len(args.csv):
        print("mixed_from_layers: give one --model per CSV", file=sys.stderr)
        return 2
    gpu = get_gpu(args.gpu, "--gpu")
    for csv, name in zip(args.csv, args.model):
        for seed in range(args.seeds):
            r = compare(csv, get_model(name, "--model"), gpu, seed)
            b, a = r["before"], r["after"]
            print(f"{Path(csv).name} ({name}, seed {seed}): {b['n']} held-out graph iterations; {r['derived']} "
                  f"attn_mixed rows derived from mixed layers")
            for tag, e in (("decodes priced as decode-kernel rows", b), ("decodes priced inside the varlen call", a)):
                print(f"  {tag:<40} all {e['all']:5.2f}%  pure-decode {e['pure_decode']:5.2f}%  mixed "
                      f"{e['mixed'] if e['mixed'] is None else round(e['mixed'], 2)}%  each {e['mixed_each']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
