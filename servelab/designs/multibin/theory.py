"""Closed forms of Multi-Bin Batching (Guldogan et al.): throughput, capacity, bins needed, latency.

Uniform service U(lmin, lmax) with equal-mass bins (Assumption 3.2, Lemma 4.1):
``expected_service_uniform`` (Eq. 20), ``throughput_uniform`` (Theorem 4.2, Eq. 4),
``c_max_uniform`` (Eq. 5), ``min_bins_for_eps`` (Theorem 4.3, Eq. 6) and
``expected_latency_uniform`` (Lemma 5.1, Eq. 7; infinite servers, so a lower bound).
Exponential service Exp(mu) (Appendix A.4): ``exponential_service_bound`` (Lemma A.1, Eq. 27 at
the boundaries of Eq. 28) and ``exponential_throughput_bound`` (Corollary A.1.1).

Two printed formulas are typos, and the code follows the derivation instead: Eq. 8 swaps
the weights of l_{i-1} and l_i (E[max of B uniforms on [a, b]] = (a + B b)/(B + 1), as Eq. 17
uses), and Eq. 60 writes log L_{k-1-j}, which reaches the undefined L_0; substituting Eq. 28
into Eq. 27 gives log L_{k-j}. ``expected_service_numeric`` integrates Eq. 2 for any
boundaries and distribution, which the tests use to check every closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.errors import UserError
from servelab.core.limits import MAX_PARAM_INT
from servelab.designs.multibin.binning import BinEdges, exponential_edges, exponential_L, harmonic, uniform_edges
from servelab.designs.multibin.service_dists import ExponentialService, UniformService


def _check(batch_size: int, num_bins: int, lmin: float | None = None, lmax: float | None = None) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    if lmin is not None and not 0 <= lmin < lmax:
        raise ValueError(f"need 0 <= lmin < lmax, got lmin={lmin}, lmax={lmax}")


def expected_service_uniform(num_bins: int, batch_size: int, lmin: float, lmax: float) -> float:
    """E[t_service,k] of Eq. 20: mean of the batch maximum under equal-mass bins."""
    _check(batch_size, num_bins, lmin, lmax)
    mid = (lmax + lmin) / 2
    k1 = batch_size / (batch_size + 1) * lmax + lmin / (batch_size + 1) - mid
    return mid + k1 / num_bins


def throughput_uniform(num_bins: int, batch_size: int, lmin: float, lmax: float) -> float:
    """Theorem 4.2: requests per unit time of one saturated server."""
    return batch_size / expected_service_uniform(num_bins, batch_size, lmin, lmax)


def c_max_uniform(batch_size: int, lmin: float, lmax: float) -> float:
    """Eq. 5: the k -> infinity limit B / E[l]."""
    _check(batch_size, 1, lmin, lmax)
    return batch_size / ((lmax + lmin) / 2)


def min_bins_for_eps(batch_size: int, lmin: float, lmax: float, eps: float) -> int:
    """Theorem 4.3: the smallest k with Throughput_k >= c_max - eps."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    c_max = c_max_uniform(batch_size, lmin, lmax)
    mid = (lmax + lmin) / 2
    gap = batch_size / (batch_size + 1) * lmax + lmin / (batch_size + 1) - mid
    estimate = (c_max - eps) * gap / (eps * mid)
    if not estimate <= MAX_BINS_FOR_EPS:
        raise UserError(f"eps={eps:g} needs about {estimate:.3g} bins, more than {MAX_BINS_FOR_EPS:,}; "
                        "use a larger eps")
    k = max(1, math.ceil(estimate))
    # guard the ceiling against floating-point error at exact integers
    while k > 1 and throughput_uniform(k - 1, batch_size, lmin, lmax) >= c_max - eps:
        k -= 1
    while throughput_uniform(k, batch_size, lmin, lmax) < c_max - eps:
        k += 1
    return k


def batching_wait(num_bins: int, batch_size: int, arrival_rate: float) -> float:
    """Eq. 64: mean wait for one's batch to fill, k (B - 1) / (2 lambda), for any bin masses."""
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0, got {arrival_rate}")
    return (batch_size - 1) * num_bins / (2 * arrival_rate)


def expected_latency_uniform(num_bins: int, batch_size: int, lmin: float, lmax: float, arrival_rate: float) -> float:
    """Lemma 5.1 (infinite servers): batching wait plus mean batch service time."""
    return expected_service_uniform(num_bins, batch_size, lmin, lmax) + batching_wait(num_bins, batch_size, arrival_rate)


def expected_service_numeric(edges: BinEdges, dist, batch_size: int) -> float:
    """Eq. 2 by quadrature: sum_i Pr(bin = i) E[max of B | bin i], for any boundaries."""
    bounds = (-math.inf, *edges.inner, math.inf)
    total = 0.0
    for lo, hi in zip(bounds, bounds[1:]):
        p = dist.cdf(hi) if math.isfinite(hi) else 1.0
        p -= dist.cdf(lo) if math.isfinite(lo) else 0.0
        if p > 0:
            total += p * dist.expected_batch_max(max(lo, dist.ppf(0.0)), hi, batch_size)
    return total


def exponential_service_bound(num_bins: int, batch_size: int, mu: float) -> float:
    """Lemma A.1, Eq. 27 at the optimal boundaries of Eq. 28: an upper bound on E[t_service,k]."""
    _check(batch_size, num_bins)
    edges = exponential_edges(mu, batch_size, num_bins).inner
    L = exponential_L(num_bins, batch_size)
    total, q_prev = 0.0, 1.0
    for i in range(1, num_bins):
        q = q_prev / L[num_bins - i - 1]  # q_i = exp(-mu l_i) = 1 / prod_{j<=i} L_{k-j}
        total += (q_prev - q) * edges[i - 1]
        q_prev = q
    last = edges[-1] if edges else 0.0
    return total + q_prev * (last + harmonic(batch_size) / mu)


def exponential_throughput_bound(num_bins: int, batch_size: int, mu: float) -> float:
    """Corollary A.1.1: Throughput_k >= B / (bound of Lemma A.1)."""
    return batch_size / exponential_service_bound(num_bins, batch_size, mu)


# k = 1..k_max rows cost O(k_max^2) quadrature segments: 256 takes about 2 s on one core,
# 1,024 about a minute, and the paper's figures stop at k = 64.
MAX_BINS = 256
# Theorem 4.3's k(eps) is a closed form, but the float search around it is not meaningful
# (nor fast) once throughputs differ in the last bits: an eps that needs more bins is an error.
MAX_BINS_FOR_EPS = 1_000_000


def check_analysis_inputs(distribution: str, lmin: float, lmax: float, mu: float, batch_size: int, k_max: int,
                          eps: float | None, arrival_rate: float | None) -> None:
    """The CLI's inputs, each named, before any closed form runs (they raise on bad values too,
    but only a ``UserError`` tells the user which option to change). Every option is checked
    whichever distribution uses it: ``--mu nan`` beside the uniform one is still a typo."""
    if distribution not in ("uniform", "exp", "exponential"):
        raise UserError(f"--distribution must be 'uniform' or 'exponential', got {distribution!r}")
    if not 1 <= k_max <= MAX_BINS:
        raise UserError(f"--k-max must be in [1, {MAX_BINS}], got {k_max}")
    if not 1 <= batch_size <= MAX_PARAM_INT:
        raise UserError(f"--batch-size must be in [1, {MAX_PARAM_INT:,}], got {batch_size}")
    if not 0 <= lmin < lmax < math.inf:
        raise UserError(f"--lmin and --lmax need 0 <= lmin < lmax (finite), got lmin={lmin}, lmax={lmax}")
    if not 0 < mu < math.inf:
        raise UserError(f"--mu must be a finite number > 0, got {mu}")
    if eps is not None and not 0 < eps < math.inf:
        raise UserError(f"--eps must be a finite number > 0, got {eps}")
    if eps is not None and distribution != "uniform":
        raise UserError("--eps applies to --distribution uniform only (Theorem 4.3 is stated for it)")
    if arrival_rate is not None and not 0 < arrival_rate < math.inf:
        raise UserError(f"--arrival-rate must be a finite number > 0, got {arrival_rate}")


@dataclass(frozen=True, slots=True)
class TheoryRow:
    num_bins: int
    edges: tuple[float, ...]
    expected_service: float  # closed form (uniform) or upper bound (exponential)
    expected_service_numeric: float  # Eq. 2 integrated at the same boundaries
    throughput: float  # B / expected_service: exact (uniform) or lower bound (exponential)
    latency: float | None  # Lemma 5.1 (uniform) / bound + batching wait (exponential), if a rate is given


def analyze(distribution: str, *, lmin: float = 1.0, lmax: float = 20.0, mu: float = 0.1, batch_size: int = 128,
            k_max: int = 8, eps: float | None = None, arrival_rate: float | None = None) -> dict:
    """Entry point of ``servelab analyze multibin``: one row per k = 1..k_max, plus c_max and k(eps)."""
    check_analysis_inputs(distribution, lmin, lmax, mu, batch_size, k_max, eps, arrival_rate)
    rows = []
    if distribution == "uniform":
        dist = UniformService(lmin, lmax)
        for k in range(1, k_max + 1):
            edges = uniform_edges(lmin, lmax, k)
            service = expected_service_uniform(k, batch_size, lmin, lmax)
            latency = expected_latency_uniform(k, batch_size, lmin, lmax, arrival_rate) if arrival_rate else None
            rows.append(TheoryRow(k, edges.inner, service, expected_service_numeric(edges, dist, batch_size),
                                  batch_size / service, latency))
        c_max = c_max_uniform(batch_size, lmin, lmax)
        k_eps = min_bins_for_eps(batch_size, lmin, lmax, eps) if eps is not None else None
    elif distribution in ("exp", "exponential"):
        dist = ExponentialService(mu)
        for k in range(1, k_max + 1):
            edges = exponential_edges(mu, batch_size, k)
            service = exponential_service_bound(k, batch_size, mu)
            latency = service + batching_wait(k, batch_size, arrival_rate) if arrival_rate else None
            rows.append(TheoryRow(k, edges.inner, service, expected_service_numeric(edges, dist, batch_size),
                                  batch_size / service, latency))
        c_max = batch_size * mu
        k_eps = None  # Theorem 4.3 is stated for the uniform case only
    else:
        raise ValueError(f"distribution must be 'uniform' or 'exponential', got {distribution!r}")
    return {"distribution": distribution, "batch_size": batch_size, "c_max": c_max, "eps": eps, "k_eps": k_eps,
            "arrival_rate": arrival_rate, "rows": rows}


def format_analysis(result: dict) -> str:
    """Markdown table of ``analyze`` output."""
    exp = result["distribution"] != "uniform"
    head = ("| k | boundaries | E[service] " + ("bound" if exp else "Eq. 20") + " | E[service] numeric | throughput "
            + (">= (Cor. A.1.1)" if exp else "(Thm 4.2)") + " | latency |")
    lines = [head, "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        edges = ", ".join(f"{e:.3g}" for e in r.edges) or "-"
        lat = f"{r.latency:.4g}" if r.latency is not None else "-"
        lines.append(f"| {r.num_bins} | {edges} | {r.expected_service:.5g} | {r.expected_service_numeric:.5g} | "
                     f"{r.throughput:.5g} | {lat} |")
    lines.append(f"\nc_max = {result['c_max']:.5g}")
    if result["k_eps"] is not None:
        lines.append(f"smallest k with throughput >= c_max - {result['eps']}: {result['k_eps']}")
    return "\n".join(lines)
