"""Where things live: the repository root and the reference data beside it (../shared/data)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    """The reference data folder: $SERVESIM_SHARED_DATA, else <repo>/../shared/data; None if absent."""
    env = os.environ.get("SERVESIM_SHARED_DATA")
    for cand in ([Path(env)] if env else []) + [REPO_ROOT.parent / "shared" / "data", Path("/work/shared/data")]:
        if cand.is_dir():
            return cand
    return None


def resolve_user_path(path, base: Path | None = None) -> Path:
    """A path from a scenario: as given if it exists (relative to the cwd), else relative to `base` or the repo."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    for root in ([base] if base else []) + [REPO_ROOT]:
        q = root / p
        if q.exists():
            return q
    return p
