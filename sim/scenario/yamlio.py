"""Reading YAML the same way everywhere (scenario files, `--set`, `--grid`): numbers as YAML 1.2 reads them, no
duplicate keys, and files that are not UTF-8 text, empty or directories named in one line."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from costmodels.errors import UserError


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 numbers (1e5 and 1E-3 are floats, not strings) and duplicate keys refused."""


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
                                  for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (first on line {seen[key]})",
                                                    key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load(text: str, where: str):
    """Parse YAML text; one line naming `where` (and the line) if it is not valid YAML."""
    try:
        return yaml.load(text, Loader=Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{where}:{line} is not valid YAML ({getattr(e, 'problem', None) or e})") from None


def scalar(text: str):
    """A value typed on the command line (`--set`, `--grid`): a YAML scalar or flow collection, read as the files
    are; text that is not valid YAML stays a string."""
    text = text.strip()
    if not text:
        return None
    try:
        return yaml.load(text, Loader=Loader)
    except yaml.YAMLError:
        return text


def read_text(path, what: str = "file") -> str:
    """A text file's contents, or one line saying why not (missing, a directory, not UTF-8, empty)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p}: is a directory, not a {what}")
    if not p.exists():
        raise UserError(f"{p}: {what} does not exist")
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        raise UserError(f"{p}: is gzip-compressed; decompress it first (gunzip)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if not text.strip():
        raise UserError(f"{p}: is empty")
    return text
