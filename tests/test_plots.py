"""Plots draw what the tables say: seed means and bands, capacity markers, CDFs ending at 1, timeline counts."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from study.plots import plot_attainment, plot_cdfs, plot_metric, plot_timeline, save_figure


@pytest.fixture
def results():
    rows = []
    for pol, scale in (("vllm", 1.0), ("sarathi", 2.0)):
        for seed in (0, 1, 2):
            for rate in (1, 2, 4):
                rows.append({"status": "ok", "policy": pol, "seed": seed, "workload.rate": rate,
                             "tps": scale * rate * 100 + seed, "slo_attainment": max(0.0, 1 - 0.1 * rate * scale / 2 - 0.01 * seed)})
    rows.append({"status": "error", "policy": "vllm", "seed": 9, "workload.rate": 1, "tps": np.nan, "slo_attainment": np.nan})
    return pd.DataFrame(rows)


def test_metric_lines_are_seed_means_with_min_max_bands(results, tmp_path):
    fig = plot_metric(results, "workload.rate", "tps")
    ax = fig.axes[0]
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert set(lines) == {"vllm", "sarathi"}
    np.testing.assert_allclose(lines["vllm"].get_ydata(), [101, 201, 401])     # mean of seeds 0,1,2 (+0,+1,+2)
    np.testing.assert_allclose(lines["sarathi"].get_ydata(), [201, 401, 801])
    bands = ax.collections
    assert len(bands) == 2
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(100) and ys.max() == pytest.approx(402)
    paths = save_figure(fig, tmp_path / "m.x", ("png", "svg"))
    assert [p.name for p in paths] == ["m.x.png", "m.x.svg"] and all(p.stat().st_size > 1000 for p in paths)


def test_attainment_plot_marks_target_and_capacity(results):
    cap = pd.DataFrame({"policy": ["vllm", "vllm", "sarathi"], "seed": [0, 1, 0], "capacity_rps": [3.0, 3.4, 1.5],
                        "target_attainment": [0.8] * 3})
    fig = plot_attainment(results, "workload.rate", capacity=cap)
    ax = fig.axes[0]
    stars = [l for l in ax.get_lines() if l.get_marker() == "*"]
    assert sorted(float(s.get_xdata()[0]) for s in stars) == pytest.approx([1.5, 3.2])
    assert all(float(s.get_ydata()[0]) == 0.8 for s in stars)
    assert any(list(l.get_ydata()) == [0.8, 0.8] for l in ax.get_lines())   # the target line


def test_cdf_ends_at_one_and_counts_finished_requests():
    req = pd.DataFrame({"ttft_s": [0.3, 0.1, np.nan, 0.2], "e2e_s": [1.0, 2.0, np.nan, 3.0]})
    fig = plot_cdfs({"run": req}, ("ttft_s", "e2e_s"))
    line = fig.axes[0].get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), [0.1, 0.2, 0.3])
    np.testing.assert_allclose(line.get_ydata(), [1 / 3, 2 / 3, 1.0])


def test_timeline_panels_from_a_real_run(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "examples/infermax-default.yaml", "--set", "workload.num_requests=32", "--set", "workload.output=32",
                 "--set", "memory.M=2000", "--out", str(out), "--no-progress"]) == 0
    assert main(["plot", "timeline", str(out)]) == 0
    assert (out / "timeline.png").exists() and (out / "timeline.svg").exists()
    it = pd.read_csv(out / "iterations.csv")
    fig = plot_timeline(it, 2000)
    assert len(fig.axes) == 4
    assert fig.axes[3].get_lines()[0].get_ydata()[-1] == it["preemptions"].sum() > 0
    assert max(fig.axes[2].get_lines()[0].get_ydata()) <= 1.0
    assert main(["plot", "cdf", str(out), "--out", str(tmp_path / "cdf")]) == 0
    assert (tmp_path / "cdf.svg").exists()


def test_cli_metric_and_attainment_from_a_sweep_directory(tmp_path, results):
    results.to_csv(tmp_path / "results.csv", index=False)
    assert main(["plot", "metric", str(tmp_path), "--y", "tps", "--logy"]) == 0
    assert (tmp_path / "metric_tps_vs_workload_rate.png").exists()
    assert main(["plot", "attainment", str(tmp_path / "results.csv"), "--target", "0.9", "--where", "policy=vllm"]) == 0
    assert (tmp_path / "attainment_slo_vs_workload_rate.svg").exists()
    assert main(["plot", "metric", str(tmp_path), "--y", "nope"]) == 2


def test_library_plots_keep_a_backend_the_user_chose():
    # A notebook picks its inline backend before servesim draws; switching to Agg would hide its later figures.
    import subprocess
    import sys
    code = ("import matplotlib; matplotlib.use('svg'); import matplotlib.pyplot\n"
            "from study.plots import pyplot; pyplot()\n"
            "print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    assert out == "svg"


def _many_policies(n):
    return pd.DataFrame([{"status": "ok", "policy": f"p{i:02d}", "seed": 0, "workload.rate": r,
                          "ttft_p99": (i + 1) * r} for i in range(n) for r in (1, 2)])


@pytest.mark.parametrize("n", [3, 12, 20, 35])
def test_every_series_has_its_own_look_units_title_and_a_legend_off_the_data(n):
    fig = plot_metric(_many_policies(n), "workload.rate", "ttft_p99")
    ax = fig.axes[0]
    lines = [l for l in ax.get_lines() if l.get_label().startswith("p")]
    looks = {(tuple(np.round(l.get_color(), 3)) if not isinstance(l.get_color(), str) else l.get_color(),
              l.get_marker(), l.get_linestyle()) for l in lines}
    assert len(lines) == n and len(looks) == n               # no two series drawn alike
    if n <= 20:                                              # colours alone tell up to 20 series apart
        assert len({tuple(np.round(l.get_color(), 3)) for l in lines}) == n
    assert ax.get_xlabel() == "request rate (req/s)" and ax.get_ylabel() == "ttft_p99 (s)"
    assert ax.get_title()
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1            # right of the axes: it covers no data


def test_attainment_marks_a_curve_that_rises_again_with_load():
    df = pd.DataFrame({"status": "ok", "policy": "vllm", "seed": 0, "workload.rate": [1, 2, 3, 4],
                       "slo_attainment": [1.0, 0.7, 0.9, 0.2]})
    fig = plot_attainment(df, "workload.rate")
    ax = fig.axes[0]
    marked = [c for c in ax.collections if len(c.get_offsets()) and c.get_edgecolor().size]
    assert [tuple(o) for c in marked for o in c.get_offsets()] == [(3.0, 0.9)]
    assert any("not monotone" in t.get_text() for t in ax.texts)
    monotone = df.assign(slo_attainment=[1.0, 0.9, 0.7, 0.2])
    ax = plot_attainment(monotone, "workload.rate").axes[0]
    assert not any("not monotone" in t.get_text() for t in ax.texts)


def test_cluster_timeline_and_replica_plots_draw_one_line_per_replica_by_pool(tmp_path):
    """A P/D run: the timeline draws one line per replica whose times never run backwards (rows of replicas were
    once interleaved), each line a shade of its pool's colour, and KV as a share of that replica's own M."""
    import matplotlib.colors as mcolors
    out = tmp_path / "pd"
    assert main(["run", "examples/cluster-pd.yaml", "--set", "workload.num_requests=80", "--out", str(out),
                 "--no-progress"]) == 0
    assert main(["plot", "timeline", str(out), "--formats", "png"]) == 0
    assert main(["plot", "replicas", str(out), "--formats", "png"]) == 0
    assert (out / "timeline.png").exists() and (out / "replicas.png").exists()
    it = pd.read_csv(out / "iterations.csv")
    caps = dict(zip(*pd.read_csv(out / "replicas.csv")[["replica", "M"]].to_numpy().T))
    fig = plot_timeline(it, caps)
    lines = fig.axes[0].get_lines()
    assert len(lines) == it["replica"].nunique() == 3
    for line in lines:
        assert (np.diff(line.get_xdata()) >= 0).all()
    kv = fig.axes[2].get_lines()
    assert all(0 < max(line.get_ydata()) <= 1.0 for line in kv)
    hue = [mcolors.rgb_to_hsv(mcolors.to_rgb(line.get_color()))[0] for line in lines]
    assert hue[0] > 0.5 > hue[1] and abs(hue[1] - hue[2]) < 0.05      # prefill blue, both decode replicas orange
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["replica 0 (prefill)", "replica 1 (decode)", "replica 2 (decode)"]
