"""vLLM's names for servesim's knobs: the one table that maps each engine argument to the field it sets."""
from __future__ import annotations

from costmodels.errors import UserError

# Engine arguments that set a field of a typed scenario section: alias -> (section, field). The alias may be
# written in that section or at the top level of a scenario (vLLM's flat engine-argument style).
SECTION_ALIASES: dict[str, tuple[str, str]] = {
    "gpu_memory_utilization": ("hardware", "gpu_memory_utilization"),
    "block_size": ("memory", "block_size"),
    "enable_prefix_caching": ("memory", "prefix_caching"),
    "swap_space": ("memory", "swap_space_gib"),
    "max_model_len": ("model", "max_model_len"),
}

# Engine arguments that set policy knobs: alias -> {policy class name: the knobs it sets}. Each policy family
# names its limits its own way; a class not listed has no such knob and the alias is refused for it. Looked up
# along the class's bases, so a subclass (an extension's preset of the unified loop) inherits its parent's row.
POLICY_ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "max_num_seqs": {"UnifiedScheduler": ("R_max",), "VLLMv0Scheduler": ("max_num_seqs",),
                     "AptServe": ("max_num_seqs",), "Alise": ("max_batch",), "RoundRobin": ("max_batch",)},
    # vLLM has one token budget per step; the unified loop splits it into C (all tokens) and P (prefill tokens),
    # so the alias sets both, as a vLLM engine with that budget would run.
    "max_num_batched_tokens": {"UnifiedScheduler": ("C", "P"), "VLLMv0Scheduler": ("max_num_batched_tokens",),
                               "AptServe": ("max_batched_tokens",), "Alise": ("max_batch_tokens",),
                               "RoundRobin": ("max_batched_tokens",)},
    "enable_chunked_prefill": {"UnifiedScheduler": ("chunked",), "VLLMv0Scheduler": ("enable_chunked_prefill",)},
}

ALIASES = (*SECTION_ALIASES, *POLICY_ALIASES)


def table_text() -> str:
    """The whole table in one line, for error messages."""
    parts = [f"{a} -> {s}.{f}" for a, (s, f) in SECTION_ALIASES.items()]
    parts += [f"{a} -> policy knob" for a in POLICY_ALIASES]
    return "vLLM names: " + ", ".join(parts) + " (servesim policies --knobs NAME)"


def policy_aliases(cls) -> dict[str, tuple[str, ...]]:
    """The vLLM names a policy class understands: alias -> its knobs."""
    out = {}
    for alias, per_class in POLICY_ALIASES.items():
        for base in getattr(cls, "__mro__", ()):
            if base.__name__ in per_class:
                out[alias] = per_class[base.__name__]
                break
    return out


def policy_knob_alias(cls) -> dict[str, str]:
    """knob -> the vLLM name that sets it (the knob's own name where vLLM spells it the same)."""
    return {knob: alias for alias, knobs in policy_aliases(cls).items() for knob in knobs}


def _same_knob(node: dict, alias: str, internal: tuple, where: str) -> None:
    both = [k for k in internal if k in node and k != alias]
    if both:
        raise UserError(f"{where}: {alias} and {', '.join(both)} set the same knob ({alias} is vLLM's name for "
                        f"{', '.join(internal)}); give one of them")


def translate_policy(spec: dict, cls, where: str = "policy", name: str | None = None) -> dict:
    """A policy section with vLLM's names replaced by this class's knobs; one line for an alias the class lacks,
    for an alias given next to its own knob, or for a scenario-section alias written here."""
    if not any(k in ALIASES for k in spec):
        return spec
    mine = policy_aliases(cls)
    out = dict(spec)
    for alias in POLICY_ALIASES:
        if alias not in out:
            continue
        if alias not in mine:
            raise UserError(f"{where}.{alias}: policy {name or cls.__name__!r} has no knob for vLLM's {alias} "
                            f"(servesim policies --knobs {name or cls.__name__})")
        knobs = mine[alias]
        if knobs == (alias,):
            continue
        _same_knob(out, alias, knobs, where)
        value = out.pop(alias)
        for k in knobs:
            out[k] = value
    for alias, (section, field) in SECTION_ALIASES.items():
        if alias in out and not _is_policy_knob(cls, alias):
            raise UserError(f"{where}.{alias}: vLLM's {alias} is a scenario field, not a policy knob; "
                            f"set {section}.{field} (or {alias} at the top level)")
    return out


def _is_policy_knob(cls, knob: str) -> bool:
    import dataclasses
    cfg = getattr(cls, "Config", None)
    return cfg is not None and dataclasses.is_dataclass(cfg) and knob in {f.name for f in dataclasses.fields(cfg)}


def translate_section(section: str, node: dict, where: str) -> dict:
    """A typed section (model, hardware, memory) with vLLM's names replaced by its fields."""
    out = dict(node)
    for alias, (home, field) in SECTION_ALIASES.items():
        if alias not in out:
            continue
        if home != section:
            raise UserError(f"{where}.{alias}: vLLM's {alias} belongs to {home}: set {home}.{field} "
                            f"(or {alias} at the top level)")
        if alias == field:
            continue
        _same_knob(out, alias, (field,), where)
        out[field] = out.pop(alias)
    for alias in POLICY_ALIASES:
        if alias in out:
            raise UserError(f"{where}.{alias}: vLLM's {alias} is a policy knob: set policy.{alias} "
                            f"(or {alias} at the top level)")
    return out


def home(alias: str) -> str:
    """The section a top-level alias goes to."""
    return SECTION_ALIASES[alias][0] if alias in SECTION_ALIASES else "policy"


def internal_names(alias: str) -> set[str]:
    """Every field or knob an alias may stand for, whatever the policy."""
    if alias in SECTION_ALIASES:
        return {SECTION_ALIASES[alias][1]}
    return {k for knobs in POLICY_ALIASES.get(alias, {}).values() for k in knobs}


def alias_hint(section: str) -> str:
    """'; vLLM names: ...' for an unknown-key message about one section ('' = the top level: all of them)."""
    if not section:
        return "; " + table_text()
    here = [f"{a} -> {f}" for a, (s, f) in SECTION_ALIASES.items() if s == section and a != f]
    same = [a for a, (s, f) in SECTION_ALIASES.items() if s == section and a == f]
    if not here and not same:
        return ""
    return "; vLLM names: " + ", ".join(here + [f"{a} (same name)" for a in same])


def policy_hint(cls, name: str) -> str:
    """'; vLLM names: ...' for an unknown-knob message about one policy."""
    mine = policy_aliases(cls)
    text = ", ".join(f"{a} -> {', '.join(k)}" if k != (a,) else f"{a} (same name)" for a, k in mine.items())
    return f"; vLLM names: {text or 'none for this policy'} (servesim policies --knobs {name})"
