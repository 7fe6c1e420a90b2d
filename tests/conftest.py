"""Shared fixtures: the reference data directory (tests skip with a reason when it is absent)."""
import pytest

from sim.paths import shared_data_dir


@pytest.fixture(scope="session")
def shared_data():
    d = shared_data_dir()
    if d is None:
        pytest.skip("reference data ../shared/data is absent (set SERVESIM_SHARED_DATA to its path)")
    return d
