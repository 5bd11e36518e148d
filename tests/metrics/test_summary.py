import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_builders import build_request
from servelab.core.request import SLO, RequestStatus
from servelab.metrics.collector import MetricsCollector
from servelab.metrics.request_metrics import RequestTable
from servelab.metrics.summary import ConservationError, LatencyStats, summarize


def _collector_for(requests, steps=()):
    c = MetricsCollector()
    for s in steps:
        c.on_step(*s)
    for r in requests:
        c.on_request_end(r)
    return c


def _small_run():
    slo = SLO(ttft_s=1.0, tpot_s=0.5)
    reqs = [
        build_request(0, 0.0, [0.5, 1.0, 1.5], slo=slo),  # met; 3 tokens
        build_request(1, 1.0, [3.0, 3.25], slo=slo),  # TTFT 2.0: missed
        build_request(2, 2.0, [2.5], slo=slo),  # met; 1 token
        build_request(3, 2.5, [], status=RequestStatus.REJECTED, reason="kv_full", slo=slo),
        build_request(4, 3.0, [3.5], status=RequestStatus.ABORTED, reason="client", slo=slo),
    ]
    steps = [
        # instance, start, duration, tokens, rows, padding, kv used, kv total, waiting, running, flops
        (0, 0.0, 2.0, 30, 2, 10, 50, 100, 2, 1, 4e12),
        (0, 2.0, 2.0, 20, 2, 0, 100, 100, 0, 2, 4e12),
        (1, 1.0, 1.0, 10, 1, 0, 0, 100, 4, 0, None),
    ]
    return reqs, _collector_for(reqs, steps)


def test_counts_rates_and_attainment():
    reqs, c = _small_run()
    s = summarize(RequestTable.from_requests(reqs), c, peak_flops_per_instance=1e12)
    assert (s.num_arrived, s.num_completed, s.num_rejected, s.num_aborted) == (5, 3, 1, 1)
    assert s.end_reasons == (("finished", "length", 3), ("rejected", "kv_full", 1), ("aborted", "client", 1))
    assert s.duration_s == 3.5  # first arrival 0.0, last end 3.5
    assert s.num_output_tokens == 7  # every emitted token, the aborted one's too
    assert s.output_tokens_per_s == pytest.approx(7 / 3.5)
    assert s.requests_per_s == pytest.approx(3 / 3.5)
    assert s.num_slo_met == 2 and s.slo_attainment == pytest.approx(2 / 5)
    assert s.goodput_requests_per_s == pytest.approx(2 / 3.5)
    assert s.goodput_tokens_per_s == pytest.approx(4 / 3.5)
    assert s.ttft.count == 3 and s.ttft.mean == pytest.approx((0.5 + 2.0 + 0.5) / 3)
    assert s.tpot.count == 2 and s.tbt.count == 3 and s.tbt.max == 0.5
    assert s.e2e.max == 2.25
    assert s.padding_waste == pytest.approx(10 / 70)
    # cluster KV: [0,1) 50/100, [1,2) 50/200, [2,4) 100/200
    assert s.kv_utilization_mean == pytest.approx((0.5 + 0.25 + 2 * 0.5) / 4)
    assert s.kv_utilization_max == 0.5
    assert s.queue_length_max == 6 and s.queue_length_mean == pytest.approx((2 + 6 + 2 * 4) / 4)
    inst = {i.instance_id: i for i in s.instances}
    assert inst[0].busy_s == 4.0 and inst[0].busy_fraction == pytest.approx(4 / 3.5)
    assert inst[0].mfu == pytest.approx(8e12 / (1e12 * 4.0)) and inst[1].mfu is None


def test_duration_and_slo_override():
    reqs, c = _small_run()
    s = summarize(RequestTable.from_requests(reqs), c, duration_s=7.0, slo=SLO(ttft_s=3.0))
    assert s.duration_s == 7.0 and s.output_tokens_per_s == 1.0
    assert s.num_slo_met == 3 and s.slo_attainment == pytest.approx(3 / 5)


def test_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    reqs = []
    for rid in range(200):
        arrival = float(rng.uniform(0, 20))
        times = (arrival + np.cumsum(rng.exponential(0.05, int(rng.integers(1, 30))))).tolist()
        reqs.append(build_request(rid, arrival, times))
    table = RequestTable.from_requests(reqs)
    s = summarize(table, _collector_for(reqs))
    ttft = np.array([r.token_times_s[0] - r.arrival_time_s for r in reqs])
    gaps = np.concatenate([np.diff(r.token_times_s) for r in reqs])
    for stats, values in ((s.ttft, ttft), (s.tbt, gaps)):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        assert (stats.p50, stats.p90, stats.p99) == pytest.approx((p50, p90, p99))
        assert stats.mean == pytest.approx(values.mean()) and stats.count == len(values)


def test_unfinished_requests_break_conservation():
    reqs, c = _small_run()
    reqs.append(build_request(17, 1.0, [1.5], status=RequestStatus.DECODING))
    reqs.append(build_request(23, 1.0, [], status=RequestStatus.QUEUED))
    with pytest.raises(ConservationError, match=r"2 never ended.*ids 17, 23"):
        summarize(RequestTable.from_requests(reqs), c)


def test_collector_ends_must_match_table():
    reqs, _ = _small_run()
    table = RequestTable.from_requests(reqs)
    with pytest.raises(ConservationError, match="without on_request_end: ids 4"):
        summarize(table, _collector_for(reqs[:4]))
    with pytest.raises(ConservationError, match="more than once: ids 2"):
        summarize(table, _collector_for(reqs + [reqs[2]]))
    with pytest.raises(ConservationError, match="not in the table: ids 4"):
        summarize(RequestTable.from_requests(reqs[:4]), _collector_for(reqs))


def test_to_dict_is_json_safe():
    s = summarize(RequestTable.from_requests([]), MetricsCollector())
    d = s.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["num_arrived"] == 0 and d["ttft"]["p99"] is None and d["instances"] == []
    reqs, c = _small_run()
    d = summarize(RequestTable.from_requests(reqs), c).to_dict()
    assert json.loads(json.dumps(d, allow_nan=False))["end_reasons"][0] == ["finished", "length", 3]


def test_flat_dict_for_sweeps():
    reqs, c = _small_run()
    flat = summarize(RequestTable.from_requests(reqs), c, peak_flops_per_instance=1e12).flat_dict()
    assert flat["ttft_count"] == 3 and flat["tbt_max"] == 0.5 and flat["num_completed"] == 3
    assert flat["mfu_mean"] == 2.0 and flat["busy_fraction_mean"] == pytest.approx((4 / 3.5 + 1 / 3.5) / 2)
    assert "end_reasons" not in flat and "instances" not in flat
    assert all(v is None or isinstance(v, (int, float)) for v in flat.values())


def test_latency_stats_ignore_nan():
    stats = LatencyStats.of(np.array([1.0, math.nan, 3.0]))
    assert stats.count == 2 and stats.mean == 2.0 and stats.p50 == 2.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="duration_s"):
        summarize(RequestTable.from_requests([]), MetricsCollector(), duration_s=0)


_request_strategy = st.tuples(
    st.floats(0, 100, allow_nan=False),  # arrival
    st.lists(st.floats(0, 5, allow_nan=False), max_size=6),  # gaps: first is the TTFT
    st.sampled_from([RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED]),
    st.one_of(st.none(), st.builds(SLO, ttft_s=st.one_of(st.none(), st.floats(0.1, 5)),
                                   tpot_s=st.one_of(st.none(), st.floats(0.1, 5)),
                                   tbt_s=st.one_of(st.none(), st.floats(0.1, 5)))),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_request_strategy, max_size=25))
def test_goodput_never_exceeds_throughput(specs):
    reqs = []
    for rid, (arrival, gaps, status, slo) in enumerate(specs):
        if status is RequestStatus.FINISHED and not gaps:
            gaps = [0.5]
        times = (arrival + np.cumsum(gaps)).tolist()
        reqs.append(build_request(rid, arrival, times, status=status, slo=slo))
    s = summarize(RequestTable.from_requests(reqs), _collector_for(reqs))
    assert s.num_arrived == s.num_completed + s.num_rejected + s.num_aborted == len(reqs)
    assert s.num_slo_met <= s.num_completed
    if reqs and s.has_slo:
        assert 0.0 <= s.slo_attainment <= 1.0
    if not s.has_slo:  # no target anywhere: attainment and goodput are undefined, not the finished share
        assert math.isnan(s.slo_attainment) and math.isnan(s.goodput_requests_per_s)
    elif s.duration_s > 0:
        assert s.goodput_requests_per_s <= s.requests_per_s
        assert s.goodput_tokens_per_s <= s.output_tokens_per_s


def test_end_reasons_are_codes_with_counts_not_one_entry_per_request():
    """Issue 31 (7): a summary held 1,268 distinct end reasons (135 KB), each with its token counts."""
    reqs = [build_request(i, float(i), [], status=RequestStatus.REJECTED,
                          reason=f"prompt {1000 + i} + max_tokens {i} exceeds max_model_len 4096")
            for i in range(200)]
    reqs.append(build_request(200, 1.0, [1.5]))
    s = summarize(RequestTable.from_requests(reqs), _collector_for(reqs, [(0, 0.0, 1.0, 1, 1, 0, 1, 10, 0, 1, None)]))
    assert s.end_reasons == (("rejected", "prompt N + max_tokens N exceeds max_model_len N", 200),
                             ("finished", "length", 1))
