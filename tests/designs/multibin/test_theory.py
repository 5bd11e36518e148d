"""Closed forms of Multi-Bin Batching against numeric integration and Monte Carlo."""

import math

import numpy as np
import pytest

from servelab.designs.multibin.binning import exponential_edges, uniform_edges
from servelab.designs.multibin.theory import (analyze, c_max_uniform, expected_latency_uniform,
                                               expected_service_numeric, expected_service_uniform,
                                               exponential_service_bound, format_analysis, min_bins_for_eps,
                                               throughput_uniform)
from servelab.designs.multibin.queue_sim import simulate_batches
from servelab.designs.multibin.service_dists import ExponentialService, UniformService


@pytest.mark.parametrize("k,B", [(1, 2), (1, 128), (3, 8), (5, 128), (7, 16)])
def test_uniform_service_closed_form_matches_quadrature(k, B):
    dist = UniformService(1.0, 20.0)
    numeric = expected_service_numeric(uniform_edges(1.0, 20.0, k), dist, B)
    assert expected_service_uniform(k, B, 1.0, 20.0) == pytest.approx(numeric, rel=1e-6)


def test_uniform_service_matches_monte_carlo():
    rng = np.random.default_rng(1)
    B, k = 16, 3
    x = rng.uniform(1, 20, size=(200_000, B))
    # a batch from bin i holds B draws from U(l_{i-1}, l_i); bins are equally likely
    edges = (1.0, *uniform_edges(1, 20, k).inner, 20.0)
    bins = rng.integers(0, k, size=x.shape[0])
    lo, hi = np.array(edges[:-1])[bins], np.array(edges[1:])[bins]
    maxima = (lo[:, None] + (hi - lo)[:, None] * (x - 1) / 19).max(axis=1)
    assert maxima.mean() == pytest.approx(expected_service_uniform(k, B, 1, 20), rel=2e-3)


def test_equal_mass_boundaries_are_optimal():
    """Lemma 4.1: moving any boundary away from Eq. 3 increases E[service]."""
    dist = UniformService(1.0, 20.0)
    best = expected_service_numeric(uniform_edges(1, 20, 3), dist, 32)
    for shift in (-1.0, -0.3, 0.3, 1.0):
        edges = uniform_edges(1, 20, 3)
        moved = type(edges)((edges.inner[0] + shift, edges.inner[1]))
        assert expected_service_numeric(moved, dist, 32) > best


def test_throughput_increases_to_c_max():
    values = [throughput_uniform(k, 128, 1, 20) for k in range(1, 200)]
    assert all(b > a for a, b in zip(values, values[1:]))
    assert values[-1] < c_max_uniform(128, 1, 20) == pytest.approx(128 / 10.5)
    assert throughput_uniform(10**7, 128, 1, 20) == pytest.approx(c_max_uniform(128, 1, 20), rel=1e-6)


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 3.0, 5.0])
def test_min_bins_is_smallest(eps):
    k = min_bins_for_eps(128, 1, 20, eps)
    target = c_max_uniform(128, 1, 20) - eps
    assert throughput_uniform(k, 128, 1, 20) >= target
    assert k == 1 or throughput_uniform(k - 1, 128, 1, 20) < target


def test_latency_lemma_matches_infinite_server_simulation():
    rng = np.random.default_rng(2)
    n, B, k, rate = 64_000, 32, 2, 2.0
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    service = rng.uniform(1, 20, n)
    res = simulate_batches(service, service, arrivals, uniform_edges(1, 20, k), B, num_servers=None)
    assert res.mean_latency_s == pytest.approx(expected_latency_uniform(k, B, 1, 20, rate), rel=0.02)


def test_exponential_boundaries_minimise_the_bound():
    """Lemma A.1's boundaries minimise Eq. 27; the bound is exact at k=1 and above the true value."""
    mu, B, k = 0.1, 200, 3
    edges = exponential_edges(mu, B, k)
    dist = ExponentialService(mu)

    def bound(inner):
        q = [1.0] + [math.exp(-mu * l) for l in inner]
        total = sum((q[i - 1] - q[i]) * inner[i - 1] for i in range(1, k))
        return total + q[-1] * (inner[-1] + sum(1 / j for j in range(1, B + 1)) / mu)

    assert bound(edges.inner) == pytest.approx(exponential_service_bound(k, B, mu), rel=1e-12)
    for d in (-0.5, 0.5):
        assert bound((edges.inner[0] + d, edges.inner[1])) > bound(edges.inner)
        assert bound((edges.inner[0], edges.inner[1] + d)) > bound(edges.inner)
    assert exponential_service_bound(1, B, mu) == pytest.approx(expected_service_numeric(exponential_edges(mu, B, 1), dist, B))
    assert exponential_service_bound(k, B, mu) >= expected_service_numeric(edges, dist, B)


def test_exponential_numeric_matches_monte_carlo():
    rng = np.random.default_rng(3)
    mu, B, k = 0.1, 20, 3
    edges = exponential_edges(mu, B, k)
    x = rng.exponential(1 / mu, 400_000)
    res = simulate_batches(x, x, np.zeros_like(x), edges, B, num_servers=None)
    full = res.batch_sizes == B
    assert full.mean() > 0.99
    numeric = expected_service_numeric(edges, ExponentialService(mu), B)
    assert res.mean_batch_service_s == pytest.approx(numeric, rel=0.01)


def test_analyze_tables_and_errors():
    out = analyze("uniform", eps=0.5, k_max=3, arrival_rate=1.0)
    assert [r.num_bins for r in out["rows"]] == [1, 2, 3] and out["k_eps"] == 21
    assert "Thm 4.2" in format_analysis(out)
    assert "Cor. A.1.1" in format_analysis(analyze("exponential", k_max=2))
    with pytest.raises(ValueError, match="distribution"):
        analyze("gamma")
    with pytest.raises(ValueError, match="lmin"):
        throughput_uniform(2, 8, 5, 1)
