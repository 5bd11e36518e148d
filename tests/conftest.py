"""Shared fixtures for every test folder."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest
from simkit import DATA_DIR, ToyCostModel


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run first (a stable sort keeps the rest in order). xdist sends tests
    one at a time (``--maxschedchunk 1`` in scripts/test.sh), so the slow ones spread over the
    workers and the many short ones fill in around them; a minutes-long test that starts last
    is the suite's tail, one worker busy, the other idle. (With xdist's default chunks, a first
    chunk of ~200 tests put every slow test on one worker: sorting alone changed nothing.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def toy_cost() -> ToyCostModel:
    return ToyCostModel()


@pytest.fixture
def data_dir() -> Path:
    assert DATA_DIR.is_dir(), f"shared data folder not found at {DATA_DIR}"
    return DATA_DIR


# --- the suite's CPU budget (CI: 10 min on 2 cores) ---------------------------------------
# With SERVELAB_TEST_CPU_LOG=<folder>, every test's CPU seconds (this process and the children it
# waited for: servers, CLI subprocesses, spawned engines) go to <folder>/<worker>.jsonl, one line per
# test. Wall time (--durations) on a shared machine measures the load as much as the test; CPU
# time says which tests the suite's budget is spent on (scripts/test_cpu_report.py sums them).
_CPU_LOG = os.environ.get("SERVELAB_TEST_CPU_LOG")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if _CPU_LOG:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu0, wall0 = _cpu_s(), time.monotonic()
        yield
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(_CPU_LOG) / f"{worker}.jsonl", "a") as out:
            out.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_s() - cpu0, 3),
                                  "wall_s": round(time.monotonic() - wall0, 3)}) + "\n")
