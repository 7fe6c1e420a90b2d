"""Where benchmark figures go: one JSON file per run, stamped with the machine it was measured on."""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def machine() -> dict:
    """The host a figure belongs to (figures are compared only on the same one)."""
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}


def write_json(path, payload: dict, indent: int = 1) -> Path:
    """Write `payload` (with a `machine` entry unless it has one) to `path`, creating its folder; say so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**payload, "machine": payload.get("machine") or machine()}, indent=indent))
    print(f"wrote {path}")
    return path
