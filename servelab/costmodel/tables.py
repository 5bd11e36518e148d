"""Lookup tables over a size axis (token count, batch size, message bytes), log-log linear.

Every measured table the profile-driven cost model reads (operator times by token count,
CPU overhead by batch size, collectives by message size) is turned into one of these:

- duplicate x values are averaged;
- with ``monotone`` (CPU overhead, collectives), the y values are made non-decreasing by
  isotonic regression in log space (``scipy.optimize.isotonic_regression``,
  pool-adjacent-violators), so a noisy point is pulled toward its neighbours. Operator
  tables keep their measured medians (``monotone=False``): GEMM times really do dip at tile
  boundaries, and following them predicts left-out token counts better (docs/costmodel.md,
  ``held_out_errors``); the simulator makes the *step* monotone instead, by a running
  maximum over the summed layer time (``profiled``);
- between points: piecewise-linear in (log x, log y), i.e. a local power law, which follows
  both the flat memory-bound start and the linear compute-bound end of a GEMM;
- above the last point: linear in x from the last point (throughput-bound work grows in
  proportion); below the first: the first value (a kernel has a minimum duration), and 0
  at x = 0 (no work, no kernel).

Evaluation is vectorised; callers that sit on the simulator's hot path sample a table once
into a dense list (``dense``) and index it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class LogLogTable:
    x: np.ndarray  # ascending, unique, > 0
    y: np.ndarray  # > 0 (seconds); non-decreasing when ``monotone``
    source: str = ""
    monotone: bool = True

    @classmethod
    def fit(cls, x, y, source: str = "", monotone: bool = True) -> LogLogTable:
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if x.shape != y.shape or x.ndim != 1 or x.size == 0:
            raise ValueError(f"{source or 'table'}: x and y must be equal-length 1-D arrays, got {x.shape} {y.shape}")
        if np.any(~np.isfinite(x)) or np.any(~np.isfinite(y)) or np.any(x <= 0) or np.any(y <= 0):
            raise ValueError(f"{source or 'table'}: sizes and times must be finite and > 0")
        ux, inverse = np.unique(x, return_inverse=True)
        uy = np.bincount(inverse, weights=y) / np.bincount(inverse)
        log_y = np.log(uy)
        if monotone and uy.size > 1:
            from scipy.optimize import isotonic_regression  # here: scipy.optimize costs ~1 CPU-s to import

            log_y = isotonic_regression(log_y, increasing=True).x
        return cls(ux, np.exp(log_y), source, monotone)

    def __call__(self, x) -> np.ndarray:
        q = np.asarray(x, dtype=float)
        inside = np.exp(np.interp(np.log(np.maximum(q, self.x[0])), np.log(self.x), np.log(self.y)))
        above = self.y[-1] * q / self.x[-1]
        out = np.where(q > self.x[-1], above, inside)
        return np.where(q > 0, out, 0.0)

    def at(self, x: float) -> float:
        return float(self(np.array([x]))[0])

    def scaled(self, factor) -> LogLogTable:
        """This table times ``factor(x)`` (an array over ``self.x``), monotone if this one is."""
        return LogLogTable.fit(self.x, self.y * np.asarray(factor, dtype=float), self.source, self.monotone)

    def dense(self, n: int) -> list[float]:
        """Values at x = 0, 1, ..., n as Python floats (index with an int on the hot path)."""
        return self(np.arange(n + 1, dtype=float)).tolist()


def held_out_errors(x, y, num_folds: int = 5, monotone: bool = True) -> np.ndarray:
    """Relative errors |predicted / measured - 1| of points left out of the table: point i
    (endpoints excepted: leaving them out would test extrapolation) is predicted by a table
    fitted without fold i % num_folds. Duplicate x values are averaged first."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ux, inverse = np.unique(x, return_inverse=True)
    uy = np.bincount(inverse, weights=y) / np.bincount(inverse)
    if ux.size < 3:
        return np.empty(0)
    interior = np.arange(1, ux.size - 1)
    errors = []
    for fold in range(num_folds):
        held = interior[interior % num_folds == fold]
        if held.size == 0:
            continue
        keep = np.ones(ux.size, dtype=bool)
        keep[held] = False
        table = LogLogTable.fit(ux[keep], uy[keep], monotone=monotone)
        errors.append(np.abs(table(ux[held]) / uy[held] - 1.0))
    return np.concatenate(errors) if errors else np.empty(0)
