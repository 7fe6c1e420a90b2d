"""Fit any cost-model kind to kernel-timing tables and measure it on data it was not fitted on.

Held-out data comes two ways: contiguous blocks (token counts for the dense operators, context lengths for decode
attention, chunk-and-context pairs for prefill attention; a quarter of the blocks held out), and extrapolation
(fit on up to 1,024 tokens, test above). Errors are reported per operator, for the sum of the non-attention
operators, for a whole iteration's non-attention time (layers × sum + embedding), and for whole mixed batches.

Fits are time-weighted: the dense operators are fitted on the relative error of their per-iteration sum (a large
GEMM's error counts more than a tiny elementwise kernel's), attention on each timed operator's relative error."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.base import BatchShape
from costmodels.errors import UserError
from costmodels.operators import GEMM_SHAPES, LAYER_OPS, Shard, dense_work, gemm_dims
from costmodels.profile_data import CHECK_OPS, MIXED_OPS, VALIDATION_OPS, parse_decode, parse_prefill

KINDS = ("linear", "roofline", "profiled")
DENSE_OPS = LAYER_OPS + ("emb",)
# Decode attention over short contexts is partly served from L2 (40-50 MB on A100/H100), so its bytes may move
# faster than HBM's datasheet peak: the fit may take the bandwidth fraction up to this.
MAX_DECODE_EFF = 1.5


# -- splitting --------------------------------------------------------------------------------------------
def _blocks(keys, n_blocks, test_frac, rng):
    """Contiguous blocks of sorted distinct keys; a random quarter (test_frac) of the blocks is held out."""
    uniq = np.unique(keys)
    blocks = np.array_split(uniq, min(n_blocks, len(uniq)))
    k = max(1, int(round(len(blocks) * test_frac))) if len(blocks) > 1 else 0
    held = rng.choice(len(blocks), size=k, replace=False) if k else []
    test_keys = set(np.concatenate([blocks[i] for i in held]).tolist()) if k else set()
    return np.array([x in test_keys for x in keys])


def split_contiguous(table: pd.DataFrame, test_frac: float = 0.25, seed: int = 0, n_blocks: int = 8):
    """(train, test): contiguous blocks of token counts (dense ops, all tensor-parallel degrees and operators at a
    count move together), of decode contexts, of prefill (chunk, context) pairs."""
    rng = np.random.default_rng(seed)
    te = np.zeros(len(table), dtype=bool)
    op = table["op"].to_numpy()
    dense = np.isin(op, DENSE_OPS)
    if dense.any():
        te[dense] = _blocks(table["num_tokens"].to_numpy()[dense], n_blocks, test_frac, rng)
    dec = op == "attn_decode"
    if dec.any():
        ctx = np.array([max(parse_decode(s)) for s in table["decode"].to_numpy()[dec]])
        te[dec] = _blocks(ctx, n_blocks, test_frac, rng)
    pre = op == "attn_prefill"
    if pre.any():
        pairs = [parse_prefill(s) for s in table["prefill"].to_numpy()[pre]]
        key = np.array([max(c) * 100_000 + max(k) for c, k in pairs])      # sorted by chunk, then context
        te[pre] = _blocks(key, n_blocks, test_frac, rng)
    mix = np.isin(op, MIXED_OPS)
    if mix.any():        # mixed batches in contiguous blocks of the KV their decodes read
        te[mix] = _blocks(np.array([sum(parse_decode(s)) for s in table["decode"].to_numpy()[mix]]), n_blocks,
                          test_frac, rng)
    te |= np.isin(op, VALIDATION_OPS + CHECK_OPS)     # whole layers and iterations are validation only
    return table[~te].reset_index(drop=True), table[te].reset_index(drop=True)


def split_extrapolation(table: pd.DataFrame, limit: int = 1024):
    """(train, test): fit on configurations of at most `limit` tokens (dense: batch tokens; decode: context;
    prefill: chunk + context), test on the larger ones."""
    size = []
    for op, n, pf, dc in zip(table["op"], table["num_tokens"], table["prefill"], table["decode"]):
        if op == "attn_decode":
            size.append(max(parse_decode(dc)))
        elif op == "attn_prefill":
            c, k = parse_prefill(pf)
            size.append(max(a + b for a, b in zip(c, k)))
        else:
            size.append(int(n))
    te = np.asarray(size) > limit
    return table[~te].reset_index(drop=True), table[te].reset_index(drop=True)


# Kept for callers of the first version: a random split of configurations.
def split_by_config(table: pd.DataFrame, test_frac: float = 0.25, seed: int = 0):
    from costmodels.profile_data import config_key
    keys = table.apply(config_key, axis=1)
    uniq = np.unique(keys)
    rng = np.random.default_rng(seed)
    test = set(rng.choice(uniq, size=max(1, int(round(len(uniq) * test_frac))), replace=False).tolist())
    te = keys.isin(test).to_numpy() | table["op"].isin(VALIDATION_OPS).to_numpy()
    return table[~te].reset_index(drop=True), table[te].reset_index(drop=True)


# -- fitting ------------------------------------------------------------------------------------------------
def fit(kind: str, table: pd.DataFrame, model, gpu, tp: int = 1, base=None):
    """Fit `kind` to the rows (layer_forward rows are never fitted). `base`: a roofline to take what the rows
    do not time from (profiled: attention if absent; linear: attention if absent)."""
    if kind not in KINDS:
        raise UserError(f"--kind: {kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    rows = table[~table["op"].isin(VALIDATION_OPS + CHECK_OPS)]
    if kind == "profiled":
        return fit_profiled(rows, model, gpu, tp)
    if kind == "linear":
        return fit_linear(rows, model, gpu, tp)
    return fit_roofline(rows, model, gpu)


def _need(table, ops, kind):
    missing = [op for op in ops if op not in set(table["op"])]
    if missing:
        raise UserError(f"profile: fitting a {kind} model needs rows for op(s) {', '.join(missing)}")


def _dense_rows(table, model):
    d = table[table["op"].isin(DENSE_OPS)].copy()
    if "tp" not in d:
        d["tp"] = 1
    return d


def dense_arrays(d: pd.DataFrame, model):
    """Per row: is it a GEMM, FLOPs, bytes, rows M; and the (tp, tokens) group it belongs to."""
    shards = {tp: Shard.of(model, int(tp)) for tp in d["tp"].unique()}
    gemm, F, B, M = [], [], [], []
    for op, n, tp in zip(d["op"], d["num_tokens"], d["tp"]):
        f, b = dense_work(shards[tp], op, n)
        gemm.append(op in GEMM_SHAPES)
        F.append(float(f))
        B.append(float(b))
        M.append(float(n))
    return np.array(gemm), np.array(F), np.array(B), np.array(M)


def _dense_pred(theta, gemm, F, B, M, gpu, peak):
    ec, mh, em, ov, eel, oel = theta
    t_g = np.maximum(F * (M + mh) / np.maximum(M, 1e-12) / (peak * ec), B / (gpu.hbm_bytes_per_s * em)) + ov
    t_e = B / (gpu.hbm_bytes_per_s * eel) + oel
    return np.where(gemm, t_g, t_e)


def fit_dense_params(table, model, gpu) -> dict:
    """GEMM and elementwise parameters on the per-iteration relative error of the non-attention sum."""
    from scipy.optimize import least_squares
    from costmodels.roofline import PARAMS
    d = _dense_rows(table, model)
    if d.empty:
        raise UserError("profile: fitting a roofline model needs non-attention operator rows (mlp.csv)")
    gemm, F, B, M = dense_arrays(d, model)
    y = d["time_ms"].to_numpy(float) * 1e-3
    mult = np.where(d["op"].to_numpy() == "emb", 1.0, model.layers)
    codes, _ = pd.factorize(d["tp"].astype(str) + "|" + d["num_tokens"].astype(str))
    Y = np.bincount(codes, weights=y * mult)
    peak = gpu.fp8_flops if (model.dtype == "fp8" and gpu.fp8_flops) else gpu.peak_flops
    names = ("gemm_compute_eff", "gemm_m_half", "gemm_memory_eff", "gemm_overhead_s", "elementwise_memory_eff",
             "elementwise_overhead_s")
    lo = np.array([PARAMS[k][1][0] for k in names])
    hi = np.array([PARAMS[k][1][1] for k in names])
    scale = np.array([1.0, 100.0, 1.0, 1e-5, 1.0, 1e-5])

    def resid(z):
        P = np.bincount(codes, weights=_dense_pred(z * scale, gemm, F, B, M, gpu, peak) * mult)
        return (P - Y) / Y
    x0 = np.clip(np.array([0.7, 64.0, 0.8, 5e-6, 0.6, 3e-6]), lo, hi) / scale
    r = least_squares(resid, x0, bounds=(lo / scale, hi / scale))
    return dict(zip(names, (r.x * scale).tolist()))


def fit_decode(table, model, gpu, tp: int = 1, context_half: bool = False):
    """Decode attention: Σ(m + 1)·c·(1 + (b_half + ch·m̄/1000)/b)^γ + ψ·b + c0 per layer (m̄ the mean context; ch
    fitted only with context_half, else 0), every coefficient >= 0 and γ <= 1 (so more requests, or longer
    contexts, never take less time), relative error per timed row. With ch the occupancy's half-batch grows with the
    context: a request's thread blocks hold more of an SM the longer its context, so more requests are needed to
    fill the GPU. Returns (c, b_half, ψ, c0, γ, ch), seconds."""
    from scipy.optimize import least_squares
    dec = table[table["op"] == "attn_decode"]
    if dec.empty:
        return None
    ctx = [parse_decode(s) for s in dec["decode"]]
    b = np.array([len(c) for c in ctx], dtype=float)
    K = np.array([sum(c) for c in ctx], dtype=float)
    y = dec["time_ms"].to_numpy(float) * 1e-3
    s = Shard.of(model, tp)
    kv_token = 2.0 * (s.mla_latent / 2 if s.mla_latent else s.kv_width) * s.kv_bytes
    c_ideal = kv_token / gpu.hbm_bytes_per_s
    scale = np.array([c_ideal, 1.0, 1e-6, 1e-6, 1.0, 1.0])

    def resid(z):
        c, bh, psi, c0, g, ch = z * scale
        return (K * c * (1.0 + (bh + ch * (K / b) / 1000.0) / b) ** g + psi * b + c0 - y) / y
    r = least_squares(resid, [1.1, 2.0, 1.0, 5.0, 0.5, 1.0 if context_half else 0.0],
                      bounds=([1.0 / MAX_DECODE_EFF, 0.0, 0.0, 0.0, 0.0, 0.0],
                              [20.0, 1024.0, 100.0, 1000.0, 1.0, 1e6 if context_half else 1e-12]))
    c, bh, psi, c0, g, ch = (r.x * scale).tolist()
    return c, bh, psi, c0, g, (ch if context_half else 0.0)


def small_decode_rows(table, max_batch: int) -> dict:
    """The profile's decode rows per batch size up to max_batch: {b: {context: mean contexts Σ(m+1)/b increasing,
    s: seconds per layer (median of repeats)}}, kept where at least two contexts were timed."""
    dec = table[table["op"] == "attn_decode"]
    rows = {}
    for spec, t in zip(dec["decode"], dec["time_ms"].to_numpy(float)):
        ctx = parse_decode(spec)
        if len(ctx) <= max_batch:
            rows.setdefault(len(ctx), {}).setdefault(sum(ctx) / len(ctx), []).append(t * 1e-3)
    out = {}
    for b, by_ctx in sorted(rows.items()):
        if len(by_ctx) >= 2:
            xs = sorted(by_ctx)
            out[b] = {"context": xs, "s": [float(np.median(by_ctx[x])) for x in xs]}
    return out


def fit_prefill(table):
    """Prefill attention: non-negative least squares of time on Σck, Σc², Σc, Σk, n (relative error)."""
    from scipy.optimize import nnls
    pre = table[table["op"] == "attn_prefill"]
    if pre.empty:
        return None
    X = []
    for pf in pre["prefill"]:
        c, k = (np.asarray(v, dtype=float) for v in parse_prefill(pf))
        X.append([np.sum(c * k), np.sum(c * c), np.sum(c), np.sum(k), len(c)])
    X = np.array(X)
    y = pre["time_ms"].to_numpy(float) * 1e-3
    w = 1.0 / y
    col = X.max(axis=0)
    col[col == 0] = 1.0
    coef, _ = nnls(X / col * w[:, None], y * w)
    return tuple((coef / col).tolist())


def mixed_rows(table, mode: str = "one-varlen"):
    """attn_mixed rows timed with the engine's `mode` of running a mixed batch (files without the column: one varlen
    call, the harness's only way before the column)."""
    m = table[table["op"].isin(MIXED_OPS)]
    if "mixed_attention" in m:
        m = m[m["mixed_attention"].astype(str).isin((mode, "", "nan"))]
    return m[m["decode"] != ""]


def fit_mixed_decode(table, pre):
    """A mixed batch's decodes inside the one varlen call (vLLM's FlashAttention backend runs prefills and decodes
    together; FlashAttention splits the KV only for all-decode batches, so there each decode is a thread block per
    query head over its whole context): the decode form of fit_decode, fitted on attn_mixed rows less the prefill
    fit `pre`, relative error of the whole row. None without such rows. Returns (c, b_half, ψ, c0, γ, ch), seconds."""
    from scipy.optimize import least_squares
    rows = mixed_rows(table)
    if len(rows) < 3 or pre is None:
        return None
    y = rows["time_ms"].to_numpy(float) * 1e-3
    P, b, K = [], [], []
    for pf, dc in zip(rows["prefill"], rows["decode"]):
        c, k = (np.asarray(v, dtype=float) for v in parse_prefill(pf))
        P.append(pre[0] * np.sum(c * k) + pre[1] * np.sum(c * c) + pre[2] * np.sum(c) + pre[3] * np.sum(k)
                 + pre[4] * len(c))
        m = parse_decode(dc)
        b.append(len(m))
        K.append(sum(m))
    P, b, K = np.array(P), np.array(b, dtype=float), np.array(K, dtype=float)
    c_ideal = float(np.median(np.maximum(y - P, 0.1 * y) / K))
    scale = np.array([c_ideal, 1.0, 1e-6, 1e-6, 1.0, 1.0])

    def resid(z):
        c, bh, psi, c0, g, ch = z * scale
        return (P + K * c * (1.0 + (bh + ch * (K / b) / 1000.0) / b) ** g + psi * b + c0 - y) / y
    r = least_squares(resid, [1.0, 2.0, 0.1, 1.0, 0.5, 0.0],
                      bounds=([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [20.0, 1024.0, 100.0, 1000.0, 1.0, 1e6]))
    return tuple((r.x * scale).tolist())


def fit_roofline(table, model, gpu):
    """Roofline v2's efficiencies on per-operator rows: dense ops time-weighted, decode and prefill attention as
    timed; attention rows missing: the shipped efficiencies stay."""
    from costmodels.roofline import RooflineCostModel, load_efficiencies, DEFAULT_PARAMS, PARAMS
    params = {**DEFAULT_PARAMS, **load_efficiencies(gpu.family)[0]}
    if table["op"].isin(DENSE_OPS).any():
        params.update(fit_dense_params(table, model, gpu))
    s = Shard.of(model, 1)
    dec = fit_decode(table, model, gpu)
    if dec is not None:
        c, bh, psi, c0, g, _ = dec
        params["decode_batch_exp"] = g
        kv_token = 2.0 * (s.mla_latent / 2 if s.mla_latent else s.kv_width) * s.kv_bytes
        params["decode_memory_eff"] = min(MAX_DECODE_EFF, kv_token / (gpu.hbm_bytes_per_s * c))
        params["decode_batch_half"] = bh
        params["decode_per_seq_s"] = max(0.0, psi - 2.0 * s.q_width * s.act_bytes /
                                         (gpu.hbm_bytes_per_s * params["decode_memory_eff"]))
        params["decode_fixed_s"] = c0
    pre = fit_prefill(table)
    if pre is not None:
        a_ck, a_cc, a_c, a_k, a_1 = pre
        kv_token = 2.0 * s.kv_width * s.kv_bytes
        chunk_bytes = 2.0 * s.q_width * s.act_bytes + 2.0 * kv_token

        def eff(num, a, key):
            lo, hi = PARAMS[key][1]
            return float(np.clip(num / a, lo, hi)) if a > 0 else hi
        params["prefill_ck_eff"] = eff(4.0 * s.q_width / gpu.peak_flops, a_ck, "prefill_ck_eff")
        params["prefill_cc_eff"] = eff(2.0 * s.q_width / gpu.peak_flops, a_cc, "prefill_cc_eff")
        params["prefill_token_eff"] = eff(chunk_bytes / gpu.hbm_bytes_per_s, a_c, "prefill_token_eff")
        params["prefill_context_eff"] = eff(kv_token / gpu.hbm_bytes_per_s, a_k, "prefill_context_eff")
        params["prefill_per_seq_s"] = float(np.clip(a_1, *PARAMS["prefill_per_seq_s"][1]))
    params = {k: float(np.clip(v, *PARAMS[k][1])) for k, v in params.items()}
    return RooflineCostModel(model, gpu, params=params)


def fit_profiled(table, model, gpu, tp: int = 1, base=None):
    """The pair's measured dense tables (every tensor-parallel degree present), embedding, and constrained
    attention fits; attention the rows lack comes from roofline v2 for the GPU."""
    from costmodels.profiled import SMALL_DECODE_BATCH, ProfiledCostModel
    from costmodels.roofline import RooflineCostModel
    d = _dense_rows(table, model)
    _need(d, LAYER_OPS, "profiled")
    dense = {}
    for t, g in d[d["op"].isin(LAYER_OPS)].groupby("tp"):
        per = g.groupby(["num_tokens", "op"])["time_ms"].median().unstack("op").dropna()
        if set(LAYER_OPS) <= set(per.columns):
            s = per[list(LAYER_OPS)].sum(axis=1)
            dense[int(t)] = {"tokens": s.index.to_numpy(int).tolist(), "layer_ms": s.to_numpy(float).tolist()}
    emb = d[(d["op"] == "emb") & (d["tp"] == min(dense))].groupby("num_tokens")["time_ms"].median()
    emb_fit = {"tokens": emb.index.to_numpy(int).tolist(), "ms": emb.to_numpy(float).tolist()} if len(emb) > 1 else None
    base = base or RooflineCostModel(model, gpu, tp=1)
    dec = fit_decode(table, model, gpu, context_half=True)
    pre = fit_prefill(table)
    small = small_decode_rows(table, SMALL_DECODE_BATCH) if dec is not None else {}
    if dec is None:
        c = base._dec
        dec = (c[0], c[1], c[2], c[3], c[4], c[5])
    if pre is None:
        pre = tuple(base._pre)
    keys = ("per_kv_token_s", "batch_half", "per_seq_s", "fixed_s", "batch_exp", "ctx_half")
    decode = dict(zip(keys, dec))
    if small:
        decode["small_batch"] = small
    mixed = fit_mixed_decode(table, pre)
    if mixed is not None:
        decode["in_varlen"] = dict(zip(keys, mixed))
    return ProfiledCostModel(dense, decode,
                             dict(zip(("ck_s", "c2_s", "c_s", "k_s", "per_seq_s"), pre)), model, gpu,
                             tp=tp if tp in dense else min(dense), emb=emb_fit, profiled_tp=1)


def fit_linear(table, model, gpu, tp=1):
    """InferMax's features, non-negative least squares on relative error. Terms the rows do not time (attention,
    for a profile of the non-attention operators only) come from roofline v2 for the GPU, turned into the same
    features, and the provenance says so."""
    from costmodels.linear import LinearCostModel, _nnls_rel
    from costmodels.roofline import RooflineCostModel
    _need(table, LAYER_OPS, "linear")
    d = table[table["tp"] == tp] if "tp" in table else table
    other = other_sum(d)
    n = other.index.to_numpy(float)
    a_o, b_o = _nnls_rel(np.c_[n, np.ones_like(n)], other.to_numpy(float))
    step_a = step_b = 0.0
    emb = d[d["op"] == "emb"]
    if len(emb):
        ne = emb["num_tokens"].to_numpy(float)
        step_a, step_b = _nnls_rel(np.c_[ne, np.ones_like(ne)], emb["time_ms"].to_numpy(float))
    notes = []
    pre = table[table["op"] == "attn_prefill"]
    dec = table[table["op"] == "attn_decode"]
    base = None
    if pre.empty or dec.empty:
        base = RooflineCostModel(model, gpu, tp=tp)
    if len(pre):
        P = np.array([_prefill_feats(s) for s in pre["prefill"]])
        a_p, a_pk, a_pr, s_p, b_p = _nnls_rel(P, pre["time_ms"].to_numpy(float))
    else:       # the roofline's prefill attention per layer, in ms: Σck, Σc² terms; Σc folds into a_o
        a = [v * 1e3 for v in base._pre]
        a_pk, a_p, a_pr, s_p, b_p = a[0], a[1], a[3], a[4], 0.0
        a_o += a[2]
        notes.append("prefill attention from roofline v2 (the profile has no attn_prefill rows)")
    if len(dec):
        D = np.array([[sum(m), len(m), 1.0] for m in map(parse_decode, dec["decode"])])
        a_d, s_d, b_d = _nnls_rel(D, dec["time_ms"].to_numpy(float))
    else:       # the roofline's decode attention at a batch of 32, linearised in Σ(m + 1) and batch
        c = base._dec
        a_d = c[0] * base._occupancy(32) * 1e3
        s_d, b_d = c[2] * 1e3, c[3] * 1e3
        notes.append("decode attention from roofline v2 at batch 32 (the profile has no attn_decode rows)")
    coeffs = dict(a_o=a_o, b_o=b_o, a_p=a_p, a_pk=a_pk, a_pr=a_pr, s_p=s_p, b_p=b_p, a_d=a_d, s_d=s_d, b_d=b_d,
                  step_a=step_a, step_b=step_b)
    lm = LinearCostModel(coeffs, layers=model.layers, model=model, gpu=gpu, tp=tp)
    lm.provenance = {"notes": notes} if notes else {}
    return lm


def other_sum(table) -> pd.Series:
    """Σ of the non-attention layer ops per token count (ms), only where every op was timed; repeated
    timings of one op at one token count are averaged first, not added."""
    dense = table[table["op"].isin(LAYER_OPS)].groupby(["num_tokens", "op"])["time_ms"].mean().unstack("op")
    return dense.dropna().sum(axis=1) if set(LAYER_OPS) <= set(dense.columns) else pd.Series(dtype=float)


def _prefill_feats(s):
    c, k = (np.asarray(v, dtype=float) for v in parse_prefill(s))
    return [np.sum(c * c), np.sum(c * k), np.sum(k), len(c), 1.0]


# -- predictions ----------------------------------------------------------------------------------------------
def _at_tp(cm, tp: int):
    """The same fitted model for another tensor-parallel degree (profile rows of several degrees)."""
    if tp == cm.tp:
        return cm
    cache = cm.__dict__.setdefault("_tp_variants", {})
    if tp not in cache:
        if cm.kind == "linear":
            cache[tp] = None
        elif cm.kind == "profiled":
            from costmodels.profiled import ProfiledCostModel
            cache[tp] = (ProfiledCostModel(cm.dense_tables, cm.decode_fit, cm.prefill_fit, cm.model, cm.gpu, tp=tp,
                                           emb=cm.emb_fit, profiled_tp=cm.profiled_tp,
                                           mixed_attention=cm.mixed_attention)
                         if tp in cm.dense_tables else None)
        else:
            from costmodels.roofline import RooflineCostModel
            cache[tp] = RooflineCostModel(cm.model, cm.gpu, tp=tp, params=cm.params)
    return cache[tp]


def predict_groups(cm, shape: BatchShape) -> dict:
    """Seconds per layer for 'other' (all non-attention layer ops, no all-reduce), 'attn_prefill', 'attn_decode';
    'emb' per iteration. The common ground on which every kind is compared with measurements."""
    pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
    n = sum(pt) + len(dc)
    if cm.kind == "linear":
        k, L = cm.coefficients, 1e-3
        pre = (k["a_p"] * sum(c * c for c in pt) + k["a_pk"] * sum(c * x for c, x in zip(pt, pc)) + k["a_pr"] * sum(pc)
               + k["s_p"] * len(pt) + k["b_p"]) if pt else 0.0
        dec = (k["a_d"] * sum(dc) + k["s_d"] * len(dc) + k["b_d"]) if dc else 0.0
        return {"other": (k["a_o"] * n + k["b_o"]) * L, "attn_prefill": pre * L, "attn_decode": dec * L,
                "emb": (k["step_a"] * n + k["step_b"]) * L}
    other = float(cm.dense_ops_time(n))       # profiles time the operators, not the all-reduces between them
    return {"other": other, "attn_prefill": cm.prefill_attn_time(pt, pc), "attn_decode": cm.batch_decode_attn_time(shape),
            "emb": float(cm.emb_time(n))}


def predict_op(cm, row):
    """Seconds the model gives the operator a profile row timed; None where the kind has no such operator."""
    from costmodels.profile_data import row_shape
    m = _at_tp(cm, int(row.get("tp", 1)))
    if m is None:
        return None
    m = in_mode(m, row.get("mixed_attention"))
    shape = row_shape(row)
    op = row["op"]
    if op in MIXED_OPS:
        g = predict_groups(m, shape)
        return g["attn_prefill"] + g["attn_decode"]
    if op == "layer_forward":
        g = predict_groups(m, shape)
        return g["other"] + g["attn_prefill"] + g["attn_decode"]
    if op == "iteration_forward":
        return float(m.compute_time(shape))
    if op == "moe_mlp":
        return float(m.moe_time(shape.num_tokens)) if hasattr(m, "moe_time") else None
    if m.kind == "linear":
        return predict_groups(m, shape)[op] if op in ("attn_prefill", "attn_decode", "emb") else None
    if op in ("attn_prefill", "attn_decode"):
        return predict_groups(m, shape)[op]
    if op == "emb":
        return float(m.emb_time(shape.num_tokens))
    if m.kind == "profiled":
        return None          # the profiled model keeps the operators' sum, not each operator
    return float(m.dense_op_time(op, shape.num_tokens))


def in_mode(cm, mode):
    """The model pricing a mixed batch's attention as the row's engine ran it (column mixed_attention)."""
    if not isinstance(mode, str) or not mode or not hasattr(cm, "in_mode"):
        return cm
    return cm.in_mode(mode)


MIXED_LABEL = {"one-varlen": "mixed: one varlen call", "split": "mixed: prefill + decode kernels"}
ITERATION_TIMING = {"graph": "graph-replayed, as engines run them", "eager": "eager: Python dispatch included"}


# -- held-out errors --------------------------------------------------------------------------------------
def _err_row(name, y, p):
    y, p = np.asarray(y, dtype=float), np.asarray(p, dtype=float)
    ape = np.abs(p - y) / y
    return {"what": name, "n": int(len(ape)), "mape_pct": 100 * float(np.mean(ape)),
            "p90_ape_pct": 100 * float(np.quantile(ape, 0.9)), "max_ape_pct": 100 * float(np.max(ape)),
            "bias_pct": 100 * float(np.median(p / y - 1))}


def heldout_errors(cm, test: pd.DataFrame, reference: pd.DataFrame | None = None, n_mixed: int = 300, seed: int = 0):
    """Per-operator errors; 'other' = Σ non-attention ops per layer at one token count; 'iteration non-attention'
    = layers × other + embedding (the whole iteration without attention); decode batches of at most 8 requests;
    and whole iterations: measured layer_forward rows if the profile has them, else mixed batches composed from
    held-out attention rows plus the measured non-attention ops at the batch's token count."""
    rows = []
    fitted = test[~test["op"].isin(VALIDATION_OPS + CHECK_OPS)]
    key = fitted["op"]
    if "mixed_attention" in fitted:      # attn_mixed rows one line per way the engine ran them
        mode = fitted["mixed_attention"].astype(str).replace("nan", "")
        key = key.where(~key.isin(MIXED_OPS) | (mode == ""), key + " (" + mode.map(lambda x: MIXED_LABEL.get(x, x)) + ")")
    for op, g in fitted.groupby(key, sort=False):
        pairs = [(y, predict_op(cm, r)) for y, (_, r) in zip(g["time_ms"] * 1e-3, g.iterrows())]
        pairs = [(y, p) for y, p in pairs if p is not None]
        if pairs:
            rows.append(_err_row(op, *zip(*pairs)))
        if op == "attn_decode" and pairs:
            small = [(y, p) for (y, p), s in zip(pairs, g["decode"]) if len(parse_decode(s)) <= 8]
            if small:
                rows.append(_err_row("attn_decode, batch <= 8", *zip(*small)))
    tps = sorted(test["tp"].unique()) if "tp" in test else [1]
    for tp in tps:
        sub = test[test["tp"] == tp] if "tp" in test else test
        other = other_sum(sub) * 1e-3
        m = _at_tp(cm, int(tp))
        if not len(other) or m is None:
            continue
        pred = np.array([predict_groups(m, BatchShape([int(n)], [0]))["other"] for n in other.index])
        tag = f" (tp {tp})" if len(tps) > 1 else ""
        rows.append(_err_row(f"other (sum of non-attention ops){tag}", other.to_numpy(), pred))
        emb = sub[sub["op"] == "emb"].groupby("num_tokens")["time_ms"].median() * 1e-3
        both = other.index.intersection(emb.index)
        if len(both):
            L = cm.model.layers if cm.model is not None else cm.layers
            y = L * other.loc[both].to_numpy() + emb.loc[both].to_numpy()
            p = np.array([L * predict_groups(m, BatchShape([int(n)], [0]))["other"]
                          + predict_groups(m, BatchShape([int(n)], [0]))["emb"] for n in both])
            rows.append(_err_row(f"iteration non-attention{tag}", y, p))
    timing = test["timing"] if "timing" in test else pd.Series("cpu", index=test.index)
    mode_col = (test["mixed_attention"].astype(str).replace("nan", "") if "mixed_attention" in test
                else pd.Series("", index=test.index))
    for op, what in (("layer_forward", "layer_forward (measured mixed batches)"),
                     ("iteration_forward", "iteration_forward (measured whole iterations)")):
        for how, g in test[test["op"] == op].groupby(timing[test["op"] == op], sort=False):
            label = what if how not in ITERATION_TIMING else f"{op} ({ITERATION_TIMING[how]})"
            modes = sorted(set(mode_col.loc[g.index]) - {""})
            if len(modes) < 2:
                rows.append(_err_row(label, g["time_ms"].to_numpy() * 1e-3, [predict_op(cm, r) for _, r in g.iterrows()]))
                continue
            # the profile timed mixed batches both ways: one line per way, each with the batches without prefill
            for mode in modes:
                sub = g[mode_col.loc[g.index].isin((mode, ""))]
                rows.append(_err_row(f"{label[:-1]}; {MIXED_LABEL.get(mode, mode)})", sub["time_ms"].to_numpy() * 1e-3,
                                     [predict_op(cm, r) for _, r in sub.iterrows()]))
    ref = reference if reference is not None else test
    ref1 = ref[ref["tp"] == 1] if "tp" in ref else ref
    layers = cm.model.layers if cm.model is not None else getattr(cm, "layers", 32)
    grid = mixed_iteration_grid(test[test["tp"] == 1] if "tp" in test else test, ref1, layers, n_mixed, seed)
    if grid:
        m1 = _at_tp(cm, 1)
        rows.append(_err_row("iteration (mixed-batch grid)", [g[1] for g in grid],
                             [_iteration(m1, s) for s, _ in grid]))
    return pd.DataFrame(rows)


def _iteration(cm, shape):
    g = predict_groups(cm, shape)
    L = cm.model.layers if cm.model is not None else cm.layers
    return L * (g["other"] + g["attn_prefill"] + g["attn_decode"]) + g["emb"]


def mixed_iteration_grid(test, reference, layers: int, n_mixed: int = 300, seed: int = 0):
    """(shape, measured seconds) for whole iterations: pure-decode, pure-prefill and hybrid batches built
    from held-out attention rows; the non-attention ops at the batch's token count are interpolated in the
    measured per-op table (profiled every few tokens, so interpolation adds little)."""
    other = other_sum(reference)
    if len(other) < 2:
        return []
    emb = reference[reference["op"] == "emb"].groupby("num_tokens")["time_ms"].mean()
    n_max = other.index.max()
    at = lambda s, n: float(np.interp(n, s.index.to_numpy(float), s.to_numpy(float))) if len(s) else 0.0  # noqa: E731
    pre = test[test["op"] == "attn_prefill"]
    dec = test[test["op"] == "attn_decode"]
    rng = np.random.default_rng(seed)
    combos = [(i, None) for i in range(len(pre))] + [(None, j) for j in range(len(dec))]
    if len(pre) and len(dec):
        combos += list(zip(rng.integers(0, len(pre), n_mixed), rng.integers(0, len(dec), n_mixed)))
    out = []
    for i, j in combos:
        chunks, ctx = parse_prefill(pre["prefill"].iloc[i]) if i is not None else ([], [])
        dctx = parse_decode(dec["decode"].iloc[j]) if j is not None else []
        n = sum(chunks) + len(dctx)
        if n > n_max:
            continue
        attn = (pre["time_ms"].iloc[i] if i is not None else 0.0) + (dec["time_ms"].iloc[j] if j is not None else 0.0)
        t_ms = layers * (at(other, n) + attn) + at(emb, n)
        out.append((BatchShape(chunks, ctx, dctx), t_ms * 1e-3))
    return out


def refuse_eager(table, allow_eager: bool = False):
    """Operator rows timed eager on a GPU measure PyTorch's dispatch as much as the kernels (1.3-5x an engine at small
    batches): a model fitted on them models eager PyTorch. Refused unless asked for."""
    if allow_eager or "timing" not in table:
        return
    fitted = ~table["op"].isin(VALIDATION_OPS + CHECK_OPS)
    eager = fitted & (table["timing"] == "eager")
    if eager.any():
        files = sorted(set(table.loc[eager, "source"])) if "source" in table else []
        raise UserError(f"{', '.join(files) or 'profile'}: {int(eager.sum())} operator rows were timed eager (one "
                        f"Python call each, launch and dispatch included), so a fit would model eager PyTorch, not an "
                        f"engine; profile again with CUDA-graph timing (servesim profile, the default) or pass "
                        f"--allow-eager")


def calibrate(paths, model, gpu, kind: str, tp: int | None = None, test_frac: float = 0.25, seed: int = 0,
              stat: str = "median", extrapolate_above: int = 1024, allow_eager: bool = False):
    """Read profiles; fit `kind` on contiguous-block training data and on data up to `extrapolate_above` tokens
    and measure each on what it did not see; then refit on all rows for the shipped coefficients.
    Returns (cost model, held-out errors by contiguous blocks, held-out errors above the extrapolation limit)."""
    from costmodels.profile_data import read_profiles
    table = read_profiles(paths, tp=tp, stat=stat)
    refuse_eager(table, allow_eager)
    fit_tp = tp or 1
    train, test = split_contiguous(table, test_frac, seed)
    errs = heldout_errors(fit(kind, train, model, gpu, fit_tp), test, reference=table, seed=seed)
    tr_x, te_x = split_extrapolation(table, extrapolate_above)
    errs_x = (heldout_errors(fit(kind, tr_x, model, gpu, fit_tp), te_x, reference=table, seed=seed)
              if len(te_x) and len(tr_x) else pd.DataFrame())
    cm = fit(kind, table, model, gpu, fit_tp)
    meta = table.attrs.get("meta", {})
    cm.provenance = {
        **(cm.provenance or {}),
        "sources": sorted({Path(p).name for p in paths}), "files": sorted(set(table["source"])) if "source" in table else [],
        "rows": int(len(table)), "tp": sorted(int(t) for t in table["tp"].unique()), "stat": stat,
        "fitted_by": f"servesim calibrate --kind {kind} (costmodels.calibrate)", "date": _dt.date.today().isoformat(),
        "heldout": {"split": f"contiguous blocks, test_frac={test_frac}, seed={seed}",
                    "mape_pct": {r["what"]: round(r["mape_pct"], 2) for _, r in errs.iterrows()},
                    f"extrapolation above {extrapolate_above} tokens":
                        {r["what"]: round(r["mape_pct"], 2) for _, r in errs_x.iterrows()} if len(errs_x) else {}},
        **({"profile_meta": meta} if meta else {}),
    }
    return cm, errs, errs_x


def format_errors(errs) -> str:
    w = max(len(str(s)) for s in errs["what"]) if len(errs) else 10
    lines = [f"  {'operator / whole':<{w}}  {'n':>5}  {'MAPE%':>7}  {'p90%':>7}  {'max%':>7}  {'bias%':>7}"]
    for _, r in errs.iterrows():
        lines.append(f"  {r['what']:<{w}}  {r['n']:>5}  {r['mape_pct']:>7.2f}  {r['p90_ape_pct']:>7.2f}  "
                     f"{r['max_ape_pct']:>7.2f}  {r['bias_pct']:>7.2f}")
    return "\n".join(lines)
