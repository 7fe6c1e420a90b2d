"""Batch-time and memory models: hardware/model catalogs and cost models behind one interface."""
from costmodels.base import BatchShape, CostModel, register_costmodel, build_costmodel, COSTMODELS
from costmodels.catalog import GPU, ModelSpec, get_gpu, get_model, kv_capacity_tokens, GPUS, MODELS
from costmodels import linear as _linear  # noqa: F401  (registers "linear")
from costmodels import roofline as _roofline  # noqa: F401  (registers "roofline")
from costmodels import profiled as _profiled  # noqa: F401  (registers "profiled")
from costmodels import default as _default  # noqa: F401  (registers "auto": profiled where fitted, else roofline)

from costmodels.roofline import RooflineCostModel
from costmodels.profiled import ProfiledCostModel

__all__ = ["BatchShape", "CostModel", "register_costmodel", "build_costmodel", "COSTMODELS",
           "GPU", "ModelSpec", "get_gpu", "get_model", "kv_capacity_tokens", "GPUS", "MODELS",
           "RooflineCostModel", "ProfiledCostModel"]
