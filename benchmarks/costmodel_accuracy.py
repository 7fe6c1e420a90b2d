"""Held-out accuracy (and call cost) of every cost-model kind on a profile: prints a table, writes JSON.

    PYTHONPATH=. python benchmarks/costmodel_accuracy.py [--data DIR_OR_CSV ...] [--model llama-2-7b --gpu a100-80gb]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from costmodels import BatchShape, get_gpu, get_model
from costmodels.calibrate import fit, heldout_errors, split_by_config
from costmodels.profile_data import read_profiles
from costmodels.roofline import RooflineCostModel
from sim.paths import shared_data_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", help="profiles (default: the shared Vidur A100 Llama-2-7B folder)")
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--gpu", default="a100-80gb")
    ap.add_argument("--test-frac", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/costmodel_accuracy.json")
    args = ap.parse_args(argv)
    data = args.data
    if not data:
        root = shared_data_dir()
        if root is None:
            print("no --data given and ../shared/data is absent", file=sys.stderr)
            return 2
        data = [root / "profiles" / "vidur-a100-llama-2-7b"]
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    table = read_profiles(data)
    train, test = split_by_config(table, args.test_frac, args.seed)

    models, fit_s = {}, {}
    for kind in ("linear", "roofline", "profiled"):
        t0 = time.perf_counter()
        models[kind] = fit(kind, train, model, gpu)
        fit_s[kind] = time.perf_counter() - t0
    models = {"linear": models["linear"], "roofline (default eff.)": RooflineCostModel(model, gpu),
              "roofline (fitted)": models["roofline"], "profiled": models["profiled"]}
    errs = {name: heldout_errors(cm, test, reference=table, seed=args.seed).set_index("what") for name, cm in models.items()}

    rows = list(dict.fromkeys(w for e in errs.values() for w in e.index))
    names = list(models)
    w = max(len(r) for r in rows)
    print(f"held-out MAPE % ({model.name} on {gpu.name}; {args.test_frac:.0%} of configurations, seed {args.seed}; "
          f"{len(train)} train / {len(test)} test rows)")
    print(f"{'operator / whole':<{w}}  " + "  ".join(f"{n:>23}" for n in names))
    for r in rows:
        cells = [f"{errs[n].loc[r, 'mape_pct']:>23.2f}" if r in errs[n].index else f"{'-':>23}" for n in names]
        print(f"{r:<{w}}  " + "  ".join(cells))
    it = "iteration (mixed-batch grid)"
    print(f"{'iteration p90 APE %':<{w}}  " + "  ".join(f"{errs[n].loc[it, 'p90_ape_pct']:>23.2f}" for n in names))
    print(f"{'iteration max APE %':<{w}}  " + "  ".join(f"{errs[n].loc[it, 'max_ape_pct']:>23.2f}" for n in names))

    shape = BatchShape([512], [1024], np.random.default_rng(0).integers(100, 3000, 64).tolist())
    call_us = {}
    for name, cm in models.items():
        cm.batch_time(shape)
        t0 = time.perf_counter()
        for _ in range(2000):
            cm.batch_time(shape)
        call_us[name] = (time.perf_counter() - t0) / 2000 * 1e6
    print("batch_time call cost (µs, 1 prefill + 64 decodes): " + ", ".join(f"{n} {v:.1f}" for n, v in call_us.items()))
    print("fit time (s): " + ", ".join(f"{k} {v:.2f}" for k, v in fit_s.items()))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": model.name, "gpu": gpu.name, "data": [str(Path(d).name) for d in data], "test_frac": args.test_frac,
        "seed": args.seed, "train_rows": len(train), "test_rows": len(test),
        "errors": {n: e.reset_index().to_dict(orient="records") for n, e in errs.items()},
        "batch_time_call_us": call_us, "fit_s": fit_s, "python": platform.python_version(),
    }, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
