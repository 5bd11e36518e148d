"""The predictor: vectorised pass layout, probes that agree with commits, the O(1) queue,
calibration from a real queue, and Algorithm 1's search on top of it."""

import numpy as np
import pytest
from simkit import ToyCostModel

from servelab.designs.dynaserve.passes import decode_rows, fcfs_prefill
from servelab.designs.dynaserve.profile import ProfileTable
from servelab.designs.dynaserve.split import choose_split, segments_for
from servelab.designs.dynaserve.timeline import Segment, Timeline

TARGET = 0.09


@pytest.fixture
def table():
    return ProfileTable.from_cost_model(ToyCostModel(step_s=0.02, token_s=1e-4, ctx_s=1e-7), 4096, 256)


def test_decode_rows_by_hand():
    rows, ctx = decode_rows(np.array([0, 1, 1]), np.array([2, 3, 1]), np.array([10.0, 20.0, 5.0]), cap=256)
    # pass 0: r0 (ctx 10); pass 1: r0 (11), r1 (20), r2 (5); pass 2: r1 (21); pass 3: r1 (22)
    assert rows.tolist() == [1, 3, 1, 1]
    assert ctx.tolist() == [10, 36, 21, 22]
    capped, capped_ctx = decode_rows(np.zeros(4, int), np.full(4, 2), np.full(4, 100.0), cap=2)
    assert capped.tolist() == [2, 2] and capped_ctx.tolist() == pytest.approx([200, 202])  # 4 rows at 100, 101: half kept


def test_fcfs_prefill_fills_free_budget_then_full_passes():
    pre, ends = fcfs_prefill(np.array([100.0, 0.0, 50.0]), np.array([120.0, 100.0]), full_pass_tokens=60)
    # request 0: 100 in pass 0, 20 in pass 2; request 1: 30 in pass 2, 60 in pass 3, 10 in pass 4
    assert pre.tolist() == [100, 0, 50, 60, 10]
    assert ends.tolist() == [2, 4]


def test_probe_predicts_what_commit_does(table):
    t = Timeline(table, target_s=TARGET, max_num_seqs=256)
    t.rebuild(0.0, np.array([50, 200, 400]), np.array([500.0, 900.0, 1500.0]), [])
    for seg in (Segment(0.0, 700, 0, 700), Segment(0.0, 300, 120, 300), Segment(0.5, 0, 600, 1000),
                Segment(0.0, 0, 30, 64)):
        probe = t.probe(seg)
        got = t.commit(seg)
        assert got.work_s == pytest.approx(probe.work_s, rel=0.02)
        assert got.segment_end_s == pytest.approx(probe.segment_end_s, rel=0.05, abs=0.05)
        assert np.all(np.diff(t.end[t.head:t.size]) >= 0)


def test_add_counts_the_work_at_once_and_flush_lays_it_down(table):
    t = Timeline(table, target_s=TARGET, max_num_seqs=256)
    t.rebuild(0.0, np.array([100]), np.array([500.0]), [])
    before = t.work_s
    t.add(Segment(0.0, 400, 50, 400))
    queued = t.work_s
    assert queued > before and t.pending
    t.flush()
    assert not t.pending and t.work_s == pytest.approx(queued, rel=0.02)


def test_advance_drops_the_passes_the_clock_has_passed(table):
    t = Timeline(table, target_s=TARGET, max_num_seqs=256)
    t.rebuild(0.0, np.array([100]), np.array([500.0]), [])
    n, drain = t.num_passes, t.drain_s
    t.advance(drain / 2)
    assert 0 < t.num_passes < n and t.drain_s == drain
    t.advance(drain + 1)
    assert t.num_passes == 0 and t.work_s == 0 and t.drain_s == drain + 1


def test_rebuild_matches_committing_one_by_one(table):
    left, ctx = np.array([30, 80, 10]), np.array([300.0, 1200.0, 50.0])
    segs = [Segment(0.0, 500, 40, 500), Segment(0.0, 200, 0, 200)]
    fast = Timeline(table, target_s=TARGET, max_num_seqs=256)
    fast.rebuild(0.0, left, ctx, segs)
    slow = Timeline(table, target_s=TARGET, max_num_seqs=256)
    slow.rebuild(0.0, left, ctx, [])
    for s in segs:
        slow.commit(s)
    assert fast.work_s == pytest.approx(slow.work_s, rel=0.05)
    assert fast.drain_s == pytest.approx(slow.drain_s, rel=0.05)


def test_a_decode_heavy_request_moves_decode_to_alpha(table):
    alpha = Timeline(table, target_s=TARGET, max_num_seqs=256)
    beta = Timeline(table, target_s=TARGET, max_num_seqs=256)
    choice = choose_split(219, 219 + 1467, alpha, beta, max_probes=6)
    assert 219 < choice.split_tokens < 219 + 1467  # s = P would leave alpha idle after 219 tokens
    assert choice.num_probes <= 6
    assert abs(choice.alpha_work_s - choice.beta_work_s) < 0.25 * max(choice.alpha_work_s, choice.beta_work_s)


def test_a_prefill_heavy_request_on_a_busy_alpha_moves_prefill_to_beta(table):
    alpha = Timeline(table, target_s=TARGET, max_num_seqs=256)
    beta = Timeline(table, target_s=TARGET, max_num_seqs=256)
    alpha.rebuild(0.0, np.array([], int), np.array([]), [Segment(0.0, 4000, 0, 4000)])
    choice = choose_split(3000, 3020, alpha, beta)
    assert choice.split_tokens < 3000


def test_a_probe_adds_the_segment_work_wherever_it_lands(table):
    t = Timeline(table, target_s=TARGET, max_num_seqs=256)
    t.rebuild(0.0, np.array([50, 200]), np.array([500.0, 900.0]), [])
    for seg in (Segment(0.0, 700, 0, 700), Segment(0.3, 0, 600, 1000)):
        assert t.probe(seg).work_s == pytest.approx(t.work_s + t.segment_work(seg.prefill_tokens, seg.decode_tokens,
                                                                             seg.context))


def test_segments_cover_the_request_once():
    for split in (0, 100, 219, 500, 1686):
        a, b = segments_for(split, 219, 1686, 0.0, 1.0)
        tokens = sum(s.prefill_tokens + s.decode_tokens for s in (a, b) if s is not None)
        assert tokens == 1686
