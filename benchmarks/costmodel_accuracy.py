"""Cost-model accuracy on data each model was not fitted on; prints the tables and writes JSON.

    PYTHONPATH=. python benchmarks/costmodel_accuracy.py [--seeds 4]

1. A100 Llama-2-7B: linear, roofline v2 and profiled (the default for the pair) fitted on 75% of the profile and
   tested on the rest held out in contiguous blocks (token counts, decode contexts, prefill chunk x context), for
   several split seeds; and fitted on up to 1,024 tokens, tested above (extrapolation).
2. Transfer: roofline v2 with efficiencies fitted on the A100 Llama-2-7B profile alone predicts the H100
   Llama-2-7B and A100 Llama-3-8B non-attention profiles (no refit): per-iteration MAPE by tensor-parallel degree.
3. Collectives: the all-reduce lines against the measured NCCL times (1 KB-64 MB, 2-8 GPUs), on the sizes they
   were fitted to and refitted on every other size and tested on the rest.
4. The cost of one batch_time call on the engine's sums path (µs).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from costmodels import get_gpu, get_model
from costmodels.calibrate import fit, fit_roofline, heldout_errors, split_contiguous, split_extrapolation
from costmodels.profile_data import read_profiles
from costmodels.roofline import RooflineCostModel
from sim.paths import shared_data_dir

KINDS = ("linear", "roofline", "profiled")
ROWS = ("attn_decode", "attn_decode, batch <= 8", "attn_prefill", "other (sum of non-attention ops) (tp 1)",
        "iteration non-attention (tp 1)", "iteration (mixed-batch grid)")


def heldout_table(table, model, gpu, seeds):
    out = {k: {} for k in KINDS}
    for kind in KINDS:
        per_seed = []
        for seed in range(seeds):
            tr, te = split_contiguous(table, 0.25, seed)
            e = heldout_errors(fit(kind, tr, model, gpu), te, reference=table, seed=seed).set_index("what")
            per_seed.append(e)
        for row in ROWS:
            vals = [e.loc[row] for e in per_seed if row in e.index]
            if vals:
                out[kind][row] = {"mape_pct_seed0": round(float(vals[0]["mape_pct"]), 2),
                                  "mape_pct_mean": round(float(np.mean([v["mape_pct"] for v in vals])), 2),
                                  "bias_pct_seed0": round(float(vals[0]["bias_pct"]), 2)}
        tr, te = split_extrapolation(table, 1024)
        e = heldout_errors(fit(kind, tr, model, gpu), te, reference=table).set_index("what")
        out[kind]["extrapolation"] = {r: round(float(e.loc[r, "mape_pct"]), 2) for r in ROWS if r in e.index}
    return out


def transfer_table(shared):
    l7 = get_model("llama-2-7b")
    a100 = read_profiles([shared / "profiles" / "vidur-a100-llama-2-7b"], tp=None)
    params = fit_roofline(a100, l7, get_gpu("a100-80gb")).params
    out = {}
    for folder, model, gpu in (("vidur-h100-llama-2-7b", "llama-2-7b", "h100-sxm"),
                               ("vidur-a100-llama-3-8b", "llama-3-8b", "a100-80gb")):
        t = read_profiles([shared / "profiles" / folder], tp=None)
        cm = RooflineCostModel(get_model(model), get_gpu(gpu), params=params)
        e = heldout_errors(cm, t, n_mixed=0).set_index("what")
        out[f"{model} on {gpu}"] = {int(tp): round(float(e.loc[f"iteration non-attention (tp {tp})", "mape_pct"]), 2)
                                    for tp in sorted(t["tp"].unique())}
    return out


def collective_table(shared):
    from costmodels.collectives import fit_two_lines, read_nccl, two_line_time, _fits
    fitted = _fits().get("nccl", {})
    out, all_fit, all_held = {}, [], []
    for (kind, n), (s, y) in sorted(read_nccl(shared / "profiles" / "vidur-network").items()):
        p = fitted[kind][str(n)]
        ape = np.abs(two_line_time(p, s) - y) / y
        order = np.argsort(s)
        tr, te = order[::2], order[1::2]
        q = fit_two_lines(s[tr], y[tr])
        ape_h = np.abs(two_line_time(q, s[te]) - y[te]) / y[te]
        out[f"{kind}/{n}"] = {"mape_pct": round(100 * float(ape.mean()), 2), "heldout_mape_pct": round(100 * float(ape_h.mean()), 2)}
        all_fit.append(ape)
        all_held.append(ape_h)
    out["all"] = {"mape_pct": round(100 * float(np.concatenate(all_fit).mean()), 2),
                  "heldout_mape_pct": round(100 * float(np.concatenate(all_held).mean()), 2)}
    return out


def call_cost():
    from costmodels import build_costmodel
    l7, a100 = get_model("llama-2-7b"), get_gpu("a100-80gb")
    out = {}
    for kind in KINDS:
        cm = build_costmodel({"kind": kind}, l7, a100)
        args = (64 + 512, 1, 512 * 512, 512 * 1024, 1024, 64, 64 * 1500)
        cm.time_from_sums(*args)
        t0 = time.perf_counter()
        for _ in range(20000):
            cm.time_from_sums(*args)
        out[kind] = round((time.perf_counter() - t0) / 20000 * 1e6, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/costmodel_accuracy.json")
    args = ap.parse_args(argv)
    shared = shared_data_dir()
    if shared is None:
        print("../shared/data is absent", file=sys.stderr)
        return 2
    l7, a100 = get_model("llama-2-7b"), get_gpu("a100-80gb")
    table = read_profiles([shared / "profiles" / "vidur-a100-llama-2-7b"], tp=None)
    held = heldout_table(table, l7, a100, args.seeds)
    print(f"1. A100 Llama-2-7B, held out by contiguous blocks (25%; seed 0 / mean of {args.seeds} seeds), MAPE %")
    print(f"   {'':38}" + "".join(f"{k:>22}" for k in KINDS))
    for row in ROWS:
        cells = [f"{held[k][row]['mape_pct_seed0']:>9.2f} / {held[k][row]['mape_pct_mean']:>6.2f}   " if row in held[k]
                 else f"{'-':>22}" for k in KINDS]
        print(f"   {row:<38}" + "".join(cells))
    bias = {k: held[k].get("attn_decode, batch <= 8", {}).get("bias_pct_seed0") for k in KINDS}
    print(f"   decode batch <= 8 median bias % (seed 0): {bias}")
    print("   extrapolation (fit <= 1024 tokens, test above), MAPE %:")
    for k in KINDS:
        print(f"     {k:<9} " + ", ".join(f"{r}: {v}" for r, v in held[k]["extrapolation"].items()))
    tr = transfer_table(shared)
    print("2. Transfer: roofline v2 fitted on A100 Llama-2-7B only, non-attention per-iteration MAPE % by TP")
    for what, d in tr.items():
        print(f"   {what:<28} " + ", ".join(f"tp{k}: {v}" for k, v in d.items()))
    coll = collective_table(shared)
    print("3. All-reduce model vs measured NCCL (1 KB-64 MB), MAPE % on fit sizes / on held-out sizes")
    for k, v in coll.items():
        print(f"   {k:<26} {v['mape_pct']:>6.2f} / {v['heldout_mape_pct']:>6.2f}")
    cost = call_cost()
    print(f"4. time_from_sums call (µs): {cost}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"heldout_a100_llama_2_7b": held, "transfer": tr, "collectives": coll,
                                          "call_us": cost, "python": platform.python_version(),
                                          "machine": platform.machine()}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
