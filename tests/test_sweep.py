"""Sweeps: grid parsing, resume after a crash, identical rows across --jobs and Dask, errors recorded per point."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from costmodels.errors import UserError
from sim.cli import main
from study.sweep import (Axis, PointStore, SweepSpec, expand, load_sweep, parse_grid_arg, run_sweep, scenario_key)

REPO = Path(__file__).resolve().parent.parent

# Small runs (~0.05 s each) that still evict at the smaller M, so the rows differ from point to point.
BASE = {"name": "tiny", "seed": 0, "memory": {"M": 400, "block_size": 1}, "policy": {"name": "vllm"},
        "workload": {"kind": "poisson", "num_requests": 24, "rate": 50,
                     "prompt": {"dist": "uniform", "low": 8, "high": 64}, "output": {"dist": "uniform", "low": 2, "high": 24}}}


def spec(*axes, base=BASE):
    return SweepSpec("tiny", dict(base), "test", list(axes))


GRID = (Axis("memory.M", [200, 400, 1000]), Axis("policy.name", ["vllm", "sarathi"]), Axis("seed", [0, 1]))


def comparable(df):
    """Everything but the wall clock, which is the one thing allowed to differ between identical runs."""
    return df.drop(columns=["wall_s"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    return run_sweep(spec(*GRID), out, jobs=1, progress=False).table


def test_grid_values_parse_like_set_plus_scientific_numbers():
    assert parse_grid_arg("memory.M=1e3,1e4,100").values == [1000, 10000, 100]
    assert parse_grid_arg("workload.rate=0.5, 2").values == [0.5, 2]
    assert parse_grid_arg("policy.name=vllm,sarathi-ef").values == ["vllm", "sarathi-ef"]
    ax = parse_grid_arg("workload.prompt=[64, {dist: uniform, low: 1, high: 9}]")
    assert ax.values == [64, {"dist": "uniform", "low": 1, "high": 9}]
    with pytest.raises(UserError, match="KEY=V1"):
        parse_grid_arg("memory.M")


def test_key_is_the_resolved_scenario_so_equal_runs_share_it_and_different_seeds_do_not():
    a, b = expand(spec(Axis("workload.rate", [2]))), expand(spec(Axis("workload.rate", [2.0])))
    assert a[0].key == b[0].key
    s = expand(spec(Axis("seed", [0, 1])))
    assert s[0].key != s[1].key
    assert s[0].key == scenario_key(s[0].raw)


def test_table_has_one_row_per_point_in_grid_order_with_axes_seed_and_metrics(reference):
    df = reference
    assert len(df) == 12 and df["key"].is_unique
    assert list(df["point"]) == list(range(12))
    assert list(df["memory.M"][:4]) == [200, 200, 200, 200] and list(df["seed"][:2]) == [0, 1]
    for col in ("tps", "ttft_p99", "tbt_p99_p99", "tpot_mean", "e2e_p50", "slo_attainment", "goodput_rps",
                "evictions", "kv_util_mean", "makespan_s", "wall_s", "M"):
        assert col in df, col
    assert (df["status"] == "ok").all()
    assert (df["M"] == df["memory.M"]).all()
    # the axes really reached the runs: smaller M evicts more
    ev = df.groupby("memory.M")["evictions"].sum()
    assert ev[200] > ev[1000]


def test_resume_after_crash_gives_exactly_the_uninterrupted_table(tmp_path, reference):
    sp = spec(*GRID)
    calls = []

    def crash_after_five(pt, row):
        calls.append(pt.key)
        if len(calls) == 5:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_sweep(sp, tmp_path, jobs=1, progress=False, on_point=crash_after_five)
    store = PointStore(tmp_path)
    assert len(list(store.dir.glob("*.json"))) == 5
    # a crash in the middle of a write leaves a temp file and, at worst, a torn point file: neither counts as done
    (store.dir / ".deadbeef.123.tmp").write_text('{"key": "dead')
    torn = store.path(calls[0])
    torn.write_text(torn.read_text()[:20])
    again = run_sweep(sp, tmp_path, jobs=1, progress=False)
    assert again.skipped == 4 and again.ran == 8
    pd.testing.assert_frame_equal(comparable(again.table), comparable(reference))
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert len(on_disk) == 12 and on_disk["key"].is_unique
    # a third run does nothing and changes nothing
    third = run_sweep(sp, tmp_path, jobs=1, progress=False)
    assert third.ran == 0
    pd.testing.assert_frame_equal(comparable(third.table), comparable(reference))


def test_killed_cli_sweep_resumes_without_loss_or_duplicates(tmp_path, reference):
    """A real crash: SIGKILL the CLI once some points are stored, rerun the same command."""
    out = tmp_path / "out"
    scn = tmp_path / "tiny.yaml"
    import yaml
    scn.write_text(yaml.safe_dump(BASE))
    cmd = [sys.executable, "-m", "sim.cli", "sweep", str(scn), "--grid", "memory.M=200,400,1000",
           "--grid", "policy.name=vllm,sarathi", "--grid", "seed=0,1", "--out", str(out), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (out / "points").exists() and len(list((out / "points").glob("*.json"))) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stored = len(list((out / "points").glob("*.json")))
    assert 3 <= stored < 12, "the kill should land mid-sweep"
    assert subprocess.run(cmd, cwd=REPO, env=env, capture_output=True).returncode == 0
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 12 and df["key"].is_unique
    ref = reference.drop(columns=["wall_s"])
    got = df.drop(columns=["wall_s"])[ref.columns]
    pd.testing.assert_frame_equal(got, pd.read_csv(_roundtrip(ref, tmp_path)), check_dtype=False)


def _roundtrip(df, tmp_path):
    p = tmp_path / "ref.csv"
    df.to_csv(p, index=False)
    return p


def test_two_jobs_give_identical_rows_to_one(tmp_path, reference):
    res = run_sweep(spec(*GRID), tmp_path, jobs=2, progress=False)
    assert res.ran == 12
    pd.testing.assert_frame_equal(comparable(res.table), comparable(reference))


def test_dask_local_gives_identical_rows_to_one_job(tmp_path, reference):
    pytest.importorskip("distributed", reason="Dask distributed not installed (pip install 'servesim[dask]')")
    res = run_sweep(spec(*GRID), tmp_path, jobs=2, dask="local", progress=False)
    pd.testing.assert_frame_equal(comparable(res.table), comparable(reference))


def test_dask_missing_gives_one_clear_line(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_distributed(name, *a, **k):
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError("no distributed")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    with pytest.raises(UserError, match=r"servesim\[dask\]"):
        run_sweep(spec(Axis("seed", [0])), tmp_path, dask="local", progress=False)


def test_an_invalid_grid_point_stops_the_sweep_before_the_first_run(tmp_path):
    sp = spec(Axis("policy.name", ["vllm", "no-such-policy", "sarathi"]))
    with pytest.raises(UserError, match=r"grid point 1 \(policy.name=no-such-policy\): policy.name: unknown policy"):
        run_sweep(sp, tmp_path, jobs=1, progress=False)
    assert not list((tmp_path / "points").glob("*.json"))
    with pytest.raises(UserError, match=r"grid point 0 \(cluster.replicas=0\): cluster.replicas: must be an integer"
                                        r" >= 1.*nothing was run"):
        run_sweep(spec(Axis("cluster.replicas", [0, 1])), tmp_path, progress=False)
    with pytest.raises(UserError, match=r"grid point 0 .*2 of 3 points are invalid"):
        run_sweep(spec(Axis("workload.num_requests", [0, -1, 2])), tmp_path, progress=False)


def test_a_point_failing_while_it_runs_is_recorded_and_the_rest_complete(tmp_path, monkeypatch):
    """A point that passes the check can still fail in its run (a stuck policy, say): that is data, kept per point.
    The check is switched off here so that a bad policy name stands for such a failure."""
    import study.sweep as sweep_mod
    monkeypatch.setattr(sweep_mod, "check_points", lambda spec, points: None)
    sp = spec(Axis("policy.name", ["vllm", "no-such-policy", "sarathi"]))
    res = run_sweep(sp, tmp_path, jobs=1, progress=False)
    df = res.table
    assert list(df["status"]) == ["ok", "error", "ok"]
    assert "unknown policy 'no-such-policy'" in df["error"][1]
    assert df["completed"][0] == 24 and df["completed"][2] == 24 and pd.isna(df["completed"][1])
    rec = json.loads(PointStore(tmp_path).path(df["key"][1]).read_text())
    assert rec["row"]["status"] == "error"
    assert run_sweep(sp, tmp_path, progress=False).ran == 0               # errors count as done ...
    assert run_sweep(sp, tmp_path, progress=False, retry_errors=True).ran == 1   # ... unless asked to retry


def test_a_mistyped_axis_fails_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match="memroy"):
        run_sweep(spec(Axis("memroy.M", [1, 2])), tmp_path, progress=False)
    assert not list((tmp_path / "points").glob("*.json"))


@pytest.mark.parametrize("key,message", [("workload.rte", "unknown key(s) rte"),
                                         ("policy.Cx", "unknown knob(s) Cx"),
                                         ("costmodel.fo", "unknown key(s) fo")])
def test_a_mistyped_key_inside_a_free_form_section_fails_before_anything_runs(tmp_path, key, message):
    """policy, costmodel and workload check their keys only when built: the sweep builds them for the first point."""
    with pytest.raises(UserError, match=re.escape(message)):
        run_sweep(spec(Axis(key, [1, 2])), tmp_path, progress=False)
    assert not list((tmp_path / "points").glob("*.json"))
    with pytest.raises(UserError, match=re.escape(message)):         # the same key given as --set
        run_sweep(load_sweep(REPO / "examples/poisson-10k.yaml", ["seed=0,1"], [f"{key}=1"]), tmp_path,
                  progress=False)


def test_cli_sweep_and_sweep_files(tmp_path, capsys):
    rc = main(["sweep", str(REPO / "examples/infermax-default.yaml"), "--grid", "memory.M=2e3,4e3",
               "--set", "workload.num_requests=8", "--set", "workload.output=4", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert list(df["memory.M"]) == [2000, 4000] and (df["requests"] == 8).all()
    shown = capsys.readouterr().out.splitlines()          # the per-point table printed after the sweep
    assert re.findall(r"\S+ \([^)]*\)|\S+", shown[1]) == [      # every column with its unit
        "memory.M (tokens)", "tps (tokens/s)", "ttft_p50 (s)", "ttft_p99 (s)", "tpot_p99 (s/token)",
        "slo_attainment (fraction)", "evictions (count)"]
    assert [line.split()[0] for line in shown[2:4]] == ["2000", "4000"]
    base = ["sweep", str(REPO / "examples/infermax-default.yaml"), "--grid", "memory.M=2e3,4e3", "--set",
            "workload.num_requests=8", "--set", "workload.output=4", "--out", str(tmp_path), "--no-progress"]
    assert main(base + ["--show", "none"]) == 0 and len(capsys.readouterr().out.splitlines()) == 1
    assert main(base + ["--show", "tps,nosuch"]) == 2
    assert "--show: no column(s) nosuch" in capsys.readouterr().err
    fig9 = load_sweep(REPO / "examples/sweeps/infermax-fig9.yaml")
    pts = expand(fig9)
    assert len(pts) == 5 * 11 * 4
    assert {p.raw["workload"]["output"] for p in pts} == {32}
    conv = load_sweep(REPO / "examples/sweeps/conv-rate-presets.yaml", ["workload.rate=1,2"])
    assert [a.key for a in conv.axes] == ["workload.rate", "policy.name", "seed"]
    assert conv.axes[0].values == [1, 2]
    from policies import POLICIES
    from policies.unified import UnifiedScheduler
    assert set(conv.axes[1].values) == {n for n, (cls, _, _) in POLICIES.items() if cls is UnifiedScheduler}


def _descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc to find the worker processes")
def test_a_killed_sweep_leaves_no_worker_running(tmp_path):
    # long points (200k requests each) so the workers are mid-simulation when the sweep's process is killed
    cmd = [sys.executable, "-m", "sim.cli", "sweep", "examples/poisson-10k.yaml", "--grid", "seed=0,1,2",
           "--set", "workload.num_requests=200000", "--set", "sim.record_iterations=false", "--jobs", "2",
           "--out", str(tmp_path / "sweep"), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers, t0 = [], time.time()
    while len(workers) < 3 and time.time() - t0 < 60:     # the forkserver and two workers
        time.sleep(0.2)
        workers = _descendants(proc.pid)
    assert len(workers) >= 3
    proc.kill()
    proc.wait()
    t0 = time.time()
    while any(_running(p) for p in workers) and time.time() - t0 < 15:
        time.sleep(0.2)
    left = [p for p in workers if _running(p)]
    for p in left:                                         # do not leave them behind if the assertion fails
        os.kill(p, 9)
    assert not left
