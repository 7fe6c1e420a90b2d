"""Read the shipped profile and fit YAML files with libyaml's C parser when present (the profiles are large)."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

# Same YAML 1.1 semantics as yaml.SafeLoader; about 10x faster on the profile files, whose flow sequences made
# parsing the largest part of a short run's start-up.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_CACHE: dict = {}     # (path, mtime, size) → parsed mapping: a cluster builds many replicas from the same files


def read_yaml(path) -> dict:
    """The mapping in a YAML file (empty file: {}); a fresh copy each call, parsed once per file version."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE[key] = yaml.load(p.read_text(), Loader=_LOADER) or {}
    return copy.deepcopy(_CACHE[key])
