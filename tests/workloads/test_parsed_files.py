"""Data files are parsed once per process, and a cached parse is never a stale or shared one."""

from __future__ import annotations

import os

import numpy as np
import pytest

from servelab.workloads import WorkloadError, parse_workload, parsed_files

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROWS = ["2023-11-16 18:15:46.6805900,374,44\n", "2023-11-16 18:15:50.9951690,396,109\n"]


@pytest.fixture(autouse=True)
def cold_cache():
    parsed_files.forget()
    yield
    parsed_files.forget()


def _azure(path, rows):
    path.write_text(HEADER + "".join(rows))
    return path


def test_a_file_is_parsed_once_and_each_call_gets_its_own_list(tmp_path, monkeypatch):
    path = _azure(tmp_path / "t.csv", ROWS)
    calls = []
    real = parsed_files.load_azure_llm
    monkeypatch.setattr(parsed_files, "load_azure_llm", lambda p: calls.append(p) or real(p))
    first = parsed_files.trace("azure-code", path)
    second = parsed_files.trace("azure-code", path)
    assert len(calls) == 1
    assert first == second and first is not second  # equal requests, a list per caller
    first.clear()  # a caller changing its list does not change the next caller's
    assert len(parsed_files.trace("azure-code", path)) == 2


def test_a_file_changed_in_place_is_parsed_again(tmp_path):
    path = _azure(tmp_path / "t.csv", ROWS)
    assert [s.num_prompt_tokens for s in parsed_files.trace("azure-conv", path)] == [374, 396]
    _azure(path, ROWS[:1])
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime even on a coarse clock
    assert [s.num_prompt_tokens for s in parsed_files.trace("azure-conv", path)] == [374]


def test_a_bad_file_fails_every_time_and_leaves_nothing_cached(tmp_path):
    path = _azure(tmp_path / "t.csv", [ROWS[0], "2023-11-16 18:15:50.9951690,-3,109\n"])
    for _ in range(2):
        with pytest.raises(WorkloadError, match="t.csv"):
            parsed_files.trace("azure-conv", path)
    assert not parsed_files._parsed


def test_a_missing_file_gets_the_loaders_own_error(tmp_path, data_dir):
    with pytest.raises(WorkloadError, match="missing.csv"):
        parse_workload(f"azure-conv:path={tmp_path / 'missing.csv'}", data_dir, 0)


def test_cached_length_tables_are_read_only(tmp_path):
    path = _azure(tmp_path / "t.csv", ROWS)
    table = parsed_files.trace_lengths("azure-conv", path)
    assert table is parsed_files.trace_lengths("azure-conv", path)
    with pytest.raises(ValueError):
        table.num_prompt_tokens[0] = 1
    assert np.array_equal(table.num_output_tokens, [44, 109])


def test_a_workload_spec_reads_the_same_requests_cold_and_warm(data_dir):
    for spec in ("poisson:rate=4,n=50,lengths=mix(azure-code:0.5,azure-conv:0.5)", "azure-code:window=0-120,n=30"):
        parsed_files.forget()
        cold = parse_workload(spec, data_dir, 3)
        assert parse_workload(spec, data_dir, 3) == cold


def test_at_most_max_files_are_kept(tmp_path):
    for i in range(parsed_files.MAX_FILES + 3):
        parsed_files.trace("azure-conv", _azure(tmp_path / f"t{i}.csv", ROWS))
    assert len(parsed_files._parsed) == parsed_files.MAX_FILES
