"""Shared fixtures for workload tests: the real data directory and temp-file writers."""

from pathlib import Path

import pytest

from servelab.paths import default_data_dir

DATA_DIR = default_data_dir()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    assert DATA_DIR.is_dir(), f"real data expected at {DATA_DIR}"
    return DATA_DIR


@pytest.fixture
def write_file(tmp_path):
    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
