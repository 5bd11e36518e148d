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

    Active set by elimination: solve on the active columns, drop the most negative
    coefficient, repeat. Columns that are all zero get 0. This equals true NNLS whenever
    the dropped columns stay at zero in the optimum, which holds for the few, physically
    separate features fitted here; it is deterministic and needs only numpy.
    """
    x = np.asarray(features, dtype=float)
    y = np.asarray(measured, dtype=float)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"features {x.shape} and measured {y.shape} do not match")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured values must be finite and > 0")
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
