"""Length generators: fixed, uniform, normal, lognormal, Zipf, empirical resampling, and InferMax's S/L mixes."""
from __future__ import annotations

import numpy as np

from costmodels.errors import UserError

# InferMax §4.7 / A.3: short sizes S and long sizes L; a type names (input class, output class).
INFERMAX_S, INFERMAX_L = (8, 16), (512, 1024)
INFERMAX_TYPES = ("SISO", "SILO", "LISO", "LILO")


def _num(spec, key, where, default=None, positive=False):
    if key not in spec and default is None:
        raise UserError(f"{where}: missing {key!r}")
    v = spec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{where}.{key}: expected a number, got {v!r}")
    if positive and not v > 0:
        raise UserError(f"{where}.{key}: must be > 0, got {v!r}")
    return float(v)


def _bounded(x, spec, where):
    """Round to whole tokens and clip to [min, max] (min defaults to 1: every request has ≥ 1 token)."""
    lo = int(_num(spec, "min", where, 1))
    hi = spec.get("max")
    if lo < 1:
        raise UserError(f"{where}.min: must be >= 1, got {lo}")
    x = np.maximum(np.rint(x), lo)
    if hi is not None:
        if hi < lo:
            raise UserError(f"{where}: max={hi} < min={lo}")
        x = np.minimum(x, int(hi))
    return x.astype(np.int64)


def _fixed(spec, n, rng, where):
    return np.full(n, int(_num(spec, "value", where, positive=True)), dtype=np.int64)


def _uniform(spec, n, rng, where):
    lo, hi = int(_num(spec, "low", where)), int(_num(spec, "high", where))
    if lo > hi or lo < 1:
        raise UserError(f"{where}: uniform needs 1 <= low <= high, got low={lo} high={hi}")
    return rng.integers(lo, hi + 1, size=n)


def _normal(spec, n, rng, where):
    return _bounded(rng.normal(_num(spec, "mean", where), _num(spec, "std", where, positive=True), n), spec, where)


def _lognormal(spec, n, rng, where):
    """Either (mu, sigma) of log-length, or the (mean, std) of the lengths themselves."""
    if "mu" in spec or "sigma" in spec:
        mu, sigma = _num(spec, "mu", where), _num(spec, "sigma", where, positive=True)
    else:
        m, s = _num(spec, "mean", where, positive=True), _num(spec, "std", where, positive=True)
        sigma = float(np.sqrt(np.log1p((s / m) ** 2)))
        mu = float(np.log(m) - sigma ** 2 / 2)
    return _bounded(rng.lognormal(mu, sigma, n), spec, where)


def _zipf(spec, n, rng, where):
    """P(k) ∝ k^-a on low..high (bounded, so any a > 0 works; numpy's unbounded zipf needs a > 1)."""
    a = _num(spec, "a", where, positive=True)
    lo, hi = int(_num(spec, "low", where, 1)), int(_num(spec, "high", where))
    if lo < 1 or lo > hi:
        raise UserError(f"{where}: zipf needs 1 <= low <= high, got low={lo} high={hi}")
    k = np.arange(lo, hi + 1, dtype=float)
    p = k ** -a
    return rng.choice(np.arange(lo, hi + 1), size=n, p=p / p.sum())


def _empirical(spec, n, rng, where):
    """Resample (with replacement) from `values`, or from a column of a loaded trace."""
    if "values" in spec:
        vals = np.asarray(spec["values"])
        if vals.ndim != 1 or not len(vals) or not np.issubdtype(vals.dtype, np.number) or (vals < 1).any():
            raise UserError(f"{where}.values: expected a non-empty list of integers >= 1")
    else:
        from traces.loaders import load_trace
        trace = dict(spec.get("trace") or {})
        col = spec.get("column")
        if col not in ("prompt_tokens", "output_tokens"):
            raise UserError(f"{where}.column: must be prompt_tokens or output_tokens, got {col!r}")
        vals = load_trace(where=f"{where}.trace", **trace)[col].to_numpy()
    return rng.choice(vals.astype(np.int64), size=n, replace=True)


def _choice(spec, n, rng, where):
    """Pick uniformly (or with `weights`) from a list of sizes, e.g. InferMax's S = {8, 16}."""
    vals = np.asarray(spec.get("values") or [], dtype=np.int64)
    if not len(vals) or (vals < 1).any():
        raise UserError(f"{where}.values: expected a non-empty list of integers >= 1")
    w = spec.get("weights")
    p = None if w is None else np.asarray(w, float) / np.sum(w)
    return rng.choice(vals, size=n, p=p)


DISTS = {"fixed": (_fixed, ("value",)), "uniform": (_uniform, ("low", "high")),
         "normal": (_normal, ("mean", "std", "min", "max")),
         "lognormal": (_lognormal, ("mu", "sigma", "mean", "std", "min", "max")),
         "zipf": (_zipf, ("a", "low", "high")), "empirical": (_empirical, ("values", "trace", "column")),
         "choice": (_choice, ("values", "weights"))}


def draw_lengths(spec, n: int, rng: np.random.Generator, where: str) -> np.ndarray:
    """A length spec is an int (fixed) or {dist: NAME, ...knobs}; returns n integers >= 1."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return np.full(n, int(spec), dtype=np.int64)
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected an integer or a mapping with 'dist', got {spec!r}")
    spec = dict(spec)
    dist = spec.pop("dist", "fixed")
    if dist not in DISTS:
        raise UserError(f"{where}.dist: unknown length distribution {dist!r}; allowed: {', '.join(DISTS)}")
    fn, keys = DISTS[dist]
    bad = set(spec) - set(keys)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for dist {dist}; "
                        f"allowed: dist, {', '.join(keys)}")
    return np.asarray(fn(spec, n, rng, where), dtype=np.int64)


def infermax_mix(types, n: int, rng: np.random.Generator, where: str, weights=None,
                 short=INFERMAX_S, long=INFERMAX_L):
    """InferMax heterogeneous workloads: n requests split over `types` (e.g. LILO+SILO), each size drawn from
    S or L, randomly shuffled. Returns (prompt, output, type label)."""
    types = [types] if isinstance(types, str) else list(types or [])
    bad = [t for t in types if t not in INFERMAX_TYPES]
    if not types or bad:
        raise UserError(f"{where}.types: expected a list of {', '.join(INFERMAX_TYPES)}, got {types!r}")
    w = np.ones(len(types)) if weights is None else np.asarray(weights, float)
    if len(w) != len(types) or (w < 0).any() or w.sum() <= 0:
        raise UserError(f"{where}.weights: need one non-negative weight per type ({len(types)})")
    # Exact counts per type (largest remainder), then shuffle: the mix ratio is what the user asked, not a draw.
    quota = w / w.sum() * n
    counts = np.floor(quota).astype(int)
    counts[np.argsort(counts - quota, kind="stable")[: n - counts.sum()]] += 1  # ties: earlier type first
    labels = np.repeat(np.asarray(types), counts)
    rng.shuffle(labels)
    sizes = {"S": np.asarray(short, np.int64), "L": np.asarray(long, np.int64)}
    prompt = np.empty(n, np.int64)
    output = np.empty(n, np.int64)
    for t in types:
        m = labels == t
        prompt[m] = rng.choice(sizes[t[0]], size=int(m.sum()))
        output[m] = rng.choice(sizes[t[2]], size=int(m.sum()))
    return prompt, output, labels
