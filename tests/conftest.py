"""Shared fixtures: the reference data directory (tests skip with a reason when it is absent)."""
import os

import pytest
from hypothesis import settings

# CI and the default run replay the same examples (a red CI must be reproducible); HYPOTHESIS_PROFILE=explore
# draws fresh examples on every run.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from sim.paths import shared_data_dir


@pytest.fixture(scope="session")
def shared_data():
    d = shared_data_dir()
    if d is None:
        pytest.skip("reference data ../shared/data is absent (set SERVESIM_SHARED_DATA to its path)")
    return d
