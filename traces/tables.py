"""Read CSV/JSONL request files into a tidy table, checking every row and naming file:line for each bad one."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from sim.paths import resolve_user_path, shared_data_dir

MAX_TIME_S = 1e11
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "datetime": None}


def open_user_file(path, where: str, hint: str = "") -> Path:
    """Resolve a scenario path (cwd first, then the repo root) or fail with one line saying where to get it."""
    if path is None:
        raise UserError(f"{where}.path: missing; give the trace file to read")
    p = resolve_user_path(path)
    if not p.is_file():
        p = _in_shared_data(path) or p
    if p.is_dir():
        raise UserError(f"{where}.path: {path} is a directory; give a trace file (csv or jsonl)")
    if not p.is_file():
        raise UserError(f"{where}.path: {path} does not exist{'; ' + hint if hint else ''}")
    check_text_file(p)
    return p


def check_text_file(p: Path) -> None:
    """One line for a trace that cannot be text: empty, gzip-compressed, or not UTF-8 (judged on its start; a bad
    byte further on is reported by the reader with its line)."""
    with open(p, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise UserError(f"{p}: is empty; a trace needs a header and at least one request")
    if head[:2] == b"\x1f\x8b":
        raise UserError(f"{p}: is gzip-compressed; decompress it first (gunzip {p.name})")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < 1 << 16 or e.start < len(head) - 4:   # not a multi-byte character cut by the window
            line = head[:e.start].count(b"\n") + 1
            raise UserError(f"{p}:{line}: is not UTF-8 text (byte {e.start}); save the trace as UTF-8") from None


def _in_shared_data(path) -> Path | None:
    """`.../shared/data/X` also resolves inside the reference data folder wherever it lives
    ($SERVESIM_SHARED_DATA, or beside a checkout that is not the main one, e.g. a git worktree)."""
    parts = Path(path).parts
    base = shared_data_dir()
    for i in range(len(parts) - 1):
        if parts[i:i + 2] == ("shared", "data") and base is not None:
            q = base.joinpath(*parts[i + 2:])
            return q if q.is_file() else None
    return None


def read_raw(path: Path, fmt: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The file as strings-or-values, plus the 1-based file line of each row (for error messages)."""
    if fmt == "csv":
        try:
            # Let the C parser type clean numeric columns (fast path); anything odd stays text and is
            # diagnosed row by row below. keep_default_na=False: an empty cell is an error, not a NaN.
            df = pd.read_csv(path, skipinitialspace=True, keep_default_na=False, low_memory=False)
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: is not UTF-8 text ({e.reason} at byte {e.start}); save the trace as UTF-8") \
                from None
        except pd.errors.EmptyDataError:
            raise UserError(f"{path}: is empty; a trace needs a header and at least one request") from None
        except pd.errors.ParserError as e:
            m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
            if m:
                raise UserError(f"{path}:{m.group(2)}: {m.group(3)} fields, but the header has {m.group(1)} "
                                f"columns") from None
            raise UserError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
        header, first = _first_rows(path)
        if len(first) > len(header):
            # every row has more fields than the header (pandas raises when only some have): pandas would quietly
            # turn the first ones into an index
            raise UserError(f"{path}:2: {len(first)} fields, but the header has {len(header)} columns "
                            f"(a trailing comma, or a column without a name?)")
        df.columns = [str(c).strip() for c in df.columns]
        return df, _data_lines(path, len(df))
    if fmt == "jsonl":
        rows, lines = [], []
        with open(path, encoding="utf-8") as f:
            for lineno, text in _utf8_lines(path, f):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise UserError(f"{path}:{lineno}: expected a JSON object per line")
                rows.append(obj)
                lines.append(lineno)
        return pd.DataFrame(rows), np.asarray(lines, dtype=np.int64)
    raise UserError(f"{path}: unknown file format {fmt!r}; allowed: csv, jsonl")


def _first_rows(path: Path) -> tuple[list, list]:
    """The header's fields and the first data row's, as the csv module splits them."""
    import csv
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(line for line in f if line.strip())
        header = next(rows, [])
        return header, next(rows, [])


def _utf8_lines(path: Path, f):
    lineno = 0
    try:
        for lineno, text in enumerate(f, 1):
            yield lineno, text
    except UnicodeDecodeError:
        raise UserError(f"{path}:{lineno + 1}: is not UTF-8 text; save the trace as UTF-8") from None


def _data_lines(path: Path, n: int) -> np.ndarray:
    """The 1-based file line of each of the n data rows: the reader skips blank lines, so count them back in."""
    data = path.read_bytes()
    if b"\n\n" not in data and b"\n\r\n" not in data:
        return np.arange(n) + 2                 # line 1 is the header
    nonblank = [i + 1 for i, line in enumerate(data.split(b"\n")) if line.strip(b"\r")]
    lines = np.asarray(nonblank[1:], dtype=np.int64)
    return lines[:n] if len(lines) >= n else np.arange(n) + 2   # quoted multi-line cells: fall back to row order


class RowChecker:
    """Collects bad rows; raises on the first one, or drops them when the user asked to skip and reports the count."""

    def __init__(self, path: Path, lines: np.ndarray, skip_bad_rows: bool):
        self.path, self.lines, self.skip = path, lines, skip_bad_rows
        self.bad = np.zeros(len(lines), dtype=bool)
        self.reasons: dict[str, int] = {}

    def flag(self, mask: np.ndarray, problem: str, reason_of) -> None:
        """`problem` names the kind (for the skip count); `reason_of(i)` words row i's problem in full."""
        mask = np.asarray(mask, dtype=bool) & ~self.bad
        idx = np.flatnonzero(mask)
        if not len(idx):
            return
        if not self.skip:
            i = int(idx[0])
            raise UserError(f"{self.path}:{int(self.lines[i])}: {reason_of(i)} "
                            f"(set skip_bad_rows: true to drop such rows)")
        self.reasons[problem] = self.reasons.get(problem, 0) + len(idx)
        self.bad |= mask

    def report(self, out=None) -> int:
        n = int(self.bad.sum())
        if n:
            detail = "; ".join(f"{k}: {v}" for k, v in self.reasons.items())
            print(f"servesim: skipped {n} malformed row(s) of {self.path} ({detail})", file=out or sys.stderr)
        return n


class _Cells:
    """A column's cells as the file wrote them, looked up only when a message needs one."""

    def __init__(self, col: pd.Series):
        self.col = col

    def __getitem__(self, i) -> str:
        v = self.col.iloc[i]
        return str(v.item() if hasattr(v, "item") else v)


def numeric_column(raw: pd.Series, name: str, checker: RowChecker, integer: bool, minimum: float) -> np.ndarray:
    """Parse a column as numbers; flag non-numeric, non-integer and below-minimum values."""
    text = _Cells(raw)
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        vals = raw.to_numpy(dtype=float)
        checker.flag(np.isnan(vals), f"{name} missing", lambda i: f"column {name!r} is missing")
    else:
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        missing = (raw.isna() | (raw.astype(str).str.strip() == "")).to_numpy()
        checker.flag(missing, f"{name} missing", lambda i: f"column {name!r} is missing")
    checker.flag(np.isnan(vals), f"{name} not a number",
                 lambda i: f"column {name!r} = {text[i]!r} is not a number")
    checker.flag(np.isinf(vals), f"{name} not finite",
                 lambda i: f"column {name!r} = {text[i]!r} is not a finite number")
    if integer:
        checker.flag(~np.isnan(vals) & (vals != np.round(vals)), f"{name} not an integer",
                     lambda i: f"column {name!r} = {text[i]!r} is not an integer")
    checker.flag(~np.isnan(vals) & (vals < minimum), f"{name} below {minimum:g}",
                 lambda i: f"column {name!r} = {text[i]!r} is below the minimum {minimum:g}")
    return vals


def time_column(raw: pd.Series, name: str, unit: str, checker: RowChecker, sort: bool = False) -> np.ndarray:
    """Seconds (absolute); datetimes may mix formats (Azure 2024 mixes fractional and whole seconds).
    Rows earlier than a previous row are bad unless the user asked to `sort` the trace by time."""
    if unit not in TIME_UNITS:
        raise UserError(f"time_unit: {unit!r} unknown; allowed: {', '.join(TIME_UNITS)}")
    text = _Cells(raw)
    if unit == "datetime":
        ts = pd.to_datetime(raw.astype(str), format="ISO8601", utc=True, errors="coerce")
        if ts.isna().any():  # trailing blanks are harmless; strip only when needed (it is slow)
            ts = pd.to_datetime(raw.astype(str).str.strip(), format="ISO8601", utc=True, errors="coerce")
        bad = ts.isna().to_numpy()
        checker.flag(bad, f"{name} not a timestamp",
                     lambda i: f"column {name!r} = {text[i]!r} is not a timestamp")
        ns = ts.to_numpy(dtype="datetime64[ns]").astype("int64").astype(float)
        secs = np.where(bad, np.nan, ns * 1e-9)
    else:
        secs = numeric_column(raw, name, checker, integer=False, minimum=0.0) * TIME_UNITS[unit]
    # beyond ~3,000 years: a wrong time_unit or a corrupt cell, and float seconds lose the resolution anyway
    checker.flag(~np.isnan(secs) & (secs > MAX_TIME_S), f"{name} out of range",
                 lambda i: f"column {name!r} = {text[i]!r} is more than {MAX_TIME_S:.0e} s "
                 f"(time_unit is {unit!r}; allowed: {', '.join(TIME_UNITS)})")
    if sort:
        return secs
    # Backwards timestamps are a data error, not something to sort away silently.
    good = ~np.isnan(secs) & ~checker.bad
    running_max = np.fmax.accumulate(np.where(good, secs, -np.inf))
    prev_max = np.concatenate(([-np.inf], running_max[:-1]))
    checker.flag(good & (secs < prev_max), f"{name} going backwards",
                 lambda i: f"column {name!r} = {text[i]!r} goes backwards in time "
                 f"(earlier than a previous row; sort: true orders the trace by time)")
    return secs


def tidy_table(raw: pd.DataFrame, lines: np.ndarray, path: Path, mapping: dict, *, time_unit: str = "s",
               skip_bad_rows: bool = False, sort: bool = False,
               optional=("cls", "session", "prefix_hashes", "prefix", "predicted_output_tokens")) -> pd.DataFrame:
    """Map source columns to arrival_s / prompt_tokens / output_tokens (+ optional ones) and validate every row.

    `mapping` is {tidy name: source column}; arrival_s may be absent (None), then every arrival is 0."""
    for tidy in ("prompt_tokens", "output_tokens", "arrival_s"):
        col = mapping.get(tidy)
        if col is not None and col not in raw.columns:
            raise UserError(f"{path}: missing column {col!r} (needed for {tidy}); "
                            f"the file has: {', '.join(map(str, raw.columns))}")
    checker = RowChecker(path, lines, skip_bad_rows)
    out = {}
    if mapping.get("arrival_s") is not None:
        out["arrival_s"] = time_column(raw[mapping["arrival_s"]], mapping["arrival_s"], time_unit, checker, sort)
    else:
        out["arrival_s"] = np.zeros(len(raw))
    for tidy in ("prompt_tokens", "output_tokens"):
        out[tidy] = numeric_column(raw[mapping[tidy]], mapping[tidy], checker, integer=True, minimum=1)
    for tidy in optional:
        col = mapping.get(tidy)
        if col is not None:
            if col not in raw.columns:
                raise UserError(f"{path}: missing column {col!r} (mapped to {tidy})")
            out[tidy] = raw[col].to_numpy()
    checker.report()
    keep = ~checker.bad
    df = pd.DataFrame({k: v[keep] for k, v in out.items()})
    if not len(df):
        raise UserError(f"{path}: no usable rows")
    if sort:
        df = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    df["arrival_s"] = df["arrival_s"] - df["arrival_s"].iloc[0]
    for c in ("prompt_tokens", "output_tokens"):
        df[c] = df[c].astype(np.int64)
    return df.reset_index(drop=True)
