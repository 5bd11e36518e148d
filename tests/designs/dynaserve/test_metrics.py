"""DynaServe's metrics on hand-built runs: per-request P99 TBT, goodput, token share, steady
throughput, non-overlapped transfer."""

import numpy as np
import pytest

from servelab.core.request import Request, RequestSpec, RequestStatus
from servelab.designs.dynaserve import metrics as dm
from servelab.metrics.request_metrics import RequestTable


def _req(rid, times, arrival=0.0, delay=0.0):
    r = Request(RequestSpec(rid, arrival, 10, max(len(times), 1)))
    r.token_times_s = list(times)
    r.num_generated_tokens = len(times)
    r.first_scheduled_time_s = arrival + delay
    r.finish(RequestStatus.FINISHED, times[-1], "length")
    return r


def test_one_slow_gap_fails_a_short_request_but_not_a_long_one():
    short = _req(0, [0.1 + 0.05 * i for i in range(10)] + [1.0])  # 10 gaps, one of 0.55 s
    long_ = _req(1, list(np.cumsum([0.05] * 150)) + [20.0])  # 150 gaps, one slow: 1% allowed
    two = _req(2, list(np.cumsum([0.05] * 150)) + [20.0, 40.0])  # 151 gaps, two slow
    fine = _req(3, [0.2, 0.25, 0.3])
    table = RequestTable.from_requests([short, long_, two, fine])
    assert dm.meets_tbt(table).tolist() == [False, True, False, True]
    out = dm.tbt_outcome(table)
    assert out.attainment == 0.5
    assert out.goodput_tokens_per_s == pytest.approx((151 + 3) / out.duration_s)
    assert out.token_share_within == pytest.approx(np.mean(table.tbt_gaps_s <= 0.1))


def test_saturated_throughput_counts_the_second_half_of_the_arrivals():
    # arrivals every 0.05 s for 10 s, completions every 0.1 s (the queue grows), a long drain
    reqs = [_req(i, [0.1 * (i + 1)], arrival=0.05 * i) for i in range(200)]
    table = RequestTable.from_requests(reqs)
    assert dm.saturated_throughput(table) == pytest.approx(10.0, rel=0.05)
    assert dm.tbt_outcome(table).requests_per_s == pytest.approx(10.0, rel=0.05)
    assert dm.bottleneck_throughput(200, [10.0, 20.0]) == 10.0


def test_capacity_needs_both_the_slo_and_a_bounded_delay():
    table = RequestTable.from_requests([_req(i, [0.1 * (i + 1)]) for i in range(10)])
    out = dm.tbt_outcome(table)
    assert dm.capacity_pass(out)
    assert not dm.capacity_pass(out, max_delay_s=-1.0)


def test_the_papers_capacity_rule_bounds_the_median_delay_and_the_p99_rule_is_stricter():
    """Sarathi-Serve (whose definition the paper follows) bounds the median scheduling delay:
    two requests of 100 queued 5 s pass it but fail the P99 rule (the rule used before)."""
    reqs = [_req(i, [6.0 + 0.05 * k for k in range(5)], delay=5.0 if i < 2 else 0.0) for i in range(100)]
    out = dm.tbt_outcome(RequestTable.from_requests(reqs))
    assert out.delay_p50_s == 0.0 and out.delay_p99_s == pytest.approx(5.0)
    assert dm.capacity_pass(out)  # the default is the paper's rule
    assert dm.capacity_pass(out, delay_rule="median")
    assert not dm.capacity_pass(out, delay_rule="p99")
    with pytest.raises(ValueError, match="delay_rule"):
        dm.capacity_pass(out, delay_rule="mean")


def test_non_overlapped_transfer_is_landing_minus_handoff():
    gaps = dm.non_overlapped_transfer_s({1: 1.0, 2: 2.0, 3: 3.0}, {1: 1.5, 2: 2.001})
    assert gaps.tolist() == pytest.approx([0.5, 0.001])
    assert dm.handoff_times({0: {"handoff_times_s": {1: 1.0}}, 1: {}}) == {1: 1.0}
