"""Loaders for public trace formats (Azure 2023/2024, BurstGPT, Mooncake, Vidur, Splitwise) and generic CSV/JSONL."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from traces.tables import open_user_file, read_raw, tidy_table

AZURE_HINT = ("the public Azure LLM inference traces are at https://github.com/Azure/AzurePublicDataset "
              "(data/AzureLLMInferenceTrace_{code,conv}.csv); point the scenario at your copy with "
              "--set workload.path=FILE")

# name: (file format, {tidy: source column}, time unit, hint)
FORMATS: dict[str, tuple] = {
    # What `servesim trace make` writes (and any tidy table): the column names are the tidy names.
    "servesim": ("csv", {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens",
                         "output_tokens": "output_tokens"}, "s", ""),
    "azure": ("csv", {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens",
                      "output_tokens": "GeneratedTokens"}, "datetime", AZURE_HINT),
    "burstgpt": ("csv", {"arrival_s": "Timestamp", "prompt_tokens": "Request tokens",
                         "output_tokens": "Response tokens"}, "s",
                 "BurstGPT is at https://github.com/HPMLL/BurstGPT (data/BurstGPT_1.csv)"),
    "mooncake": ("jsonl", {"arrival_s": "timestamp", "prompt_tokens": "input_length",
                           "output_tokens": "output_length", "prefix_hashes": "hash_ids"}, "ms",
                 "Mooncake traces are at https://github.com/kvcache-ai/Mooncake (FAST25-release/traces/)"),
    # Vidur's processed traces: arrived_at is optional (length-only traces replay as offline).
    "vidur": ("csv", {"arrival_s": "arrived_at", "prompt_tokens": "num_prefill_tokens",
                      "output_tokens": "num_decode_tokens"}, "s", ""),
    "splitwise": ("csv", {"arrival_s": "arrival_timestamp", "prompt_tokens": "prompt_size",
                          "output_tokens": "token_size"}, "s", ""),
}
GENERIC = ("csv", "jsonl")


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def is_jsonl(path: Path) -> bool:
    """JSON Lines by its suffix, or by its first non-blank line opening a JSON object (whatever the suffix)."""
    if path.suffix in JSONL_SUFFIXES:
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                return line.lstrip().startswith("{")
    return False


def detect_format(path: Path) -> str:
    """Guess the format from the header (CSV) or the first object's keys (JSONL)."""
    if is_jsonl(path):
        raw, _ = read_raw(path, "jsonl")        # an invalid line is named as such, not as a missing column
        cols = set(raw.columns)
    else:
        with open(path, encoding="utf-8", errors="replace") as f:   # open_user_file has checked the text
            cols = {c.strip() for c in f.readline().strip().split(",")}
    for name, (_, mapping, _, _) in FORMATS.items():
        need = {mapping["prompt_tokens"], mapping["output_tokens"]}
        if need <= cols:
            return name
    raise UserError(f"{path}: cannot tell the trace format from its columns ({', '.join(sorted(cols))}); "
                    f"set format to one of {', '.join(list(FORMATS) + list(GENERIC))} "
                    f"(csv/jsonl take a columns mapping)")


def load_trace(path, format: str = "auto", columns: dict | None = None, time_unit: str | None = None,
               skip_bad_rows: bool = False, sort: bool = False, where: str = "workload",
               **filters) -> pd.DataFrame:
    """One tidy table (arrival_s from the first request, prompt_tokens, output_tokens, optional cls/session/...)."""
    hint = FORMATS.get(format, (None, None, None, ""))[3] if format != "auto" else ""
    p = open_user_file(path, where, hint or (AZURE_HINT if "Azure" in str(path) else ""))
    detected = format == "auto"
    if detected:
        format = detect_format(p)
    if format in FORMATS:
        fmt, mapping, unit, _ = FORMATS[format]
        mapping = {**mapping, **(columns or {})}
        if detected and is_jsonl(p):
            fmt = "jsonl"         # a format's columns recognised in a JSON-lines file: read it as one
    elif format in GENERIC:
        fmt, unit = format, "s"
        if not columns or "prompt_tokens" not in columns or "output_tokens" not in columns:
            raise UserError(f"{where}.columns: format {format} needs a mapping with at least prompt_tokens and "
                            f"output_tokens (and arrival_s, cls, session), e.g. {{arrival_s: ts, prompt_tokens: "
                            f"in, output_tokens: out}}")
        mapping = dict(columns)
    else:
        raise UserError(f"{where}.format: unknown trace format {format!r}; allowed: auto, "
                        f"{', '.join(list(FORMATS) + list(GENERIC))}")
    bad = set(mapping) - {"arrival_s", "prompt_tokens", "output_tokens", "cls", "session", "prefix_hashes",
                          "prefix", "predicted_output_tokens"}
    if bad:
        raise UserError(f"{where}.columns: unknown target(s) {', '.join(sorted(bad))}; allowed: arrival_s, "
                        f"prompt_tokens, output_tokens, cls, session, prefix_hashes, prefix")
    raw, lines = read_raw(p, fmt)
    if format in FORMATS:  # a format's own optional columns (e.g. Mooncake hash_ids) may be absent
        for tidy in ("prefix_hashes", "session", "cls"):
            if tidy in mapping and mapping[tidy] not in raw.columns and tidy not in (columns or {}):
                del mapping[tidy]
    if format == "vidur" and mapping.get("arrival_s") not in raw.columns:
        mapping["arrival_s"] = None
    if format == "servesim":
        for extra in ("cls", "session", "predicted_output_tokens", "prefix_hashes", "prefix"):
            if extra in raw.columns:
                mapping.setdefault(extra, extra)
        if "prefix_hashes" in raw.columns:  # `trace make` writes the hash lists as space-separated ids
            raw["prefix_hashes"] = [[int(h) for h in str(v).split()] for v in raw["prefix_hashes"]]
        if "prefix" in raw.columns:         # and segments as KEY:TOKENS items
            from traces.prefix import parse_prefix
            raw["prefix"] = [parse_prefix(v, str(p), i) for i, v in enumerate(raw["prefix"])]
    if format == "burstgpt":
        raw, lines = _burstgpt_filter(raw, lines, p, **filters)
        if "Session ID" in raw.columns and "session" not in mapping:
            mapping["session"] = "Session ID"
    elif filters:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(filters))} for format {format}")
    return tidy_table(raw, lines, p, mapping, time_unit=time_unit or unit, skip_bad_rows=skip_bad_rows,
                      sort=sort)


def _burstgpt_filter(raw, lines, path, model: str | None = None, log_type: str | None = None,
                     keep_failed: bool = False):
    """BurstGPT logs failed calls with Response tokens = 0; they never produced tokens, so they are dropped
    (and counted) unless keep_failed, in which case they are rejected as bad rows."""
    keep = np.ones(len(raw), dtype=bool)
    if model is not None:
        keep &= (raw["Model"].str.strip() == model).to_numpy()
    if log_type is not None:
        keep &= (raw["Log Type"].str.strip() == log_type).to_numpy()
    if not keep_failed and "Response tokens" in raw.columns:
        failed = (pd.to_numeric(raw["Response tokens"], errors="coerce") == 0).to_numpy() & keep
        if failed.any():
            print(f"servesim: {path}: dropped {int(failed.sum())} failed request(s) (Response tokens = 0)",
                  file=sys.stderr)
        keep &= ~failed
    return raw[keep].reset_index(drop=True), lines[keep]
