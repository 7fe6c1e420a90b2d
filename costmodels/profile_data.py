"""Kernel-timing tables: the harness CSV format, the Vidur CSVs, validation, and conversion to batch shapes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.base import BatchShape
from costmodels.errors import UserError
from costmodels.operators import ATTN_OPS, LAYER_OPS

# One row = one timed operator on one batch shape, time in ms (per layer for layer/attention ops, per
# iteration for `emb`; `layer_forward` is one whole decoder layer and `iteration_forward` a whole iteration (every layer,
# lm_head, a greedy draw) on a mixed batch, both for validation).
#   prefill: "c:k;c:k" chunk:cached-context per prefill request;  decode: "m;m;..." KV tokens read per request
REQUIRED = ("op", "num_tokens", "prefill", "decode", "time_ms")
VALIDATION_OPS = ("layer_forward", "iteration_forward")   # measured for validation, never fitted
CHECK_OPS = ("moe_mlp",)   # one MoE layer's routed experts: compared with the model (profile --check), not fitted
# attn_mixed: one mixed batch's attention (prefill chunks and decodes) as the engine runs it, column mixed_attention
# saying how: 'one-varlen' (one varlen FlashAttention call, vLLM's FlashAttention backend) or 'split' (prefill and
# decode kernels, FlashInfer-style). Fitted: the decodes' cost inside the varlen call.
MIXED_OPS = ("attn_mixed",)
MIXED_MODES = ("one-varlen", "split")
KNOWN_OPS = LAYER_OPS + ATTN_OPS + ("emb",) + VALIDATION_OPS + CHECK_OPS + MIXED_OPS
# How a row was timed. Harness files from before the column existed were timed eager on CUDA.
TIMINGS = ("graph", "eager", "cpu", "vidur", "unknown")
VIDUR_MLP_OPS = LAYER_OPS + ("emb",)


def read_profiles(paths, tp: int | None = 1, stat: str = "median") -> pd.DataFrame:
    """Read and concatenate profile files of either format into the harness table, validated. tp=None keeps every
    tensor-parallel degree a Vidur mlp.csv has (column `tp`); harness files and attention samples are tp 1 unless
    they say otherwise."""
    frames = []
    for p in paths:
        p = Path(p)
        if p.is_dir():  # a Vidur folder: mlp.csv + attention*.csv
            files = sorted(p.glob("mlp.csv")) + sorted(p.glob("attention*.csv"))
            if not files:
                raise UserError(f"{p}: folder has no mlp.csv or attention*.csv")
            frames += [read_profile(f, tp, stat) for f in files]
        else:
            frames.append(read_profile(p, tp, stat))
    return pd.concat(frames, ignore_index=True)


def read_profile(path, tp: int | None = 1, stat: str = "median") -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: profile file does not exist")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if "op" in df.columns or not any(c.startswith("time_stats.") for c in df.columns):
        out = _validate_harness(df, path)
        out["timing"] = _timing(out, path)
        if "mixed_attention" in out:
            out["mixed_attention"] = _mixed_modes(out, path)
    elif "num_tokens" in df.columns:
        out = _from_vidur_mlp(df, path, tp, stat)
        out["timing"] = "vidur"
    else:
        out = _from_vidur_attention(df, path, tp, stat)
        out["timing"] = "vidur"
    out["source"] = path.name
    if "tp" not in out:
        out["tp"] = tp or 1
    return out


def _validate_harness(df: pd.DataFrame, path) -> pd.DataFrame:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; a harness profile needs "
                        f"{', '.join(REQUIRED)} (or give Vidur's mlp.csv / attention.csv)")
    df = df.copy()
    for col in ("prefill", "decode"):   # empty cells read back as NaN
        df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
    bad_op = ~df["op"].isin(KNOWN_OPS)
    if bad_op.any():
        i = int(np.argmax(bad_op.to_numpy()))
        raise UserError(f"{path}: row {i + 2}: unknown op {df['op'].iloc[i]!r}; allowed: {', '.join(KNOWN_OPS)}")
    _check_positive(df, "time_ms", path)
    _check_positive(df, "num_tokens", path)
    for i, (pf, dc) in enumerate(zip(df["prefill"], df["decode"])):
        try:
            parse_prefill(pf), parse_decode(dc)
        except ValueError:
            raise UserError(f"{path}: row {i + 2}: prefill must look like 'c:k;c:k' and decode like 'm;m', "
                            f"got {pf!r} / {dc!r}") from None
    return df


def _timing(df, path):
    """The `timing` column, filled in for files written before it existed (CUDA rows then were timed eager)."""
    if "timing" in df.columns:
        t = df["timing"].astype(object).where(df["timing"].notna(), "").astype(str)
        bad = ~t.isin(TIMINGS)
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise UserError(f"{path}: row {i + 2}: timing {t.iloc[i]!r} is not one of {', '.join(TIMINGS)}")
        return t
    if "device" in df.columns:
        return np.where(df["device"].astype(str) == "cuda", "eager", "cpu")
    return "unknown"      # a hand-made table: nothing says how it was timed


def _mixed_modes(df, path):
    m = df["mixed_attention"].astype(object).where(df["mixed_attention"].notna(), "").astype(str)
    bad = ~m.isin(MIXED_MODES + ("",))
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise UserError(f"{path}: row {i + 2}: mixed_attention {m.iloc[i]!r} is not one of {', '.join(MIXED_MODES)} "
                        f"(or empty)")
    return m


def _check_positive(df, col, path):
    v = pd.to_numeric(df[col], errors="coerce")
    bad = ~(v > 0) | ~np.isfinite(v)
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise UserError(f"{path}: row {i + 2}: {col} must be a positive number, got {df[col].iloc[i]!r}")
    df[col] = v


def _stat_col(df, op, stat, path):
    col = f"time_stats.{op}.{stat}"
    if col not in df.columns:
        raise UserError(f"{path}: missing column {col} (Vidur format needs time_stats.<op>.{stat})")
    return col


def _tp_rows(df, tp, path):
    if "num_tensor_parallel_workers" not in df.columns:
        raise UserError(f"{path}: missing column num_tensor_parallel_workers (Vidur format)")
    if tp is None:
        return df
    d = df[df["num_tensor_parallel_workers"] == tp]
    if d.empty:
        raise UserError(f"{path}: no rows for num_tensor_parallel_workers={tp}; "
                        f"present: {sorted(df['num_tensor_parallel_workers'].unique().tolist())}")
    return d


def _from_vidur_mlp(df, path, tp, stat) -> pd.DataFrame:
    d = _tp_rows(df, tp, path)
    rows = []
    for op in VIDUR_MLP_OPS:
        col = _stat_col(d, op, stat, path)
        rows.append(pd.DataFrame({"op": op, "num_tokens": d["num_tokens"].to_numpy(), "prefill": "", "decode": "",
                                  "time_ms": d[col].to_numpy(float),
                                  "tp": d["num_tensor_parallel_workers"].to_numpy(int)}))
    out = pd.concat(rows, ignore_index=True)
    _check_positive(out, "time_ms", path)
    return out


def _from_vidur_attention(df, path, tp, stat) -> pd.DataFrame:
    need = ("batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; expected a Vidur mlp.csv or attention.csv")
    d = _tp_rows(df, tp, path) if "num_tensor_parallel_workers" in df.columns else df
    reshape = sum(d[c].fillna(0.0).to_numpy(float) for op in ("attn_input_reshape", "attn_output_reshape")
                  if (c := f"time_stats.{op}.{stat}") in d.columns)
    pre = d["is_prefill"].astype(str).str.lower().isin(("true", "1")).to_numpy()
    t_pre = d[_stat_col(d, "attn_prefill", stat, path)].to_numpy(float)
    t_dec = d[_stat_col(d, "attn_decode", stat, path)].to_numpy(float)
    b, c, k = (d[x].to_numpy(int) for x in ("batch_size", "prefill_chunk_size", "kv_cache_size"))
    rows = []
    for i in range(len(d)):
        if pre[i]:  # Vidur profiles prefill as `batch_size` identical requests
            rows.append(("attn_prefill", b[i] * c[i], ";".join([f"{c[i]}:{k[i]}"] * b[i]), "", t_pre[i] + reshape[i]))
        else:       # kv_cache_size = cached tokens; the step reads them plus the new one
            rows.append(("attn_decode", b[i], "", ";".join([str(k[i] + 1)] * b[i]), t_dec[i] + reshape[i]))
    out = pd.DataFrame(rows, columns=list(REQUIRED))
    _check_positive(out, "time_ms", path)
    return out


def parse_prefill(s: str):
    """'c:k;c:k' -> ([c, c], [k, k])."""
    if not s:
        return [], []
    pairs = [p.split(":") for p in str(s).split(";")]
    return [int(p[0]) for p in pairs], [int(p[1]) for p in pairs]


def parse_decode(s: str):
    return [int(m) for m in str(s).split(";")] if s else []


def format_prefill(chunks, contexts) -> str:
    return ";".join(f"{int(c)}:{int(k)}" for c, k in zip(chunks, contexts))


def format_decode(contexts) -> str:
    return ";".join(str(int(m)) for m in contexts)


def row_shape(row) -> BatchShape:
    """The batch shape one profile row timed (dense-op rows: num_tokens tokens of one prefill)."""
    chunks, ctx = parse_prefill(row["prefill"])
    dec = parse_decode(row["decode"])
    if not chunks and not dec:
        chunks, ctx = [int(row["num_tokens"])], [0]
    return BatchShape(prefill_tokens=chunks, prefill_context=ctx, decode_context=dec)


def config_key(row) -> str:
    """Rows that timed the same configuration share a key, so a train/test split never leaks repeats."""
    tp = row.get("tp", 1)
    return (f"{row['op'] if row['op'] in ATTN_OPS + VALIDATION_OPS + MIXED_OPS else 'dense'}|{tp}|{row['num_tokens']}|"
            f"{row['prefill']}|{row['decode']}")
