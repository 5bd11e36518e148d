"""scripts/scale_report.py: a point's ratio to one instance is the median of its runs' ratios to
the one-instance runs around them in its process, and the targets are judged on it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from simkit import load_script


@pytest.fixture(scope="module")
def report():
    return load_script("scale_report")


def _row(n: int, ratios: list[float] | None = None) -> dict:
    row = {"instances": n, "requests": 10 * n, "output_tokens": 1000 * n, "cpu_s": 1.0, "tokens_per_cpu_s": 1e6,
           "gc_cpu_s": 0.0, "peak_rss_gb": 0.2, "rss_gb_before_run": 0.1, "repeats": 1, "makespan_s": [10.0],
           "fingerprints": ["f"], "rate_per_instance": 5.5, "requests_per_instance": 10, "load": [1.0, 1.0]}
    if ratios is not None:
        row["ratios"] = ratios
        row["reference"] = {"tokens_per_cpu_s": [1e6] * (len(ratios) + 1), "fingerprints": ["f"]}
    return row


def test_ratio_is_the_median_of_the_bracketed_runs(report):
    assert report.ratio(_row(32, [0.9, 0.7, 0.8])) == pytest.approx(0.8)
    assert report.ratio(_row(32, [0.9, 0.7])) == pytest.approx(0.8)  # the middle of two
    assert report.ratio(_row(1)) == 1.0  # the one-instance row itself


def test_write_judges_targets_by_the_median_and_names_every_run(report, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "OUT", tmp_path / "scale.md")
    args = SimpleNamespace(quick=False, small_runs=3, compare_with=None, compare_rev="?", one_repeats=16)
    report.write([_row(1), _row(32, [0.84, 0.90, 0.88]), _row(256, [0.6])], {}, args)
    text = (tmp_path / "scale.md").read_text()
    assert "- 32 instances at 0.88 (median; each run 0.84 / 0.90 / 0.88) of one instance's tokens per CPU-s " \
           "(target >= 0.85): **met by the median, in 2 of 3 runs**." in text
    assert "- 256 instances at 0.60 of one instance's tokens per CPU-s (target >= 0.85): **not met**." in text
    assert "every reference run gave the one-instance row's results: yes" in text


def test_the_command_line_names_the_points_when_not_the_default(report, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "OUT", tmp_path / "scale.md")
    args = SimpleNamespace(quick=False, small_runs=3, compare_with=None, compare_rev="?", one_repeats=16,
                           instances="1,32")
    report.write([_row(1), _row(32, [0.9])], {}, args)
    assert "Written by `python scripts/scale_report.py --instances 1,32`" in (tmp_path / "scale.md").read_text()
    args.instances = report.DEFAULT_INSTANCES
    report.write([_row(1), _row(32, [0.9])], {}, args)
    assert "Written by `python scripts/scale_report.py`;" in (tmp_path / "scale.md").read_text()


def test_the_host_section_reads_the_absolute_target_against_the_trace_benchmark_here(report, tmp_path, monkeypatch):
    """The 1.5 M target was set where the trace benchmark ran at 2.02 M: on a host where it runs at
    1.0 M the largest point needs 0.74 of it, and the reference revision's own run there gives the
    host's factor apart from the code."""
    monkeypatch.setattr(report, "OUT", tmp_path / "scale.md")
    args = SimpleNamespace(quick=False, small_runs=3, compare_with=None, compare_rev="?", one_repeats=16,
                           host_tree=Path("/x"))
    big = {**_row(32, [0.9]), "tokens_per_cpu_s": 800_000.0}
    host = {"tokens_per_cpu_s": 1_000_000.0, "runs": [0.9e6, 1.0e6, 1.1e6], "load": [0.5, 0.6]}
    old = {"tokens_per_cpu_s": 808_000.0, "runs": [8.08e5], "load": [0.5, 0.5]}
    report.write([_row(1), big], {}, args, host, old)
    text = (tmp_path / "scale.md").read_text()
    assert "--host-tree TREE-OF-15f3719" in text
    assert "this host runs that code 2.5x slower than the host that measured 2.02 M" in text
    assert "the largest point ran at 0.80 of this revision's benchmark (0.80 M of 1.00 M): **met**" in text
    report.write([_row(1), {**big, "tokens_per_cpu_s": 700_000.0}], {}, args, host, None)
    text = (tmp_path / "scale.md").read_text()
    assert "0.70 of this revision's benchmark" in text and "**not met** on that reading" in text
    assert "own code on this host" not in text
