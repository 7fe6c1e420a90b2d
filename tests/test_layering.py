"""The rooms' import arrows point one way (docs/architecture.md): no module imports a higher room, and no module
imports itself around a circle of others. Every import counts, also the late ones inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim.paths import REPO_ROOT

PACKAGES = ("sim", "policies", "costmodels", "traces", "solver", "profiles", "study")

# (room, rank, module prefixes), first match wins: a module may import its own room and any room of lower rank.
ROOMS = [
    ("base", 0, ("costmodels.errors", "sim.errors", "sim.paths")),
    ("cli", 10, ("sim.cli", "costmodels.cli", "solver.cli")),
    ("options", 2, ("sim.options",)),                 # option-value checks: any command may use them
    ("sim-package", 10, ("sim",)),                     # sim/__init__.py: lazy re-exports of the public face
    ("costmodels", 1, ("costmodels",)),
    ("policies", 2, ("policies",)),
    ("profiles", 2, ("profiles",)),
    ("traces", 3, ("traces",)),
    ("kv", 4, ("sim.kv",)),
    ("metrics", 4, ("sim.metrics",)),
    ("engine", 5, ("sim.engine",)),
    ("scenario", 6, ("sim.scenario",)),
    ("cluster", 7, ("sim.cluster",)),
    ("solver", 8, ("solver",)),
    ("study", 9, ("study",)),                         # top-level: the tools that use the simulator and solver
]


def room_of(module: str):
    for name, rank, prefixes in ROOMS:
        for p in prefixes:
            if module == p or module.startswith(p + ".") and p != "sim":
                return name, rank
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(path: Path):
    """(imported module, line, at load time?) for every import of a project package in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import sub` may name a submodule: count the most specific module that exists.
            names = []
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                exists = (REPO_ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (REPO_ROOT / Path(*sub.split("."))).is_dir()
                names.append(sub if exists else node.module)
        for n in names:
            if n.split(".")[0] in PACKAGES:
                yield n, node.lineno, id(node) in top


def all_modules():
    for pkg in PACKAGES:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            yield module_name(path), path


def test_every_module_has_a_room():
    homeless = [m for m, _ in all_modules() if room_of(m) is None]
    assert not homeless, f"modules outside every room: {homeless}"


def test_no_upward_import():
    bad = []
    for mod, path in all_modules():
        src_room, src_rank = room_of(mod)
        for target, line, _ in project_imports(path):
            dst = room_of(target)
            if dst is None:
                continue
            dst_room, dst_rank = dst
            if dst_room != src_room and dst_rank >= src_rank:
                bad.append(f"{path.relative_to(REPO_ROOT)}:{line} ({src_room}) imports {target} ({dst_room})")
    assert not bad, "imports against the arrows:\n" + "\n".join(bad)


def reexports(package: str) -> dict:
    """name -> the module it comes from, for the `from X import name` lines at the top of a package's __init__."""
    init = REPO_ROOT / Path(*package.split(".")) / "__init__.py"
    if not init.exists():
        return {}
    out = {}
    for node in ast.parse(init.read_text(), str(init)).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                out[a.asname or a.name] = node.module
    return out


def import_graph() -> dict:
    """Module -> the project modules it imports, load-time and late ones alike. A module that imports a name from
    its own package (`from sim.metrics import X` inside sim/metrics/) is taken to import the module the package's
    __init__ re-exports X from: importing a submodule always runs its package's __init__ first, so an arrow to
    the package itself would make every package with re-exports look like a circle."""
    graph = {}
    for mod, path in all_modules():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    mod.startswith(node.module + "."):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if (REPO_ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or \
                            (REPO_ROOT / Path(*sub.split("."))).is_dir():
                        targets.add(sub)
                    else:
                        targets.add(reexports(node.module).get(a.name, node.module))
        targets.update(t for t, line, _ in project_imports(path)
                       if not (mod.startswith(t + ".") and t != mod))   # own package: resolved above
        graph[mod] = {t for t in targets if t != mod}
    return graph


def circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted: every one is an import
    circle. Arrows to modules outside the graph are ignored."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """No two project modules import each other, directly or around a circle; late imports inside functions count
    too (they only postpone the circle to the first call)."""
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_circle_finder_on_hand_cases():
    """The finder itself: a three-module circle (the shape sim/cluster once had: runner -> cluster -> results ->
    runner) is found, a chain, a self-import and an arrow out of the graph are not."""
    g = {"runner": {"cluster"}, "cluster": {"results"}, "results": {"runner", "counts"}, "counts": {"counts"},
         "x": {"numpy"}}
    assert circles(g) == [["cluster", "results", "runner"]]
    g["results"] = {"counts"}
    assert circles(g) == []


@pytest.mark.parametrize("case", [("sim.engine.loop", "study.sweep", True), ("sim.kv.paged", "sim.engine", True),
                                  ("policies.bros", "sim.kv.bidirectional", True),
                                  ("study.sweep", "sim.engine.loop", False),
                                  ("traces.loaders", "sim.paths", False),
                                  ("solver.solve", "study.plots", True), ("sim.cluster.runner", "study.progress", True),
                                  ("study.plan", "solver.solve", False), ("solver.cli", "study.plots", False),
                                  ("sim.cli", "study.sweep", False)])
def test_rule_on_hand_cases(case):
    """The rule itself: engine → study, kv → engine, policies → sim and solver → study are upward; study → engine,
    study → solver and the CLI modules → study are down."""
    src, dst, upward = case
    (a, ra), (b, rb) = room_of(src), room_of(dst)
    assert (a != b and rb >= ra) is upward


def test_study_is_its_own_package():
    """The study tools live in the top-level package `study`, not inside the simulator."""
    assert (REPO_ROOT / "study" / "__init__.py").exists()
    assert not list((REPO_ROOT / "sim").glob("study/**/*.py"))
