"""Read the shipped profile and fit YAML files with libyaml's C parser when present (the profiles are large)."""
from __future__ import annotations

from pathlib import Path

import yaml

# Same YAML 1.1 semantics as yaml.SafeLoader; about 10x faster on the profile files, whose flow sequences made
# parsing the largest part of a short run's start-up.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path) -> dict:
    """The mapping in a YAML file (empty file: {})."""
    return yaml.load(Path(path).read_text(), Loader=_LOADER) or {}
