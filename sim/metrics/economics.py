"""Money and energy of a run: $/GPU-hour and board power per GPU kind (profiles/gpu-economics.yaml), an energy model
per iteration from its MFU and MBU, and the summary columns built on them (GPU-hours, cost, cost per million
tokens, energy per token).

Iteration power per GPU = idle + (peak − idle) · min(1, compute · MFU + memory · MBU), the saturating linear fit of
benchmarks/gpu_power_probe.py on an H200. A replica's GPUs are held for the whole makespan (first arrival to last
completion): between its iterations they draw idle power, and every held hour is paid."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodels.errors import UserError
from sim.paths import REPO_ROOT

DEFAULT_FILE = REPO_ROOT / "profiles" / "gpu-economics.yaml"
ENV_FILE = "SERVESIM_GPU_ECONOMICS"
FIELDS = ("usd_per_gpu_hour", "power_idle_w", "power_peak_w")
NAN = float("nan")


@dataclass(frozen=True)
class GpuEconomics:
    """One GPU kind's price and power, and the activity coefficients of the energy model."""
    gpu: str
    usd_per_gpu_hour: float = NAN            # NaN: no price known (cost columns are NaN)
    power_idle_w: float = NAN
    power_peak_w: float = NAN
    compute: float = 1.94
    memory: float = 0.88

    def power_w(self, mfu, mbu):
        """Board power of one GPU at these utilisations (arrays or floats)."""
        act = np.clip(self.compute * np.asarray(mfu, float) + self.memory * np.asarray(mbu, float), 0.0, 1.0)
        return self.power_idle_w + (self.power_peak_w - self.power_idle_w) * act


_cache: dict = {}


def _number(v, where: str) -> float:
    if v is None:
        return NAN
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isinf(v):
        raise UserError(f"{where}: expected a number >= 0 (or null), got {v!r}")
    return float(v)


def _read(path: Path) -> dict:
    """{gpu: {field: value}} and the activity coefficients, from one economics file."""
    key = (str(path), path.stat().st_mtime_ns)
    if key in _cache:
        return _cache[key]
    import yaml
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping with gpus: {{NAME: {{usd_per_gpu_hour, power_idle_w, "
                        f"power_peak_w}}}}")
    bad = sorted(set(doc) - {"gpus", "activity", "source_date"})
    if bad:
        raise UserError(f"{path}: unknown key(s) {', '.join(bad)}; allowed: gpus, activity, source_date")
    gpus = {}
    for name, row in (doc.get("gpus") or {}).items():
        if not isinstance(row, dict):
            raise UserError(f"{path}: gpus.{name}: expected a mapping of {', '.join(FIELDS)}")
        unknown = sorted(set(row) - set(FIELDS))
        if unknown:
            raise UserError(f"{path}: gpus.{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
        gpus[str(name)] = {k: _number(v, f"{path}: gpus.{name}.{k}") for k, v in row.items()}
    act = doc.get("activity") or {}
    if not isinstance(act, dict) or set(act) - {"compute", "memory"}:
        raise UserError(f"{path}: activity: expected {{compute: NUMBER, memory: NUMBER}}")
    out = {"gpus": gpus, "activity": {k: _number(v, f"{path}: activity.{k}") for k, v in act.items()}}
    _cache[key] = out
    return out


def economics_table() -> dict:
    """The default table with the user's file ($SERVESIM_GPU_ECONOMICS) laid over it, key by key."""
    base = _read(DEFAULT_FILE)
    gpus = {k: dict(v) for k, v in base["gpus"].items()}
    act = dict(base["activity"])
    user = os.environ.get(ENV_FILE)
    if user:
        p = Path(user).expanduser()
        if not p.is_file():
            raise UserError(f"${ENV_FILE}={user}: no such file (a YAML of gpus: {{NAME: {{usd_per_gpu_hour: ...}}}})")
        over = _read(p)
        for name, row in over["gpus"].items():
            gpus.setdefault(name, {}).update(row)
        act.update(over["activity"])
    return {"gpus": gpus, "activity": act}


def gpu_economics(hardware) -> GpuEconomics:
    """Price and power of a scenario's hardware section: the table's row for its GPU, then the section's own
    usd_per_gpu_hour / power_idle_w / power_peak_w where set."""
    table = economics_table()
    row = dict(table["gpus"].get(hardware.gpu, {}))
    for k in FIELDS:
        v = getattr(hardware, k, None)
        if v is not None:
            row[k] = float(v)
    return GpuEconomics(hardware.gpu, **{k: row.get(k, NAN) for k in FIELDS}, **table["activity"])


def replica_energy_j(econ: GpuEconomics, gpus: int, iterations, held_s: float) -> float:
    """Joules drawn by one replica's `gpus` GPUs held for held_s: each iteration at the power of its MFU/MBU, the
    rest of the held time at idle. `iterations` None: not recorded (NaN); an empty table: the replica never ran.
    NaN too when the iterations carry no utilisation (a cost model naming no catalog GPU or model)."""
    if iterations is None:
        return NAN
    if not len(iterations):
        return gpus * held_s * econ.power_idle_w if held_s == held_s else NAN
    if "mfu" not in iterations:
        return NAN
    dur = iterations["duration_s"].to_numpy(float)
    mfu, mbu = iterations["mfu"].to_numpy(float), iterations["mbu"].to_numpy(float)
    busy_j = float(np.sum(dur * econ.power_w(mfu, mbu)))
    idle_s = max(0.0, held_s - float(dur.sum())) if held_s == held_s else 0.0
    return gpus * (busy_j + idle_s * econ.power_idle_w)


def economics_summary(parts, makespan_s: float, generated_tokens: int) -> dict:
    """Summary columns from [(GpuEconomics, gpus, iterations table[, held_s])] per replica; a replica without its
    own held time is held for the makespan (a fixed fleet)."""
    span = makespan_s if makespan_s == makespan_s else NAN
    rows = [(p[0], p[1], p[2], p[3] if len(p) > 3 else span) for p in parts]
    gpu_hours = sum(g * held for _, g, _, held in rows) / 3600.0
    cost = sum(e.usd_per_gpu_hour * g * held for e, g, _, held in rows) / 3600.0
    energy = sum(replica_energy_j(e, g, it, held) for e, g, it, held in rows if held > 0 or it is None)
    tokens = generated_tokens if generated_tokens else NAN
    return {"gpu_hours": gpu_hours, "cost_usd": cost, "usd_per_million_tokens": cost / tokens * 1e6,
            "energy_j": energy, "joules_per_token": energy / tokens,
            "power_w_mean": energy / span if span and span == span else NAN}
