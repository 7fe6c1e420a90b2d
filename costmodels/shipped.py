"""Refit every coefficient file shipped under profiles/ from the shared public profiles, with provenance:

    python -m costmodels.shipped [../shared/data]

- profiles/roofline-efficiencies.yaml: roofline v2 per GPU family. ampere: fitted on the A100 Llama-2-7B profile
  (mlp.csv, every tensor-parallel degree, and attention_sample.csv). hopper: the dense-operator parameters fitted
  on the H100 Llama-2-7B mlp.csv; its attention parameters are the ampere fit's (no H100 attention profile is
  shared). Other GPUs use the ampere fit's fractions of their own datasheet peaks.
- profiles/a100-80gb/llama-2-7b-profiled.yaml, profiles/h100-sxm/llama-2-7b-profiled.yaml: the profiled model
  (H100: measured dense operators, attention from the hopper roofline).
- profiles/a100-80gb/llama-2-7b-linear.yaml: InferMax's linear model, fitted as the findings need it (its
  small-batch error is stated in costmodels/linear.py).
- profiles/collectives.yaml: `python -m costmodels.collectives` (NCCL and vLLM custom all-reduce lines).
Nothing here is fitted on the measured vLLM runs (those are validation data: profiles/overheads.yaml says what
was fitted on which of them)."""
from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

import yaml

from costmodels.catalog import get_gpu, get_model
from costmodels.errors import UserError
from costmodels.linear import PROFILES_DIR

VIDUR = "microsoft/vidur profiling data (MIT), ../shared/data/profiles/"


def fit_families(shared: Path) -> dict:
    from costmodels.calibrate import fit_dense_params, fit_roofline
    from costmodels.profile_data import read_profiles
    l7 = get_model("llama-2-7b")
    a100 = read_profiles([shared / "profiles" / "vidur-a100-llama-2-7b"], tp=None)
    ampere = fit_roofline(a100, l7, get_gpu("a100-80gb")).params
    h100 = read_profiles([shared / "profiles" / "vidur-h100-llama-2-7b"], tp=None)
    hopper = {**ampere, **fit_dense_params(h100, l7, get_gpu("h100-sxm"))}
    today = _dt.date.today().isoformat()
    r = lambda d: {k: float(f"{v:.6g}") for k, v in d.items()}  # noqa: E731
    return {
        "default_family": "ampere",
        "families": {
            "ampere": {"params": r(ampere), "provenance": {
                "data": VIDUR + "vidur-a100-llama-2-7b (mlp.csv, tp 1/2/4/8; attention_sample.csv, tp 1)",
                "fitted_by": "costmodels.calibrate.fit_roofline via python -m costmodels.shipped", "date": today}},
            "hopper": {"params": r(hopper), "provenance": {
                "data": VIDUR + "vidur-h100-llama-2-7b (mlp.csv, tp 1/2/4/8) for the dense operators; attention "
                        "parameters are the ampere fit's (no H100 attention profile)",
                "fitted_by": "costmodels.calibrate.fit_dense_params via python -m costmodels.shipped", "date": today}},
        },
    }


def fit_profiled_files(shared: Path) -> list:
    from costmodels.calibrate import fit_profiled
    from costmodels.profile_data import read_profiles
    from costmodels.roofline import RooflineCostModel
    out = []
    l7 = get_model("llama-2-7b")
    for gpu_name, folder in (("a100-80gb", "vidur-a100-llama-2-7b"), ("h100-sxm", "vidur-h100-llama-2-7b")):
        gpu = get_gpu(gpu_name)
        table = read_profiles([shared / "profiles" / folder], tp=None)
        cm = fit_profiled(table, l7, gpu, base=RooflineCostModel(l7, gpu))
        cm.provenance = {"data": VIDUR + folder + " (every file in the folder, every tensor-parallel degree)",
                         "attention": "fitted on attention_sample.csv" if (shared / "profiles" / folder /
                                                                             "attention_sample.csv").exists()
                         else "from roofline v2 with the GPU family's efficiencies (no attention profile)",
                         "fitted_by": "costmodels.calibrate.fit_profiled via python -m costmodels.shipped",
                         "date": _dt.date.today().isoformat()}
        path = PROFILES_DIR / gpu_name / "llama-2-7b-profiled.yaml"
        cm.save(path)
        out.append(path)
    return out


def fit_linear_file(shared: Path) -> Path:
    """InferMax's linear model as the findings use it (costmodels.linear.fit_default, unchanged)."""
    from costmodels.linear import default_profile_path, fit_default
    path = default_profile_path("a100-80gb", "llama-2-7b")
    fit_default(shared / "profiles" / "vidur-a100-llama-2-7b", path)
    return path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    shared = Path(argv[0] if argv else Path(__file__).resolve().parent.parent.parent / "shared" / "data")
    if not (shared / "profiles").is_dir():
        print(f"no profiles under {shared}", file=sys.stderr)
        return 2
    try:                                   # a folder that lacks a profile the fits read is one line
        fams = fit_families(shared)
        (PROFILES_DIR / "roofline-efficiencies.yaml").write_text(yaml.safe_dump(fams, sort_keys=False))
        print(f"wrote {PROFILES_DIR / 'roofline-efficiencies.yaml'}")
        for p in fit_profiled_files(shared):
            print(f"wrote {p}")
        print(f"wrote {fit_linear_file(shared)}")
    except UserError as e:
        print(f"costmodels.shipped: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
