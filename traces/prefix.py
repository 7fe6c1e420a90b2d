"""Prefix identity of requests: which leading tokens of a prompt are the same content as other requests' tokens.

A request's `prefix` is a sequence of segments (key, tokens): its prompt starts with `tokens` tokens of the content
named `key`, then the next segment, and so on; whatever the segments leave of the prompt is the request's own. Two
requests share their first n tokens exactly when their segment lists agree that far (same keys, same lengths).
Keys are any hashable values; ("g", row) names the generated tokens of the request in that row of the table (a
later turn of a conversation repeats an earlier answer), and ("u", row) is reserved for a request's own tokens.

Mooncake's traces name content by `hash_ids` of fixed 512-token blocks; `prefix_from_hashes` turns those into
segments. The KV manager (sim/kv/prefix_cache.py) turns segments into block identities for any block size."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError

RESERVED = ("u",)           # ("u", row): a request's own tokens (the simulator's name for the unsegmented rest)


def prefix_from_hashes(hashes, prompt_tokens: int, block_tokens: int, where: str = "prefix_hashes", row: int = 0):
    """Segments for a prompt whose content is named block by block (Mooncake: 512-token blocks); the last block
    may be partial. More ids than the prompt has blocks is an error."""
    ids = list(hashes) if hashes is not None and not (isinstance(hashes, float) and np.isnan(hashes)) else []
    if not ids:
        return ()
    need = -(-int(prompt_tokens) // block_tokens)
    if len(ids) > need:
        raise UserError(f"{where}: row {row}: {len(ids)} hash ids of {block_tokens}-token blocks for a prompt of "
                        f"{prompt_tokens} tokens (at most {need}); set hash_block_tokens to the trace's block size")
    out, left = [], int(prompt_tokens)
    for h in ids:
        n = min(block_tokens, left)
        out.append((("h", h), n))
        left -= n
    return tuple(out)


def check_prefix(df: pd.DataFrame, where: str) -> None:
    """Every row's segments are (hashable key, tokens >= 1) pairs that fit in its prompt; one line per mistake."""
    if "prefix" not in df:
        return
    prompts = df["prompt_tokens"].to_numpy()
    for row, (segs, prompt) in enumerate(zip(df["prefix"].to_numpy(), prompts)):
        if segs is None or (isinstance(segs, float) and np.isnan(segs)):
            continue
        total = 0
        try:
            items = list(segs)
        except TypeError:
            raise UserError(f"{where}: row {row}: prefix must be a list of (key, tokens) segments, got {segs!r}") from None
        for seg in items:
            if not (isinstance(seg, (tuple, list)) and len(seg) == 2):
                raise UserError(f"{where}: row {row}: prefix segment {seg!r} is not a (key, tokens) pair")
            key, n = seg
            try:
                hash(key)
            except TypeError:
                raise UserError(f"{where}: row {row}: prefix key {key!r} is not hashable (use a string, number "
                                "or tuple)") from None
            if isinstance(key, tuple) and key and key[0] in RESERVED:
                raise UserError(f"{where}: row {row}: prefix key {key!r} is reserved for a request's own tokens")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise UserError(f"{where}: row {row}: prefix segment {key!r} has {n!r} tokens; must be an integer >= 1")
            total += int(n)
        if total > prompt:
            raise UserError(f"{where}: row {row}: prefix segments cover {total} tokens but the prompt has {prompt}; "
                            "segments must fit inside the prompt")


def format_prefix(segs) -> str:
    """A CSV cell: `key:tokens` pairs separated by spaces (keys written with repr so they read back)."""
    if not segs:
        return ""
    return " ".join(f"{_key_text(k)}:{n}" for k, n in segs)


def parse_prefix(text, where: str, row: int):
    """Inverse of format_prefix for string keys and keys made of strings and integers."""
    if text is None or (isinstance(text, float) and np.isnan(text)) or str(text).strip() == "":
        return ()
    out = []
    for item in str(text).split():
        key, sep, n = item.rpartition(":")
        if not sep or not n.isdigit() or not key:
            raise UserError(f"{where}: row {row}: prefix item {item!r} is not KEY:TOKENS")
        out.append((_key_parse(key), int(n)))
    return tuple(out)


def _key_text(k) -> str:
    if isinstance(k, tuple):
        return "/".join(str(x) for x in k)
    return str(k)


def _key_parse(text: str):
    parts = text.split("/")
    vals = tuple(int(p) if p.lstrip("-").isdigit() else p for p in parts)
    return vals if len(vals) > 1 else vals[0]
