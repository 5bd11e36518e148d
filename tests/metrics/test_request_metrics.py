import math

import numpy as np
import pytest

from metrics_builders import build_request

from servelab.core.request import SLO, RequestStatus
from servelab.metrics.request_metrics import ABORTED, FINISHED, REJECTED, UNFINISHED, RequestTable


def test_exact_latencies():
    reqs = [
        build_request(0, 1.0, [1.5, 1.75, 2.0, 2.5], first_scheduled_s=1.25),
        build_request(1, 2.0, [3.0]),  # one token: TPOT undefined
        build_request(2, 0.5, [], status=RequestStatus.REJECTED, reason="too_long"),
    ]
    t = RequestTable.from_requests(reqs)
    assert t.status.tolist() == [FINISHED, FINISHED, REJECTED]
    assert t.num_output_tokens.tolist() == [4, 1, 0]
    assert t.ttft_s[0] == 0.5 and t.ttft_s[1] == 1.0 and math.isnan(t.ttft_s[2])
    assert t.tpot_s[0] == pytest.approx(1.0 / 3)
    assert math.isnan(t.tpot_s[1]) and math.isnan(t.tpot_s[2])
    assert t.tbt_gaps_s.tolist() == [0.25, 0.25, 0.5]
    assert t.tbt_gap_row.tolist() == [0, 0, 0]
    assert t.max_tbt_s[0] == 0.5 and math.isnan(t.max_tbt_s[1])
    assert t.e2e_s[0] == 1.5 and t.e2e_s[1] == 1.0 and math.isnan(t.e2e_s[2])
    assert t.queueing_s[0] == 0.25 and t.queueing_s[1] == 0.0 and math.isnan(t.queueing_s[2])
    assert t.finish_reason == ("length", "length", "too_long")


def test_gaps_never_cross_requests():
    reqs = [build_request(5, 0.0, [1.0, 2.0]), build_request(6, 0.0, [0.5]), build_request(7, 0.0, [0.25, 0.5, 4.0])]
    t = RequestTable.from_requests(reqs)
    assert t.tbt_gaps_s.tolist() == [1.0, 0.25, 3.5]
    assert t.tbt_gap_row.tolist() == [0, 2, 2]
    assert t.max_tbt_s[0] == 1.0 and math.isnan(t.max_tbt_s[1]) and t.max_tbt_s[2] == 3.5
    assert t.gaps_of(np.array([False, False, True])).tolist() == [0.25, 3.5]


def test_slo_met_rules():
    slo = SLO(ttft_s=0.5, tpot_s=0.25, tbt_s=0.5)
    reqs = [
        build_request(0, 0.0, [0.5, 0.75, 1.0], slo=slo),  # exactly at every bound: met
        build_request(1, 0.0, [0.75, 1.0], slo=slo),  # TTFT too slow
        build_request(2, 0.0, [0.25, 0.5, 1.25], slo=slo),  # TPOT 0.5 > 0.25
        build_request(3, 0.0, [0.25, 0.25, 0.25, 0.25, 1.0], slo=SLO(tbt_s=0.5)),  # TPOT fine, one gap 0.75
        build_request(4, 0.0, [0.5], slo=slo),  # one token: TPOT/TBT undefined, TTFT ok
        build_request(5, 0.0, [0.25], status=RequestStatus.ABORTED, reason="client", slo=slo),
        build_request(6, 0.0, [], status=RequestStatus.REJECTED, reason="full", slo=slo),
        build_request(7, 0.0, [100.0]),  # no SLO at all: met once finished
        build_request(8, 0.0, [0.25], status=RequestStatus.DECODING, slo=slo),  # never ended
    ]
    t = RequestTable.from_requests(reqs)
    assert t.slo_met().tolist() == [True, False, False, False, True, False, False, True, False]
    assert t.status[5] == ABORTED and t.status[8] == UNFINISHED
    # an override replaces every request's own targets
    assert t.slo_met(SLO(ttft_s=1.0)).tolist() == [True, True, True, True, True, False, False, False, False]


def test_empty_table():
    t = RequestTable.from_requests([])
    assert len(t) == 0 and t.tbt_gaps_s.size == 0 and t.slo_met().size == 0


def test_bad_token_times_name_the_request():
    with pytest.raises(ValueError, match="backwards for request ids 3"):
        RequestTable.from_requests([build_request(1, 0.0, [1.0, 2.0]), build_request(3, 0.0, [1.0, 0.5])])
    with pytest.raises(ValueError, match="before arrival for request ids 4"):
        RequestTable.from_requests([build_request(4, 2.0, [1.0])])


def test_matches_per_request_loop():
    rng = np.random.default_rng(0)
    reqs = []
    for rid in range(300):
        arrival = float(rng.uniform(0, 10))
        n = int(rng.integers(0, 12))
        times = (arrival + np.cumsum(rng.exponential(0.1, n))).tolist()
        status = RequestStatus.FINISHED if n else RequestStatus.REJECTED
        reqs.append(build_request(rid, arrival, times, status=status))
    t = RequestTable.from_requests(reqs)
    for i, r in enumerate(reqs):
        tt = r.token_times_s
        if len(tt) >= 2:
            assert t.tpot_s[i] == pytest.approx(np.mean(np.diff(tt)))
            assert t.max_tbt_s[i] == pytest.approx(np.max(np.diff(tt)))
        if tt:
            assert t.ttft_s[i] == pytest.approx(tt[0] - r.arrival_time_s)
    expected_gaps = np.concatenate([np.diff(r.token_times_s) for r in reqs if len(r.token_times_s) > 1])
    np.testing.assert_allclose(t.tbt_gaps_s, expected_gaps)
