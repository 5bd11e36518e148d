"""scripts/scale_report.py: a point run several times reports its median run, and each run's
ratio to one instance is paired with the one-instance run of the same round."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "scale_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("scale_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(cpu: float, tokens: float = 1e6) -> dict:
    return {"cpu_s": cpu, "tokens_per_cpu_s": tokens / cpu, "fingerprints": ["f"]}


def test_median_run_keeps_the_middle_run_and_every_cpu(report):
    m = report.median_run([_run(3.0), _run(1.0), _run(2.0)])
    assert m["cpu_s"] == 2.0 and m["cpu_runs"] == [3.0, 1.0, 2.0]
    assert report.median_run([_run(4.0), _run(1.0)])["cpu_s"] == 1.0  # the lower middle of two


def test_paired_ratios_divide_within_a_round(report):
    runs = {1: [_run(1.0), _run(2.0)], 32: [_run(1.25), _run(2.0)], 256: [_run(9.0)]}
    ratios = report.paired_ratios(runs, 1)
    assert ratios[32] == pytest.approx([0.8, 1.0]) and ratios[1] == pytest.approx([1.0, 1.0])
    assert 256 not in ratios  # one run: nothing to pair
