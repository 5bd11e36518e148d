"""nonneg_relative_lstsq: the true non-negative least-squares optimum of the relative error."""

import numpy as np
import pytest

from servelab.costmodel.fitting import nonneg_relative_lstsq, nonneg_relative_lstsq_elimination


def _problem(seed):
    rng = np.random.default_rng(seed)
    n, k = rng.integers(10, 120), rng.integers(2, 8)
    x = rng.uniform(0, 1, (n, k)) * 10.0 ** rng.uniform(-3, 6, k)
    true = np.abs(rng.normal(size=k)) * (rng.uniform(size=k) > 0.3) * 10.0 ** rng.uniform(-9, -3, k)
    y = np.abs(x @ true) * rng.lognormal(0, 0.1, n) + 1e-6
    return x, y


def _loss(x, y, c):
    return float(np.sum(((x @ c) / y - 1.0) ** 2))


@pytest.mark.parametrize("seed", range(40))
def test_kkt_conditions_hold_and_it_never_loses_to_the_old_fit(seed):
    x, y = _problem(seed)
    c = nonneg_relative_lstsq(x, y)
    assert np.all(c >= 0)
    w = x / y[:, None]
    scale = np.abs(w).max(axis=0)
    grad = 2 * (w / scale).T @ (w @ c - 1.0)  # gradient in the scaled coordinates
    assert np.all(grad[c > 0] == pytest.approx(0.0, abs=1e-6 * max(1.0, np.abs(grad).max())))
    assert np.all(grad[c == 0] >= -1e-6)
    old = nonneg_relative_lstsq_elimination(x, y)
    assert _loss(x, y, c) <= _loss(x, y, old) * (1 + 1e-9) + 1e-12


def test_all_zero_columns_get_zero_and_exact_data_is_recovered():
    x = np.column_stack([np.ones(6), np.arange(1.0, 7.0), np.zeros(6)])
    y = 2e-3 + 5e-4 * np.arange(1.0, 7.0)
    assert nonneg_relative_lstsq(x, y) == pytest.approx([2e-3, 5e-4, 0.0], rel=1e-9)
