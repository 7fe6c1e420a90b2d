"""Tensor-parallel collectives: all-reduce time by interconnect and GPU count, from fitted latency–bandwidth lines.

NCCL picks a protocol per message size (low-latency for small messages, the bandwidth-optimal one for large), so
its time is the faster of two lines, t(s) = min(a1 + s/b1, a2 + s/b2) for s bytes. The lines are fitted per node
kind and GPU count to Vidur's measured NCCL all-reduce times (../shared/data/profiles/vidur-network: A100 and
H100, NVSwitch "dgx" nodes and pairwise NVLink; single-node rows only) and shipped in profiles/collectives.yaml.

vLLM does not use NCCL for small all-reduces on NVLink: its custom one-shot/two-shot kernel runs them (up to
8 MB). Its times on H100 (tp 2/4/8, 512 B to 1 MB, without CUDA graphs) are public (sgl-project/sglang PR 2904,
"vllm" rows); one line per GPU count is fitted to them (`custom` in the same file). On Hopper NVLink nodes a message
up to 1 MB (the data's range) takes the faster of that line and NCCL's, which keeps time monotone in size; above
1 MB, and on other nodes, NCCL's lines apply. A GPU with no fitted node kind gets a
ring over its link from the datasheet (latency 20 µs, 70% of the link's bandwidth)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml
from costmodels.yamlfile import read_yaml

from costmodels.errors import UserError

FIT_PATH = Path(__file__).resolve().parent.parent / "profiles" / "collectives.yaml"
CUSTOM_MAX_BYTES = 1024 ** 2              # default reach of the custom all-reduce line (its data: up to 1 MB)
# vLLM's own limit for its custom all-reduce on Hopper (all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"], v0.11+):
# above it the engine hands the message to NCCL
VLLM_CUSTOM_MAX_BYTES_HOPPER = {2: 64 * 1024 ** 2, 4: 32 * 1024 ** 2, 6: 512 * 1024, 8: 256 * 1024}
FIT_RANGE = (1e3, 64e6)                   # message sizes the fits are made and judged on (bytes)

# sgl-project/sglang PR 2904 (2025-01-15), H100, vLLM's custom all-reduce without CUDA graphs: bytes → ms at tp 2/4/8
CUSTOM_AR_H100 = {512: (0.0095, 0.0091, 0.0101), 4096: (0.0088, 0.0085, 0.0093), 32768: (0.0087, 0.0092, 0.0118),
                  262144: (0.0129, 0.0206, 0.0241), 524288: (0.0177, 0.0269, 0.0304),
                  1048576: (0.0266, 0.0402, 0.0450)}


def node_kind(gpu) -> str | None:
    """Which fitted node kind a GPU's tensor-parallel group sits in (None: derive from the datasheet)."""
    return getattr(gpu, "node_kind", None)


@lru_cache(maxsize=1)
def _fits() -> dict:
    if not FIT_PATH.exists():
        return {}
    return read_yaml(FIT_PATH)


def two_line_time(params, nbytes):
    """min(a1 + s/b1, a2 + s/b2), params = [a1, b1, a2, b2] (seconds, bytes/s)."""
    a1, b1, a2, b2 = params
    return np.minimum(a1 + np.asarray(nbytes, float) / b1, a2 + np.asarray(nbytes, float) / b2)


def allreduce_time_s(gpu, nbytes, tp: int, backend: str = "auto", latency_scale: float = 1.0,
                     per_byte_scale: float | None = None):
    """Seconds for one all-reduce of `nbytes` (a number or an array) over `tp` GPUs. backend: auto (vLLM: its
    custom kernel where it runs, NCCL otherwise), nccl, or custom. latency_scale multiplies the custom kernel's
    fixed time (measured without CUDA graphs, whose launch part a graph removes). per_byte_scale, when given,
    multiplies the custom kernel's per-byte time and says the engine runs it in CUDA graphs with registered
    buffers: then it reaches as far as vLLM lets it (VLLM_CUSTOM_MAX_BYTES_HOPPER), not only over its data."""
    scalar = np.ndim(nbytes) == 0
    s = np.asarray(nbytes, dtype=float)
    if tp <= 1:
        out = np.zeros_like(s)
        return float(out) if scalar else out
    fits = _fits()
    kind = node_kind(gpu)
    custom = fits.get("custom", {}).get(kind, {}).get(str(tp)) if kind else None
    if backend == "custom" and custom is None:
        raise UserError(f"costmodel.allreduce: no custom all-reduce data for {gpu.name} at tp={tp}; use nccl or auto")
    nccl = fits.get("nccl", {}).get(kind, {}).get(str(tp)) if kind else None
    if nccl is not None:
        t = two_line_time(nccl, s)
    else:
        link = gpu.nvlink_bytes_per_s or gpu.pcie_bytes_per_s
        t = 20e-6 + 2 * (tp - 1) / tp * s / (0.7 * link)
    if backend in ("auto", "custom") and custom is not None:
        a, b = custom
        reach, k = CUSTOM_MAX_BYTES, 1.0
        if per_byte_scale is not None:
            reach, k = VLLM_CUSTOM_MAX_BYTES_HOPPER.get(tp, CUSTOM_MAX_BYTES), per_byte_scale
        t = np.where(s <= reach, np.minimum(a * latency_scale + k * s / b, t), t)
    t = np.where(s > 0, t, 0.0)
    return float(t) if scalar else t


# -- fitting ------------------------------------------------------------------------------------------------
def read_nccl(folder) -> dict:
    """{(node kind, gpus): (bytes, seconds)} from a vidur-network folder, single-node rows, median times."""
    import pandas as pd
    out = {}
    for sub in sorted(Path(folder).iterdir()):
        f = sub / "all_reduce.csv"
        if not f.exists():
            continue
        d = pd.read_csv(f)
        d = d[d["devices_per_node"] >= d["num_workers"]]
        for n, g in d.groupby("num_workers"):
            s = g["size"].to_numpy(float) * 2.0              # elements of fp16
            y = g["time_stats.all_reduce.median"].to_numpy(float) * 1e-3
            keep = (s >= FIT_RANGE[0]) & (s <= FIT_RANGE[1])
            if keep.any() and n <= 8:
                out[(sub.name, int(n))] = (s[keep], y[keep])
    return out


def fit_two_lines(s, y):
    """Least absolute relative error fit of min(a1 + s/b1, a2 + s/b2), from several starts."""
    from scipy.optimize import least_squares
    best = None
    for start in range(8):
        rng = np.random.default_rng(start)
        p0 = np.r_[np.log(rng.uniform(5e-6, 6e-5, 2)), np.log(rng.uniform(2e10, 8e11, 2))]

        def resid(p):
            a, b = np.exp(p[:2]), np.exp(p[2:])
            return (np.minimum(a[0] + s / b[0], a[1] + s / b[1]) - y) / y
        r = least_squares(resid, p0, loss="soft_l1", f_scale=0.05)
        if best is None or r.cost < best.cost:
            best = r
    a, b = np.exp(best.x[:2]), np.exp(best.x[2:])
    return [float(a[0]), float(b[0]), float(a[1]), float(b[1])]


def fit_custom_h100():
    """One line per GPU count through the published custom all-reduce times (least relative error)."""
    from scipy.optimize import least_squares
    s = np.array(sorted(CUSTOM_AR_H100), dtype=float)
    out = {}
    for i, tp in enumerate((2, 4, 8)):
        y = np.array([CUSTOM_AR_H100[int(v)][i] for v in s]) * 1e-3
        r = least_squares(lambda p: (np.exp(p[0]) + s / np.exp(p[1]) - y) / y, [np.log(8e-6), np.log(4e10)])
        out[str(tp)] = [float(np.exp(r.x[0])), float(np.exp(r.x[1]))]
    return out


def fit_all(folder) -> tuple[dict, dict]:
    """Fitted parameters and their MAPE per (node kind, gpus)."""
    data = read_nccl(folder)
    nccl, errors = {}, {}
    for (kind, n), (s, y) in sorted(data.items()):
        p = fit_two_lines(s, y)
        nccl.setdefault(kind, {})[str(n)] = p
        errors[f"{kind}/{n}"] = round(100 * float(np.mean(np.abs(two_line_time(p, s) - y) / y)), 2)
    custom = {"h100_dgx": fit_custom_h100()}
    return {"nccl": nccl, "custom": custom}, errors


def main(argv=None) -> int:
    """python -m costmodels.collectives FOLDER: fit FOLDER's all-reduce profiles and rewrite the shipped fit."""
    import datetime as _dt
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m costmodels.collectives FOLDER  (Vidur's network profiles: FOLDER/<node kind>/"
              "all_reduce.csv, e.g. ../shared/data/profiles/vidur-network); rewrites profiles/collectives.yaml",
              file=sys.stderr)
        return 2
    folder = Path(argv[0])
    # a folder without profiles used to overwrite the shipped fit with an empty one
    if not folder.is_dir() or not any((sub / "all_reduce.csv").is_file() for sub in folder.iterdir() if sub.is_dir()):
        print(f"collectives: {folder}: no <node kind>/all_reduce.csv under it; nothing written", file=sys.stderr)
        return 2
    params, errs = fit_all(folder)
    if not params["nccl"]:
        print(f"collectives: {folder}: no single-node rows of 2-8 GPUs between 1 KB and 64 MB; nothing written",
              file=sys.stderr)
        return 2
    params["provenance"] = {
        "nccl": "Vidur network profiles (microsoft/vidur, MIT; ../shared/data/profiles/vidur-network): all_reduce.csv "
                "median times, single-node rows, 1 KB-64 MB, fp16 elements x 2 bytes",
        "custom": "sgl-project/sglang PR 2904: vLLM custom all-reduce on H100 without CUDA graphs, 512 B-1 MB",
        "model": "nccl: min of two latency-bandwidth lines; custom: one line. Seconds and bytes/s.",
        "fitted_by": "python -m costmodels.collectives", "date": _dt.date.today().isoformat(),
        "mape_pct_on_fit_data": errs,
    }
    FIT_PATH.write_text(yaml.safe_dump(params, sort_keys=False))
    print(yaml.safe_dump(params, sort_keys=False))
    return 0


if __name__ == "__main__":   # python -m costmodels.collectives ../shared/data/profiles/vidur-network
    raise SystemExit(main())
