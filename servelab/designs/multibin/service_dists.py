"""Service-time distributions for the Multi-Bin queueing analysis (no model, no tokens).

Each distribution samples service times, has a CDF and a quantile function, and computes
``expected_batch_max(lo, hi, B)``, the expected service time of a batch of B requests whose
times are drawn from the distribution truncated to [lo, hi), by numeric integration
(E[max] = lo + integral_lo^hi 1 - G(x)^B dx). The closed forms of the paper are checked
against that integral; it also gives the *exact* value where the paper only bounds
(the exponential case) and handles empirical length distributions such as GSM8K.

Invariant: ``sample`` returns float64 >= 0 and depends only on the passed Generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import integrate


@dataclass(frozen=True, slots=True)
class UniformService:
    """U(lmin, lmax): Assumption 3.2."""

    lmin: float
    lmax: float

    def __post_init__(self) -> None:
        if not 0 <= self.lmin < self.lmax:
            raise ValueError(f"uniform service needs 0 <= lmin < lmax, got ({self.lmin}, {self.lmax})")

    @property
    def mean(self) -> float:
        return (self.lmin + self.lmax) / 2

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.lmin, self.lmax, size=n)

    def cdf(self, x: float) -> float:
        return min(max((x - self.lmin) / (self.lmax - self.lmin), 0.0), 1.0)

    def ppf(self, q: float) -> float:
        return self.lmin + q * (self.lmax - self.lmin)

    def expected_batch_max(self, lo: float, hi: float, batch_size: int) -> float:
        return _integrate_max(self.cdf, max(lo, self.lmin), min(hi, self.lmax), batch_size)


@dataclass(frozen=True, slots=True)
class ExponentialService:
    """Exp(mu) (rate mu, mean 1/mu): Assumption A.1."""

    mu: float

    def __post_init__(self) -> None:
        if not self.mu > 0:
            raise ValueError(f"exponential service needs mu > 0, got {self.mu}")

    @property
    def mean(self) -> float:
        return 1.0 / self.mu

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.exponential(1.0 / self.mu, size=n)

    def cdf(self, x: float) -> float:
        return 1.0 - math.exp(-self.mu * x) if x > 0 else 0.0

    def ppf(self, q: float) -> float:
        return -math.log1p(-q) / self.mu

    def expected_batch_max(self, lo: float, hi: float, batch_size: int) -> float:
        if math.isinf(hi):  # memoryless tail: lo + max of B Exp(mu) = lo + H_B / mu
            return lo + float(np.sum(1.0 / np.arange(1, batch_size + 1))) / self.mu
        return _integrate_max(self.cdf, lo, hi, batch_size)


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalService:
    """Resampled observed values (token counts or seconds); ``values`` is kept sorted."""

    values: np.ndarray

    def __post_init__(self) -> None:
        values = np.sort(np.asarray(self.values, dtype=np.float64))
        if values.size == 0 or values[0] < 0:
            raise ValueError("empirical service needs at least one value, all >= 0")
        object.__setattr__(self, "values", values)

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, size=n)]

    def cdf(self, x: float) -> float:
        return float(np.searchsorted(self.values, x, side="right")) / self.values.size

    def ppf(self, q: float) -> float:
        return float(np.quantile(self.values, q))

    def expected_batch_max(self, lo: float, hi: float, batch_size: int) -> float:
        """Exact for a discrete distribution: sum over support points of P(max = v) * v."""
        inside = self.values[(self.values >= lo) & (self.values < hi)]
        if inside.size == 0:
            return float("nan")
        support, counts = np.unique(inside, return_counts=True)
        cum = np.cumsum(counts) / inside.size
        prev = np.concatenate(([0.0], cum[:-1]))
        return float(np.sum(support * (cum**batch_size - prev**batch_size)))


def _integrate_max(cdf, lo: float, hi: float, batch_size: int) -> float:
    """E[max of B iid draws from cdf truncated to [lo, hi)] by quadrature."""
    if not hi > lo:
        return float(lo)
    f_lo, f_hi = cdf(lo), cdf(hi)
    mass = f_hi - f_lo
    if mass <= 0:
        return float(lo)
    value, _ = integrate.quad(lambda x: 1.0 - ((cdf(x) - f_lo) / mass) ** batch_size, lo, hi, limit=200)
    return float(lo + value)
