"""Serving capacity: the highest request rate whose SLO attainment still meets a target.

``capacity_search`` bisects on the rate, one run per probe, assuming attainment falls as
the rate rises. Midpoints are geometric, so the stopping rule ``hi / lo <= 1 + rel_tol``
is reached in the fewest probes whatever the scale. Every probe is recorded, so a
non-monotone (noisy) curve is visible in the result rather than hidden by it.

Outcomes (``CapacityResult.status``):
    "found"      lo passes, hi fails; capacity is the highest passing rate probed,
                 within ``rel_tol`` of the threshold (or after ``max_iters`` bisections).
    "lo_fails"   even ``lo`` misses the target; capacity is None (it is below ``lo``).
    "hi_passes"  ``hi`` still meets the target; capacity is ``hi``, a lower bound only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from servelab.core.errors import UserError


@dataclass(frozen=True, slots=True)
class CapacityProbe:
    rate: float
    attainment: float
    passed: bool


@dataclass(frozen=True, slots=True)
class CapacityResult:
    status: str  # "found", "lo_fails" or "hi_passes"
    capacity_rate: float | None  # highest rate known to pass; None when lo fails
    lowest_failing_rate: float | None  # the bracket's upper end; None when hi passes
    target_attainment: float
    probes: tuple[CapacityProbe, ...]  # in the order they were run

    @property
    def num_probes(self) -> int:
        return len(self.probes)


def capacity_search(run_at_rate: Callable[[float], float], *, lo: float, hi: float,
                    target_attainment: float = 0.9, rel_tol: float = 0.02,
                    max_iters: int = 20) -> CapacityResult:
    """Bisect on rate in ``[lo, hi]``; ``run_at_rate(rate)`` returns SLO attainment in [0, 1].

    ``max_iters`` bounds the bisection probes (the two endpoint probes come on top).
    """
    _validate(lo, hi, target_attainment, rel_tol, max_iters)
    probes: list[CapacityProbe] = []

    def probe(rate: float) -> bool:
        returned = run_at_rate(rate)
        try:
            attainment = float(returned)
        except (TypeError, ValueError):
            attainment = math.nan
        if not 0.0 <= attainment <= 1.0:
            raise ValueError(f"run_at_rate({rate}) returned {returned!r}; expected an attainment in [0, 1]")
        passed = attainment >= target_attainment
        probes.append(CapacityProbe(rate, attainment, passed))
        return passed

    if not probe(lo):
        return CapacityResult("lo_fails", None, lo, target_attainment, tuple(probes))
    if probe(hi):
        return CapacityResult("hi_passes", hi, None, target_attainment, tuple(probes))
    good, bad = lo, hi
    for _ in range(max_iters):
        if bad / good <= 1.0 + rel_tol:
            break
        mid = math.sqrt(good * bad)
        if probe(mid):
            good = mid
        else:
            bad = mid
    return CapacityResult("found", good, bad, target_attainment, tuple(probes))


def _validate(lo: float, hi: float, target: float, rel_tol: float, max_iters: int) -> None:
    if not (math.isfinite(lo) and lo > 0):
        raise UserError(f"capacity: lo must be a finite rate > 0, got {lo!r}")
    if not (math.isfinite(hi) and hi > lo):
        raise UserError(f"capacity: hi must be finite and > lo ({lo}), got {hi!r}")
    if not 0.0 < target <= 1.0:
        raise UserError(f"capacity: target_attainment must be in (0, 1], got {target!r}")
    if not rel_tol > 0:
        raise UserError(f"capacity: rel_tol must be > 0, got {rel_tol!r}")
    if max_iters < 0:
        raise UserError(f"capacity: max_iters must be >= 0, got {max_iters!r}")
