"""The claim registry: each paper claim is a function of a Scale returning paper value, our value and a verdict."""
from __future__ import annotations

import importlib
import json
from pathlib import Path
import time
from dataclasses import dataclass
from typing import Callable

REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, NOT_RUN = "reproduced", "direction only", "not reproduced", "not run"
UNTESTABLE = "untestable here"
MAGNITUDE_TOLERANCE = 0.5   # spec §6 advice: magnitudes are soft targets, within ±50% of the paper's effect
TIE = 0.02                  # a relative difference below this is a tie: no direction can be read from it
SATURATED = 0.98            # fractions (attainment, SSR) at or above this for every system cannot be ordered


@dataclass(frozen=True)
class Scale:
    """How big the experiments are. `full` is the paper's setup; `quick` shrinks B and M together so the
    contention B·(I+O)/M, which drives evictions, stays the same."""
    name: str
    B: int
    m_factor: float
    I_grid: tuple
    O_grid: tuple
    M_sweep_I: tuple          # prompt sizes for the M sweep (Figure 9)
    rank_B: int               # requests per heterogeneous workload (Figures 15–17), with M scaled to match
    msweep_B: int = 1024      # requests in the M sweep (Figure 9); M values are absolute there, as in the paper
    csp_small_I: tuple = (1, 4, 16, 64)       # §4.5 CSP grid (B = O = 4): prompts where evicting should pay
    csp_large_I: tuple = (128, 512, 1024)     # ... and where it should not
    csp_time_limit_s: float = 20.0            # per solve (backend auto, one thread)
    # Apt-Serve / BROS / EconoServe / ALISE (online workloads; full = the benchmark scripts' setups)
    slo_requests: int = 500   # Apt-Serve: ShareGPT-like requests per run
    capacity_tol: float = 0.04  # Apt-Serve: relative tolerance of the effective-throughput (capacity) search
    bros_rt: int = 200        # BROS: RT requests per run (BE batches arrive while the RT stream lasts)
    la_fraction: float = 1.0  # EconoServe / ALISE: fraction of the benchmarks' request counts per run
    rate_stride: int = 1      # EconoServe / ALISE: every k-th rate of the benchmarks' rate grids

    @property
    def M(self) -> int:
        return int(100_000 * self.m_factor)

    @property
    def rank_M(self) -> int:
        """M for the heterogeneous workloads: 100K scaled by rank_B/1024, keeping the paper's contention."""
        return int(100_000 * self.rank_B / 1024)


FULL = Scale("full", B=1024, m_factor=1.0, I_grid=(1, 16, 128, 512, 1024), O_grid=(1, 32, 1024),
             M_sweep_I=(1, 16, 64), rank_B=256)
QUICK = Scale("quick", B=128, m_factor=0.125, I_grid=(16, 128, 1024), O_grid=(1, 32, 1024),
              M_sweep_I=(16,), rank_B=32, csp_small_I=(1, 4), csp_large_I=(512, 1024), csp_time_limit_s=4.0,
              slo_requests=150, capacity_tol=0.15, bros_rt=100, la_fraction=0.5, rate_stride=2)


@dataclass
class Outcome:
    """What one claim check found. direction/magnitude are None when not checked (no paper number, not run)."""
    paper: str
    ours: str
    direction: bool | None
    magnitude: bool | None = None
    note: str = ""
    untestable: str = ""      # why this setup cannot tell (a tie, every system saturated): verdict *untestable here*

    def __post_init__(self):
        # numpy comparisons give numpy.bool_, which `is False` would not recognise
        self.direction = None if self.direction is None else bool(self.direction)
        self.magnitude = None if self.magnitude is None else bool(self.magnitude)
        if self.untestable:
            self.note = f"{self.note} Untestable: {self.untestable}".strip()

    @property
    def verdict(self) -> str:
        if self.direction is None:
            return NOT_RUN
        if self.untestable:
            return UNTESTABLE
        if not self.direction:
            return NOT_REPRODUCED
        return DIRECTION_ONLY if self.magnitude is False else REPRODUCED


@dataclass
class Claim:
    id: str
    paper: str                # which seed paper (infermax, aptserve, ...)
    section: str
    statement: str
    check: Callable           # check(scale) -> Outcome
    quick: bool = True        # part of `reproduce --quick` and the fast CI subset
    requires: tuple = ()      # importable modules the check needs (e.g. the solver); missing → not run
    figure: str | None = None  # name of the figure (study.findings.figures) that shows the data behind it
    why: str = ""             # our explanation, shown when the direction or the magnitude disagrees


@dataclass
class Result:
    claim: Claim
    outcome: Outcome
    scale: str
    wall_s: float = 0.0
    stamp: str = ""           # code version of the row: hash of the files its paper's claims depend on


CLAIMS: dict[str, Claim] = {}
# Per paper: how our setup differs from the paper's (aspect, paper, ours) and a header note computed at run time
# (e.g. how far our baseline's capacity is from the paper's), shown above the paper's rows in the report.
SETUPS: dict = {}
PAPER_TITLES = {"infermax": "InferMax", "aptserve": "Apt-Serve", "bros": "BROS", "econoserve": "EconoServe",
                "alise": "ALISE"}


def register_setup(paper: str, rows, header=None) -> None:
    """rows: (aspect, the paper's setup, ours); header: callable(scale) -> str, or None."""
    SETUPS[paper] = (list(rows), header)
# Modules that register claims; a new seed paper adds its module here.
CLAIM_MODULES = ["study.findings.infermax", "study.findings.aptserve", "study.findings.bros", "study.findings.econoserve",
                 "study.findings.alise"]


def register_claim(id: str, paper: str, section: str, statement: str, *, quick: bool = True,
                   requires: tuple = (), figure: str | None = None, why: str = ""):
    def deco(fn):
        CLAIMS[id] = Claim(id, paper, section, statement, fn, quick, tuple(requires), figure, why)
        return fn
    return deco


def attach_why(whys: dict) -> None:
    """Set the `why` of registered claims (id → our explanation of a disagreement)."""
    for cid, why in whys.items():
        CLAIMS[cid].why = why


WHYS_FILE = Path(__file__).with_name("whys.json")


def load_claims() -> dict[str, Claim]:
    for mod in CLAIM_MODULES:
        importlib.import_module(mod)
    if WHYS_FILE.exists():       # explanations written after the runs (prose: not part of a row's code stamp)
        attach_why({k: v for k, v in json.loads(WHYS_FILE.read_text()).items() if k in CLAIMS})
    return CLAIMS


def why_text(claim: Claim, out: Outcome) -> str:
    """The claim's explanation, shown with a row whose direction or magnitude disagrees."""
    return claim.why if claim.why and out.verdict in (NOT_REPRODUCED, DIRECTION_ONLY) else ""


def missing_requirement(claim: Claim) -> str | None:
    for mod in claim.requires:
        try:
            importlib.import_module(mod)
        except ImportError:
            return mod
    return None


def evaluate(claim: Claim, scale: Scale) -> Result:
    t0 = time.perf_counter()
    missing = missing_requirement(claim)
    if missing:
        out = Outcome("see statement", "-", None, None, f"needs `{missing}`, which is not available in this build")
    else:
        out = claim.check(scale)
    from study.findings.stamps import row_stamp
    return Result(claim, out, scale.name, time.perf_counter() - t0, row_stamp(claim.paper))


def not_modelled(paper: str, reason: str) -> Outcome:
    """A claim the simulator cannot check (a dataset, baseline or component it lacks): verdict *not run*."""
    return Outcome(paper, "-", None, None, f"not modelled: {reason}")


def within_ratio(ours: float, paper: float, tol: float = MAGNITUDE_TOLERANCE) -> bool:
    """Magnitude agreement for an 'N x better' claim: the effect, the excess over 1x, within ±tol of the paper's
    (1.5x vs 1.9x: 0.5 against 0.9, agrees; 1.15x vs 2.3x: 0.15 against 1.3, does not). One rule at every ratio:
    comparing raw ratios would let 1x (no effect) pass a 1.5x claim."""
    return within(ours - 1, paper - 1, tol)


def within(ours: float, paper: float, tol: float = MAGNITUDE_TOLERANCE) -> bool:
    """Magnitude agreement: our number within ±tol (relative) of the paper's."""
    if paper == 0:
        return bool(abs(ours) <= tol)
    return bool(abs(ours / paper - 1.0) <= tol)


def tie(a: float, b: float, tol: float = TIE) -> bool:
    """Are two values of one metric equal within `tol` relative (no direction can be read)?"""
    scale = max(abs(a), abs(b))
    return scale == 0 or abs(a - b) <= tol * scale


def untestable_reason(values: dict, fraction: bool = False, tol: float = TIE) -> str:
    """Why comparing these systems' values (name → value) cannot test a claim here, or "" if it can: every
    fraction at or above the saturation level, or all values tied."""
    vals = [v for v in values.values() if v == v]
    if not vals:
        return "no values"
    if fraction and min(vals) >= SATURATED:
        return ("every system is at " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in values.items()) +
                f" (≥ {100 * SATURATED:.0f}%): saturated, no ordering can be read")
    if all(tie(v, vals[0], tol) for v in vals):
        return ("all within " + f"{100 * tol:.0f}%: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items()) +
                " (a tie)")
    return ""
