"""Shared pieces of the EconoServe / ALISE benchmarks. The run metrics, sustainable-rate rule and the papers'
setups live in study.findings.length_aware (the findings' claims use them too); this adds writing the results."""
from __future__ import annotations

import json
from pathlib import Path

from study.findings.length_aware import run, sustainable_rate  # noqa: F401  (re-exported for the benchmarks)

OUT_DIR = Path(__file__).resolve().parent / "results"


def write(name: str, payload: dict) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    p = OUT_DIR / f"{name}.json"
    p.write_text(json.dumps(payload, indent=1, default=float))
    return p
