"""Scenario YAML → validated dataclasses, with `--set a.b=c` overrides reaching every field."""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path


from costmodels.errors import UserError
from costmodels.values import describe, finite, typed
from sim.metrics import SLO


@dataclass
class ModelSection:
    """Which model (a name in costmodels.MODELS, or a local Hugging Face config.json) and the serving limit on
    prompt + output tokens."""
    name: str = "llama-2-7b"
    config: typing.Optional[str] = None          # a local config.json (or its folder): the model is read from it
    dtype: typing.Optional[str] = None           # weight precision override (e.g. fp8 for an FP8 checkpoint)
    max_model_len: typing.Optional[int] = None   # null: the model's context length; longer requests are rejected


@dataclass
class HardwareSection:
    """Which GPU (a name in costmodels.GPUS), tensor-parallel degree, and the memory fraction the server may use."""
    gpu: str = "a100-80gb"
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    host_memory_gib: float = 512.0     # CPU memory of the server: bounds swap space and the CPU KV offload tier
    # price and board power of one GPU; null: the GPU's row in profiles/gpu-economics.yaml (sim/metrics/economics.py)
    usd_per_gpu_hour: typing.Optional[float] = None
    power_idle_w: typing.Optional[float] = None
    power_peak_w: typing.Optional[float] = None


@dataclass
class MemorySection:
    """KV memory. M (tokens) given directly, or derived from the GPU when null."""
    M: typing.Optional[int] = None
    block_size: int = 16
    watermark: typing.Optional[float] = None     # admission watermark (fraction of blocks); null: the policy's engine
    swap_space_gib: float = 4.0
    activation_reserve_gib: typing.Optional[float] = None   # null: vLLM's profiling reservations for the policy's
                                                            # largest step (costmodels.memory); a number replaces them
    kv_dtype: typing.Optional[str] = None
    kv_quant_bits: int = 16            # store KV quantized (8 = INT8, ALISE): M holds 16/bits × tokens; reads pay dequant
    prefix_caching: typing.Optional[bool] = None   # automatic prefix caching; null: the policy's engine default
    cpu_offload_gib: float = 0.0       # CPU tier behind the prefix cache (vLLM's KV offloading), GiB per GPU
    disk_offload_gib: float = 0.0      # disk tier under the CPU tier (LMCache-style), GiB per GPU
    disk_gb_per_s: float = 2.0         # the disk tier's read bandwidth, GB/s for the whole server


@dataclass
class SimSection:
    """Loop guards and what to record."""
    max_iterations: int = 0            # 0 = run to completion; a hit is reported as truncated, never silently
    watchdog_iterations: int = 200_000  # iterations without a generated token before declaring a livelock
    keep_token_times: bool = False     # keep every token time per request (memory grows with tokens)
    record_iterations: bool = True
    fast_forward: bool = True          # advance steady decode stretches in closed form (identical results)


@dataclass
class Scenario:
    name: str = "scenario"
    seed: int = 0
    model: ModelSection = field(default_factory=ModelSection)
    hardware: HardwareSection = field(default_factory=HardwareSection)
    costmodel: dict = field(default_factory=lambda: {"kind": "auto"})
    memory: MemorySection = field(default_factory=MemorySection)
    policy: dict = field(default_factory=lambda: {"name": "vllm"})
    workload: dict = field(default_factory=lambda: {"kind": "offline", "num_requests": 1024,
                                                    "prompt": 128, "output": 128})
    slo: dict = field(default_factory=dict)
    sim: SimSection = field(default_factory=SimSection)
    solver: dict = field(default_factory=dict)   # knobs of `servesim optimal` (solver.instance.SolverOptions)
    cluster: dict = field(default_factory=dict)  # replicas behind a router, or prefill/decode pools (sim/cluster)
    lora: typing.Optional[dict] = field(default_factory=dict)   # multi-LoRA serving (sim/engine/lora.py); empty: off
    speculative: typing.Optional[dict] = field(default_factory=dict)  # speculative decoding (sim/engine/speculative.py); empty: off
    source: str = ""

    def slos(self) -> dict:
        """Per-class SLO objects: top-level targets are the 'default' class; `classes:` adds others."""
        from traces.slo_presets import expand_slo_preset  # `preset: NAME` names paper SLOs
        raw = dict(self.slo or {})
        classes = raw.pop("classes", {}) or {}
        raw = expand_slo_preset(raw, "slo")
        out = {}
        if raw:
            out["default"] = _from_dict(SLO, raw, "slo")
        for name, d in classes.items():
            out[name] = _from_dict(SLO, expand_slo_preset(d, f"slo.classes.{name}"), f"slo.classes.{name}")
        return out

    def base_dir(self):
        """The folder of the scenario file (relative paths inside it resolve there first), or None."""
        p = Path(self.source) if self.source else None
        return p.parent if p is not None and p.suffix in (".yaml", ".yml") else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        for sec in ("speculative", "lora"):   # off: left out, so a run's identity (sweep keys) stays what it was
            if not d.get(sec):
                d.pop(sec, None)
        mem = d["memory"]
        for k, default in (("disk_offload_gib", 0.0), ("disk_gb_per_s", 2.0)):   # the same for the disk tier
            if mem.get(k) == default:
                mem.pop(k)
        return d


def _coerce(value, typ, where):
    origin = typing.get_origin(typ)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where)
    if typ in (bool, int, str):          # one check for scenario fields and policy knobs (costmodels/values.py)
        return typed(value, typ, where, default=typ)
    if typ is float:
        return float(typed(value, typ, where, default=typ))
    if typ is dict:
        if isinstance(value, dict):
            return value
        raise UserError(f"{where}: expected a mapping, got {describe(value)}")
    return value


def _from_dict(cls, d, where):
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise UserError(f"{where}: expected a mapping, got {d!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    public = [f for f in fields if f != "source"]
    bad = sorted(set(d) - set(public))
    if bad:
        from policies.vllm_names import alias_hint
        hint = alias_hint(where) if cls is Scenario or where in ("model", "hardware", "memory") else ""
        raise UserError(f"{where + ': ' if where else ''}unknown key(s) {', '.join(map(str, bad))}; "
                        f"allowed: {', '.join(public)}{hint}")
    kw = {}
    for k, v in d.items():
        t = hints[k]
        if dataclasses.is_dataclass(t):
            kw[k] = _from_dict(t, v, f"{where}.{k}" if where else k)
        else:
            kw[k] = _coerce(v, t, f"{where}.{k}" if where else k)
    return cls(**kw)


def parse_override(text: str) -> tuple[list, object]:
    from sim.scenario.yamlio import scalar
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. policy.name=sarathi")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not key.strip() or any(not p.strip() for p in path):
        raise UserError(f"--set {text!r}: the key must be a dotted scenario field such as memory.M (no empty parts)")
    return [p.strip() for p in path], scalar(raw)


def apply_overrides(raw: dict, overrides) -> dict:
    raw = lift_aliases(copy.deepcopy(raw))
    for text in overrides or ():
        path, value = parse_override(text)
        set_field(raw, path, value, f"--set {text!r}")
    return raw


def set_field(raw: dict, path: list, value, where: str) -> None:
    """Set a dotted field of a raw scenario mapping, creating sections on the way. A field set by one name
    replaces the file's value under the other (vLLM's name or servesim's), so an override wins instead of
    clashing; a top-level vLLM name is set in its section."""
    from policies.vllm_names import ALIASES, home
    if len(path) == 1 and path[0] in ALIASES:
        path = [home(path[0]), path[0]]
    node = raw
    for p in path[:-1]:
        if node.get(p) is None:
            node[p] = {}
        if not isinstance(node[p], dict):
            raise UserError(f"{where}: {p!r} is not a section")
        node = node[p]
    _drop_same_knob(node, path[-1], path[-2] if len(path) > 1 else "")
    node[path[-1]] = value


def _drop_same_knob(node: dict, key: str, section: str) -> None:
    from policies.vllm_names import ALIASES, home, internal_names, policy_aliases
    here = [a for a in ALIASES if home(a) == section]
    if key in here:
        for k in internal_names(key) - {key}:
            node.pop(k, None)
        return
    for alias in here:
        if alias in node and alias != key and key in internal_names(alias):
            value = node.pop(alias)
            cls = _policy_class(node) if section == "policy" else None
            for k in (policy_aliases(cls).get(alias, ()) if cls is not None else ()):
                if k != key:            # the alias's other knobs (C beside P) keep the value it gave them
                    node[k] = value


def _policy_class(spec):
    from policies import POLICIES
    entry = POLICIES.get(spec.get("name")) if isinstance(spec, dict) else None
    return entry[0] if entry else None


def lift_aliases(raw: dict) -> dict:
    """vLLM names written at the top level (its flat engine arguments) move into their sections."""
    from policies.vllm_names import ALIASES, home, internal_names
    top = [k for k in raw if k in ALIASES]
    if not top:
        return raw
    raw = dict(raw)
    for alias in top:
        sec = home(alias)
        node = raw.get(sec)
        if node is None:    # a policy knob with no policy section refines the default policy
            node = copy.deepcopy(Scenario().policy) if sec == "policy" else {}
        if not isinstance(node, dict):
            raise UserError(f"{sec}: expected a mapping")
        clash = sorted(({alias} | internal_names(alias)) & set(node))
        if clash:
            raise UserError(f"{alias} (top level) and {sec}.{clash[0]} set the same knob; give one of them")
        node = dict(node)
        node[alias] = raw.pop(alias)
        raw[sec] = node
    return raw


def canonical_names(raw: dict) -> dict:
    """A raw scenario with every vLLM name replaced by servesim's (policies/vllm_names.py), in the sections and in
    the cluster's replica groups, so that both spellings resolve to the same scenario."""
    from policies.vllm_names import translate_section
    raw = lift_aliases(raw)
    for sec in ("model", "hardware", "memory"):
        if isinstance(raw.get(sec), dict):
            raw[sec] = translate_section(sec, raw[sec], sec)
    base_name = raw["policy"].get("name") if isinstance(raw.get("policy"), dict) else None
    if isinstance(raw.get("policy"), dict):
        raw["policy"] = _canonical_policy(raw["policy"], "policy", base_name)
    cluster = raw.get("cluster")
    if isinstance(cluster, dict):
        raw["cluster"] = cluster = copy.deepcopy(cluster)
        groups = []
        reps = cluster.get("replicas")
        if isinstance(reps, dict):
            groups.append(("cluster.replicas", reps))
        elif isinstance(reps, list):
            groups += [(f"cluster.replicas[{i}]", g) for i, g in enumerate(reps) if isinstance(g, dict)]
        dis = cluster.get("disaggregation")
        if isinstance(dis, dict):
            groups += [(f"cluster.disaggregation.{p}", dis[p]) for p in ("prefill", "decode")
                       if isinstance(dis.get(p), dict)]
        for where, g in groups:
            for sec in ("model", "hardware", "memory"):
                if isinstance(g.get(sec), dict):
                    g[sec] = translate_section(sec, g[sec], f"{where}.{sec}")
            if isinstance(g.get("policy"), dict):
                g["policy"] = _canonical_policy(g["policy"], f"{where}.policy", base_name)
    return raw


_VLLM_COUNTS = ("max_num_seqs", "max_num_batched_tokens")     # vLLM's names of limits that are counts


def _canonical_policy(spec: dict, where: str, fallback_name):
    from policies.vllm_names import translate_policy
    name = spec.get("name", fallback_name)
    for alias in _VLLM_COUNTS:
        if alias not in spec:
            continue
        value = spec[alias]
        if value is None:                  # vLLM's None: the engine's default, the preset's here
            spec = {k: v for k, v in spec.items() if k != alias}
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            # vLLM takes only positive counts here; the knobs they map to give 0 and -1 other meanings (R_max 0:
            # no limit, -1: v1's default), which the vLLM name must not reach
            raise UserError(f"{where}.{alias}: {value!r} is not allowed: vLLM's {alias} is an integer >= 1 "
                            f"(servesim policies --knobs {name or 'NAME'} says what the knob it sets takes)")
    cls = _policy_class({"name": name})
    return spec if cls is None else translate_policy(spec, cls, where, name)


MAX_GIB = 1e6       # GiB of memory on one server (a petabyte): past it a size means nothing and overflows counts

# Ranges of the typed fields: (section, field, test, what is allowed). The free-form sections (policy, costmodel,
# workload) check their own keys and values where they are built.
_RANGES = (
    ("", "seed", lambda v: v >= 0, "an integer >= 0"),
    ("model", "max_model_len", lambda v: v is None or v >= 1, "an integer >= 1 (or null: the model's context)"),
    ("hardware", "tp", lambda v: v >= 1, "an integer >= 1 (1, 2, 4 or 8 that divides the model's heads)"),
    ("hardware", "gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("memory", "block_size", lambda v: v >= 1, "an integer >= 1 (tokens per KV block; vLLM's default is 16)"),
    ("memory", "swap_space_gib", lambda v: 0 <= v <= MAX_GIB, f">= 0 and <= {MAX_GIB:.0e} GiB"),
    ("memory", "activation_reserve_gib", lambda v: v is None or 0 <= v <= MAX_GIB,
     f">= 0 and <= {MAX_GIB:.0e} GiB, or null"),
    ("memory", "cpu_offload_gib", lambda v: 0 <= v <= MAX_GIB, f">= 0 (0 = no CPU tier) and <= {MAX_GIB:.0e} GiB"),
    ("memory", "disk_offload_gib", lambda v: 0 <= v <= MAX_GIB, f">= 0 (0 = no disk tier) and <= {MAX_GIB:.0e} GiB"),
    ("memory", "disk_gb_per_s", lambda v: 0 < v <= 1e6, "> 0 and <= 1e6 (GB/s)"),
    ("hardware", "host_memory_gib", lambda v: 0 < v <= MAX_GIB, f"> 0 and <= {MAX_GIB:.0e} GiB"),
    ("hardware", "usd_per_gpu_hour", lambda v: v is None or 0 <= v <= 1e6,
     ">= 0 and <= 1e6 USD (or null: the GPU's listed price)"),
    ("hardware", "power_idle_w", lambda v: v is None or 0 <= v <= 1e5, ">= 0 and <= 1e5 W (or null: the GPU's listed idle power)"),
    ("hardware", "power_peak_w", lambda v: v is None or 0 <= v <= 1e5, ">= 0 and <= 1e5 W (or null: the GPU's board power limit)"),
    ("sim", "max_iterations", lambda v: v >= 0, "an integer >= 0 (0 = run to completion)"),
    ("sim", "watchdog_iterations", lambda v: v >= 1, "an integer >= 1"),
)


def _check_ranges(scn: Scenario) -> None:
    for section, name, ok, allowed in _RANGES:
        value = getattr(getattr(scn, section) if section else scn, name)
        if not ok(value):
            raise UserError(f"{section + '.' if section else ''}{name}: must be {allowed}, got {value!r}")
    from costmodels.catalog import DTYPE_BYTES
    kv_dtype = scn.memory.kv_dtype          # (the catalog's own check, later, named only "dtype")
    if kv_dtype is not None and kv_dtype not in DTYPE_BYTES:
        raise UserError(f"memory.kv_dtype: {kv_dtype!r} is not allowed; allowed: {', '.join(DTYPE_BYTES)} "
                        "(or null: the model's)")
    host = scn.hardware.host_memory_gib
    cpu = (scn.memory.cpu_offload_gib + scn.memory.swap_space_gib) * scn.hardware.tp
    if scn.memory.cpu_offload_gib and cpu > host:
        raise UserError(f"memory.cpu_offload_gib: {scn.memory.cpu_offload_gib} GiB per GPU (plus swap_space_gib "
                        f"{scn.memory.swap_space_gib}) x tp {scn.hardware.tp} = {cpu:g} GiB exceeds "
                        f"hardware.host_memory_gib = {host:g}")
    for cls, slo in scn.slos().items():
        for k, v in dataclasses.asdict(slo).items():
            if v is not None and not v > 0:
                where = "slo" if cls == "default" else f"slo.classes.{cls}"
                raise UserError(f"{where}.{k}: a latency target must be > 0 seconds (or null for none), got {v!r}")


# Keys that select something by name anywhere in a scenario (policy.name, workload.kind, arrival.process, a length
# distribution's dist, a preset, a trace format, a GPU): one string, never a list or a mapping.
NAME_KEYS = ("name", "kind", "process", "dist", "preset", "format", "gpu")


def check_values(node, where: str = "") -> None:
    """Every value of a raw scenario, before anything reads it: numbers finite and within int64, selector names
    strings. The path in a message is the one the user wrote (a list item as [i])."""
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{where}.{k}" if where else str(k)
            if k in NAME_KEYS and v is not None and not isinstance(v, (str, dict)):
                from costmodels.values import name
                name(v, path)
            check_values(v, path)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_values(v, f"{where}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        finite(node, where or "value")


def scenario_from_dict(raw: dict, overrides=(), source: str = "scenario") -> Scenario:
    raw = dict(raw or {})
    defaults = Scenario()
    from policies.vllm_names import POLICY_ALIASES
    for sec in ("policy", "workload", "costmodel"):
        # an override of one field of a section the file leaves out refines the default, not an empty mapping
        keys = [str(o).split("=", 1)[0].strip() for o in overrides or ()]
        if sec not in raw and any(k.startswith(sec + ".") or (sec == "policy" and k in POLICY_ALIASES) for k in keys):
            raw[sec] = copy.deepcopy(getattr(defaults, sec))
    raw = apply_overrides(raw, overrides)
    check_values(raw)
    raw = canonical_names(raw)
    scn = _from_dict(Scenario, raw, "")
    scn.source = source
    for sec in ("speculative", "lora"):  # `null` turns them off, as an empty section does
        if getattr(scn, sec) is None:
            setattr(scn, sec, {})
    for sec in ("policy", "workload", "costmodel", "cluster", "speculative", "lora"):
        if not isinstance(getattr(scn, sec), dict):
            raise UserError(f"{source}: {sec}: expected a mapping")
    _check_ranges(scn)
    return scn


def read_yaml_mapping(path, what: str = "file") -> dict:
    """A YAML file whose top level is a mapping; one clear line (with the line number) when it is not."""
    from sim.scenario.yamlio import load, read_text
    path = Path(path)
    raw = load(read_text(path, what), str(path))
    if raw is None:
        raise UserError(f"{path}: is empty")
    if not isinstance(raw, dict):
        raise UserError(f"{path}: top level must be a mapping of sections")
    return raw


def load_scenario(path, overrides=()) -> Scenario:
    path = Path(path)
    raw = read_yaml_mapping(path, "scenario file")
    try:
        return scenario_from_dict(raw, overrides, str(path))
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
