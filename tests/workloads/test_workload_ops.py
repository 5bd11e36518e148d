import numpy as np
import pytest

from servelab.core.request import SLO, RequestSpec, ServiceClass
from servelab.workloads import (GammaArrivals, IndependentLengths, PoissonArrivals, RequestAttrs, Uniform,
                                alpaca_like, arrival_times, build_workload, describe, head, mean_rate_per_s,
                                scale_rate, scale_to_rate, time_window)
from servelab.workloads.lengths import Fixed


def small_workload():
    times = [0.0, 1.0, 1.5, 4.0, 10.0]
    return [RequestSpec(i, t, 10 + i, 5) for i, t in enumerate(times)]


def test_build_workload_invariants_and_determinism():
    def build(seed):
        return build_workload(GammaArrivals(5.0, 2.0), alpaca_like(), 500, np.random.default_rng(seed))

    workload = build(3)
    assert [s.request_id for s in workload] == list(range(500))
    assert workload[0].arrival_time_s == 0.0 and np.all(np.diff(arrival_times(workload)) >= 0)
    assert all(s.predicted_output_tokens is None for s in workload)
    assert workload == build(3) and workload != build(4)


def test_changing_lengths_keeps_arrivals_for_a_seed():
    a = build_workload(PoissonArrivals(2.0), alpaca_like(), 50, np.random.default_rng(9))
    b = build_workload(PoissonArrivals(2.0), IndependentLengths(Fixed(3), Uniform(1, 9)), 50, np.random.default_rng(9))
    assert np.array_equal(arrival_times(a), arrival_times(b))


def test_scale_rate_divides_every_gap():
    workload = small_workload()
    faster = scale_rate(workload, 2.0)
    assert arrival_times(faster).tolist() == [0.0, 0.5, 0.75, 2.0, 5.0]
    assert [s.num_prompt_tokens for s in faster] == [s.num_prompt_tokens for s in workload]
    assert mean_rate_per_s(faster) == pytest.approx(2 * mean_rate_per_s(workload))
    gaps = np.diff(arrival_times(workload))
    assert np.allclose(np.diff(arrival_times(faster)) / gaps, 0.5)  # same pattern, new clock


def test_scale_to_rate_hits_target():
    workload = build_workload(GammaArrivals(3.0, 4.0), alpaca_like(), 300, np.random.default_rng(0))
    assert mean_rate_per_s(scale_to_rate(workload, 7.5)) == pytest.approx(7.5)
    with pytest.raises(ValueError):
        scale_rate(workload, 0)


def test_time_window_rebases_and_renumbers():
    window = time_window(small_workload(), 1.0, 5.0)
    assert [(s.request_id, s.arrival_time_s, s.num_prompt_tokens) for s in window] == [
        (0, 0.0, 11), (1, 0.5, 12), (2, 3.0, 13)]
    assert time_window(small_workload(), 20.0, 30.0) == []
    assert [s.request_id for s in head(small_workload(), 2)] == [0, 1]


def test_describe_reports_counts_rate_and_percentiles():
    stats = describe(small_workload())
    assert stats.num_requests == 5 and stats.duration_s == 10.0 and stats.rate_per_s == pytest.approx(0.4)
    assert stats.prompt_mean == 12.0 and stats.prompt_p50 == 12.0 and stats.output_p99 == 5.0
    assert "5 requests over 10.0 s" in str(stats)


def test_attrs_assign_classes_priorities_and_slo():
    attrs = RequestAttrs(SLO(ttft_s=2.0, tpot_s=0.1), offline_fraction=0.25, priority_weights=((0, 3.0), (5, 1.0)))
    workload = build_workload(PoissonArrivals(1.0), alpaca_like(), 4000, np.random.default_rng(2), attrs)
    offline = [s for s in workload if s.service_class is ServiceClass.OFFLINE]
    assert len(offline) / len(workload) == pytest.approx(0.25, abs=0.03)
    assert all(s.slo is None for s in offline)
    assert all(s.slo == SLO(2.0, 0.1) for s in workload if s.service_class is ServiceClass.ONLINE)
    assert np.mean([s.priority == 5 for s in workload]) == pytest.approx(0.25, abs=0.03)
    with pytest.raises(ValueError):
        RequestAttrs(offline_fraction=1.5)
