"""Write a `servesim validate --data` folder from the public sim-to-real error records (measured vLLM 0.15.1 runs).

The shared validation folder holds the 13 training/validation experiments. The same study's test set (H100,
A100-80GB and L40S; Mixtral MoE; TP 1-8) is public only as simulator error records whose `actual` column is the
measured value: inference-sim/sim-to-real-accuracy-validation, `results_iter36/error_records.csv` at commit
7f3b270. This script turns those rows into experiments.csv + workloads.yaml in the shared folder's format, for
held-out checks only (nothing is fitted on them; the folder is written outside the repository, never committed):

  git -C <mirror> show 7f3b270:results_iter36/error_records.csv > /tmp/records.csv
  PYTHONPATH=. python benchmarks/vllm_ground_truth.py --records /tmp/records.csv --out /tmp/vllm-gt
  servesim validate --data /tmp/vllm-gt --jobs 2

Columns the records lack are filled from the study's design document (docs/plans/...-design.md in that
repository): max_num_seqs 128; CPU offloading 8 GiB where `cpu_offload` is true (vLLM's block count for it is
computed the way the shared rows show it: 8 GiB over one block's per-GPU KV bytes); the GPU KV blocks vLLM
reported are not public, so that cell is left empty (validate predicts them). Workloads the shared folder lacks:
`general` is general-lite's request shape at 8 then 20 req/s (600 s each; inference-sim testdata
roofline_goldendataset.json has the same definition), `reasoning` is reasoning-lite's request shape at 4 req/s for
1,200 s (the design document's table; its system-prompt grouping is not published, reasoning-lite's is assumed)."""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")
EXTRA_WORKLOADS = {
    "general": ("general-lite", [{"duration": 600, "rate": 8.0}, {"duration": 600, "rate": 20.0}]),
    "reasoning": ("reasoning-lite", [{"duration": 1200, "rate": 4.0}]),
}
CPU_OFFLOAD_BYTES = 8 * 1024 ** 3
BLOCK = 16


def read_records(path: Path) -> dict:
    """exp_id -> {config..., metric: measured ms} from the summary rows (stage_index -1)."""
    out: dict = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["stage_index"] != "-1" or r["metric_name"] not in METRICS:
                continue
            eid = str(int(float(r["exp_id"])))
            e = out.setdefault(eid, {"exp_id": eid, "hf_model": r["model"], "hardware": r["hardware"],
                                     "tp": int(float(r["tp"])), "precision": r["precision"] or "FP16",
                                     "max_num_batched_tokens": int(float(r["max_num_batched_tokens"])),
                                     "gpu_memory_utilization": float(r["gpu_mem_util"] or 0.9),
                                     "cpu_offload": r["cpu_offload"] == "True", "workload": r["workload"]})
            val = float(r["actual"])
            prev = e.get(r["metric_name"])
            if prev is not None and abs(prev - val) > 1e-6 * max(1.0, abs(val)):
                raise SystemExit(f"experiment {eid}: two measured values for {r['metric_name']}: {prev}, {val}")
            e[r["metric_name"]] = val
    return out


def cpu_blocks(hf_model: str, tp: int) -> int:
    from costmodels.catalog import model_by_hf_id
    m = model_by_hf_id(hf_model)
    if m is None:
        return 0
    return int(math.floor(CPU_OFFLOAD_BYTES / (BLOCK * m.kv_bytes_per_token(None, tp))))


def main(argv=None) -> int:
    import yaml
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", required=True, help="error_records.csv of the sim-to-real study")
    ap.add_argument("--shared", help="the shared vllm-0.15.1 folder (for its workloads; default: ../shared/data)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from study.validate import data_dir, load_experiments
    shared = data_dir(args.shared)
    _, workloads = load_experiments(shared)
    workloads = dict(workloads)
    for name, (base, stages) in EXTRA_WORKLOADS.items():
        workloads.setdefault(name, {"stages": stages, "shared_prefix": dict(workloads[base]["shared_prefix"])})
    exps = read_records(Path(args.records))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cols = ["exp_id", "hf_model", "hardware", "tp", "precision", "max_num_seqs", "max_num_batched_tokens",
            "gpu_memory_utilization", "vllm_kv_blocks_gpu", "vllm_kv_blocks_cpu", "workload"] + \
        [f"{m}_ms" for m in METRICS]
    with open(out / "experiments.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for eid in sorted(exps, key=int):
            e = exps[eid]
            if any(m not in e for m in METRICS):
                continue
            w.writerow([eid, e["hf_model"], e["hardware"], e["tp"], e["precision"], 128, e["max_num_batched_tokens"],
                        e["gpu_memory_utilization"], "", cpu_blocks(e["hf_model"], e["tp"]) if e["cpu_offload"] else 0,
                        e["workload"]] + [round(e[m], 4) for m in METRICS])
    (out / "workloads.yaml").write_text(yaml.safe_dump({"load_type": "constant", "workloads": workloads},
                                                       sort_keys=False))
    (out / "README.md").write_text(
        "Written by benchmarks/vllm_ground_truth.py from the sim-to-real study's public error records "
        f"({Path(args.records).name}); measured values only. GPU KV blocks are not public (empty).\n")
    print(f"wrote {len(exps)} experiments to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
