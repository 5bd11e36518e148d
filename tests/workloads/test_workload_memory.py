"""A workload too large for memory is refused before it is built, with what it would need
and the limit it passed (issue 22, item 6: ``poisson:n=10000000`` took 3 GB before its first
step); one of a million requests stays allowed on a machine with the memory for it."""

from __future__ import annotations

import pytest

from servelab.core.errors import UserError
from servelab.workloads.memory import (BYTES_PER_OUTPUT_TOKEN, BYTES_PER_REQUEST, LIMIT_ENV, check_workload_memory,
                                       memory_limit_bytes, workload_bytes)
from servelab.workloads.spec import parse_workload


def test_a_workload_over_the_limit_is_refused_before_it_is_built(monkeypatch, tmp_path):
    monkeypatch.setenv(LIMIT_ENV, "0.01")
    with pytest.raises(UserError) as err:
        parse_workload("poisson:rate=1,n=20000,prompt=fixed(10),output=fixed(100)", tmp_path, 0)
    message = str(err.value)
    need = workload_bytes(20_000, 2_000_000) / 2**30
    assert f"20,000 requests with 2,000,000 output tokens need about {need:.1f} GiB" in message
    assert f"over the workload memory limit of 0.0 GiB ({LIMIT_ENV}=0.01" in message and "\n" not in message


def test_the_limit_applies_to_trace_files_too(monkeypatch, data_dir):
    monkeypatch.setenv(LIMIT_ENV, "0.001")
    with pytest.raises(UserError, match="19,366 requests .* over the workload memory limit"):
        parse_workload("azure-conv", data_dir, 0)


def test_the_default_limit_is_read_from_available_memory_and_allows_a_million_requests(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    limit, source = memory_limit_bytes()
    assert "available now" in source and limit > 0
    million = workload_bytes(1_000_000, 200_000_000)  # 200 output tokens each
    assert million == 1_000_000 * BYTES_PER_REQUEST + 200_000_000 * BYTES_PER_OUTPUT_TOKEN
    if limit > million:  # a machine with the memory for it (this one: 24 GB) takes it
        check_workload_memory(1_000_000, 200_000_000)


@pytest.mark.parametrize("text", ["x", "0", "-1", "nan", "inf"])
def test_a_bad_limit_setting_is_named(monkeypatch, text):
    monkeypatch.setenv(LIMIT_ENV, text)
    with pytest.raises(UserError, match=f"{LIMIT_ENV}="):
        check_workload_memory(1, 1)
