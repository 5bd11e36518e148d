"""Shared fitting helpers: relative-error summaries and non-negative least squares.

Every fit in this package minimises *relative* error (rows weighted by 1/measured), because
step and kernel times span four orders of magnitude and a simulator cares about percent,
not microseconds, on small steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FitError:
    """Relative errors |predicted / measured - 1| over the fitted samples."""

    num_samples: int
    median_rel_error: float
    p90_rel_error: float
    max_rel_error: float

    def __str__(self) -> str:
        return (f"n={self.num_samples} median {self.median_rel_error:.1%} p90 {self.p90_rel_error:.1%} "
                f"max {self.max_rel_error:.1%}")


def fit_error(predicted: np.ndarray, measured: np.ndarray) -> FitError:
    rel = np.abs(np.asarray(predicted, dtype=float) / np.asarray(measured, dtype=float) - 1.0)
    return FitError(int(rel.size), float(np.median(rel)), float(np.percentile(rel, 90)), float(rel.max()))


def nonneg_relative_lstsq(features: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Coefficients c >= 0 minimising sum(((features @ c) / measured - 1)^2).

    ``scipy.optimize.nnls`` (Lawson-Hanson) on the rows divided by ``measured``, columns scaled
    to a maximum of 1 so features of very different magnitudes (tokens vs context products)
    condition well. Columns that are all zero get 0. It replaced an active-set-by-elimination
    approximation: exact where that was not, and faster (docs/ux.md, ``scripts/ux_report.py``).
    """
    from scipy.optimize import nnls

    x = np.asarray(features, dtype=float)
    y = np.asarray(measured, dtype=float)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"features {x.shape} and measured {y.shape} do not match")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured values must be finite and > 0")
    weighted = x / y[:, None]
    scale = np.abs(weighted).max(axis=0)
    active = scale > 0
    coef = np.zeros(x.shape[1])
    if active.any():
        solution, _ = nnls(weighted[:, active] / scale[active], np.ones_like(y))
        coef[active] = solution / scale[active]
    return coef


def nonneg_relative_lstsq_elimination(features: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """The former hand-written fit (active set by elimination), kept for the comparison in
    ``scripts/ux_report.py``: solve on the active columns, drop the most negative, repeat."""
    x = np.asarray(features, dtype=float)
    y = np.asarray(measured, dtype=float)
    weighted = x / y[:, None]
    scale = np.abs(weighted).max(axis=0)
    active = [j for j in range(x.shape[1]) if scale[j] > 0]
    coef = np.zeros(x.shape[1])
    while active:
        a = weighted[:, active] / scale[active]
        sol, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
        sol = sol / scale[active]
        if sol.min() >= 0:
            coef[active] = sol
            break
        del active[int(np.argmin(sol))]
    return coef
