"""Padding analysis of BucketServe (Eqs. 2-4): how much a set of bucket boundaries wastes.

A padded batch computes every row at the batch's longest length, so a row of length S in a
batch padded to U wastes ``1 - S/U`` of its slot. This module measures that waste for a
batch (Eq. 2), for a set of bucket edges under a length distribution (Eq. 3, padding to each
bucket's upper bound ``U_b`` as the paper writes it, and padding to the longest length in
the bucket, which is what a padded step actually pays), the paper's "optimal" boundary as
the conditional expectation of the bucket (Eq. 4), and, as a reference the paper does not
give, the boundaries that truly minimise the expected waste for K buckets (dynamic
programming over the empirical length distribution).

Note on Eq. 4: ``E[S | bucket]`` lies inside the bucket, so as an *upper* bound it would
leave the longer half of the bucket's requests outside it; it is a centre, not a bound.
We report it as the paper defines it and compare against the exact minimiser.

The distribution is empirical: a sample of lengths (``numpy`` array), weights equal.
Pure functions, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def waste_ratio(lengths) -> float:
    """Eq. 2: (S_max - S_avg) / S_max for one batch; 0 for an empty batch."""
    s = np.asarray(lengths, dtype=float)
    if s.size == 0:
        return 0.0
    if np.any(s <= 0):
        raise ValueError("waste_ratio: every sequence length must be > 0")
    return float((s.max() - s.mean()) / s.max())


def _check_edges(edges) -> np.ndarray:
    e = np.asarray(edges, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError(f"bucket edges must be >= 2 strictly increasing numbers, got {list(edges)}")
    return e


def _bucket_of(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    if s.size and (s.min() < e[0] or s.max() > e[-1]):
        raise ValueError(f"lengths span [{s.min()}, {s.max()}], outside the edges [{e[0]}, {e[-1]}]")
    # [L_b, U_b) buckets, the last one closed at the top edge
    return np.minimum(np.searchsorted(e, s, side="right") - 1, e.size - 2)


def expected_waste(lengths, edges, *, pad_to: str = "upper") -> float:
    """Eq. 3 on an empirical distribution: mean over requests of ``1 - S / U``.

    ``pad_to="upper"`` pads each request to its bucket's upper edge ``U_b`` (the paper's
    formula); ``pad_to="max"`` pads to the longest request in the same bucket (what a padded
    prefill of the whole bucket pays).
    """
    s = np.asarray(lengths, dtype=float)
    if s.size == 0:
        return 0.0
    e = _check_edges(edges)
    b = _bucket_of(s, e)
    if pad_to == "upper":
        top = e[b + 1]
    elif pad_to == "max":
        top = np.zeros(e.size - 1)
        np.maximum.at(top, b, s)
        top = top[b]
    else:
        raise ValueError(f"pad_to must be 'upper' or 'max', got {pad_to!r}")
    return float(np.mean(1.0 - s / top))


def conditional_means(lengths, edges) -> np.ndarray:
    """Eq. 4: E[S | L_b <= S < U_b] for every bucket (NaN for an empty bucket)."""
    s = np.asarray(lengths, dtype=float)
    e = _check_edges(edges)
    b = _bucket_of(s, e)
    k = e.size - 1
    counts = np.bincount(b, minlength=k)
    sums = np.bincount(b, weights=s, minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def optimal_edges(lengths, num_buckets: int) -> tuple[np.ndarray, float]:
    """Edges of at most ``num_buckets`` buckets that minimise the pad-to-max waste exactly.

    Dynamic programming over the sorted distinct lengths: a bucket covering distinct values
    ``v[i..j]`` costs ``sum(p) - sum(p*v) / v[j]``. Returns half-open edges (each inner edge the
    smallest length of the next bucket; the first edge is 0, the last one past the longest) and
    the minimal expected waste.
    O(K * d^2) with d distinct lengths, vectorised over one axis.
    """
    s = np.asarray(lengths, dtype=float)
    if s.size == 0 or num_buckets < 1:
        raise ValueError("optimal_edges needs a non-empty sample and num_buckets >= 1")
    values, counts = np.unique(s, return_counts=True)
    p = counts / counts.sum()
    cum_p = np.concatenate(([0.0], np.cumsum(p)))
    cum_pv = np.concatenate(([0.0], np.cumsum(p * values)))
    d = values.size
    k_max = min(num_buckets, d)
    # best[k][j]: min waste covering values[0..j-1] with k buckets; arg[k][j]: start of last bucket
    best = np.full((k_max + 1, d + 1), np.inf)
    arg = np.zeros((k_max + 1, d + 1), dtype=int)
    best[0, 0] = 0.0
    starts = np.arange(d)
    for k in range(1, k_max + 1):
        for j in range(1, d + 1):
            i = starts[:j]
            cost = best[k - 1, i] + (cum_p[j] - cum_p[i]) - (cum_pv[j] - cum_pv[i]) / values[j - 1]
            pick = int(np.argmin(cost))
            best[k, j], arg[k, j] = cost[pick], pick
    k_best = int(np.argmin(best[:, d]))
    starts_of, j = [], d
    for k in range(k_best, 0, -1):
        j = arg[k, j]
        starts_of.append(j)
    # half-open edges: each inner edge is the smallest length of the next bucket
    inner = [values[i] for i in sorted(starts_of)[1:]]
    return np.array([0.0] + inner + [values[-1] + 1]), float(best[k_best, d])


@dataclass(frozen=True, slots=True)
class BoundaryReport:
    """How bisection edges compare with Eq. 4 and with the exact optimum (same bucket count)."""

    edges: tuple[float, ...]
    conditional_means: tuple[float, ...]
    waste_single_upper: float  # one bucket [0, L_max], pad to L_max (Eq. 3)
    waste_single_max: float  # one bucket, pad to the longest request
    waste_bisection_upper: float  # Eq. 3 as written
    waste_bisection_max: float
    waste_eq4_upper: float  # buckets with each upper edge moved to its Eq. 4 conditional mean
    waste_optimal_max: float  # exact minimum with as many buckets
    mean_abs_gap_to_eq4: float  # mean |U_b - E[S|b]| over non-empty buckets, in tokens


def compare_boundaries(lengths, edges, max_len: int) -> BoundaryReport:
    """Report how close a set of (bisection) edges gets to Eq. 4 and to the true optimum."""
    s = np.asarray(lengths, dtype=float)
    e = _check_edges(edges)
    means = conditional_means(s, e)
    filled = ~np.isnan(means)
    uppers = e[1:]
    # Eq. 4 taken literally: the upper bound of each non-empty bucket becomes its mean, so
    # requests above it pay a ratio clipped at 0 (they would belong to the next bucket).
    b = _bucket_of(s, e)
    eq4_top = np.where(filled, means, uppers)[b]
    waste_eq4 = float(np.mean(np.clip(1.0 - s / eq4_top, 0.0, None)))
    _, opt = optimal_edges(s, int(filled.sum()))
    single = [0.0, float(max_len)]
    return BoundaryReport(
        edges=tuple(float(x) for x in e), conditional_means=tuple(float(x) for x in means),
        waste_single_upper=expected_waste(s, single, pad_to="upper"),
        waste_single_max=expected_waste(s, single, pad_to="max"),
        waste_bisection_upper=expected_waste(s, e, pad_to="upper"),
        waste_bisection_max=expected_waste(s, e, pad_to="max"),
        waste_eq4_upper=waste_eq4, waste_optimal_max=opt,
        mean_abs_gap_to_eq4=float(np.mean(np.abs(uppers[filled] - means[filled]))),
    )
