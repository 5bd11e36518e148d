"""Shared fitting helpers: relative-error summaries and non-negative least squares.

Every fit in this package minimises *relative* error (rows weighted by 1/measured), because
step and kernel times span four orders of magnitude and a simulator cares about percent,
not microseconds, on small steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_FACTOR_TOKENS = 16  # token counts that get their own factor in a linear step-time model


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


def small_token_factors(tokens: np.ndarray, ratios: np.ndarray, c_step: float = 0.0, per_row: float = 0.0,
                        max_tokens: int = MAX_FACTOR_TOKENS) -> tuple[float, ...]:
    """Median ratio per token count <= ``max_tokens`` timed at least twice, made monotone,
    linear between those counts, up to the largest; clipped to [0.5, 2] (a BLAS regime is tens
    of percent, more is noise). Empty when fewer than two such counts were timed, or when no
    step was larger (the line then has nothing else to fit and the factors would only echo its
    misfit).

    Monotone: a decode of T + 1 rows does everything one of T rows does and more, so the line's
    part of it, ``(c_step + per_row * T) * factor(T)``, may not fall as T grows; the medians
    are fitted to that by pool-adjacent-violators (weighted by steps; scipy's
    ``isotonic_regression``). Without it a burst of load during a few small steps made a 1-row decode dearer than a 3-row one."""
    small = [int(t) for t in tokens if 0 < t <= max_tokens]
    counts = sorted(t for t in set(small) if small.count(t) >= 2)
    if len(counts) < 2 or not np.any(tokens > max_tokens):
        return ()
    line = np.array([c_step + per_row * t for t in counts])
    medians = np.array([float(np.median(ratios[tokens == t])) for t in counts])
    weights = [small.count(t) for t in counts]
    if np.all(line > 0):
        from scipy.optimize import isotonic_regression  # here: scipy.optimize costs ~1 CPU-s to import

        medians = isotonic_regression(medians * line, weights=np.asarray(weights, dtype=float)).x / line
    grid = np.arange(1, counts[-1] + 1)
    if np.all(line > 0):  # interpolate the step times (monotone), not the factors
        values = np.interp(grid, counts, medians * line) / (c_step + per_row * grid)
    else:
        values = np.interp(grid, counts, medians)
    return tuple(float(np.clip(v, 0.5, 2.0)) for v in values)
