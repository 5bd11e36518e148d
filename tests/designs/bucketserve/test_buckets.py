"""Property tests of the Request Bucketing Manager (Algorithm 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.designs.bucketserve.buckets import BucketingConfig, BucketManager

MAX_LEN = 4096

ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "adjust"]), st.integers(0, MAX_LEN), st.integers(0, 64)),
    max_size=120,
)


def _run(manager: BucketManager, script) -> dict[int, int]:
    live: dict[int, int] = {}
    next_key = 0
    for op, length, n in script:
        if op == "add":
            manager.add(next_key, length, float(next_key))
            live[next_key] = length
            next_key += 1
        elif op == "remove" and live:
            key = sorted(live)[n % len(live)]
            assert manager.remove(key).length == live.pop(key)
        elif op == "adjust":
            before = [i for i in range(manager.num_buckets) if len(manager) >= n and manager.qualifies_for_split(i, n)]
            edges = manager.edges()
            result = manager.adjust(n)
            if len(manager) < n:  # low load: everything merged into one bucket, no splitting
                assert manager.num_buckets == 1
            elif manager.config.repeat:
                for i in range(manager.num_buckets):
                    assert not manager.qualifies_for_split(i, n), "a bucket still qualifies after ADJUSTBUCKETS"
            else:  # one pass: each bucket that qualified is split once at its midpoint, no other
                assert result.num_splits == len(before)
                mids = {(edges[i] + edges[i + 1]) // 2 for i in before}
                assert set(manager.edges()) == set(edges) | mids
        manager.check_invariants()
    return live


@settings(max_examples=150, deadline=None)
@given(ops, st.floats(0.0, 0.9), st.sampled_from([None, 0, 2, 8]), st.booleans(), st.booleans())
def test_every_request_in_exactly_one_matching_bucket(script, theta, m, split_high, repeat):
    manager = BucketManager(BucketingConfig(MAX_LEN, theta, m, 1, split_high, repeat))
    live = _run(manager, script)
    assert len(manager) == len(live)
    seen = {}
    for i, view in enumerate(manager.views()):
        last = i == manager.num_buckets - 1
        for e in manager.entries(i):
            assert view.low <= e.length < view.up or (last and e.length == view.up)
            assert e.key not in seen
            seen[e.key] = e.length
    assert seen == live
    edges = manager.edges()
    assert edges[0] == 0 and edges[-1] == MAX_LEN and all(a < b for a, b in zip(edges, edges[1:]))


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(st.integers(0, 10**6), max_size=40), st.sampled_from(["fcfs", "sjf", "any"]))
def test_removing_a_batch_at_once_equals_removing_it_one_by_one(script, picks, how):
    """``remove_many`` (the decision's fast path) leaves the state ``remove`` would, entry for entry."""
    one, many = BucketManager(BucketingConfig(MAX_LEN)), BucketManager(BucketingConfig(MAX_LEN))
    live = _run(one, script)
    _run(many, script)
    if live:
        if how == "any":
            keys = list(dict.fromkeys(sorted(live)[p % len(live)] for p in picks))
        else:
            index = one.oldest_bucket()
            keys = [e.key for e in one.candidates(index, how, max(1, len(picks)))]
        assert [one.remove(k) for k in keys] == many.remove_many(keys)
        many.check_invariants()
    assert one.views() == many.views()
    assert [one.entries(i) for i in range(one.num_buckets)] == [many.entries(i) for i in range(many.num_buckets)]
    assert one.oldest_bucket() == many.oldest_bucket() and one.longest() == many.longest()


def test_removing_a_batch_names_what_is_not_there():
    manager = BucketManager(BucketingConfig(MAX_LEN))
    manager.add(1, 10, 0.0)
    with pytest.raises(KeyError, match="2"):
        manager.remove_many([1, 2])
    with pytest.raises(KeyError):
        manager.remove_many([1, 1])
    assert len(manager) == 1  # nothing removed by a refused batch


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, MAX_LEN), min_size=1, max_size=200), st.integers(0, 50))
def test_lookup_is_bisection_consistent_with_intervals(lengths, n_max):
    manager = BucketManager(BucketingConfig(MAX_LEN, 0.5, 0, 1))
    for k, s in enumerate(lengths):
        manager.add(k, s, 0.0)
    manager.adjust(n_max)
    edges = manager.edges()
    for s in range(0, MAX_LEN + 1, 37):
        i = manager.bucket_index(s)
        assert edges[i] <= s < edges[i + 1] or (i == manager.num_buckets - 1 and s == MAX_LEN)


def test_merge_when_total_below_n_max():
    manager = BucketManager(BucketingConfig(MAX_LEN, 0.5, 0, 1))
    for k in range(10):
        manager.add(k, 10 + k, float(k))
    manager.adjust(1)
    assert manager.num_buckets > 1
    result = manager.adjust(11)
    assert result.merged and manager.num_buckets == 1 and len(manager) == 10
    manager.check_invariants()


def test_split_follows_algorithm_1():
    # 7 of 8 requests below the midpoint 2048, more than m = 4 requests: split
    manager = BucketManager(BucketingConfig(MAX_LEN, 0.5, 4, 1))
    for k, s in enumerate([100, 200, 300, 400, 500, 600, 700, 3000]):
        manager.add(k, s, float(k))
    result = manager.adjust(4)
    assert result.num_splits >= 1
    assert manager.edges()[:2] == [0, 1024] or 2048 in manager.edges()
    # a long-heavy bucket is not split by the paper's rule (only split_high does that)
    long_heavy = BucketManager(BucketingConfig(MAX_LEN, 0.5, 4, 1))
    for k, s in enumerate([3000, 3100, 3200, 3300, 3400, 3500, 3600, 100]):
        long_heavy.add(k, s, float(k))
    assert long_heavy.adjust(4).num_splits == 0
    symmetric = BucketManager(BucketingConfig(MAX_LEN, 0.5, 4, 1, split_high=True))
    for k, s in enumerate([3000, 3100, 3200, 3300, 3400, 3500, 3600, 100]):
        symmetric.add(k, s, float(k))
    assert symmetric.adjust(4).num_splits >= 1


def test_m_defaults_to_n_max():
    manager = BucketManager(BucketingConfig(MAX_LEN))
    for k in range(6):
        manager.add(k, 10, float(k))
    assert manager.adjust(6).num_splits == 0  # 6 requests, not more than m = N_max = 6
    assert manager.adjust(5).num_splits > 0


def test_selection_orders():
    manager = BucketManager(BucketingConfig(MAX_LEN))
    for k, (s, t) in enumerate([(50, 3.0), (10, 1.0), (90, 2.0), (30, 0.5)]):
        manager.add(k, s, t)
    assert [e.key for e in manager.candidates(0, "fcfs", 10)] == [3, 1, 2, 0]
    assert [e.length for e in manager.candidates(0, "sjf", 2)] == [10, 30]
    assert [e.length for e in manager.candidates(0, "ljf", 2)] == [90, 50]
    manager.repartition([0, 40, MAX_LEN])
    assert manager.oldest_bucket() == 0  # request 3 (t=0.5, length 30)
    manager.remove(3)
    manager.remove(1)
    assert manager.oldest_bucket() == 1
    assert manager.fullest_bucket() == 1


def test_bad_input_is_a_clear_error():
    manager = BucketManager(BucketingConfig(100))
    with pytest.raises(ValueError, match="outside"):
        manager.add(1, 101, 0.0)
    manager.add(1, 5, 0.0)
    with pytest.raises(ValueError, match="already"):
        manager.add(1, 5, 0.0)
    with pytest.raises(KeyError):
        manager.remove(2)
    with pytest.raises(ValueError, match="theta"):
        BucketingConfig(100, theta=1.5)


def test_adjust_makes_one_split_pass_as_algorithm_1_unless_repeat():
    """Algorithm 1 splits each qualifying bucket once per ADJUSTBUCKETS call; repeating until
    no bucket qualifies (the default before issue 32) is the ``repeat`` variant."""
    lengths = [10 + k for k in range(40)]  # all far below every midpoint down to width 64
    one = BucketManager(BucketingConfig(MAX_LEN, 0.5, 4, 16))
    rep = BucketManager(BucketingConfig(MAX_LEN, 0.5, 4, 16, repeat=True))
    for k, s in enumerate(lengths):
        one.add(k, s, float(k))
        rep.add(k, s, float(k))
    assert one.adjust(4).num_splits == 1 and one.edges() == [0, 2048, MAX_LEN]
    assert one.adjust(4).num_splits == 1 and one.edges() == [0, 1024, 2048, MAX_LEN]  # the next call goes on
    assert rep.adjust(4).num_splits > 2
    assert not any(rep.qualifies_for_split(i, 4) for i in range(rep.num_buckets))
