"""Paper findings the simulator reproduces: a registry of claims, memoised runs, the report and its figures."""
from study.findings.registry import (CLAIMS, FULL, QUICK, Claim, Outcome, Result, Scale, evaluate, load_claims,
                                   register_claim)

__all__ = ["CLAIMS", "FULL", "QUICK", "Claim", "Outcome", "Result", "Scale", "evaluate", "load_claims",
           "register_claim"]
