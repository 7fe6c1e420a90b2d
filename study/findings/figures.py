"""The figures behind the reproduction report, drawn from the same memoised runs the claims use."""
from __future__ import annotations

from pathlib import Path

from study.findings import infermax as im
from study.findings.registry import Scale
from study.findings.runs import mixed, offline
from study.plots import pyplot

FIGURES: dict = {}


def figure(name, title):
    def deco(fn):
        FIGURES[name] = (fn, title)
        return fn
    return deco


FIG5_ROWS = (("makespan_s", "latency (s)"), ("tps", "TPS"), ("ttft_mean", "mean TTFT (s)"),
             ("tpot_mean", "mean TPOT (s)"), ("evictions", "evictions"), ("kv_util_mean", "mean KV use / M"))


@figure("fig5", "Figure 5: high contention, metrics vs I per O")
def fig5(s: Scale):
    plt = pyplot()
    fig, axes = plt.subplots(len(FIG5_ROWS), len(s.O_grid), figsize=(4 * len(s.O_grid), 2.3 * len(FIG5_ROWS)),
                             squeeze=False, sharex=True)
    for j, O in enumerate(s.O_grid):
        for p in ("vllm", "sarathi", "sarathi-p=c"):
            rows = [offline(p, I, O, s.B, s.M) for I in s.I_grid]
            for i, (key, label) in enumerate(FIG5_ROWS):
                axes[i][j].plot(s.I_grid, [r.get(key, float("nan")) for r in rows], marker="o", label=p)
                axes[i][j].set_ylabel(label)
        axes[0][j].set_title(f"O = {O}, B = {s.B}, M = {s.M}")
        axes[-1][j].set_xlabel("I (prompt tokens)")
        for i in range(len(FIG5_ROWS)):
            axes[i][j].set_xscale("log", base=2)
    axes[0][0].legend(fontsize=8)
    return fig


@figure("fig6", "Figure 6: TPS vs O for B = 32 and the contention B (vLLM, I = 128)")
def fig6(s: Scale):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    o_grid = (1, 32, 256, 1024)
    for B in (32, s.B):
        ax.plot(o_grid, [offline("vllm", 128, O, B, s.M if B == s.B else 100_000)["tps"] for O in o_grid],
                marker="o", label=f"B = {B}")
    ax.set(xscale="log", xlabel="O (output tokens)", ylabel="TPS", title="vLLM, I = 128")
    ax.legend()
    return fig


@figure("fig8", "Figure 8: original vs eviction-free at O = 1024")
def fig8(s: Scale):
    plt = pyplot()
    rows = (("tps", "TPS"), ("ttft_mean", "mean TTFT (s)"), ("tpot_mean", "mean TPOT (s)"),
            ("running_mean", "mean running size"))
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.2))
    for p in im.EF_BASES:
        for variant, ls in ((p, "-"), (f"{p}-ef", "--")):
            runs = [offline(variant, I, 1024, s.B, s.M) for I in s.I_grid]
            for ax, (key, label) in zip(axes, rows):
                ax.plot(s.I_grid, [r[key] for r in runs], ls, marker="o", label=variant)
                ax.set(xscale="log", xlabel="I", ylabel=label)
    axes[2].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"O = 1024, B = {s.B}, M = {s.M}")
    return fig


@figure("fig9", "Figure 9: TPS vs M, with and without evictions (O = 32)")
def fig9(s: Scale):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(s.M_sweep_I), figsize=(4.5 * len(s.M_sweep_I), 3.5), squeeze=False)
    for ax, I in zip(axes[0], s.M_sweep_I):
        for p in ("vllm", "vllm-ef", "sarathi", "sarathi-ef"):
            Ms = [M for M in im.M_SWEEP if I + 31 <= M]
            ax.plot(Ms, [offline(p, I, 32, s.msweep_B, M)["tps"] for M in Ms], "--" if p.endswith("ef") else "-",
                    marker="o", label=p)
        ax.set(xscale="log", xlabel="M (KV tokens)", ylabel="TPS", title=f"I = {I}, B = {s.msweep_B}")
    axes[0][0].legend(fontsize=8)
    return fig


@figure("fig11", "Figure 11: TPS vs R_max (I = 128)")
def fig11(s: Scale):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    grid = im._rmax_grid(s)
    for ax, O in zip(axes, (32, 1024)):
        for p in ("vllm", "sarathi"):
            ax.plot(grid, im._rmax_tps(p, 128, O, s), marker="o", label=p)
        ax.axvline(s.M / (128 + O), color="grey", ls=":", label="M/(I+O)")
        ax.set(xscale="log", xlabel="R_max", ylabel="TPS", title=f"O = {O}, B = {s.B}, M = {s.M}")
    axes[1].legend(fontsize=8)
    return fig


@figure("fig12", "Figure 12: low contention (B = 32), latency vs I")
def fig12(s: Scale):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(s.O_grid), figsize=(4 * len(s.O_grid), 3.3), squeeze=False)
    for ax, O in zip(axes[0], s.O_grid):
        for p in ("vllm", "sarathi", "sarathi-nohy"):
            ax.plot(s.I_grid, [offline(p, I, O, 32, 100_000)["makespan_s"] for I in s.I_grid], marker="o", label=p)
        ax.set(xscale="log", xlabel="I", ylabel="latency (s)", title=f"O = {O}, B = 32")
    axes[0][0].legend(fontsize=8)
    return fig


def _rank_bars(s: Scale, metric: str, label: str):
    plt = pyplot()
    import numpy as np
    fig, ax = plt.subplots(figsize=(9, 3.5))
    xs = np.arange(len(im.WORKLOADS))
    for k, p in enumerate(im.RANKERS):
        vals = [mixed(p, a, b, s.rank_B, s.rank_M)[metric] for a, b in im.WORKLOADS]
        ax.bar(xs + (k - 1) * 0.27, vals, 0.27, label=p)
    ax.set_xticks(xs, ["+".join(w) for w in im.WORKLOADS], fontsize=8)
    ax.set(ylabel=label, title=f"heterogeneous workloads, B = {s.rank_B}, M = {s.rank_M}")
    ax.legend(fontsize=8)
    return fig


@figure("fig15", "Figure 15: latency of the ranking schedulers")
def fig15(s):
    return _rank_bars(s, "makespan_s", "latency (s)")


@figure("fig16", "Figure 16: mean TTFT of the ranking schedulers")
def fig16(s):
    return _rank_bars(s, "ttft_mean", "mean TTFT (s)")


@figure("fig17", "Figure 17: mean TPOT of the ranking schedulers")
def fig17(s):
    return _rank_bars(s, "tpot_mean", "mean TPOT (s)")


def draw(name: str, s: Scale, out_dir) -> Path:
    fn, _ = FIGURES[name]
    fig = fn(s)
    out = Path(out_dir) / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    pyplot().close(fig)
    return out
