"""Fit any cost-model kind to kernel-timing tables and measure it on held-out configurations."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.base import BatchShape
from costmodels.errors import UserError
from costmodels.operators import CLASSES, LAYER_OPS, OP_CLASS, Shard, decode_attn_work, dense_work, prefill_attn_work
from costmodels.profile_data import config_key, parse_decode, parse_prefill, row_shape

KINDS = ("linear", "roofline", "profiled")
GROUPS = ("other", "attn_prefill", "attn_decode", "emb")


# -- splitting --------------------------------------------------------------------------------------------
def split_by_config(table: pd.DataFrame, test_frac: float = 0.25, seed: int = 0):
    """Random split of distinct configurations (all ops at one token count move together), fixed seed."""
    keys = table.apply(config_key, axis=1)
    uniq = np.unique(keys)
    rng = np.random.default_rng(seed)
    test = set(rng.choice(uniq, size=max(1, int(round(len(uniq) * test_frac))), replace=False).tolist())
    te = keys.isin(test).to_numpy()
    layer_rows = (table["op"] == "layer_forward").to_numpy()
    # Whole-layer forwards are validation only: never fitted, always in the held-out set.
    return table[~te & ~layer_rows].reset_index(drop=True), table[te | layer_rows].reset_index(drop=True)


# -- fitting each kind ------------------------------------------------------------------------------------
def fit(kind: str, table: pd.DataFrame, model, gpu, tp: int = 1):
    if kind not in KINDS:
        raise UserError(f"--kind: {kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    fit_rows = table[table["op"] != "layer_forward"]
    if kind == "profiled":
        from costmodels.profiled import ProfiledCostModel
        return ProfiledCostModel.fit(fit_rows, layers=model.layers, model=model, gpu=gpu, tp=tp)
    if kind == "linear":
        return fit_linear(fit_rows, model, gpu, tp)
    return fit_roofline(fit_rows, model, gpu, tp)


def _need(table, ops, kind):
    missing = [op for op in ops if op not in set(table["op"])]
    if missing:
        raise UserError(f"profile: fitting a {kind} model needs rows for op(s) {', '.join(missing)}")


def fit_linear(table, model, gpu, tp=1):
    """InferMax features on the harness table: the same terms and NNLS on relative error as
    LinearCostModel.fit_vidur, from any profile format."""
    from costmodels.linear import LinearCostModel, _nnls_rel
    _need(table, LAYER_OPS + ("attn_prefill", "attn_decode"), "linear")
    other = other_sum(table)
    n = other.index.to_numpy(float)
    a_o, b_o = _nnls_rel(np.c_[n, np.ones_like(n)], other.to_numpy(float))
    step_a = step_b = 0.0
    emb = table[table["op"] == "emb"]
    if len(emb):
        ne = emb["num_tokens"].to_numpy(float)
        step_a, step_b = _nnls_rel(np.c_[ne, np.ones_like(ne)], emb["time_ms"].to_numpy(float))
    pre = table[table["op"] == "attn_prefill"]
    P = np.array([_prefill_feats(s) for s in pre["prefill"]])
    a_p, a_pk, a_pr, s_p, b_p = _nnls_rel(P, pre["time_ms"].to_numpy(float))
    dec = table[table["op"] == "attn_decode"]
    D = np.array([[sum(m), len(m), 1.0] for m in map(parse_decode, dec["decode"])])
    a_d, s_d, b_d = _nnls_rel(D, dec["time_ms"].to_numpy(float))
    coeffs = dict(a_o=a_o, b_o=b_o, a_p=a_p, a_pk=a_pk, a_pr=a_pr, s_p=s_p, b_p=b_p, a_d=a_d, s_d=s_d, b_d=b_d,
                  step_a=step_a, step_b=step_b)
    return LinearCostModel(coeffs, layers=model.layers, model=model, gpu=gpu, tp=tp)


def other_sum(table) -> pd.Series:
    """Σ of the non-attention layer ops per token count (ms), only where every op was timed; repeated
    timings of one op at one token count are averaged first, not added."""
    dense = table[table["op"].isin(LAYER_OPS)].groupby(["num_tokens", "op"])["time_ms"].mean().unstack("op")
    return dense.dropna().sum(axis=1) if set(LAYER_OPS) <= set(dense.columns) else pd.Series(dtype=float)


def _prefill_feats(s):
    c, k = (np.asarray(v, dtype=float) for v in parse_prefill(s))
    return [np.sum(c * c), np.sum(c * k), np.sum(k), len(c), 1.0]


def fit_roofline(table, model, gpu, tp=1):
    """Fit the roofline's efficiencies and launch overhead to per-operator times (least squares on log
    ratio). `emb` is left out: profiled embedding kernels are not shaped like a roofline."""
    from scipy.optimize import least_squares
    from costmodels.roofline import DEFAULT_COMPUTE_EFF, DEFAULT_MEMORY_EFF, RooflineCostModel
    rows = table[table["op"].isin(LAYER_OPS + ("attn_prefill", "attn_decode"))]
    if rows.empty:
        raise UserError("profile: fitting a roofline model needs per-operator rows")
    F, B, cls = _work_arrays(rows, Shard.of(model, tp))
    y = rows["time_ms"].to_numpy(float) * 1e-3
    ci = np.array([CLASSES.index(c) for c in cls])
    ec0 = np.array([DEFAULT_COMPUTE_EFF[c] for c in CLASSES])
    em0 = np.array([DEFAULT_MEMORY_EFF[c] for c in CLASSES])
    # Only the roof each class can physically hit is fitted: elementwise kernels and decode attention are
    # bandwidth-bound, so their compute efficiencies stay at the defaults (free, they fit noise).
    fc = [CLASSES.index(c) for c in ("gemm", "attn_prefill")]
    k = len(CLASSES)

    def effs(theta):
        ec, em = ec0.copy(), np.exp(theta[len(fc):len(fc) + k])
        ec[fc] = np.exp(theta[:len(fc)])
        return ec, em, theta[-1]

    def pred(theta):
        ec, em, launch = effs(theta)
        return np.maximum(F / (gpu.peak_flops * ec[ci]), B / (gpu.hbm_bytes_per_s * em[ci])) + launch

    x0 = np.r_[np.log(ec0[fc]), np.log(em0), 4e-6]
    nfree = len(fc) + k
    lo = np.r_[np.full(nfree, np.log(1e-6)), 0.0]    # low bound so CPU profiles against GPU datasheets still fit
    hi = np.r_[np.zeros(nfree), 1e-2]
    res = least_squares(lambda th: np.log(pred(th) / y), x0, bounds=(lo, hi), x_scale=np.r_[np.ones(nfree), 1e-6])
    ec, em, launch = effs(res.x)
    return RooflineCostModel(model, gpu, tp=tp, compute_eff=dict(zip(CLASSES, ec)), memory_eff=dict(zip(CLASSES, em)),
                             launch_s=float(launch))


def _work_arrays(rows, shard):
    F, B, cls = np.zeros(len(rows)), np.zeros(len(rows)), []
    for i, (op, n, pf, dc) in enumerate(zip(rows["op"], rows["num_tokens"], rows["prefill"], rows["decode"])):
        if op == "attn_prefill":
            F[i], B[i] = prefill_attn_work(shard, *parse_prefill(pf))
        elif op == "attn_decode":
            F[i], B[i] = decode_attn_work(shard, parse_decode(dc))
        else:
            F[i], B[i] = dense_work(shard, op, n)
        cls.append(OP_CLASS[op])
    return F, B, cls


# -- predictions by operator group ------------------------------------------------------------------------
def predict_groups(cm, shape: BatchShape) -> dict:
    """Seconds per layer for 'other' (all non-attention layer ops), 'attn_prefill', 'attn_decode'; 'emb' per
    iteration. The common ground on which every kind is compared with measurements."""
    if cm.kind == "linear":
        k, L = cm.coefficients, 1e-3
        pt, pc, dc = shape.prefill_tokens, shape.prefill_context, shape.decode_context
        n = sum(pt) + len(dc)
        pre = (k["a_p"] * sum(c * c for c in pt) + k["a_pk"] * sum(c * x for c, x in zip(pt, pc)) + k["a_pr"] * sum(pc)
               + k["s_p"] * len(pt) + k["b_p"]) if pt else 0.0
        dec = (k["a_d"] * sum(dc) + k["s_d"] * len(dc) + k["b_d"]) if dc else 0.0
        return {"other": (k["a_o"] * n + k["b_o"]) * L, "attn_prefill": pre * L, "attn_decode": dec * L,
                "emb": (k["step_a"] * n + k["step_b"]) * L}
    t = cm.op_times(shape)
    return {"other": sum(t[op] for op in LAYER_OPS), "attn_prefill": t["attn_prefill"],
            "attn_decode": t["attn_decode"], "emb": t.get("emb", 0.0)}


def predict_op(cm, row) -> float | None:
    """Seconds the model gives the operator a profile row timed; None where the kind has no such operator."""
    shape = row_shape(row)
    if row["op"] == "layer_forward":
        g = predict_groups(cm, shape)
        return g["other"] + g["attn_prefill"] + g["attn_decode"]
    if cm.kind == "linear":
        return predict_groups(cm, shape)[row["op"]] if row["op"] in GROUPS[1:] else None
    return cm.op_times(shape).get(row["op"])


# -- held-out errors --------------------------------------------------------------------------------------
def _err_row(name, y, p):
    ape = np.abs(np.asarray(p) - np.asarray(y)) / np.asarray(y)
    return {"what": name, "n": int(len(ape)), "mape_pct": 100 * float(np.mean(ape)),
            "p90_ape_pct": 100 * float(np.quantile(ape, 0.9)), "max_ape_pct": 100 * float(np.max(ape)),
            "bias_pct": 100 * float(np.median(np.asarray(p) / np.asarray(y) - 1))}


def heldout_errors(cm, test: pd.DataFrame, reference: pd.DataFrame | None = None, n_mixed: int = 300, seed: int = 0):
    """Per-operator errors, per-group errors ('other' = Σ non-attention ops at one token count), and whole
    iterations: measured layer_forward rows if the profile has them, else a grid of mixed batches composed
    from held-out attention rows plus the measured non-attention ops at the batch's token count."""
    rows = []
    for op, g in test[test["op"] != "layer_forward"].groupby("op", sort=False):
        pairs = [(y, predict_op(cm, r)) for y, (_, r) in zip(g["time_ms"] * 1e-3, g.iterrows())]
        pairs = [(y, p) for y, p in pairs if p is not None]
        if pairs:
            rows.append(_err_row(op, *zip(*pairs)))
    other = other_sum(test) * 1e-3
    if len(other):
        pred = [predict_groups(cm, BatchShape([int(n)], [0]))["other"] for n in other.index]
        rows.append(_err_row("other (sum of non-attention ops)", other.to_numpy(), pred))
    lf = test[test["op"] == "layer_forward"]
    if len(lf):
        rows.append(_err_row("layer_forward (measured mixed batches)", lf["time_ms"].to_numpy() * 1e-3,
                             [predict_op(cm, r) for _, r in lf.iterrows()]))
    grid = mixed_iteration_grid(test, reference if reference is not None else test, cm.layers if hasattr(cm, "layers") else 32,
                                n_mixed, seed)
    if grid:
        rows.append(_err_row("iteration (mixed-batch grid)", [g[1] for g in grid],
                             [_iteration(cm, s) for s, _ in grid]))
    return pd.DataFrame(rows)


def _iteration(cm, shape):
    g = predict_groups(cm, shape)
    return cm.layers * (g["other"] + g["attn_prefill"] + g["attn_decode"]) + g["emb"]


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


def calibrate(paths, model, gpu, kind: str, tp: int = 1, test_frac: float = 0.25, seed: int = 0, stat: str = "median"):
    """Read profiles, fit `kind` on a random configuration split, measure held-out error, then refit on all
    rows for the shipped coefficients. Returns (cost model, held-out error table)."""
    from costmodels.profile_data import read_profiles
    table = read_profiles(paths, tp=tp, stat=stat)
    train, test = split_by_config(table, test_frac, seed)
    errs = heldout_errors(fit(kind, train, model, gpu, tp), test, reference=table, seed=seed)
    cm = fit(kind, table, model, gpu, tp)
    meta = table.attrs.get("meta", {})
    cm.provenance = {
        "sources": sorted({Path(p).name for p in paths}), "files": sorted(set(table["source"])) if "source" in table else [],
        "rows": int(len(table)), "tp": tp, "stat": stat,
        "fitted_by": f"servesim calibrate --kind {kind} (costmodels.calibrate)", "date": _dt.date.today().isoformat(),
        "heldout": {"split": f"random by configuration, test_frac={test_frac}, seed={seed}",
                    "mape_pct": {r["what"]: round(r["mape_pct"], 2) for _, r in errs.iterrows()}},
        **({"profile_meta": meta} if meta else {}),
    }
    return cm, errs
