"""The bad inputs of the third round (issue 34), one hand-written case per class: each ends in one line naming the
field, option, file or grid point and what is allowed (exit 2), never a traceback, a silent replacement or exit 0."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodels.errors import UserError
from sim.cli import main

SMALL = "workload: {kind: offline, num_requests: 4, prompt: 16, output: 4}\n"
CLUSTER = SMALL + "cluster: {replicas: 2, router: round_robin}\n"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def scenario(tmp_path):
    def write(text=SMALL, name="s.yaml"):
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return write


def one_line_error(capsys, argv) -> str:
    """Run the CLI in this process; it must exit 2 with exactly one `servesim: error:` line on stderr."""
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("servesim: note:")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("servesim: error: "), (rc, err)
    return err[0]


# -- tracebacks --------------------------------------------------------------------------------------------------
def test_a_list_where_a_name_belongs_in_set(capsys, scenario):
    """It ended in `TypeError: unhashable type: 'list'`."""
    line = one_line_error(capsys, ["run", scenario(), "--set", "policy.name=[vllm,sarathi]"])
    assert "policy.name: expected a name (one string), got a list ['vllm', 'sarathi']" in line


def test_a_number_that_overflows_a_float(capsys, scenario):
    """1e400 reads as inf; it ended in `OverflowError: cannot convert float infinity to integer`."""
    line = one_line_error(capsys, ["run", scenario(), "--set", "memory.swap_space_gib=1e400"])
    assert "memory.swap_space_gib: expected a number, got inf" in line
    line = one_line_error(capsys, ["run", scenario(), "--set", "memory.swap_space_gib=1e300"])
    assert "memory.swap_space_gib: must be >= 0 and <= 1e+06 GiB" in line


def test_a_non_numeric_router_knob(capsys, scenario):
    line = one_line_error(capsys, ["run", scenario(CLUSTER), "--set",
                                   "cluster.router={name: prefix_affinity, overlap_weight: abc}"])
    assert "cluster.router.overlap_weight: router 'prefix_affinity' takes a float here, got 'abc'" in line
    line = one_line_error(capsys, ["run", scenario(CLUSTER), "--set",
                                   "cluster.router={name: prefix_affinity, overlap_weight: .nan}"])
    assert "cluster.router.overlap_weight: expected a number, got nan" in line


@pytest.mark.parametrize("seeds,message", [("1.5", "got '1.5'"), ("0,x", "got 'x'"),
                                           ("0,,1", "an empty item in '0,,1'"), ("-1", "seeds must be >= 0, got -1")])
def test_plan_seeds_that_are_not_integers(capsys, scenario, seeds, message):
    line = one_line_error(capsys, ["plan", scenario(CLUSTER), "--rate", "2", f"--seeds={seeds}"])
    assert line.startswith("servesim: error: plan --seeds: ") and message in line


@pytest.mark.parametrize("args,message", [
    (["plan", "CLUSTER", "--rate", "2", "--bound-requests", "-5"],
     "plan --bound-requests: must be >= 0 (0: all requests), got -5"),
    (["plan", "CLUSTER", "--rate", "2", "--prune", "-1"], "plan --prune: must be >= 0 (0: search every configuration)"),
    (["capacity", "SINGLE", "--rate-start", "0"], "--rate-start: must be > 0 requests/s, got 0"),
    (["capacity", "SINGLE", "--target-rate", "-5"], "--target-rate: must be > 0 requests/s, got -5"),
    (["capacity", "SINGLE", "--max-evals", "0"], "--max-evals: must be >= 1, got 0")])
def test_search_options_out_of_range(capsys, scenario, args, message):
    """Each was taken without a word: a negative --bound-requests cut the bounds' workload to a negative size,
    --rate-start 0 fell back to the scenario's rate, --target-rate -5 printed 0 replicas needed, --max-evals 0
    blamed the tolerance."""
    path = scenario(CLUSTER if args[1] == "CLUSTER" else SMALL.replace("offline", "poisson, rate: 2")
                    + "slo: {ttft_s: 1}\n")
    line = one_line_error(capsys, [args[0], path, *args[2:]])
    assert line.startswith(f"servesim: error: {message}"), line


@pytest.mark.parametrize("args,message", [
    (["--max-tokens", "16"], "--max-tokens: must be >= 32 (the largest token count and context timed), got 16"),
    (["--max-tokens", "0"], "--max-tokens: must be >= 32"), (["--max-tokens", "-5"], "--max-tokens: must be >= 32"),
    (["--repeats", "0"], "--repeats: must be >= 1 (timed repeats per point), got 0"),
    (["--iterations", "-1"], "--iterations: must be >= 0 (0: no whole iterations), got -1"),
    (["--collectives", "--repeats", "0"], "--repeats: must be >= 1 (timed repeats per point), got 0")])  # was 20
def test_profile_grid_options_out_of_range(capsys, tmp_path, args, message):
    """--max-tokens -5 (or anything under 32) ended in numpy's `ValueError: a cannot be empty`; 0 and --repeats 0
    fell back to the defaults without a word. Checked before any backend is made (no PyTorch needed)."""
    line = one_line_error(capsys, ["profile", "--model", "tiny-llama", "--device", "cpu", "--backend", "numpy",
                                   "--quick", "--out", str(tmp_path / "p.csv"), *args])
    assert line.startswith(f"servesim: error: {message}"), line
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("seed,extra,message", [
    ("-3", [], "s.yaml: seed: expected an integer >= 0, got -3"),
    ("x", [], "s.yaml: seed: expected an integer, got 'x'"),
    ("1.5", [], "s.yaml: seed: expected an integer, got 1.5"),
    ("0", ["--seed", "-1"], "--seed: expected an integer >= 0")])
def test_trace_make_seeds_as_a_scenario_takes_them(capsys, scenario, tmp_path, seed, extra, message):
    """A negative seed ended in numpy's `ValueError: expected non-negative integer`, a text one in int()'s; 1.5 was
    read as 1."""
    spec = scenario(f"seed: {seed}\n" + SMALL.replace("offline", "poisson, rate: 1"))
    line = one_line_error(capsys, ["trace", "make", spec, "-o", str(tmp_path / "t.csv"), *extra])
    assert message in line, line
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("args,message", [
    (["--test-frac", "1.5"], "--test-frac: must be in (0, 1) (the share of configurations held out), got 1.5"),
    (["--test-frac", "0"], "--test-frac: must be in (0, 1)"), (["--seed", "-1"], "--seed: must be >= 0, got -1"),
    (["--tp", "0"], "--tp: must be >= 1 (a tensor-parallel degree), got 0")])
def test_calibrate_split_options_out_of_range(capsys, tmp_path, args, message):
    """--test-frac 1.5 and --seed -1 were numpy tracebacks; --test-frac 0 still held out a row per operator and
    --tp 0 was ignored. Checked before the profiles are read or a model is written."""
    line = one_line_error(capsys, ["calibrate", "--model", "tiny-llama", "--gpu", "a100-80gb", "-o",
                                   str(tmp_path / "m.yaml"), str(tmp_path / "p.csv"), *args])
    assert line.startswith(f"servesim: error: {message}"), line
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.parametrize("size", ["0", "-16"])
def test_a_kv_block_of_no_tokens(capsys, scenario, size):
    """memory.block_size 0 ended in `ZeroDivisionError: float floor division by zero` while sizing the CPU tier."""
    line = one_line_error(capsys, ["run", scenario(), "--set", f"memory.block_size={size}"])
    assert line.endswith(f"memory.block_size: must be an integer >= 1 (tokens per KV block; vLLM's default is 16), "
                         f"got {size}"), line


def test_a_kv_dtype_outside_the_catalog_names_the_field(capsys, scenario):
    """The catalog's check said only "dtype: 'fp3' is not allowed", not which field of the scenario held it."""
    line = one_line_error(capsys, ["run", scenario(), "--set", "memory.kv_dtype=fp3"])
    assert line.endswith("memory.kv_dtype: 'fp3' is not allowed; allowed: fp32, fp16, bf16, fp8, int8, int4 "
                         "(or null: the model's)"), line


@pytest.mark.parametrize("args,message", [
    (["attainment", "--target", "1.5"], "--target: an attainment target must be in (0, 1], got 1.5"),
    (["attainment", "--target", "-1"], "--target: an attainment target must be in (0, 1], got -1"),
    (["timeline", "--capacity-tokens", "0"], "--capacity-tokens: must be >= 1 (KV tokens, M), got 0")])
def test_plot_options_out_of_range(capsys, tmp_path, args, message):
    """--target 1.5 drew a target line off the attainment scale; --capacity-tokens 0 fell back to the run's M."""
    line = one_line_error(capsys, ["plot", args[0], str(tmp_path), *args[1:], "--out", str(tmp_path / "p")])
    assert line == f"servesim: error: {message}", line


@pytest.mark.parametrize("only", [",17", "17,,20", " "])
def test_validate_only_with_an_empty_item(capsys, only):
    """--only ,17 said "unknown experiment id(s) ;" naming an empty id. Refused before any data is read."""
    line = one_line_error(capsys, ["validate", "--only", only])
    assert line == f"servesim: error: validate --only: an empty item in {only!r}; give comma-separated experiment ids"


def test_numeric_options_of_every_command_are_finite(capsys, scenario):
    line = one_line_error(capsys, ["plan", scenario(CLUSTER), "--rate", "nan"])
    assert line == "servesim: error: --rate: expected a finite number, got 'nan'"
    line = one_line_error(capsys, ["sweep", scenario(), "--grid", "seed=0,1", "--jobs", "two"])
    assert line == "servesim: error: --jobs: expected an integer, got 'two'"


def test_validate_data_whose_yaml_does_not_parse(capsys, tmp_path):
    (tmp_path / "experiments.csv").write_text("exp_id,hf_model,hardware,workload,tp,gpu_memory_utilization,"
                                              "max_num_batched_tokens,max_num_seqs,vllm_kv_blocks_gpu,"
                                              "vllm_kv_blocks_cpu\n")
    (tmp_path / "workloads.yaml").write_text("workloads: [a\n")
    line = one_line_error(capsys, ["validate", "--data", str(tmp_path)])
    assert "workloads.yaml: line 2 is not valid YAML" in line
    (tmp_path / "workloads.yaml").write_text("workloads: {}\n")
    line = one_line_error(capsys, ["validate", "--data", str(tmp_path)])
    assert "experiments.csv: no experiments (no rows)" in line


@pytest.mark.parametrize("pick", ["'x'", "5", "-1", "True"])
def test_an_extension_router_that_returns_no_replica(monkeypatch, pick):
    from sim.cluster import routers
    from sim.cluster.runner import run_scenario
    from sim.scenario.config import scenario_from_dict
    import yaml
    monkeypatch.setattr(routers, "ROUTERS", dict(routers.ROUTERS))
    ns = {}
    exec(f"def pick(self, req, replicas, now):\n    return {pick}\n", ns)
    bad = type("Bad", (routers.Router,), {"name": "bad", "pick": ns["pick"]})
    routers.register_router("bad", bad, "returns no replica")
    raw = yaml.safe_load(CLUSTER)
    raw["cluster"]["router"] = "bad"
    with pytest.raises(UserError, match=r"cluster.router: router 'bad' picked .* but the pool has 2 replicas "
                                        r"\(an index 0..1\)"):
        run_scenario(scenario_from_dict(raw))


# -- silently wrong ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["workload.rate=1e-300", "workload.rate=1e-10"])
def test_a_rate_whose_gaps_lose_all_precision_is_refused_with_the_limit(capsys, scenario, setting):
    """rate=1e-300 ran and printed TTFT 0.9 ms and TPOT 0: the arrival times had lost every digit."""
    line = one_line_error(capsys, ["run", scenario(), "--set", "workload.kind=poisson", "--set", setting])
    assert "workload.rate:" in line and "the lowest rate allowed is 1e-09 requests/s" in line
    assert main(["run", scenario(), "--set", "workload.kind=poisson", "--set", "workload.rate=1e-9"]) == 0


def test_a_duplicate_registry_name_is_refused_unless_replace(monkeypatch):
    from costmodels.registry import take_replacements
    from policies import POLICIES, register_policy
    from sim.cluster.routers import ROUTERS, register_router
    from traces.registry import WORKLOADS, register_workload
    from costmodels.base import COSTMODELS, register_costmodel
    with pytest.raises(UserError, match=r"register_policy: policy 'vllm' is already registered; .* replace=True"):
        register_policy("vllm", POLICIES["sarathi"][0], "a second vllm")
    with pytest.raises(UserError, match="router 'round_robin' is already registered"):
        register_router("round_robin", ROUTERS["random"][0], "again")
    with pytest.raises(UserError, match="workload 'poisson' is already registered"):
        register_workload("poisson")(WORKLOADS["gamma"])
    with pytest.raises(UserError, match="costmodel 'linear' is already registered"):
        register_costmodel("linear")(COSTMODELS["linear"])
    take_replacements()
    monkeypatch.setitem(POLICIES, "vllm", POLICIES["vllm"])          # restored after the test
    register_policy("vllm", POLICIES["sarathi"][0], "replaced on purpose", replace=True)
    assert POLICIES["vllm"][2] == "replaced on purpose" and take_replacements() == [("policy", "vllm")]


def test_the_run_says_an_extension_replaced_a_builtin(tmp_path, scenario):
    ext = tmp_path / "ext.py"
    ext.write_text("from policies import POLICIES, register_policy\n"
                   "register_policy('vllm', *POLICIES['vllm'][:1], 'my vllm', replace=True)\n")
    env = {**os.environ, "SERVESIM_EXTENSIONS": str(ext), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", scenario()], capture_output=True, text=True,
                         env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert f"servesim: note: SERVESIM_EXTENSIONS: {ext} replaced the policy 'vllm' (it said replace=True)" \
        in out.stderr
    ext.write_text("from policies import POLICIES, register_policy\n"
                   "register_policy('vllm', *POLICIES['vllm'][:1], 'my vllm')\n")
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", scenario()], capture_output=True, text=True,
                         env=env, cwd=REPO)
    assert out.returncode == 2 and "policy 'vllm' is already registered" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- misleading --------------------------------------------------------------------------------------------------
def test_invalid_json_in_a_json_lines_trace_is_named_as_such(capsys, tmp_path):
    """Whatever the suffix: it was read as a CSV header and reported as columns the format lacks."""
    p = tmp_path / "trace.txt"
    p.write_text('{"timestamp": 0, "input_length": 3, "output_length": 4}\n{bad\n')
    line = one_line_error(capsys, ["trace", "stats", str(p)])
    assert line.endswith("trace.txt:2: not valid JSON (Expecting property name enclosed in double quotes)")


@pytest.mark.parametrize("grid,message", [
    ("policy.name=vllm,nope", "grid point 1 (policy.name=nope): policy.name: unknown policy 'nope'"),
    ("cluster.replicas=0,1", "grid point 0 (cluster.replicas=0): cluster.replicas: must be an integer >= 1")])
def test_a_sweep_with_an_invalid_point_exits_2_before_running(capsys, scenario, tmp_path, grid, message):
    line = one_line_error(capsys, ["sweep", scenario(CLUSTER), "--grid", grid, "--out", str(tmp_path / "sw")])
    assert message in line and "nothing was run" in line
    assert not list((tmp_path / "sw").glob("points/*.json"))


def test_a_negative_max_requests_names_its_own_field(capsys, scenario, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,7\n")
    line = one_line_error(capsys, ["run", scenario(), "--set",
                                   f"workload={{kind: trace, path: {trace}, format: servesim, max_requests: -1}}"])
    assert "workload.max_requests: expected an integer >= 1, got -1" in line and "num_requests" not in line


def test_plot_metric_on_a_file_that_is_not_a_sweep(capsys, scenario, tmp_path):
    run_dir = tmp_path / "run"
    assert main(["run", scenario(), "--out", str(run_dir)]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["plot", "metric", str(run_dir), "--y", "ttft_p99"])
    assert "is not a sweep or capacity results table" in line and "no rows left" not in line
    empty = tmp_path / "empty.csv"
    empty.write_text("a,b\n")
    assert "has no rows" in one_line_error(capsys, ["plot", "metric", str(empty)])


def test_an_extension_path_that_is_a_directory(tmp_path):
    from sim.scenario.extensions import load_extensions
    d = tmp_path / "ext.py"
    d.mkdir()
    with pytest.raises(UserError, match=r"ext.py: is a directory; name a .py file or an importable module"):
        load_extensions(str(d))


@pytest.mark.parametrize("cluster,field", [
    ("{replicas: [{count: 1}, {count: 1, hardware: {gpu: nogpu}}]}", "cluster.replicas[1].hardware.gpu"),
    ("{disaggregation: {prefill: {count: 1, hardware: {tp: 3}}, decode: 1}}",
     "cluster.disaggregation.prefill.hardware.tp")])
def test_a_replica_groups_error_names_the_groups_field(capsys, scenario, cluster, field):
    line = one_line_error(capsys, ["run", scenario(), "--set", f"cluster={cluster}"])
    assert line.startswith(f"servesim: error: {field}: ")


def test_an_empty_stage_list(capsys, scenario):
    """With num_requests in the file it said 'give stages ... or arrival + num_requests, not both'."""
    text = "workload: {kind: shared_prefix, num_requests: 4}\n"
    line = one_line_error(capsys, ["run", scenario(text), "--set", "workload.stages=[]"])
    assert "workload.stages: the list is empty" in line and "not both" not in line


# -- units -------------------------------------------------------------------------------------------------------
def test_trace_stats_and_cluster_tables_carry_units(capsys, scenario, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,7\n2,30,9\n")
    assert main(["trace", "stats", str(trace)]) == 0
    rows = {ln.split()[0]: ln.split()[1:] for ln in capsys.readouterr().out.splitlines()[1:]}
    assert rows["duration_s"] == ["2", "s"] and rows["rate_rps"] == ["1.5", "req/s"]
    assert rows["prompt_p50"] == ["20", "tokens"] and rows["requests"] == ["3", "requests"]
    assert main(["run", scenario(CLUSTER)]) == 0
    out = capsys.readouterr().out
    assert "routed (requests)" in out and "ttft_p99 (s)" in out and "kv_util_mean (fraction of M)" in out


def test_an_extension_cost_model_returning_nan_or_a_negative_time(monkeypatch):
    """A cost model is an extension point too: a batch time that is NaN, inf or negative would corrupt the clock."""
    from sim.cluster.runner import run_scenario
    from sim.scenario.build import build_simulation
    from sim.scenario.config import scenario_from_dict
    import yaml
    scn = scenario_from_dict(yaml.safe_load(SMALL), ["sim.fast_forward=false"])
    for bad in (float("nan"), -1.0, float("inf")):
        sim = build_simulation(scn)
        monkeypatch.setattr(sim.costmodel, "batch_time", lambda shape, bad=bad: bad)
        with pytest.raises(UserError, match=r"batch_time returned .* seconds .* must be a finite number >= 0"):
            sim.run()
    assert run_scenario(scn).summary["completed"] == 4


@pytest.mark.parametrize("argv,message", [(["MISSING"], "no <node kind>/all_reduce.csv under it; nothing written"),
                                          (["EMPTY"], "no <node kind>/all_reduce.csv under it; nothing written"),
                                          ([], "usage: python -m costmodels.collectives FOLDER")])
def test_collectives_fit_without_profiles_keeps_the_shipped_fit(capsys, monkeypatch, tmp_path, argv, message):
    """`python -m costmodels.collectives` on a folder without profiles (a typo) overwrote profiles/collectives.yaml
    with an empty NCCL fit and exited 0."""
    from costmodels import collectives
    shipped = tmp_path / "collectives.yaml"
    shipped.write_text("the shipped fit\n")
    monkeypatch.setattr(collectives, "FIT_PATH", shipped)
    (tmp_path / "empty" / "a100_dgx").mkdir(parents=True)
    folders = {"MISSING": str(tmp_path / "nowhere"), "EMPTY": str(tmp_path / "empty")}
    assert collectives.main([folders.get(a, a) for a in argv]) == 2
    assert message in capsys.readouterr().err
    assert shipped.read_text() == "the shipped fit\n"


def test_collectives_fit_from_the_shared_profiles_writes_every_node_kind(capsys, monkeypatch, tmp_path):
    """The good path still writes the fit: one two-line model per node kind and GPU count."""
    import yaml
    from costmodels import collectives
    from sim.paths import shared_data_dir
    root = shared_data_dir()
    folder = root / "profiles" / "vidur-network" if root is not None else None
    if folder is None or not folder.is_dir():
        pytest.skip("needs ../shared/data/profiles/vidur-network")
    monkeypatch.setattr(collectives, "FIT_PATH", tmp_path / "collectives.yaml")
    assert collectives.main([str(folder)]) == 0
    fit = yaml.safe_load((tmp_path / "collectives.yaml").read_text())
    kinds = sorted(p.name for p in folder.iterdir() if (p / "all_reduce.csv").is_file())
    assert sorted(fit["nccl"]) == kinds and all(len(v) == 4 for k in kinds for v in fit["nccl"][k].values())
