"""Binning rule: boundaries, and the online and offline batch formers giving identical batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.designs.multibin.binning import (BinBatcher, BinEdges, OnlineQuantileEdges, exponential_edges, form_batches,
                                       quantile_edges, uniform_edges)


def test_bin_assignment_half_open_and_clamped():
    edges = uniform_edges(0, 30, 3)  # 10, 20
    assert [edges.bin_of(v) for v in (-5, 0, 9.99, 10, 19.9, 20, 99)] == [0, 0, 0, 1, 1, 2, 2]
    assert edges.bins_of(np.array([-5, 10, 20, 99])).tolist() == [0, 1, 2, 2]


def test_boundaries():
    assert quantile_edges(np.arange(1, 101), 4).inner == pytest.approx((25.75, 50.5, 75.25))
    e = exponential_edges(0.1, 200, 2)
    assert e.inner[0] == pytest.approx(10 * np.log(np.sum(1 / np.arange(1, 201))))
    with pytest.raises(ValueError, match="non-decreasing"):
        BinEdges((3.0, 1.0))
    with pytest.raises(ValueError, match="num_bins"):
        uniform_edges(1, 2, 0)


def test_online_edges_refit_after_warmup():
    online = OnlineQuantileEdges(2, uniform_edges(0, 100, 2), warmup=10, refit_every=5)
    for v in range(9):
        online.observe(1000 + v)
    assert online.edges.inner == (50.0,)
    online.observe(1009)
    assert online.num_refits == 1 and online.edges.inner[0] == pytest.approx(1004.5)


def _online(bins, times, B, max_wait):
    batcher = BinBatcher(int(bins.max()) + 1, B, max_wait)
    out = []
    for i, (b, t) in enumerate(zip(bins.tolist(), times.tolist())):
        out += batcher.add(i, b, t)
    end = float(times[-1])  # the arrivals end: what is due by then leaves at its deadline, the rest now
    out += batcher.release_due(end) + batcher.flush(end)
    return sorted((round(x.ready_s, 9), x.bin_index, x.member_ids) for x in out)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), k=st.integers(1, 4), B=st.integers(1, 5), seed=st.integers(0, 10**6),
       max_wait=st.one_of(st.none(), st.floats(0.0, 3.0)))
def test_online_and_offline_batches_identical(n, k, B, seed, max_wait):
    rng = np.random.default_rng(seed)
    times = np.sort(np.round(rng.uniform(0, 10, n), 1))  # rounding creates ties
    bins = rng.integers(0, k, n)
    bins[0] = k - 1
    off = form_batches(bins, times, B, max_wait_s=max_wait)
    offline = sorted((round(float(off.ready_s[j]), 9), int(off.bin_index[j]),
                      tuple(off.members[off.offsets[j]:off.offsets[j + 1]].tolist())) for j in range(off.num_batches))
    assert offline == _online(bins, times, B, max_wait)
    # every request in exactly one batch, batches never mix bins, never exceed B
    assert sorted(off.members.tolist()) == list(range(n))
    for j in range(off.num_batches):
        members = off.members[off.offsets[j]:off.offsets[j + 1]]
        assert len(members) <= B and set(bins[members].tolist()) == {int(off.bin_index[j])}
    assert np.all(np.diff(off.ready_s) >= 0)


def test_max_wait_releases_partial_batch():
    batcher = BinBatcher(2, 4, max_wait_s=1.0)
    assert batcher.add(0, 0, 0.0) == []
    assert batcher.next_deadline_s() == 1.0
    assert batcher.release_due(0.5) == []
    (batch,) = batcher.release_due(1.0)
    assert batch.member_ids == (0,) and batch.ready_s == 1.0 and not batch.full
    assert batcher.next_deadline_s() is None
