"""The `sarathi-serve-a100` overheads preset: refits from the public artifact's decode batches and predicts the
held-out prefills (benchmarks/sarathi_artifact.py)."""
import numpy as np
import pytest

from benchmarks import sarathi_artifact as sa


@pytest.fixture(scope="module")
def gpu_part():
    from costmodels import get_model
    from costmodels.roofline import _build_roofline
    cm = _build_roofline({"overheads": {"kernel_overhead_scale": 1.0}}, get_model("yi-34b"), sa.host_gpu(), 2)
    return sa.gpu_times(cm)


def test_shipped_preset_is_the_fit_of_the_artifact_decode_batches(gpu_part):
    from costmodels.base import overhead_presets
    p = overhead_presets()["sarathi-serve-a100"]
    step_s, per_seq_s = sa.fit_cpu(gpu_part["decode"])
    assert p["step_s"] == pytest.approx(step_s, rel=1e-3) and p["per_seq_s"] == pytest.approx(per_seq_s, rel=1e-3)
    assert p["kernel_overhead_scale"] == 1.0                        # an eager engine: every launch paid


def test_preset_predicts_the_held_out_prefills_and_gpu_time_alone_does_not(gpu_part):
    """Decode batches are where the engine's CPU time shows (GPU alone is about half the measured time); the
    prefills it was not fitted on stay within about 10% at the median, whole or chunked."""
    step_s, per_seq_s = sa.fit_cpu(gpu_part["decode"])
    rows, alone = sa.compare(step_s, per_seq_s, gpu_part), sa.compare(0.0, 0.0, gpu_part)
    med = {k: float(np.median([abs(r["error_pct"]) for r in v])) for k, v in rows.items()}
    assert med["prefill"] <= 10.0 and med["chunked"] <= 10.0 and med["decode"] <= 10.0, med
    assert all(r["error_pct"] < -40 for r in alone["decode"])     # without the CPU time decode is far too fast
