import math

import numpy as np
import pytest

from servelab.metrics.collector import MetricsCollector, time_weighted_mean


def _step(c, iid, start, dur, kv_used=0, kv_total=10, waiting=0, tokens=10, padding=0, flops=None):
    c.on_step(iid, start, dur, tokens, 2, padding, kv_used, kv_total, waiting, 2, flops)


def test_columns_and_busy_time():
    c = MetricsCollector()
    _step(c, 0, 0.0, 0.5, flops=1e12)
    _step(c, 1, 0.25, 0.25)
    _step(c, 0, 1.0, 0.25, padding=5, flops=2e12)
    cols = c.steps
    assert len(cols) == 3 and c.num_steps == 3
    assert cols.instance_id.dtype == np.int64 and cols.instance_id.tolist() == [0, 1, 0]
    assert np.isnan(cols.flops[1]) and cols.flops[2] == 2e12
    assert c.busy_s() == {0: 0.75, 1: 0.25}
    _step(c, 1, 2.0, 1.0)  # new records invalidate the cached columns
    assert c.busy_s()[1] == 1.25


def test_cluster_series_sums_instances():
    c = MetricsCollector()
    _step(c, 0, 0.0, 1.0, kv_used=4, waiting=3)
    _step(c, 1, 1.0, 1.0, kv_used=2, waiting=1)
    _step(c, 0, 2.0, 1.0, kv_used=6, waiting=0)
    times, used, end = c.cluster_series("kv_used_blocks")
    assert times.tolist() == [0.0, 1.0, 2.0] and used.tolist() == [4, 6, 8] and end == 3.0
    times, waiting, end = c.cluster_series("num_waiting")
    assert waiting.tolist() == [3, 4, 1]
    assert time_weighted_mean(times, waiting, end) == pytest.approx((3 + 4 + 1) / 3)
    _, total, _ = c.cluster_series("kv_total_blocks")
    assert total.tolist() == [10, 20, 20]


def test_time_weighted_mean_weights_by_hold_time():
    assert time_weighted_mean(np.array([0.0, 1.0]), np.array([2.0, 8.0]), 4.0) == pytest.approx((2 + 3 * 8) / 4)
    assert math.isnan(time_weighted_mean(np.empty(0), np.empty(0), 1.0))


def test_preemptions_counted_by_kind():
    c = MetricsCollector()
    c.on_preemption(0, 1.0, "recompute")
    c.on_preemption(0, 2.0, "swap")
    c.on_preemption(1, 2.0, "recompute")
    assert c.num_preemptions("recompute") == 2 and c.num_preemptions("swap") == 1
    with pytest.raises(ValueError, match="instance 3"):
        c.on_preemption(3, 4.0, "evict")


def test_bad_step_named():
    c = MetricsCollector()
    _step(c, 0, 0.0, 0.5)
    _step(c, 2, 1.0, -0.5)
    with pytest.raises(ValueError, match="step 1 .instance 2"):
        c.steps


def test_empty_collector():
    c = MetricsCollector()
    assert len(c.steps) == 0 and c.busy_s() == {}
    times, values, end = c.cluster_series("num_waiting")
    assert times.size == 0 and math.isnan(end)
    with pytest.raises(ValueError, match="no time series"):
        c.cluster_series("flops")
