"""Exact per-iteration Apt-Serve knapsack (Definition 1) by dynamic programming, to measure the greedy's gap."""
from __future__ import annotations


def exact_knapsack(cands, budget: int, N: int, rho: float, decay: float = 0.0, fallback: str = "near_zero"):
    """Multiple-choice knapsack: per candidate none / KV (m blocks, value p) / hidden (h blocks, p − Nρm).

    `cands` are policies.aptserve.Candidate objects. Violated candidates are KV-only with the policy's demoted
    value. Returns (best value, {req: 'kv'|'hidden'}). O(len(cands) · budget)."""
    NEG = float("-inf")
    best = [0.0] + [NEG] * budget          # best[w] = max value using exactly w blocks
    choice = []
    for c in cands:
        if c.violated:
            v_kv = decay * c.p if fallback == "decay" else 1e-9 * c.p
            opts = [("kv", c.m, v_kv)]
        else:
            opts = [("kv", c.m, c.p)]
            if c.h < c.m:
                opts.append(("hidden", c.h, c.p - N * rho * c.m))
        new = best[:]
        pick = [None] * (budget + 1)
        for kind, w, v in opts:
            for used in range(budget - w, -1, -1):
                if best[used] == NEG:
                    continue
                if best[used] + v > new[used + w]:
                    new[used + w] = best[used] + v
                    pick[used + w] = (kind, used)
        choice.append(pick)
        best = new
    w = max(range(budget + 1), key=lambda i: best[i])
    value = best[w]
    chosen = {}
    for c, pick in zip(reversed(cands), reversed(choice)):
        if pick[w] is not None:
            kind, prev = pick[w]
            chosen[c.req] = kind
            w = prev
    return value, chosen


def knapsack_value(chosen: dict, cands, N: int, rho: float, decay: float = 0.0, fallback: str = "near_zero"):
    """Σ g_i of a selection, by the same value rule as `exact_knapsack`."""
    by_req = {c.req: c for c in cands}
    total = 0.0
    for r, kind in chosen.items():
        c = by_req[r]
        if c.violated:
            total += decay * c.p if fallback == "decay" else 1e-9 * c.p
        else:
            total += c.p - (N * rho * c.m if kind == "hidden" else 0.0)
    return total
