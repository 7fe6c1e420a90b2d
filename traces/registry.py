"""The workload registry: a scenario's `workload:` section names a kind; its builder returns a request table."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from costmodels.errors import UserError

# Required columns, then optional ones a builder may add.
REQUEST_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("cls", "predicted_output_tokens", "session", "prefix_hashes", "prefix")

WORKLOADS: dict[str, Callable] = {}


def register_workload(kind: str, replace: bool = False):
    """Decorator: `builder(spec, rng, where)` makes `kind:` workloads; a kind already taken is refused unless
    replace=True."""
    def deco(builder):
        from costmodels.registry import register
        register(WORKLOADS, kind, builder, "workload", replace)
        return builder
    return deco


def build_workload(spec: dict, rng: np.random.Generator, where: str = "workload") -> pd.DataFrame:
    spec = dict(spec or {})
    kind = spec.pop("kind", None)
    predictor = spec.pop("predictor", None)
    if kind not in WORKLOADS:
        what = "missing" if kind is None else f"unknown workload {kind!r}"
        raise UserError(f"{where}.kind: {what}; allowed: {', '.join(sorted(WORKLOADS))}")
    df = validate_requests(WORKLOADS[kind](spec, rng, where), where)
    if predictor is not None:
        # Drawn after the workload, so choosing a predictor never changes the requests themselves.
        from traces.predictors import predict_lengths
        df["predicted_output_tokens"] = predict_lengths(predictor, df, rng, f"{where}.predictor")
    return df


def validate_requests(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Reject bad rows with the row number and reason (never a silent drop)."""
    for col in REQUEST_COLUMNS:
        if col not in df:
            raise UserError(f"{where}: request table lacks column {col!r}; required: {', '.join(REQUEST_COLUMNS)}")
    for col in ("prompt_tokens", "output_tokens"):
        v = df[col].to_numpy()
        bad = np.flatnonzero(~(v >= 1))
        if len(bad):
            value = v[bad[0]].item() if hasattr(v[bad[0]], "item") else v[bad[0]]
            raise UserError(f"{where}: row {int(bad[0])}: {col} = {value!r}; lengths must be integers >= 1")
    a = df["arrival_s"].to_numpy(float)
    bad = np.flatnonzero(~(a >= 0))
    if len(bad):
        raise UserError(f"{where}: row {int(bad[0])}: arrival_s = {float(a[bad[0]])!r}; must be >= 0")
    from traces.prefix import check_prefix
    check_prefix(df, where)
    return df.reset_index(drop=True)
