"""Row stamps: a hash of the code each paper's report rows depend on, so a stale row fails CI."""
from __future__ import annotations

import ast
import hashlib

from sim.paths import REPO_ROOT

# The files each paper's rows depend on: its policies, the cost model, its claim module and setups. A row's stamp
# is the hash of these files when it was computed; tests/findings/test_verdicts.py fails on a stale row.
COMMON = ("costmodels/*.py", "study/findings/registry.py", "study/findings/verdicts.py",
          "study/findings/stamps.py", "study/findings/runs.py",
          "policies/base.py", "policies/unified.py", "policies/vllm.py")
DEPENDS = {
    "infermax": ("study/findings/infermax.py", "study/findings/toy.py", "solver/*.py"),
    "aptserve": ("study/findings/aptserve.py", "study/findings/aptbros.py", "policies/aptserve*.py",
                 "policies/vllm*.py", "examples/aptserve-sharegpt.yaml"),
    "bros": ("study/findings/bros.py", "study/findings/aptbros.py", "policies/bros*.py",
             "examples/bros-rt-be.yaml"),
    "econoserve": ("study/findings/econoserve.py", "study/findings/length_aware.py", "policies/econoserve*.py",
                   "policies/length_aware.py"),
    "alise": ("study/findings/alise.py", "study/findings/length_aware.py", "policies/alise*.py",
              "policies/length_aware.py"),
}


def stamp_files(paper: str) -> list:
    pats = COMMON + DEPENDS.get(paper, ())
    files = set()
    for p in pats:
        files.update(f for f in REPO_ROOT.glob(p) if f.is_file())
    return sorted(files)


def row_stamp(paper: str) -> str:
    """Hash of the files a paper's rows depend on (code version of a report row)."""
    h = hashlib.sha256()
    for f in stamp_files(paper):
        h.update(str(f.relative_to(REPO_ROOT)).encode())
        h.update(code_of(f))
    return h.hexdigest()[:12]


def code_of(path) -> bytes:
    """What a file computes: a Python module's syntax tree without docstrings (comments never reach it), a YAML
    file's data, so editing prose leaves the rows current; any other file's bytes."""
    if path.suffix in (".yaml", ".yml"):            # its data, not its comments
        import json
        import yaml
        return json.dumps(yaml.safe_load(path.read_text()), sort_keys=True, default=str).encode()
    if path.suffix != ".py":
        return path.read_bytes()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


