"""Monotone tables: shape of the interpolant, monotonicity under noise, held-out errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.costmodel.tables import LogLogTable, held_out_errors


def test_exact_at_points_and_power_law_between():
    table = LogLogTable.fit([1, 4, 16], [1.0, 2.0, 4.0])
    assert table(np.array([1.0, 4.0, 16.0])).tolist() == pytest.approx([1.0, 2.0, 4.0])
    assert table.at(2.0) == pytest.approx(2 ** 0.5)  # sqrt law between 1 and 4 in log-log


def test_extrapolates_linearly_above_and_flat_below_and_zero_at_zero():
    table = LogLogTable.fit([2, 8], [1.0, 3.0])
    assert table.at(16) == pytest.approx(6.0)
    assert table.at(1) == pytest.approx(1.0)
    assert table.at(0) == 0.0


def test_duplicates_are_averaged_and_a_dip_is_pooled():
    table = LogLogTable.fit([1, 1, 2, 3, 4], [1.0, 3.0, 5.0, 4.0, 6.0])
    assert table.at(1) == pytest.approx(2.0)
    assert table.at(2) == pytest.approx(table.at(3))  # the dip at 3 pooled with 2
    assert table.at(2) <= table.at(3) <= table.at(4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(1e-6, 1.0)), min_size=1, max_size=40))
def test_any_measured_series_gives_a_non_decreasing_table(points):
    xs, ys = zip(*points)
    table = LogLogTable.fit(xs, ys)
    q = np.linspace(0, 20_000, 513)
    values = table(q)
    assert np.all(np.diff(values) >= -1e-15 * np.abs(values[1:]))


@pytest.mark.parametrize("x, y", [([], []), ([1, 2], [1.0]), ([0, 1], [1.0, 2.0]), ([1, 2], [1.0, float("nan")])])
def test_bad_series_are_refused(x, y):
    with pytest.raises(ValueError):
        LogLogTable.fit(x, y, source="t")


def test_held_out_error_of_a_power_law_is_zero_and_of_noise_is_not():
    x = np.arange(1, 200, dtype=float)
    assert held_out_errors(x, 3e-5 * x ** 0.7).max() < 1e-9
    noisy = 3e-5 * x ** 0.7 * (1 + 0.1 * np.sin(x))
    assert held_out_errors(noisy * 0 + x, noisy).max() > 0.01


def test_a_non_monotone_table_keeps_a_measured_dip():
    table = LogLogTable.fit([1, 2, 3, 4], [1.0, 5.0, 4.0, 6.0], monotone=False)
    assert table.at(3) == pytest.approx(4.0) and table.at(3) < table.at(2)
