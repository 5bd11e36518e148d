"""Step records packed into float64 blocks read back as the tuples they were."""

import numpy as np
import pytest

from servelab.metrics import collector as collector_mod
from servelab.metrics.collector import STEP_COLUMNS, MetricsCollector


def _fill(c, n):
    for k in range(n):
        c.on_step(k % 3, 0.5 * k, 0.25, 10 + k, 2, k % 2, k, 100, k % 5, 2, None if k % 4 else 1e9 * k)


@pytest.mark.parametrize("n", [0, 1, 6, 7, 20])
def test_packed_blocks_read_as_unpacked(monkeypatch, n):
    whole = MetricsCollector()
    _fill(whole, n)
    monkeypatch.setattr(collector_mod, "CHUNK_STEPS", 3)
    packed = MetricsCollector()
    _fill(packed, n)
    assert packed.num_steps == whole.num_steps == n
    assert len(packed._blocks) == n // 3
    for name in STEP_COLUMNS:
        a, b = getattr(whole.steps, name), getattr(packed.steps, name)
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
    assert packed.busy_s() == whole.busy_s()


def test_bad_step_named_across_blocks(monkeypatch):
    monkeypatch.setattr(collector_mod, "CHUNK_STEPS", 2)
    c = MetricsCollector()
    _fill(c, 5)
    c.on_step(2, 9.0, -1.0, 1, 1, 0, 0, 10, 0, 1, None)
    with pytest.raises(ValueError, match="step 5 .instance 2"):
        c.steps
