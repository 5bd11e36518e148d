"""Padding analysis (Eqs. 2-4) and controller math (Eqs. 1, 5, 6)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.designs.bucketserve import controller, padding


def test_waste_ratio_eq2():
    assert padding.waste_ratio([100, 100]) == 0.0
    assert padding.waste_ratio([50, 100]) == pytest.approx(0.25)
    assert padding.waste_ratio([]) == 0.0
    with pytest.raises(ValueError):
        padding.waste_ratio([0, 3])


def test_expected_waste_eq3_and_eq4():
    s = np.array([10, 20, 30, 40, 90, 100])
    # one bucket [0, 100]: mean of 1 - s/100
    assert padding.expected_waste(s, [0, 100]) == pytest.approx(np.mean(1 - s / 100))
    # two buckets, pad to the bucket maximum
    w = padding.expected_waste(s, [0, 50, 100], pad_to="max")
    assert w == pytest.approx(np.mean([1 - 10 / 40, 1 - 20 / 40, 1 - 30 / 40, 0, 1 - 90 / 100, 0]))
    assert list(padding.conditional_means(s, [0, 50, 100])) == [25.0, 95.0]
    assert np.isnan(padding.conditional_means(s, [0, 5, 100])[0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=12), st.integers(1, 3))
def test_optimal_edges_beats_every_partition(lengths, k):
    s = np.array(lengths)
    edges, best = padding.optimal_edges(s, k)
    assert padding.expected_waste(s, edges, pad_to="max") == pytest.approx(best, abs=1e-12)
    values = np.unique(s)
    # brute force over every choice of k-1 cut points between distinct values
    for cuts in itertools.combinations(range(1, values.size), min(k, values.size) - 1):
        e = [0.0] + [float(values[c]) for c in cuts] + [float(values[-1]) + 1]
        assert best <= padding.expected_waste(s, e, pad_to="max") + 1e-12


def test_compare_boundaries_reports_gap():
    rng = np.random.default_rng(0)
    s = np.clip(rng.lognormal(4.5, 1.0, 2000), 1, 4096).astype(int)
    r = padding.compare_boundaries(s, [0, 256, 512, 1024, 2048, 4096], 4096)
    assert r.waste_optimal_max <= r.waste_bisection_max <= r.waste_single_max
    assert r.waste_bisection_upper <= r.waste_single_upper
    assert r.mean_abs_gap_to_eq4 > 0


def test_safe_memory_and_max_safe_batch_eq5_eq6():
    assert controller.safe_memory(100.0) == pytest.approx(90.0)
    # budget 90 tokens at 1 byte/token: 30 + 40 fits, + 30 does not
    assert controller.max_safe_batch([30, 40, 30], 90.0, 1.0) == 2
    assert controller.max_safe_batch([30, 40, 20], 90.0, 1.0) == 3
    assert controller.max_safe_batch([], 90.0, 1.0) == 0
    with pytest.raises(ValueError):
        controller.safe_memory(10, 1.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=40), st.integers(0, 400), st.integers(1, 16), st.integers(1, 64),
       st.integers(1, 5000), st.booleans())
def test_form_batch_never_exceeds_limits(lengths, free, block, rows, tokens, padded):
    limits = controller.BatchLimits(free, block, rows, tokens)
    n = controller.form_batch(lengths, limits, padded=padded)
    chosen = lengths[:n]
    assert n <= rows
    assert sum(-(-s // block) for s in chosen) <= free
    if chosen:
        assert (len(chosen) * max(chosen) if padded else sum(chosen)) <= tokens
    if n < len(lengths) and n < rows:  # the next one really does not fit
        nxt = lengths[: n + 1]
        over_blocks = sum(-(-s // block) for s in nxt) > free
        over_tokens = (len(nxt) * max(nxt) if padded else sum(nxt)) > tokens
        assert over_blocks or over_tokens


def test_estimate_n_max_uses_average_length():
    # 1000 free blocks of 16, 90% safe = 900 blocks; avg 100 tokens = 7 blocks -> 128
    assert controller.estimate_n_max(100.0, 1000, 16, 0.9, 256) == 128
    assert controller.estimate_n_max(100.0, 1000, 16, 0.9, 64) == 64
    assert controller.estimate_n_max(0.0, 1000, 16, 0.9, 64) == 64


def test_form_batch_waste_cap():
    limits = controller.BatchLimits(10_000, 16, 64, 100_000)
    assert controller.form_batch([100, 100, 10], limits) == 3
    # adding the 10-token row to two 100s: waste 1 - 210/300 = 0.3 > 0.2
    assert controller.form_batch([100, 100, 10], limits, max_waste=0.2) == 2
