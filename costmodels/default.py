"""The default cost model for a (GPU, model) pair: `profiled` where a fitted profile exists, roofline v2 elsewhere,
with the engine overheads of the `vllm` preset (profiles/overheads.yaml) unless the scenario says otherwise."""
from __future__ import annotations

from costmodels.base import register_costmodel, overhead_presets
from costmodels.errors import UserError
from costmodels.yamlfile import read_yaml


def default_kind(model, gpu, tp: int = 1) -> str:
    """'profiled' when profiles/<gpu>/<model>-profiled.yaml exists and has rows for this tensor-parallel degree."""
    from costmodels.profiled import profiled_path
    if model is None or gpu is None:
        return "linear"
    path = profiled_path(gpu.name, model.name)
    if not path.exists():
        return "roofline"
    dense = read_yaml(path).get("dense") or {}
    return "profiled" if str(tp) in {str(k) for k in dense} else "roofline"


@register_costmodel("auto")
def _build_auto(spec: dict, model, gpu, tp: int = 1, where: str = "costmodel"):
    """`kind: auto`: the default model for the pair (see the module docstring); other keys go to that kind."""
    from costmodels.base import COSTMODELS
    spec = dict(spec)
    if "overheads" not in spec:
        spec["overheads"] = "vllm" if "vllm" in overhead_presets() else None
    kind = default_kind(model, gpu, tp)
    if kind == "linear":
        raise UserError(f"{where}: kind auto needs model.name and hardware.gpu from the catalogs")
    cm = COSTMODELS[kind](spec, model=model, gpu=gpu, tp=tp, where=where)
    return cm
