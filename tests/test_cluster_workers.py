"""A decomposed cluster (a router that reads no replica state) gives the same tables whether its replicas run in
this process or in 2 or 3 worker processes (sim/cluster/decompose.py), and the same as the listed requests' run."""
import math

import numpy as np
import pandas as pd
import pytest

from costmodels.errors import UserError
from sim.cluster import decompose
from sim.cluster.cluster import Cluster
from sim.cluster.results import cluster_result
from sim.cluster.routers import build_router
from sim.scenario.build import requests_from_table
from sim.scenario.config import scenario_from_dict
from traces import build_workload

WORKLOAD = {"kind": "poisson", "num_requests": 900, "rate": 60, "prompt": {"dist": "lognormal", "mu": 5.5,
            "sigma": 1.0, "min": 2, "max": 3000}, "output": {"dist": "lognormal", "mu": 4.0, "sigma": 0.9,
                                                               "min": 1, "max": 600}}


def _raw(router="round_robin", policy="sarathi", workers=1, replicas=7, **extra):
    return {"name": "w", "seed": 11, "memory": {"M": 30000}, "policy": {"name": policy}, "workload": WORKLOAD,
            "cluster": {"replicas": replicas, "router": router, "workers": workers}, **extra}


def _run(raw, requests=None):
    scn = scenario_from_dict(raw)
    c = Cluster(scn, requests)
    return c, cluster_result(scn, c.run(), 0.0)


def _same(a, b):
    """Every table exactly: values, dtypes, column order and row order (a reordered or missing column or row, or
    one float off by an ulp, fails)."""
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    pd.testing.assert_frame_equal(a.tables["replicas"], b.tables["replicas"], check_exact=True)
    assert a.summary.keys() == b.summary.keys()
    for k, v in a.summary.items():
        if k != "wall_s":
            w = b.summary[k]
            assert v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), k
    assert {k: v for k, v in a.meta.items() if k != "wall_s"} == {k: v for k, v in b.meta.items() if k != "wall_s"}


@pytest.mark.parametrize("router,policy,extra", [
    ("round_robin", "sarathi", {}),
    ("random", "vllm", {}),
    ("round_robin", "orca", {"sim": {"record_iterations": False}}),
    ("random", "vllm", {"model": {"name": "llama-3.1-8b", "max_model_len": 8192},
                           "hardware": {"gpu": "h100-sxm"},
                           "speculative": {"method": "eagle", "k": 3, "acceptance_rate": 0.7}}),
])
def test_worker_processes_give_the_one_process_tables(router, policy, extra):
    one = None
    for workers in (1, 2, 3):
        c, res = _run(_raw(router, policy, workers, **extra))
        assert c.stream and decompose.worker_count(workers, 900, 7) == workers
        if one is None:
            one = res
            continue
        _same(one, res)
    req = one.requests          # sorted by (arrival, id); every replica took part
    assert (np.diff(req["arrival_s"].to_numpy()) >= 0).all() and set(req["replica"]) == set(range(7))
    if "speculative" in extra:
        assert one.summary["spec_steps"] > 0
    # the listed requests (no streaming: the requests as objects, run in this process) give the same tables
    raw = _raw(router, policy, 3, **extra)
    scn = scenario_from_dict(raw)
    listed = requests_from_table(build_workload(scn.workload, np.random.default_rng(scn.seed)))
    c, res = _run(raw, listed)
    assert not c.stream
    _same(one, res)


def test_a_reordered_replica_would_show():
    """The comparison above notices a replica's rows placed differently (what a worker mix-up would do)."""
    _, a = _run(_raw(workers=2))
    _, b = _run(_raw(workers=2))
    req = b.requests
    i = req.index[req["replica"] == 3]
    req.loc[i, "replica"] = 4
    with pytest.raises(AssertionError):
        _same(a, b)


@pytest.mark.parametrize("name", ["round_robin", "random"])
def test_placing_at_once_is_picking_one_by_one(name):
    for n, replicas in ((0, 3), (1, 3), (1000, 7), (5000, 100)):
        a, b = (build_router(name, np.random.default_rng([4, 1])) for _ in range(2))
        one = [a.pick(None, range(replicas), 0.0) for _ in range(n)]
        assert b.place(n, replicas).tolist() == one
        assert a.pick(None, range(replicas), 0.0) == int(b.place(1, replicas)[0])     # and they go on alike


@pytest.mark.parametrize("bad", [-1, 1.5, "many", True, [2]])
def test_a_bad_workers_value_is_one_line(bad):
    with pytest.raises(UserError, match=r"^cluster\.workers: expected auto .* got ") as e:
        _run(_raw(workers=bad))
    assert "\n" not in str(e.value)


def test_auto_workers():
    assert decompose.parse_workers(None) == decompose.parse_workers(0) == "auto"
    assert decompose.worker_count("auto", decompose.AUTO_MIN_REQUESTS - 1, 100) == 1     # small: this process
    big = decompose.worker_count("auto", decompose.AUTO_MIN_REQUESTS, 100)
    assert big == min(decompose.cpu_count(), 100)
    assert decompose.worker_count("auto", 10 ** 7, 1) == 1
    assert decompose.worker_count(8, 10, 3) == 3                  # never more than the replicas with requests


def test_small_chunks_give_the_same_tables(monkeypatch):
    _, one = _run(_raw(workers=1))
    monkeypatch.setattr(decompose, "CHUNK_REQUESTS", 50)        # a replica (about 130 requests) per task
    _, many = _run(_raw(workers=2))
    _same(one, many)


def test_cli_workers_flag(tmp_path, capsys):
    import yaml
    from sim.cli import main
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_raw(workers=1)))
    assert main(["run", str(path), "--workers", "2"]) == 0
    assert main(["run", str(path), "--workers", "two"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("servesim: error: --workers: expected auto")


def test_a_placement_off_the_pool_is_one_line(monkeypatch):
    from sim.cluster.routers import RoundRobin
    monkeypatch.setattr(RoundRobin, "place", lambda self, n, replicas: np.full(n, replicas))
    with pytest.raises(UserError, match=r"^cluster\.router: router 'round_robin' placed a request on replica 7, "
                                        r"but the pool has 7 replicas"):
        _run(_raw())


def test_a_worker_that_dies_is_one_line_not_a_hang(monkeypatch):
    import os
    run_replica = decompose.Decomposed.run_replica

    def dies_on_3(self, i):
        if i == 3:
            os._exit(1)                   # (in a worker: what the kernel's OOM killer does)
        run_replica(self, i)
    monkeypatch.setattr(decompose.Decomposed, "run_replica", dies_on_3)
    monkeypatch.setattr(decompose, "CHUNK_REQUESTS", 50)
    with pytest.raises(UserError, match=r"^cluster\.workers: a worker process ended abruptly"):
        _run(_raw(workers=2))


def test_an_error_in_a_worker_reaches_the_caller(monkeypatch):
    def fails(self, i):
        raise UserError(f"replica {i} refused")
    monkeypatch.setattr(decompose.Decomposed, "run_replica", fails)
    with pytest.raises(UserError, match=r"^replica \d refused$"):
        _run(_raw(workers=2))



def test_an_extension_that_picks_its_own_way_is_asked_request_by_request(monkeypatch):
    """A subclass of random that overrides pick (and inherits place) is placed by its own pick, not its parent's:
    every request lands where its pick says, with 1 or 2 workers."""
    from sim.cluster import routers
    from sim.cluster.decompose import _places_as_it_picks

    class Last(routers.Random):
        name = "last"

        def pick(self, req, replicas, now):
            return len(replicas) - 1

    monkeypatch.setitem(routers.ROUTERS, "last", (Last, "the last replica, always"))
    assert _places_as_it_picks(build_router("random", np.random.default_rng(0)))
    assert not _places_as_it_picks(build_router("last", np.random.default_rng(0)))
    for workers in (1, 2):
        _, res = _run(_raw("last", workers=workers))
        assert set(res.requests["replica"]) == {6}


def test_guided_chunks_cover_every_replica_once_and_shrink():
    """The pool's tasks: every replica once, in order, consecutive; sizes shrink towards one replica at the end;
    the request cap splits tasks except where one replica alone is over it."""
    replicas = list(range(3, 103))                  # 100 replicas with requests (indices need not start at 0)
    chunks = decompose.guided_chunks(replicas, [10] * 100, workers=2)
    assert [i for c in chunks for i in c] == replicas
    sizes = [len(c) for c in chunks]
    assert sizes[0] == 13                           # ceil(100 / (2 workers x 4)), worked by hand
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1
    assert sum(sizes) == 100
    cap = decompose.CHUNK_REQUESTS
    big = decompose.guided_chunks(list(range(40)), [cap // 2, cap // 2, cap + 5] + [1] * 37, workers=1)
    # tasks of ceil(40 / 4) = 10 replicas: the cap takes two halves; a replica over it runs alone; then 10 again
    assert big[:3] == [[0, 1], [2], list(range(3, 13))]
    assert decompose.guided_chunks([], [], workers=2) == []
