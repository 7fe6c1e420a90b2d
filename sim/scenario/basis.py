"""What a run's figures rest on: cost model kind and file, overheads preset, KV capacity, for the run summary."""
from __future__ import annotations

from costmodels import get_gpu


def costmodel_basis(scn) -> dict:
    """The cost model a scenario builds, named: kind ('auto' says what it chose), file and overheads preset."""
    from sim.scenario.build import scenario_costmodel, scenario_model
    cm = scenario_costmodel(scn, scenario_model(scn), get_gpu(scn.hardware.gpu))
    out = cm.basis()
    if (scn.costmodel or {}).get("kind", "linear") == "auto":
        out["costmodel_kind"] += " (auto)"
    return out


def run_basis(scenarios, capacity_tokens: int) -> dict:
    """The summary's basis columns for the scenarios a run's replicas ran (one for a single replica); where
    replicas differ, the distinct values joined by '; '."""
    rows = [costmodel_basis(s) for s in scenarios]
    out = {k: "; ".join(dict.fromkeys(r[k] for r in rows)) for k in ("costmodel_kind", "costmodel_file",
                                                                       "overheads")}
    out["kv_capacity_tokens"] = int(capacity_tokens)
    return out
