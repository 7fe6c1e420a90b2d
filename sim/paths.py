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


def output_dir(path, option: str = "--out", create: bool = True) -> Path:
    """A folder to write results into, or one line saying why it cannot be. With create=False it is only checked
    (before the work starts, so a bad place fails early without leaving a folder behind)."""
    from costmodels.errors import UserError
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserError(f"{option} {path}: is an existing file; give a folder for the result tables")
    if not create:
        q = p
        while not q.exists() and q != q.parent:
            q = q.parent
        if not q.is_dir():
            raise UserError(f"{option} {path}: {q} is a file, so this folder cannot be created")
        if not os.access(q, os.W_OK | os.X_OK):
            raise UserError(f"{option} {path}: cannot create this folder ({q} is not writable)")
        return p
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot create this folder ({e.strerror or e})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: this folder is not writable")
    return p


def output_file(path, option: str = "--out") -> Path:
    """A file to write, checked now: not a folder, its folder creatable and writable."""
    from costmodels.errors import UserError
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    output_dir(p.parent if str(p.parent) else Path("."), option=f"{option} {path}: its folder")
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{option} {path}: exists and is not writable")
    return p
