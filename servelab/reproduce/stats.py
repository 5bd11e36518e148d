"""Seeds and intervals: a claim's number as a mean over seeds with a confidence interval.

One seed is an anecdote (BucketServe's verdict against DistServe moved from 0.92 to 2.06
between seeds). An experiment that repeats over ``Run.seeds`` gets back a ``SeedRuns``;
``SeedRuns.interval(key)`` summarises one number of its rows as an ``Interval``:

* ``t_interval`` (default): mean +- t(n-1) x sd / sqrt(n), Student's t, for a handful of
  seeds of a roughly symmetric quantity;
* ``bootstrap_interval``: the percentile bootstrap of the mean (seeded, so reports are
  reproducible), for skewed quantities (tail latencies, ratios) with enough seeds (>= 5).

With one seed there is no interval: ``low`` and ``high`` are NaN and ``str`` says "1 seed".
Non-finite values (a run that reached no capacity) are left out and counted in ``num_dropped``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy import stats as _scipy_stats

METHODS = ("t", "bootstrap")


@dataclass(frozen=True, slots=True)
class Interval:
    mean: float
    low: float  # NaN with fewer than two values
    high: float
    num_values: int
    confidence: float
    method: str  # "t" or "bootstrap"
    num_dropped: int = 0  # non-finite values left out

    def format(self, fmt: str = "{:.3g}", unit: str = "") -> str:
        """``1.20 (95% CI 0.92-2.06, 3 seeds)``; ``1.20 (1 seed)`` when there is no interval."""
        mean = fmt.format(self.mean) + unit
        seeds = f"{self.num_values} seed{'s' if self.num_values != 1 else ''}"
        dropped = f", {self.num_dropped} without a value" if self.num_dropped else ""
        if not math.isfinite(self.low):
            return f"{mean} ({seeds}{dropped})"
        return (f"{mean} ({100 * self.confidence:.0f}% CI {fmt.format(self.low)}-{fmt.format(self.high)}{unit}, "
                f"{seeds}{dropped})")

    def __str__(self) -> str:
        return self.format()

    def excludes(self, value: float) -> bool:
        """Whether the interval lies wholly on one side of ``value`` (a ratio's verdict: reached
        only if the whole interval is past the paper's point). False without an interval."""
        return math.isfinite(self.low) and (value < self.low or value > self.high)


def _summarise(values: Iterable[float], confidence: float, method: str,
               bounds: Callable[[np.ndarray], tuple[float, float]]) -> Interval:
    """The finite values' mean, and ``bounds(values)`` when there are two or more."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arr = np.asarray([float(v) if v is not None else math.nan for v in values], dtype=float)
    finite = np.isfinite(arr)
    arr, dropped = arr[finite], int((~finite).sum())
    mean = float(arr.mean()) if len(arr) else math.nan
    low, high = bounds(arr) if len(arr) >= 2 else (math.nan, math.nan)
    return Interval(mean, float(low), float(high), len(arr), confidence, method, dropped)


def t_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean and Student-t interval of ``values`` (NaN bounds below two values)."""
    def bounds(arr: np.ndarray) -> tuple[float, float]:
        n, mean = len(arr), float(arr.mean())
        half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1) * arr.std(ddof=1) / math.sqrt(n))
        return mean - half, mean + half

    return _summarise(values, confidence, "t", bounds)


def bootstrap_interval(values: Iterable[float], confidence: float = 0.95, resamples: int = 4000,
                       seed: int = 0) -> Interval:
    """Mean and percentile-bootstrap interval of the mean (``resamples`` draws, seeded)."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")

    def bounds(arr: np.ndarray) -> tuple[float, float]:
        draws = np.random.default_rng(seed).integers(0, len(arr), size=(resamples, len(arr)))
        tail = (1 - confidence) / 2
        low, high = np.quantile(arr[draws].mean(axis=1), [tail, 1 - tail])
        return float(low), float(high)

    return _summarise(values, confidence, "bootstrap", bounds)


def interval(values: Iterable[float], method: str = "t", confidence: float = 0.95) -> Interval:
    if method == "t":
        return t_interval(values, confidence)
    if method == "bootstrap":
        return bootstrap_interval(values, confidence)
    raise ValueError(f"unknown interval method {method!r}; choose from {', '.join(METHODS)}")


@dataclass(frozen=True)
class SeedRuns:
    """One experiment repeated over seeds: ``rows[i]`` is what it returned for ``seeds[i]``."""

    seeds: tuple[int, ...]
    rows: tuple[Any, ...]

    def values(self, key: str | Callable[[Any], float]) -> list[float]:
        get = key if callable(key) else (lambda row: row[key])
        return [get(row) for row in self.rows]

    def interval(self, key: str | Callable[[Any], float], method: str = "t", confidence: float = 0.95) -> Interval:
        """The interval of one number over the seeds: a row key, or a function of a row."""
        return interval(self.values(key), method, confidence)


def over_seeds(fn: Callable[[int], Any], seeds: Sequence[int]) -> SeedRuns:
    """Run ``fn(seed)`` for every seed, in order."""
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("over_seeds needs at least one seed")
    return SeedRuns(seeds, tuple(fn(s) for s in seeds))
