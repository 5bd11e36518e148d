"""The drop plan (Figure 6): smallest groups merge first, one copy freed per merge, stops at
the need, ties go to the most loaded; stage ranges cover the model."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.designs.kunserve.drop_plan import (BULK_FROM, _bulk_plan, _heap_plan, drop_plan, merge_layers,
                                                 stage_layers, time_drop_plan)


def test_pairs_singletons_before_growing_groups():
    plan = drop_plan([(0,), (1,), (2,), (3,)], need_bytes=2.0, copy_bytes=1.0)
    assert plan.satisfied and plan.freed_bytes == 2.0
    assert sorted(len(g) for g in plan.groups) == [2, 2]
    assert sorted(i for g in plan.groups for i in g) == [0, 1, 2, 3]
    plan = drop_plan([(0,), (1,), (2,), (3,)], need_bytes=3.0, copy_bytes=1.0)
    assert [len(g) for g in plan.groups] == [4] and len(plan.merged) == 1


def test_stops_at_the_need_and_reports_when_no_plan_covers_it():
    plan = drop_plan([(0,), (1,), (2,), (3,)], need_bytes=0.5, copy_bytes=1.0)
    assert len(plan.merged) == 1 and plan.satisfied
    plan = drop_plan([(0,), (1,)], need_bytes=5.0, copy_bytes=1.0)
    assert plan.freed_bytes == 1.0 and not plan.satisfied
    assert drop_plan([(0,)], need_bytes=1.0, copy_bytes=1.0).merged == ()


def test_existing_groups_merge_after_singletons_and_ties_follow_the_load():
    plan = drop_plan([(0, 1), (2,), (3,), (4,)], need_bytes=1.0, copy_bytes=1.0, tie={2: 0.0, 3: -5.0, 4: -9.0})
    assert plan.merged == ((4, 3),)  # the two most loaded singletons, not the formed pair
    capped = drop_plan([(0, 1), (2, 3)], need_bytes=1.0, copy_bytes=1.0, max_group_size=3)
    assert capped.merged == () and not capped.satisfied


def test_stage_ranges_cover_the_model_contiguously():
    for layers, stages in ((48, 2), (80, 4), (7, 3)):
        ranges = stage_layers(layers, stages)
        assert ranges[0][0] == 0 and ranges[-1][1] == layers
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))


def test_planning_for_1024_instances_merges_them_all():
    out = time_drop_plan(1024, repeats=3)
    assert out["num_merges"] == 1023 and out["median_ms"] > 0


def test_a_merge_of_formed_groups_keeps_each_member_inside_the_layers_it_holds():
    """The second drop: formed groups merge without loading layers (each member keeps a
    sub-range of what it holds) and the new stages cover the model contiguously."""
    pair = [(0, (0, 24)), (1, (24, 48))]
    cases = (pair + [(2, (0, 24)), (3, (24, 48))],  # pair + pair
             pair + [(2, (0, 48))],  # pair + single
             pair + [(2, (0, 16)), (3, (16, 32)), (4, (32, 48))])  # pair + triple
    for held in cases:
        layout = merge_layers(held, 48)
        assert layout is not None and sorted(i for i, _ in layout) == [i for i, _ in held]
        ranges = [r for _, r in layout]
        assert ranges[0][0] == 0 and ranges[-1][1] == 48
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))
        have = dict(held)
        assert all(have[i][0] <= lo and hi <= have[i][1] for i, (lo, hi) in layout)
    assert [r for _, r in merge_layers(cases[0], 48)] == [(0, 12), (12, 24), (24, 36), (36, 48)]
    assert merge_layers([(0, (0, 24)), (1, (30, 48))], 48) is None  # layers 24-30: nobody holds them


@st.composite
def _plan_inputs(draw):
    """Groups partitioning shuffled instance ids (singles and formed groups), ties drawn from a
    few values (so equal ties happen) or none, needs from none to everything, and caps."""
    ids = draw(st.permutations(list(range(draw(st.integers(1, 48))))))
    sizes = draw(st.lists(st.integers(1, 5), min_size=len(ids), max_size=len(ids)))
    groups, k = [], 0
    for size in sizes:
        if k >= len(ids):
            break
        groups.append(tuple(ids[k:k + size]))
        k += size
    values = st.sampled_from([0.0, -1.0, 0.5, 1.0, 2.0, -0.0]) | st.floats(-3, 3)
    tie = draw(st.none() | st.dictionaries(st.sampled_from(ids), values))
    need = draw(st.sampled_from([0.0, -1.0, 1e18]) | st.floats(0, 60))
    copy = draw(st.sampled_from([1.0, 0.1, 0.3, 2.5, 0.0]))
    cap = draw(st.none() | st.integers(1, 12))
    return groups, need, copy, tie, cap


@settings(max_examples=400, deadline=None)
@given(_plan_inputs())
def test_the_bulk_plan_is_the_heap_plan(args):
    """The faster planner (runs of merges per numpy operation) changes no plan: the same groups,
    merged groups in the same order, the same bytes freed, on random inputs."""
    assert _bulk_plan(*args) == _heap_plan(*args)


def test_the_bulk_plan_is_the_heap_plan_at_cluster_scale():
    """Past ``BULK_FROM`` ``drop_plan`` takes the bulk path; hundreds to thousands of groups,
    some already formed, random loads, needs and caps: every plan equals the heap's."""
    rnd = random.Random(24)
    for trial in range(30):
        n = rnd.randint(BULK_FROM, 2048)
        ids = list(range(n))
        rnd.shuffle(ids)
        groups, k = [], 0
        while k < n:
            size = rnd.choice((1, 1, 1, 2, 4))
            groups.append(tuple(ids[k:k + size]))
            k += size
        tie = {i: float(rnd.randint(0, 20)) for i in ids} if trial % 3 else {i: rnd.random() for i in ids}
        for need, cap in ((float(n), None), (rnd.uniform(0, n / 2), None), (float(n), rnd.choice((2, 4, 8, 64)))):
            assert drop_plan(groups, need, 1.0, tie, cap) == _heap_plan(groups, need, 1.0, tie, cap)
    nan_tie = {0: float("nan")} | {i: 1.0 for i in range(1, BULK_FROM)}
    singles = [(i,) for i in range(BULK_FROM)]
    assert _bulk_plan(singles, 5.0, 1.0, nan_tie, None) is None  # NaN: no key order; the heap plans
    assert drop_plan(singles, 5.0, 1.0, nan_tie) == _heap_plan(singles, 5.0, 1.0, nan_tie, None)
