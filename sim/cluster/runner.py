"""Run a scenario: one replica built from the scenario (or a cluster of them), its tables and summary with the
run's metadata."""
from __future__ import annotations

import time

from sim.cluster.counts import infeasible_counts
from sim.metrics import SimResult
from sim.scenario.build import build_simulation
from sim.scenario.config import Scenario


def run_scenario(scn: Scenario, requests=None, observe=None) -> SimResult:
    """Run one scenario. `observe(sim)`, if given, is called on the built simulation before it runs and returns
    something with close() (the CLI's progress bar, study.progress.attach_run_progress). A scenario with a
    `cluster` section runs its replicas behind their router (sim/cluster/cluster.py)."""
    if scn.cluster:
        from sim.cluster.cluster import run_cluster
        return run_cluster(scn, requests)
    t0 = time.perf_counter()
    sim = build_simulation(scn, requests)
    watcher = observe(sim) if observe is not None else None
    res = sim.run()
    if watcher is not None:
        watcher.close()
    res.meta.update(scenario=scn.name, policy=scn.policy.get("name"), M=sim.memory.capacity_tokens,
                    costmodel=sim.costmodel.describe() if hasattr(sim.costmodel, "describe") else "",
                    wall_s=time.perf_counter() - t0, infeasible_ids=[r.id for r in sim.infeasible],
                    infeasible_reasons=infeasible_counts(sim.infeasible))
    breakdown = getattr(sim, "memory_breakdown", None)
    res.meta["memory"] = breakdown.as_dict() if breakdown is not None else {"M": sim.memory.capacity_tokens,
                                                                             "given": True}
    res.meta["memory_text"] = breakdown.describe() if breakdown is not None else "KV M given by memory.M"
    from sim.metrics.economics import economics_summary, gpu_economics
    recorded = res.iterations if scn.sim.record_iterations else None
    res.summary.update(economics_summary([(gpu_economics(scn.hardware), scn.hardware.tp, recorded)],
                                         res.summary["makespan_s"], res.summary["generated_tokens"]))
    res.summary["wall_s"] = res.meta["wall_s"]
    return res


def check_scenario(scn: Scenario, requests=None) -> None:
    """Build all that a run of `scn` builds, without running it: the replica (or every replica group, its routers
    and links), so that a bad policy, cost model, memory or cluster setting raises its UserError now. `requests`
    (a list, possibly empty) skips building the workload, which the caller may check on its own."""
    if scn.cluster:
        from sim.cluster.cluster import Cluster
        Cluster(scn, requests)
    else:
        build_simulation(scn, requests)
