"""Fidelity benchmark: `servesim validate` on the measured vLLM 0.15.1 deployments, figures printed and written as JSON.

Runs every experiment twice, once with the KV blocks the deployment reported and once with the KV capacity
costmodels.memory predicts, and records the per-experiment errors, the medians (all, held out from every fit, per
TP degree), which experiments the overheads and the memory reservations were fitted on, and the wall time.

  PYTHONPATH=. python benchmarks/validate_vllm.py [--jobs 2] [--out benchmarks/results/validate_vllm.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.results_io import write_json

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    from costmodels.memory import PARAMS_FILE
    from study.validate import format_report, run_validation
    import yaml
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "validate_vllm.json"))
    args = ap.parse_args(argv)
    out = {}
    for kv in ("measured", "predicted"):
        t0 = time.perf_counter()
        res = run_validation(args.data, jobs=args.jobs, kv=kv)
        res["wall_s"] = round(time.perf_counter() - t0, 2)
        print(f"== KV blocks: {kv} ({res['wall_s']} s)")
        print(format_report(res))
        out[f"kv_{kv}"] = res
    mem = yaml.safe_load(PARAMS_FILE.read_text())
    out["memory_fit"] = mem.get("provenance", {})
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
