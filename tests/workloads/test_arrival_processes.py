import numpy as np
import pytest

from servelab.workloads import BurstArrivals, GammaArrivals, PoissonArrivals, TraceArrivals


def gaps_of(times):
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    return np.diff(times)


def test_poisson_rate_and_cv():
    gaps = gaps_of(PoissonArrivals(5.0).sample(20_000, np.random.default_rng(0)))
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv(cv):
    gaps = gaps_of(GammaArrivals(4.0, cv).sample(40_000, np.random.default_rng(1)))
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_gamma_cv_zero_is_evenly_spaced():
    times = GammaArrivals(2.0, 0.0).sample(5, np.random.default_rng(0))
    assert times.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_same_seed_same_times_and_burst_all_zero():
    a = GammaArrivals(3.0, 2.0).sample(100, np.random.default_rng(7))
    b = GammaArrivals(3.0, 2.0).sample(100, np.random.default_rng(7))
    assert np.array_equal(a, b)
    assert BurstArrivals().sample(4, np.random.default_rng(0)).tolist() == [0.0] * 4
    assert PoissonArrivals(1.0).sample(0, np.random.default_rng(0)).size == 0


def test_trace_arrivals_rebases_and_limits():
    process = TraceArrivals((2.0, 3.0, 7.5))
    assert process.sample(2, np.random.default_rng(0)).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="trace has 3 arrivals"):
        process.sample(4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="non-decreasing"):
        TraceArrivals((1.0, 0.5))


@pytest.mark.parametrize("make", [lambda: PoissonArrivals(0), lambda: GammaArrivals(1, -1),
                                  lambda: GammaArrivals(-2, 1)])
def test_invalid_parameters_raise(make):
    with pytest.raises(ValueError):
        make()


def test_trace_arrivals_from_a_loaded_trace(data_dir):
    from servelab.workloads import load_azure_llm

    workload = load_azure_llm(data_dir / "traces/azure_llm_2023_code.csv")
    times = TraceArrivals.from_workload(workload).sample(100, np.random.default_rng(0))
    assert times.tolist() == [s.arrival_time_s for s in workload[:100]]
