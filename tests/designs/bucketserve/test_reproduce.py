"""The reproduction pipeline end to end on a tiny size, and the overhead benchmark's shape."""

from __future__ import annotations

import json

import pytest

from servelab.designs.bucketserve.overhead import overhead_grid
from servelab.designs.bucketserve.reproduce.run import Sizes, run_reproduction
from servelab.designs.bucketserve.reproduce.experiments import rps_at_attainment

TINY = Sizes(40, (16,), ("alpaca",), 40, (4,), (1,), 64, 16, (8,), (10,), (1, 8), 5, 256)


def test_tiny_reproduction_writes_report_plots_and_json(tmp_path):
    results = run_reproduction(tmp_path, seed=1, sizes=TINY)
    report = (tmp_path / "bucketserve.md").read_text()
    assert "simulated" in report and "| claim | paper | ours |" in report
    assert "3.580" in report and "1.930" in report  # the paper's numbers sit next to ours
    for fig in results["figures"]:
        assert (tmp_path / fig).stat().st_size > 0
    saved = json.loads((tmp_path / "bucketserve.json").read_text())
    assert {r["system"] for r in saved["offline"]} == {"bucketserve", "distserve", "static"}
    assert all(r["num_finished"] == 40 for r in saved["offline"])


def test_overhead_grid_keeps_requested_sizes():
    rows = overhead_grid((10, 100), (1, 16), repeats=5)
    assert [(r["num_queued"], r["num_buckets"]) for r in rows] == [(10, 1), (10, 16), (100, 1), (100, 16)]
    assert all(r["median_s"] > 0 for r in rows)


def test_rps_at_attainment_interpolates():
    assert rps_at_attainment([(1, 1.0), (2, 0.9), (3, 0.7)]) == pytest.approx(2.5)
    assert rps_at_attainment([(1, 0.5)]) is None
    assert rps_at_attainment([(1, 1.0), (2, 0.95)]) == 2  # never dropped: a lower bound
