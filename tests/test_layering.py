"""The rooms' import arrows point one way (docs/architecture.md): no module imports a higher room, and no two
modules import each other at load time. Every import counts, also the late ones inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim.paths import REPO_ROOT

PACKAGES = ("sim", "policies", "costmodels", "traces", "solver", "profiles")

# (room, rank, module prefixes), first match wins: a module may import its own room and any room of lower rank.
ROOMS = [
    ("base", 0, ("costmodels.errors", "sim.errors", "sim.paths")),
    ("cli", 10, ("sim.cli", "costmodels.cli", "solver.cli")),
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
    ("study", 9, ("sim.study",)),
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


def test_no_import_cycle_at_load_time():
    graph = {}
    for mod, path in all_modules():
        graph[mod] = {t for t, _, top in project_imports(path) if top and t != mod}
    state, cycle = {}, []

    def visit(m, stack):
        state[m] = 1
        for t in graph.get(m, ()):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycle.append(stack[stack.index(t):] + [t] if t in stack else [m, t])
            elif state.get(t) is None:
                visit(t, stack + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not cycle, f"import cycles: {cycle[:3]}"


@pytest.mark.parametrize("case", [("sim.engine.loop", "sim.study.sweep", True), ("sim.kv.paged", "sim.engine", True),
                                  ("policies.bros", "sim.kv.bidirectional", True),
                                  ("sim.study.sweep", "sim.engine.loop", False),
                                  ("traces.loaders", "sim.paths", False)])
def test_rule_on_hand_cases(case):
    """The rule itself: engine → study and kv → engine and policies → sim are upward; study → engine is down."""
    src, dst, upward = case
    (a, ra), (b, rb) = room_of(src), room_of(dst)
    assert (a != b and rb >= ra) is upward
