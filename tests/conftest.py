"""Shared fixtures for every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from simkit import DATA_DIR, ToyCostModel


@pytest.fixture
def toy_cost() -> ToyCostModel:
    return ToyCostModel()


@pytest.fixture
def data_dir() -> Path:
    assert DATA_DIR.is_dir(), f"shared data folder not found at {DATA_DIR}"
    return DATA_DIR
