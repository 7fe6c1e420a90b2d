"""Each policy's knobs as rows (name, vLLM's name, default, meaning), read from its Config and registry entry."""
from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize

from costmodels.errors import UserError
from policies.base import POLICIES
from policies.vllm_names import policy_knob_alias

_FIELD = re.compile(r"^\s+(\w+)\s*:")


def _comments(config_cls) -> dict[str, str]:
    """knob -> the comment written beside its field (and the comment lines that continue it). The comments are
    the knobs' documentation, so the table shows what the code says rather than a second copy that can drift."""
    try:
        src = inspect.getsource(config_cls)
    except (OSError, TypeError):       # defined somewhere without source (an interactive session)
        return {}
    by_line = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip(), tok.line.strip().startswith("#"))
    lines = src.splitlines()
    out = {}
    for i, line in enumerate(lines, start=1):
        m = _FIELD.match(line)
        if not m or i not in by_line or by_line[i][2]:
            continue
        col, text, _ = by_line[i]
        j = i + 1
        while j in by_line and by_line[j][2] and by_line[j][0] == col:    # a continuation under the comment
            text += " " + by_line[j][1]
            j += 1
        out[m.group(1)] = text
    return out


def knob_rows(name: str) -> list[dict]:
    """One row per knob of a registered policy: its default is the preset's value where the preset sets it."""
    if name not in POLICIES:
        raise UserError(f"--knobs: unknown policy {name!r}; allowed: {', '.join(sorted(POLICIES))}")
    cls, preset, _ = POLICIES[name]
    cfg = cls.Config
    meaning = {}
    for klass in reversed(cfg.__mro__):           # a subclass's comment wins over its parent's
        if dataclasses.is_dataclass(klass):
            meaning.update(_comments(klass))
    alias = policy_knob_alias(cls)
    rows = []
    for f in dataclasses.fields(cfg):
        if f.name in preset:
            default = preset[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        rows.append({"knob": f.name, "vllm_name": alias.get(f.name, ""), "default": default,
                     "meaning": meaning.get(f.name, "")})
    return rows


def families() -> list[tuple[type, list[str]]]:
    """(policy class, the registered names built on it), in first-registration order."""
    out: dict[type, list[str]] = {}
    for name, (cls, _, _) in POLICIES.items():
        out.setdefault(cls, []).append(name)
    return list(out.items())
