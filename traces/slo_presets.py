"""SLO presets from the papers, named in a scenario as `slo: {preset: NAME}` (also per class)."""
from __future__ import annotations

from costmodels.errors import UserError

# Apt-Serve Table 3: (TTFT, P99 TBT) in seconds per dataset and model.
_APT = {"sharegpt": {"opt-13b": (1.0, 1.0), "opt-30b": (1.5, 1.0), "opt-66b": (2.0, 1.0)},
        "humaneval": {"opt-13b": (0.5, 0.5), "opt-30b": (1.0, 0.5), "opt-66b": (1.5, 0.5)},
        "longbench": {"opt-13b": (4.0, 1.0), "opt-30b": (4.5, 1.0), "opt-66b": (5.0, 1.0)}}

PRESETS: dict[str, dict] = {
    f"aptserve-{ds}-{m}": {"ttft_s": t, "tbt_p99_s": b} for ds, row in _APT.items() for m, (t, b) in row.items()}
PRESETS.update({
    "aptserve-motivation": {"ttft_s": 1.0, "tbt_p99_s": 1.0},   # Apt-Serve §3
    "aptserve-ultralong": {"ttft_s": 10.0, "tbt_p99_s": 1.0},   # Apt-Serve §6.7
    "bros": {"ttft_s": 0.4, "tpot_s": 0.2},                     # BROS §7.1, real-time class
})


def econoserve_slo(t_p_s: float, t_g_s: float, mean_output_tokens: float, slo_scale: float = 2.0) -> dict:
    """EconoServe's JCT SLO = scale·(t_p + t_g·l_g) per request, as a class-wide normalized-latency bound
    (JCT / l_g) evaluated at the mean output length — the metrics keep SLOs per class, not per request."""
    if min(t_p_s, t_g_s, mean_output_tokens, slo_scale) <= 0:
        raise UserError("slo preset econoserve: t_p_s, t_g_s, mean_output_tokens and slo_scale must be > 0")
    return {"normalized_latency_s": slo_scale * (t_p_s / mean_output_tokens + t_g_s)}


def expand_slo_preset(d: dict | None, where: str) -> dict:
    """Replace `preset: NAME` by its targets; explicit keys beside it override the preset's."""
    d = dict(d or {})
    if "preset" not in d:
        return d
    name = d.pop("preset")
    if name == "econoserve":
        knobs = {k: d.pop(k) for k in ("t_p_s", "t_g_s", "mean_output_tokens", "slo_scale") if k in d}
        try:
            base = econoserve_slo(**knobs)
        except TypeError:
            raise UserError(f"{where}: preset econoserve needs t_p_s, t_g_s and mean_output_tokens "
                            f"(optional slo_scale, default 2)") from None
    elif name in PRESETS:
        base = PRESETS[name]
    else:
        raise UserError(f"{where}.preset: unknown SLO preset {name!r}; allowed: econoserve, "
                        f"{', '.join(sorted(PRESETS))}")
    return {**base, **d}
