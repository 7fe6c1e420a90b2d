"""Scenario YAML → SolverInstance: the same model, GPU, M, cost model and workload a `servesim run` would use."""
from __future__ import annotations

import dataclasses

import numpy as np

from costmodels import build_costmodel, get_gpu, get_model
from costmodels.errors import UserError
from solver.instance import SolverInstance, SolverOptions
from traces import build_workload


def options_from_dict(d: dict, where: str = "solver") -> SolverOptions:
    fields = {f.name for f in dataclasses.fields(SolverOptions)}
    bad = sorted(set(d or {}) - fields)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(fields))}")
    opt = SolverOptions(**(d or {}))
    if isinstance(opt.presets, str):
        opt.presets = [p.strip() for p in opt.presets.split(",") if p.strip()]
    opt.validate(where)
    return opt


def instance_from_scenario(scn, overrides: dict | None = None) -> SolverInstance:
    from sim.scenario.build import capacity_tokens
    from sim.scenario.build import scenario_model
    model = scenario_model(scn)
    gpu = get_gpu(scn.hardware.gpu)
    M = capacity_tokens(scn, model, gpu)
    cm = build_costmodel(scn.costmodel, model, gpu, scn.hardware.tp)
    df = build_workload(scn.workload, np.random.default_rng(scn.seed))
    opt = options_from_dict({**(scn.solver or {}), **(overrides or {})}, f"{scn.source}: solver")
    return SolverInstance([int(v) for v in df["prompt_tokens"]], [int(v) for v in df["output_tokens"]],
                          [float(v) for v in df["arrival_s"]], M, opt, cm)
