"""Digests of speculative runs' tables (requests, iterations, summary, token times): a checkout's fast paths against its plain loop and against a saved reference.

Every speed-up of the speculative fast paths (sim/engine/specstretch.py, specwalk.py) must leave the tables bit for
bit as the plain loop (sim.fast_forward false) and the code before it gave them. This runs a set of scenarios
around examples/speculative.yaml (policies vllm-v1, sglang and sarathi; drafters eagle, mtp, draft model and
n-gram; acceptance rates 0, 0.4, 0.7, 1 and per-request lists; KV pressure; prefix caching on and off; block
sizes under k + 1; iteration rows or the tally; token times kept; max_iterations; a two-replica cluster), hashes
each run's tables and
  --save FILE   writes the digests (run it on the reference checkout: PYTHONPATH=<that checkout>),
  --check FILE  compares this checkout's digests with them, and
  --plain       also runs each scenario on the plain loop and requires the same digest (slower).
Exit status 1 when a digest differs.

  PYTHONPATH=. python benchmarks/spec_digest.py [--plain] [--save FILE | --check FILE] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _base(n: int) -> dict:
    from sim.scenario.config import read_yaml_mapping
    raw = read_yaml_mapping(REPO / "examples" / "speculative.yaml", "scenario file")
    raw["workload"]["num_requests"] = n
    return raw


def _with(raw: dict, **sections) -> dict:
    out = copy.deepcopy(raw)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def scenarios() -> dict:
    """name -> raw scenario mapping."""
    out = {"example": _base(1000)}
    small = _base(200)
    drafters = {"eagle": {"method": "eagle"}, "mtp": {"method": "mtp", "draft_fraction": 0.05},
                "draft": {"method": "draft_model", "draft_model": "tiny-llama"}, "ngram": {"method": "ngram"}}
    memories = {"roomy": {}, "tight": {"M": 20000}, "tighter": {"M": 6000, "block_size": 16},
                "nocache": {"prefix_caching": False}}
    for policy in ("vllm-v1", "sglang", "sarathi"):
        for dname, drafter in drafters.items():
            for mname, mem in memories.items():
                if policy != "vllm-v1" and mname == "nocache":
                    continue
                spec = {**small["speculative"], **drafter}
                rate = 40 if mname != "roomy" else 4
                out[f"{policy}/{dname}/{mname}"] = _with(small, policy={"name": policy}, speculative=spec,
                                                         memory=mem, workload={"rate": rate})
    for a in (0.0, 0.4, 1.0):
        for k in (1, 5):
            out[f"rate{a}/k{k}"] = _with(small, speculative={**small["speculative"], "acceptance_rate": a, "k": k})
    lists = {i: [(i + j) % 4 for j in range(7)] for i in range(0, 200, 3)}
    out["lists"] = _with(small, speculative={**small["speculative"], "accepted": lists})
    out["lists/tight"] = _with(small, speculative={**small["speculative"], "accepted": lists},
                               memory={"M": 20000}, workload={"rate": 40})
    out["block4/k5"] = _with(small, speculative={**small["speculative"], "k": 5}, memory={"block_size": 4})
    out["block1"] = _with(small, memory={"block_size": 1, "M": 30000}, workload={"rate": 20})
    out["tally"] = _with(small, sim={"record_iterations": False})
    out["tally/tight"] = _with(small, sim={"record_iterations": False}, memory={"M": 20000},
                               workload={"rate": 40})
    out["token_times"] = _with(small, sim={"keep_token_times": True})
    out["max_iterations"] = _with(small, sim={"max_iterations": 3000})
    out["long_outputs"] = _with(small, workload={"rate": 2, "output": {"dist": "uniform", "low": 300,
                                                                        "high": 2000}})
    out["offline"] = {**copy.deepcopy(small), "workload": {"kind": "offline", "num_requests": 150, "prompt": 200,
                                                           "output": 400}}
    out["gpu_util"] = _with(small, hardware={"gpu": "h100-sxm", "gpu_memory_utilization": 0.25},
                            workload={"rate": 30})
    for seed in (7, 8, 9):
        out[f"seed{seed}"] = _with(small, seed=seed)
        out[f"seed{seed}/sglang/tight"] = _with(small, seed=seed, policy={"name": "sglang"}, memory={"M": 12000},
                                                workload={"rate": 20})
    out["cluster"] = _with(small, cluster={"replicas": 2, "router": "round_robin"}, workload={"rate": 8})
    return out


def digest(raw: dict, fast: bool) -> str:
    """A hash of the run's request and iteration tables, summary (less its wall time) and token times."""
    import pandas as pd
    from sim.scenario.build import build_simulation
    from sim.scenario.config import scenario_from_dict
    raw = copy.deepcopy(raw)
    raw["sim"] = {**raw.get("sim", {}), "fast_forward": fast}
    scn = scenario_from_dict(raw)
    h = hashlib.sha256()
    if scn.cluster:
        from sim.cluster.cluster import run_cluster
        res = run_cluster(scn)
    else:
        sim = build_simulation(scn)
        res = sim.run()
        if sim.keep_token_times:
            for r in sim.all_requests:
                h.update(repr(r.token_times).encode())
    for table in (res.requests, res.iterations):
        h.update(",".join(map(str, table.columns)).encode())
        h.update(pd.util.hash_pandas_object(table, index=True).values.tobytes())
    h.update(repr(sorted((k, repr(v)) for k, v in res.summary.items() if k != "wall_s")).encode())
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save")
    ap.add_argument("--check")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    import sim
    print(f"sim from {Path(sim.__file__).parent}")
    ref = json.loads(Path(args.check).read_text()) if args.check else {}
    got, bad = {}, []
    for name, raw in scenarios().items():
        if args.only not in name:
            continue
        d = got[name] = digest(raw, True)
        notes = []
        if args.plain and digest(raw, False) != d:
            notes.append("plain loop differs")
        if args.check and ref.get(name) != d:
            notes.append(f"reference {ref.get(name)}")
        if notes:
            bad.append(name)
        print(f"{name:<28} {d} {'; '.join(notes) or 'ok'}", flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(got, indent=1))
    print(f"{len(got)} scenarios, {len(bad)} differ" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
