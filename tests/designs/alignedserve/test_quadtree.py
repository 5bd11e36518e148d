"""The quad-tree keeps exact subtree counters under inserts, removals and growth, and
Density First Search produces each of Algorithm 1's three cases."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.designs.alignedserve.quadtree import QuadTree


def _check_counters(tree: QuadTree) -> None:
    def walk(node):
        if node.items is not None:
            assert node.num_requests == len(node.items)
            assert node.num_blocks == sum(b for _, b in node.items.values())
            assert all(node.lo <= length <= node.hi for length, _ in node.items.values())
            return node.num_requests, node.num_blocks
        n = b = 0
        for c in node.children or []:
            if c is not None:
                cn, cb = walk(c)
                n, b = n + cn, b + cb
        assert (node.num_requests, node.num_blocks) == (n, b)
        return n, b

    walk(tree.root)


def test_counters_stay_exact_under_random_updates():
    rng = np.random.default_rng(1)
    tree = QuadTree(max_len=65536, leaf_width=16)
    live: dict[int, int] = {}
    for step in range(3000):
        op = rng.random()
        if op < 0.5 or not live:
            rid = step
            length = int(rng.integers(1, 70000))  # beyond max_len counts as max_len
            tree.insert(rid, length, -(-min(length, 65536) // 16))
            live[rid] = min(length, 65536)
        elif op < 0.8:
            rid = int(rng.choice(list(live)))
            live[rid] = min(live[rid] + int(rng.integers(1, 40)), 65536)
            tree.update(rid, live[rid], -(-live[rid] // 16))
        else:
            rid = int(rng.choice(list(live)))
            tree.remove(rid)
            del live[rid]
    _check_counters(tree)
    assert len(tree) == len(live) and {r: tree.length_of(r) for r in live} == live


def test_case_1_takes_a_subtree_that_fits_with_enough_requests():
    tree = QuadTree(max_len=1024, leaf_width=16)
    for i in range(40):
        tree.insert(i, 100 + i % 8, 7)  # all in one leaf
    for i in range(40, 45):
        tree.insert(i, 900, 57)
    batch = tree.search(max_blocks=300, min_requests=36)
    assert batch.case == 1 and sorted(batch.request_ids) == list(range(40)) and batch.num_blocks == 280


def test_case_2_descends_to_the_densest_child():
    tree = QuadTree(max_len=1024, leaf_width=16)
    for i in range(50):  # dense region near 700
        tree.insert(i, 700 + i % 10, 45)
    for i in range(50, 60):  # sparse region near 100
        tree.insert(i, 100, 7)
    batch = tree.search(max_blocks=10_000, min_requests=36)  # the root fits: case 1 at the root
    assert batch.case == 1 and len(batch.request_ids) == 60
    batch = tree.search(max_blocks=2300, min_requests=36)  # root too big: go to the dense child
    assert set(batch.request_ids) <= set(range(50)) and batch.min_len >= 700


def test_case_3_widens_through_the_nearest_siblings():
    tree = QuadTree(max_len=1024, leaf_width=16)
    # 20 requests at 500, 20 at 530 (two leaves in two quarters), 10 far away at 50: the root is
    # too large (case 2), the densest quarter too small (case 3), and only the near leaf joins
    for i in range(20):
        tree.insert(i, 500, 32)
        tree.insert(100 + i, 530, 34)
    for i in range(10):
        tree.insert(200 + i, 50, 4)
    batch = tree.search(max_blocks=1350, min_requests=36)
    assert batch.case == 3
    assert set(batch.request_ids) == set(range(20)) | set(range(100, 120))
    assert batch.max_len - batch.min_len == 30
    assert tree.search(max_blocks=1350, min_requests=100) is None  # not enough: wait
    forced = tree.search(max_blocks=1350, min_requests=100, force=True)
    assert forced.forced and forced.num_blocks <= 1350


def test_a_subtree_that_generates_no_batch_starves_by_its_own_stamp():
    # the long request's leaf became non-empty at t=0; the short range keeps generating batches
    tree = QuadTree(max_len=4096, leaf_width=16)
    tree.insert(1, 3000, 188, now_s=0.0)
    for t in range(1, 12):
        ids = list(range(100 * t, 100 * t + 40))
        for i in ids:
            tree.insert(i, 200, 13, now_s=float(t))
        tree.mark_batch(ids, float(t))
        for i in ids:
            tree.remove(i)
        assert tree.starving(float(t), bound_s=10.0) is None or t >= 10
    node = tree.starving(11.0, bound_s=10.0)
    assert node is not None and node.lo <= 3000 <= node.hi and node.stamp == 0.0
    batch = tree.search(max_blocks=500, min_requests=36, force=True, start=node)
    assert batch.request_ids == (1,)
    tree.mark_batch(batch.request_ids, 11.0)
    tree.remove(1)
    assert tree.starving(100.0, bound_s=10.0) is None and tree.oldest_stamp == float("inf")


def test_oldest_stamp_is_the_earliest_non_empty_subtree():
    tree = QuadTree(max_len=4096, leaf_width=16)
    tree.insert(1, 100, 7, now_s=5.0)
    tree.insert(2, 2000, 125, now_s=3.0)
    tree.insert(3, 2001, 126, now_s=9.0)  # same leaf as request 2: its stamp stays 3
    assert tree.oldest_stamp == 3.0
    tree.mark_batch([2], 8.0)  # taking one of the leaf's requests refreshes the leaf
    assert tree.oldest_stamp == 5.0
    tree.remove(1)
    assert tree.oldest_stamp == 8.0


def test_in_range_returns_only_the_range():
    tree = QuadTree(max_len=4096, leaf_width=16)
    for i in range(100):
        tree.insert(i, 10 * i + 1, 1)
    got = tree.in_range(200, 300, limit=100)
    assert sorted(got) == [i for i in range(100) if 200 <= 10 * i + 1 <= 300]
    assert len(tree.in_range(1, 4096, limit=5)) == 5


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        QuadTree(max_len=0)
