"""`servesim profile --check`: every operator family of a profile against the shipped cost model for that GPU, as
measured/model ratios, flagged beyond a tolerance, with what makes a profile unfit for calibration (eager timing,
padded attention)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from costmodels.operators import GEMM_SHAPES, LAYER_OPS

TOLERANCE = 0.25
GPU_NAMES = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("A100-SXM4-80GB", "a100-80gb"),
             ("A100 80GB", "a100-80gb"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-40gb"), ("L40S", "l40s"))
PADDED_ATTENTION = ("torch-sdpa-padded", "sdpa-padded")


def family(op: str, timing: str) -> str:
    if op in GEMM_SHAPES:
        return "gemm"
    if op in LAYER_OPS:
        return "elementwise"
    if op == "iteration_forward":
        return f"iteration ({timing})"
    return op


def gpu_from_device_name(name: str) -> str | None:
    for key, gpu in GPU_NAMES:
        if key.lower() in str(name).lower():
            return gpu
    return None


def shipped_models(model, gpu, tp: int):
    """(the default cost model for the pair, the roofline): the default is `profiled` where a fit is shipped and
    keeps only sums, so per-operator rows are compared with the roofline the default falls back on."""
    from costmodels.base import build_costmodel
    default = build_costmodel({"kind": "auto"}, model, gpu, tp)
    roof = default if default.kind == "roofline" else build_costmodel({"kind": "roofline"}, model, gpu, tp)
    return default, roof


def check_profile(table: pd.DataFrame, gpu_name: str | None = None, tolerance: float = TOLERANCE):
    """One row per (model, tp, dtype, family): measured / shipped-model ratios (median, p10, p90), the model they
    were compared with, and flags."""
    from costmodels.calibrate import predict_op
    from costmodels.catalog import get_gpu, get_model, with_dtype
    rows = []
    if "model" not in table or "device_name" not in table:
        raise UserError("profile --check: needs a harness CSV (columns model and device_name); Vidur files carry "
                        "no GPU name")
    for (model_name, tp, dtype, device_name), g in table.groupby(["model", "tp", "dtype", "device_name"], sort=False):
        gname = gpu_name or gpu_from_device_name(device_name)
        if gname is None:
            raise UserError(f"profile --check: no catalog GPU for {device_name!r}; pass --gpu")
        gpu = get_gpu(gname, "--gpu")
        model = get_model(model_name, "model column")
        if dtype == "fp8":
            model = with_dtype(model, "fp8")
        default, roof = shipped_models(model, gpu, int(tp))
        timing = g["timing"] if "timing" in g else pd.Series("eager", index=g.index)
        fam = [family(op, t) for op, t in zip(g["op"], timing)]
        for f, sub in g.groupby(pd.Series(fam, index=g.index), sort=False):
            use = default if f.startswith("iteration") or f == "layer_forward" else roof
            pred = [predict_op(use, r) for _, r in sub.iterrows()]
            keep = [p is not None and p > 0 for p in pred]
            if not any(keep):
                use = roof
                pred = [predict_op(roof, r) for _, r in sub.iterrows()]
                keep = [p is not None and p > 0 for p in pred]
                if not any(keep):
                    continue
            y = sub["time_ms"].to_numpy(float)[keep] * 1e-3
            ratio = y / np.asarray([p for p, k in zip(pred, keep) if k], dtype=float)
            med = float(np.median(ratio))
            flags = []
            if abs(med - 1) > tolerance:
                flags.append(f"beyond ±{tolerance:.0%}")
            sub_t = timing.loc[sub.index]
            if (sub_t == "eager").any() and not f.startswith("iteration"):
                flags.append("timed eager (Python dispatch in every call)")
            if f.startswith("attn") or f == "layer_forward":
                impl = set(sub.get("attention_impl", pd.Series(dtype=str)).astype(str))
                if impl & set(PADDED_ATTENTION):
                    flags.append("attention padded with an explicit mask: not FlashAttention")
            rows.append({"model": model_name, "tp": int(tp), "dtype": dtype, "gpu": gname, "family": f,
                         "n": int(len(ratio)), "ratio_median": med, "ratio_p10": float(np.quantile(ratio, 0.1)),
                         "ratio_p90": float(np.quantile(ratio, 0.9)),
                         "compared_with": use.kind + (" (default)" if use is default else ""),
                         "flag": "; ".join(flags)})
    return pd.DataFrame(rows)


def format_check(df: pd.DataFrame) -> str:
    if df.empty:
        return "  (no rows to compare)"
    lines = [f"  {'model':<14} {'tp':>2} {'dtype':<5} {'family':<22} {'n':>4}  {'measured/model':>14}  "
             f"{'p10-p90':>11}  {'model':<18} flag"]
    for _, r in df.iterrows():
        lines.append(f"  {r['model']:<14} {r['tp']:>2} {r['dtype']:<5} {r['family']:<22} {r['n']:>4}  "
                     f"{r['ratio_median']:>13.2f}x  {r['ratio_p10']:>4.2f}-{r['ratio_p90']:<5.2f}  "
                     f"{r['compared_with']:<18} {r['flag'] or 'ok'}")
    flagged = int((df["flag"] != "").sum())
    lines.append(f"  {flagged} of {len(df)} families flagged (ratio beyond ±{TOLERANCE:.0%}, eager timing, or padded "
                 f"attention)")
    return "\n".join(lines)
