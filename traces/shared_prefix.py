"""Prefix-sharing workloads: inference-perf's `shared_prefix` data generator with its `constant` load stages, and a
multi-turn chat generator whose history grows turn by turn.

shared_prefix (kubernetes-sigs/inference-perf, as its 2026 releases define it): `num_groups` system prompts of
`system_prompt_len` tokens, each shared by `num_prompts_per_group` users; a user's prompt is its group's system
prompt followed by its own question of `question_len` tokens; every request asks for `output_len` tokens. The users
are shuffled once; request i of a stage goes to user i mod (number of users), so with `enable_multi_turn_chat` a
user comes back every (number of users) requests. What a returning user sends is `history`:
- `repeat` (default): the same prompt again, as the measured vLLM deployments in ../shared/data/validation show
  (their mean prompt lengths stay at system + question + chat template);
- `grow`: inference-perf's user session: the previous prompt, the model's answer and the question again, trimmed
  from the oldest turn to fit `max_model_len - output_len - 200` as its session does.
The requests are sent open loop at the stage times (a turn never waits for the one before it).

The `constant` load type: each stage sends int(rate × duration) requests with exponential gaps rescaled so the last
one lands at the stage's end; stages run back to back and each restarts the user cycle (a fresh data generator per
stage, as inference-perf does)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from costmodels.errors import UserError
from traces.arrivals import draw_arrivals
from traces.registry import register_workload
from traces.synthetic import _check_keys, _count


def _int(spec, key, where, default=None, minimum=1):
    v = spec.get(key, default)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"{where}.{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def constant_stages(stages, rng: np.random.Generator, where: str):
    """inference-perf's constant load type: (arrival times, stage index per request)."""
    if not isinstance(stages, (list, tuple)) or not stages:
        raise UserError(f"{where}.stages: expected a list of {{rate, duration}} stages")
    times, which, start = [], [], 0.0
    for k, st in enumerate(stages):
        w = f"{where}.stages[{k}]"
        if not isinstance(st, dict) or set(st) - {"rate", "duration"}:
            raise UserError(f"{w}: expected a mapping with rate and duration (seconds)")
        rate, dur = st.get("rate"), st.get("duration")
        for name, v in (("rate", rate), ("duration", dur)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise UserError(f"{w}.{name}: must be a number > 0, got {v!r}")
        n = int(rate * dur)
        if n < 1:
            raise UserError(f"{w}: rate x duration = {rate * dur:g} sends no request; raise rate or duration")
        gaps = rng.exponential(1.0 / rate, n)
        gaps *= dur / gaps.sum()
        times.append(start + np.cumsum(gaps))
        which.append(np.full(n, k))
        start += dur
    return np.concatenate(times), np.concatenate(which)


def _output_lengths(n, output_len, mean, rng, where, cv=None):
    """Requested output_len, or, when the model stops at end-of-sequence before it (base models) with a known mean:
    lengths normal around the mean with coefficient of variation `cv`, truncated to [1, output_len]; without a cv,
    a constant per-token stop probability truncated at output_len whose mean is `mean`."""
    if mean is None or mean >= output_len:
        return np.full(n, output_len, dtype=np.int64)
    if not 1 <= mean < output_len:
        raise UserError(f"{where}.mean_output_tokens: must be in [1, output_len], got {mean!r}")
    if cv is not None:
        if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not 0 <= cv <= 2:
            raise UserError(f"{where}.output_cv: must be a number in [0, 2], got {cv!r}")
        return np.clip(np.round(rng.normal(mean, cv * mean, n)), 1, output_len).astype(np.int64)
    lo, hi = 1e-9, 1.0          # E[min(Geom(p), L)] = (1 - (1-p)^L)/p falls from L to 1 as p grows
    for _ in range(200):
        p = (lo + hi) / 2
        m = (1 - (1 - p) ** output_len) / p
        lo, hi = (p, hi) if m > mean else (lo, p)
    return np.minimum(rng.geometric((lo + hi) / 2, n), output_len).astype(np.int64)


SHARED_KEYS = ("num_groups", "num_prompts_per_group", "num_unique_system_prompts", "num_users_per_system_prompt",
               "system_prompt_len", "question_len", "output_len", "mean_output_tokens", "output_cv", "template_tokens",
               "enable_multi_turn_chat", "history", "max_model_len", "stages", "arrival", "num_requests", "cls")


@register_workload("shared_prefix")
def shared_prefix(spec, rng, where):
    """System prompts shared by groups of users; see the module docstring for every field."""
    _check_keys(spec, SHARED_KEYS, where)
    groups = _int(spec, "num_groups", where, spec.get("num_unique_system_prompts", 10))
    per = _int(spec, "num_prompts_per_group", where, spec.get("num_users_per_system_prompt", 10))
    sys_len = _int(spec, "system_prompt_len", where, 100, minimum=0)
    q_len = _int(spec, "question_len", where, 50)
    out_len = _int(spec, "output_len", where, 100)
    tpl = _int(spec, "template_tokens", where, 0, minimum=0)
    history = spec.get("history", "repeat")
    if history not in ("repeat", "grow"):
        raise UserError(f"{where}.history: {history!r} is not allowed; allowed: repeat, grow")
    multi = spec.get("enable_multi_turn_chat", True)
    if not isinstance(multi, bool):
        raise UserError(f"{where}.enable_multi_turn_chat: expected true or false, got {multi!r}")
    max_len = _int(spec, "max_model_len", where, 4096)
    if "stages" in spec and not spec["stages"]:
        raise UserError(f"{where}.stages: the list is empty; give at least one {{rate, duration}} stage, or leave "
                        "stages out and give arrival + num_requests")
    if "stages" in spec and ("arrival" in spec or "num_requests" in spec):
        raise UserError(f"{where}: give stages (inference-perf's constant load) or arrival + num_requests, not both")
    if "stages" in spec:
        arrivals, stage = constant_stages(spec["stages"], rng, where)
    else:
        n = _count(spec, where, 1000)
        arrivals = draw_arrivals(spec.get("arrival") or {"process": "poisson", "rate": 1.0}, n, rng,
                                 f"{where}.arrival")
        stage = np.zeros(n, dtype=int)
    users = groups * per
    order = rng.permutation(users)              # inference-perf shuffles the users once
    n = len(arrivals)
    index = np.empty(n, dtype=np.int64)         # request → position in its stage's cycle
    for k in np.unique(stage):
        sel = np.flatnonzero(stage == k)
        index[sel] = np.arange(len(sel))
    user = order[index % users]
    rounds = index // users if multi else np.zeros(n, dtype=np.int64)
    outputs = _output_lengths(n, out_len, spec.get("mean_output_tokens"), rng, where, spec.get("output_cv"))
    group = user // per
    own = q_len + tpl
    if history == "repeat" or not multi:
        prefix = [((("sp", int(g)), sys_len), (("sq", int(u)), own)) if sys_len else ((("sq", int(u)), own),)
                  for g, u in zip(group, user)]
        prompts = np.full(n, sys_len + own, dtype=np.int64)
    else:
        prefix, prompts = _grow(n, user, group, rounds, outputs, sys_len, own, out_len, max_len)
    df = pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompts, "output_tokens": outputs})
    df["prefix"] = prefix
    df["session"] = user
    if spec.get("cls") is not None:
        df["cls"] = str(spec["cls"])
    return df


def _grow(n, user, group, rounds, outputs, sys_len, own, out_len, max_len):
    """inference-perf's growing user session: each turn is the last prompt + its answer + the question again."""
    limit = max_len - out_len - 200
    history: dict = {}                          # user → list of (segments of one past turn)
    last: dict = {}                             # user → row of its previous request
    prefix, prompts = [], []
    for row in range(n):
        u, g = int(user[row]), int(group[row])
        turns = history.setdefault(u, [])
        if u in last:                           # the previous turn's answer, then this turn's question
            prev = last[u]
            turns.append(((("g", prev), int(outputs[prev])), (("sq", u, int(rounds[row])), own)))
        base = [(("sp", g), sys_len)] if sys_len else []
        first = [(("sq", u, 0), own)]
        body = [seg for t in turns for seg in t]
        while turns and sys_len + own + sum(k for _, k in body) > limit:
            turns.pop(0)                        # trim the oldest turn, keep the system prompt
            body = [seg for t in turns for seg in t]
        segs = base + first + body
        prefix.append(tuple(segs))
        prompts.append(sum(k for _, k in segs))
        last[u] = row
    return prefix, np.asarray(prompts, dtype=np.int64)


CHAT_KEYS = ("conversations", "start", "turns", "system_prompt_len", "num_system_prompts", "user_tokens",
             "output", "think_time_s", "max_model_len", "cls", "closed_loop", "think")


@register_workload("multi_turn")
def multi_turn(spec, rng, where):
    """Conversations whose history grows: turn t's prompt is the system prompt, every earlier question and answer,
    and the new question. Conversations start by `start` (an arrival process); turns follow after the previous
    turn's start by an exponential think time (open loop: a turn may arrive before its predecessor finished, and
    then finds less of its history cached). When a prompt would pass max_model_len - output, the oldest turns go.

    closed_loop: true makes them sessions as agents and chat users run them: turn t + 1 is sent when turn t
    completes plus a pause (columns `after`: the row it follows, -1 for a first turn; `think_s`: the pause; the
    engine times them, sim/engine/sessions.py). The pause is drawn from `think`: exponential (mean
    think_time_s, the default), constant (think_time_s), or a list of seconds used in turn (a tool-call trace);
    a pause may be 0 (an agent calling the model again at once)."""
    from traces.lengths import draw_lengths
    _check_keys(spec, CHAT_KEYS, where)
    closed = spec.get("closed_loop", False)
    if not isinstance(closed, bool):
        raise UserError(f"{where}.closed_loop: expected true or false, got {closed!r}")
    if not closed and "think" in spec:
        raise UserError(f"{where}.think: pauses after a turn completes need closed_loop: true")
    if closed:
        return _closed_loop(spec, rng, where)
    conv = _int(spec, "conversations", where, 100)
    n_sys = _int(spec, "num_system_prompts", where, 1)
    sys_len = _int(spec, "system_prompt_len", where, 200, minimum=0)
    max_len = _int(spec, "max_model_len", where, 4096)
    think = spec.get("think_time_s", 10.0)
    if isinstance(think, bool) or not isinstance(think, (int, float)) or not think > 0:
        raise UserError(f"{where}.think_time_s: must be a number > 0, got {think!r}")
    starts = draw_arrivals(spec.get("start") or {"process": "poisson", "rate": 1.0}, conv, rng, f"{where}.start")
    turns = draw_lengths(spec.get("turns", {"dist": "uniform", "low": 2, "high": 8}), conv, rng, f"{where}.turns")
    rows = []
    for c in range(conv):
        t = float(starts[c])
        k = int(turns[c])
        q = draw_lengths(spec.get("user_tokens", 100), k, rng, f"{where}.user_tokens")
        o = draw_lengths(spec.get("output", 200), k, rng, f"{where}.output")
        for j in range(k):
            if j:
                t += float(rng.exponential(think))
            rows.append((t, c, j, int(q[j]), int(o[j])))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    last, hist = {}, {}
    out = {"arrival_s": [], "prompt_tokens": [], "output_tokens": [], "prefix": [], "session": []}
    for row, (t, c, j, q, o) in enumerate(rows):
        turns_c = hist.setdefault(c, [])
        if j:
            prev = last[c]
            turns_c.append(((("g", prev), out["output_tokens"][prev]),))
        turns_c.append(((("cq", c, j), q),))
        base = [(("sys", c % n_sys), sys_len)] if sys_len else []
        body = [s for tt in turns_c for s in tt]
        while len(turns_c) > 1 and sys_len + sum(k for _, k in body) > max_len - o:
            turns_c.pop(0)
            body = [s for tt in turns_c for s in tt]
        segs = tuple(base + body)
        out["arrival_s"].append(t)
        out["prompt_tokens"].append(sum(k for _, k in segs))
        out["output_tokens"].append(o)
        out["prefix"].append(segs)
        out["session"].append(c)
        last[c] = row
    df = pd.DataFrame(out)
    if spec.get("cls") is not None:
        df["cls"] = str(spec["cls"])
    return df


def _pauses(spec, n: int, rng, where) -> np.ndarray:
    """n pauses (seconds) between a turn's completion and the next turn: `think` exponential | constant | a list."""
    mean = spec.get("think_time_s", 10.0)
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not np.isfinite(mean) or mean < 0:
        raise UserError(f"{where}.think_time_s: must be a number >= 0 (seconds), got {mean!r}")
    kind = spec.get("think", "exponential")
    if isinstance(kind, list):
        if not kind or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x) or x < 0
                           for x in kind):
            raise UserError(f"{where}.think: a list of pauses must hold numbers >= 0 (seconds), got {kind!r}")
        return np.resize(np.asarray(kind, dtype=float), n)
    if kind == "exponential":
        return rng.exponential(mean, n) if mean > 0 else np.zeros(n)
    if kind == "constant":
        return np.full(n, float(mean))
    raise UserError(f"{where}.think: {kind!r} is not allowed; allowed: exponential, constant, or a list of seconds")


def _closed_loop(spec, rng, where) -> pd.DataFrame:
    """multi_turn with closed_loop: the same conversations, each turn sent after the one before it completes."""
    from traces.lengths import draw_lengths
    conv = _int(spec, "conversations", where, 100)
    n_sys = _int(spec, "num_system_prompts", where, 1)
    sys_len = _int(spec, "system_prompt_len", where, 200, minimum=0)
    max_len = _int(spec, "max_model_len", where, 4096)
    starts = draw_arrivals(spec.get("start") or {"process": "poisson", "rate": 1.0}, conv, rng, f"{where}.start")
    turns = draw_lengths(spec.get("turns", {"dist": "uniform", "low": 2, "high": 8}), conv, rng, f"{where}.turns")
    out = {"arrival_s": [], "prompt_tokens": [], "output_tokens": [], "prefix": [], "session": [], "after": [],
           "think_s": []}
    pauses = _pauses(spec, int(turns.sum()), rng, where)
    used = 0
    for c in np.argsort(starts, kind="stable"):   # rows in order of the sessions' first arrival
        k = int(turns[c])
        q = draw_lengths(spec.get("user_tokens", 100), k, rng, f"{where}.user_tokens")
        o = draw_lengths(spec.get("output", 200), k, rng, f"{where}.output")
        hist: list = []
        prev = -1
        for j in range(k):
            if j:
                hist.append(((("g", prev), int(o[j - 1])),))
            hist.append(((("cq", int(c), j), int(q[j])),))
            base = [(("sys", int(c) % n_sys), sys_len)] if sys_len else []
            body = [s for tt in hist for s in tt]
            while len(hist) > 1 and sys_len + sum(n for _, n in body) > max_len - int(o[j]):
                hist.pop(0)
                body = [s for tt in hist for s in tt]
            segs = tuple(base + body)
            row = len(out["arrival_s"])
            out["arrival_s"].append(float(starts[c]))      # later turns: the session's start until released
            out["prompt_tokens"].append(sum(n for _, n in segs))
            out["output_tokens"].append(int(o[j]))
            out["prefix"].append(segs)
            out["session"].append(int(c))
            out["after"].append(prev)
            out["think_s"].append(float(pauses[used]) if j else 0.0)
            used += 1 if j else 0
            prev = row
    df = pd.DataFrame(out)
    if spec.get("cls") is not None:
        df["cls"] = str(spec["cls"])
    return df
