"""The drop plan (Figure 6): smallest groups merge first, one copy freed per merge, stops at
the need, ties go to the most loaded; stage ranges cover the model."""

from __future__ import annotations

from servelab.designs.kunserve.drop_plan import drop_plan, stage_layers, time_drop_plan


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
