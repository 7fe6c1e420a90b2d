"""Every bad value the schema fuzzer generates (tests/schema_fuzz.py: each scenario field from the config schema
times wrong types, NaN/inf/overflow, huge, negative, empty, lists and mappings), each run through `servesim run`
in this process. Prints the counts by verdict (ok, traceback, hang, exit0-on-invalid, not-one-line) and writes
benchmarks/results/schema_fuzz.json. The acceptance: 0 tracebacks, 0 hangs, 0 exits with 0 on invalid input.

    PYTHONPATH=. python benchmarks/schema_fuzz.py
"""
from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results_io import write_json  # noqa: E402
from tests.schema_fuzz import BASE, CLUSTER_BASE, cases, run_case, verdict  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "schema_fuzz.json"


def main() -> int:
    all_cases = cases()
    with tempfile.TemporaryDirectory() as d:
        paths = {BASE: Path(d) / "base.yaml", CLUSTER_BASE: Path(d) / "cluster.yaml"}
        for text, p in paths.items():
            p.write_text(text)
        t0 = time.perf_counter()
        counts, by_class, bad = collections.Counter(), collections.Counter(), []
        for c in all_cases:
            out = run_case(c, paths[c.base])
            v = verdict(c, out)
            counts[v] += 1
            by_class[("invalid" if c.invalid else "suspicious", "exit 2" if out.rc == 2 else f"exit {out.rc}")] += 1
            if v != "ok":
                bad.append({"field": c.field, "value": c.text, "extra": list(c.extra), "verdict": v, "rc": out.rc,
                            "error": out.error, "stderr": out.lines[-3:]})
        wall = time.perf_counter() - t0
    fields = sorted({c.field for c in all_cases})
    print(f"schema fuzz: {len(all_cases)} cases over {len(fields)} fields in {wall:.1f} s")
    for v in ("ok", "traceback", "hang", "exit0-on-invalid", "not-one-line"):
        print(f"  {v:<17} {counts[v]}")
    for (cls, how), n in sorted(by_class.items()):
        print(f"  {cls:<10} input, {how}: {n}")
    for b in bad[:20]:
        print(f"  FAIL {b['verdict']}: {b['field']}={b['value']!r} {b['extra']} -> {b['error'] or b['stderr']}")
    write_json(OUT, {"cases": len(all_cases), "fields": len(fields), "wall_s": round(wall, 1),
                     "verdicts": dict(counts), "by_class": {f"{c} / {h}": n for (c, h), n in sorted(by_class.items())},
                     "failures": bad})
    return 0 if counts["ok"] == len(all_cases) else 1


if __name__ == "__main__":
    sys.exit(main())
