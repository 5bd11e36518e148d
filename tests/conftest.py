"""Shared fixtures for every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from simkit import DATA_DIR, ToyCostModel


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run first (a stable sort keeps the rest in order): under
    pytest-xdist a minutes-long test that starts last is the whole suite's tail, one worker
    busy while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def toy_cost() -> ToyCostModel:
    return ToyCostModel()


@pytest.fixture
def data_dir() -> Path:
    assert DATA_DIR.is_dir(), f"shared data folder not found at {DATA_DIR}"
    return DATA_DIR
