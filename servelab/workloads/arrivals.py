"""Arrival processes: when requests arrive, independent of what they ask for.

Each process is a small frozen config with ``sample(num_requests, rng) -> np.ndarray`` of
arrival times in seconds. Invariants of every sample: float64, non-decreasing, first arrival
at exactly 0.0 (so synthetic workloads line up with traces, which are re-based to their
first row), and the same ``rng`` state gives the same times. Arrival times and lengths come
from separate generators and are combined in ``workload.py`` (Vidur's split).

Registered by name in ``ARRIVAL_PROCESSES`` so the spec parser can list them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from servelab.core.errors import UserError
from servelab.core.limits import MAX_CV


class ArrivalProcess(Protocol):
    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray: ...


def _check_rate(rate_per_s: float) -> None:
    if not 0 < rate_per_s < math.inf:
        raise UserError(f"rate must be a finite number > 0 (requests/s), got {rate_per_s}")


def _check_count(num_requests: int) -> None:
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")


def _times_from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    """n gaps -> n arrivals starting at 0; the last gap is unused so every count starts at 0."""
    times = np.zeros(gaps_s.size, dtype=np.float64)
    if gaps_s.size > 1:
        np.cumsum(gaps_s[:-1], out=times[1:])
    return times


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Exponential inter-arrival gaps with mean ``1 / rate_per_s`` (CV of gaps = 1)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        _check_count(num_requests)
        return _times_from_gaps(rng.exponential(1.0 / self.rate_per_s, size=num_requests))


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma-distributed gaps: mean ``1 / rate_per_s``, coefficient of variation ``cv``.

    shape = 1 / cv**2, scale = 1 / (rate * shape). cv = 1 is Poisson, cv > 1 is bursty,
    cv < 1 smoother than Poisson, and cv = 0 gives evenly spaced arrivals.
    """

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)
        if not 0 <= self.cv <= MAX_CV:
            raise UserError(f"cv must be in [0, {MAX_CV:g}], got {self.cv}")

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        _check_count(num_requests)
        mean_gap_s = 1.0 / self.rate_per_s
        if self.cv == 0:
            return np.arange(num_requests, dtype=np.float64) * mean_gap_s
        shape = 1.0 / self.cv**2
        return _times_from_gaps(rng.gamma(shape, mean_gap_s / shape, size=num_requests))


@dataclass(frozen=True, slots=True)
class BurstArrivals:
    """Everything arrives at time 0: offline batch benchmarks, max-throughput runs."""

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        _check_count(num_requests)
        return np.zeros(num_requests, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """Replay recorded arrival times (re-based so the first is 0); uses the first n of them."""

    times_s: tuple[float, ...]

    def __post_init__(self) -> None:
        times = np.asarray(self.times_s, dtype=np.float64)
        if times.size == 0:
            raise ValueError("TraceArrivals needs at least one time")
        if not np.all(np.isfinite(times)) or np.any(np.diff(times) < 0):
            raise ValueError("TraceArrivals times must be finite and non-decreasing")

    @classmethod
    def from_workload(cls, workload) -> TraceArrivals:
        """The arrival times of a loaded trace (any sequence of ``RequestSpec``)."""
        return cls(tuple(spec.arrival_time_s for spec in workload))

    def sample(self, num_requests: int, rng: np.random.Generator) -> np.ndarray:
        _check_count(num_requests)
        if num_requests > len(self.times_s):
            raise ValueError(f"trace has {len(self.times_s)} arrivals, asked for {num_requests}")
        times = np.asarray(self.times_s[:num_requests], dtype=np.float64)
        return times - times[0] if times.size else times


ARRIVAL_PROCESSES: dict[str, type] = {
    "poisson": PoissonArrivals,
    "gamma": GammaArrivals,
    "burst": BurstArrivals,
    "trace": TraceArrivals,
}
