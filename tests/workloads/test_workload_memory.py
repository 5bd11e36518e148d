"""A workload too large for memory is refused before it is built, with what it would need
and the limit it passed (issue 22, item 6: ``poisson:n=10000000`` took 3 GB before its first
step); one of a million requests stays allowed on a machine with the memory for it."""

from __future__ import annotations

import pytest

from servelab.core.errors import UserError
from servelab.workloads.memory import (BYTES_PER_INSTANCE, BYTES_PER_OUTPUT_TOKEN, BYTES_PER_REQUEST, LIMIT_ENV,
                                       SUMMARY_BYTES_PER_OUTPUT_TOKEN, SUMMARY_BYTES_PER_REQUEST,
                                       check_workload_memory, memory_limit_bytes, run_shape, workload_bytes)
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
    million = workload_bytes(1_000_000, 200_000_000)  # 200 output tokens each, one instance, a summary
    assert million == (1_000_000 * (BYTES_PER_REQUEST + SUMMARY_BYTES_PER_REQUEST)
                       + 200_000_000 * (BYTES_PER_OUTPUT_TOKEN + SUMMARY_BYTES_PER_OUTPUT_TOKEN) + BYTES_PER_INSTANCE)
    if limit > million:  # a machine with the memory for it (this one: 24 GB) takes it
        check_workload_memory(1_000_000, 200_000_000)


@pytest.mark.parametrize("text", ["x", "0", "-1", "nan", "inf"])
def test_a_bad_limit_setting_is_named(monkeypatch, text):
    monkeypatch.setenv(LIMIT_ENV, text)
    with pytest.raises(UserError, match=f"{LIMIT_ENV}="):
        check_workload_memory(1, 1)


def test_perf_scale_is_estimated_without_a_summary_and_with_its_instances():
    """The 1M-request point of docs/benchmarks/scale.md (1,024 instances, 200 output tokens a
    request on average) measured 3.15 GB; the guard said 10.3 GiB, counting a summary that
    ``perf scale`` never builds, so the point needed SERVELAB_MEMORY_LIMIT_GB to run."""
    with run_shape(instances=1024, summary=False):
        point = workload_bytes(1_000_448, 200_135_316)
    assert point == workload_bytes(1_000_448, 200_135_316, instances=1024, summary=False)
    assert 3.0e9 < point < 4.0e9, point / 1e9
    assert workload_bytes(1_000_448, 200_135_316) > 2.5 * point  # the summary's arrays, where one is built


def test_the_estimate_follows_a_measured_run():
    """Python's traced peak of a ``perf scale`` workload built and run (8 instances, 300 requests
    each, 300 output tokens) against the estimate: within [0.75, 1.5] (small runs keep their step
    records as tuples, 400 B each, before they are packed; a large run is closer). Before, the
    estimate (a summary counted, no instance term) was 2.5 times the measured peak here."""
    import tracemalloc

    from servelab.catalog.instance import InstanceSpec
    from servelab.cluster.presets import cluster_for
    from servelab.costmodel.options import CostOptions
    from servelab.paths import default_data_dir
    from servelab.simulator import Simulation
    from servelab.simulator.hardware import cost_for_spec

    cost = cost_for_spec(InstanceSpec("A100-80GB", "Llama-2-7B"), CostOptions())
    tracemalloc.start()
    try:
        with run_shape(instances=8, summary=False):
            wl = parse_workload("poisson:rate=44,n=2400,prompt=uniform(512,1536),output=fixed(300)",
                                default_data_dir(), 0)
            estimate = workload_bytes(2400, 2400 * 300)
        res = Simulation(wl, cluster_for("vllm", num_instances=8, gpu="A100-80GB", model="Llama-2-7B"),
                         cost_model=cost).run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.num_output_tokens == 2400 * 300
    assert 0.75 < peak / estimate < 1.5, (peak, estimate)
