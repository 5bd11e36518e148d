"""Serving capacity: the highest request rate whose SLO attainment still meets a target.

``capacity_search`` bisects on the rate, one run per probe, assuming attainment falls as
the rate rises. Midpoints are geometric, so the stopping rule ``hi / lo <= 1 + rel_tol``
is reached in the fewest probes whatever the scale. Every probe is recorded, so a
non-monotone (noisy) curve is visible in the result rather than hidden by it.

Bracketing: with ``max_expansions > 0`` the search finds its own bracket first. When ``lo``
misses the target it tries ``lo / expand_factor`` (and again, up to ``max_expansions`` times);
when ``hi`` still meets it, ``hi * expand_factor``. The result says what it did
(``expansions``), so a start range that was wrong is visible, not silently fixed.

Outcomes (``CapacityResult.status``):
    "found"      a passing rate below a failing one; capacity is the highest passing rate
                 probed, within ``rel_tol`` of the threshold (or after ``max_iters`` bisections).
    "lo_fails"   even the lowest rate tried misses the target; capacity is None (it is below).
    "hi_passes"  the highest rate tried still meets it; capacity is that rate, a lower bound only.

A probe may report aborted requests (``run_at_rate`` returns ``(attainment, num_aborted)``);
they are kept per probe, because an attainment measured while requests were lost is suspect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from servelab.core.errors import UserError


# One start range and bracketing rule for the CLI and the API.
DEFAULT_LO = 0.5  # req/s
DEFAULT_HI = 64.0  # req/s
DEFAULT_MAX_EXPANSIONS = 6  # each side: 4**6 = 4096x beyond the start range


@dataclass(frozen=True, slots=True)
class CapacityProbe:
    rate: float
    attainment: float
    passed: bool
    num_aborted: int = 0
    num_rejected: int = 0  # requests the policy or admission rejected at this rate
    num_arrived: int = 0  # 0: not reported


@dataclass(frozen=True, slots=True)
class CapacityResult:
    status: str  # "found", "lo_fails" or "hi_passes"
    capacity_rate: float | None  # highest rate known to pass; None when lo fails
    lowest_failing_rate: float | None  # the bracket's upper end; None when hi passes
    target_attainment: float
    probes: tuple[CapacityProbe, ...]  # in the order they were run
    expansions: tuple[str, ...] = ()  # what the bracketing did, e.g. "lo 0.5 failed: tried 0.125"
    rejections: str = "count"  # "count": a rejected request misses the SLO; "exclude": left out
    rejection_note: str = ""  # one line when requests were rejected: how many, why, the attainment cap

    @property
    def num_probes(self) -> int:
        return len(self.probes)

    @property
    def num_aborted(self) -> int:
        """Requests aborted over every probe (0 for a clean search)."""
        return sum(p.num_aborted for p in self.probes)


def capacity_search(run_at_rate: Callable[[float], float | tuple[float, int]], *, lo: float, hi: float,
                    target_attainment: float = 0.9, rel_tol: float = 0.02,
                    max_iters: int = 20, max_expansions: int = 0, expand_factor: float = 4.0) -> CapacityResult:
    """Bisect on rate in ``[lo, hi]``; ``run_at_rate(rate)`` returns SLO attainment in [0, 1]
    (or ``(attainment, num_aborted)``, or ``(attainment, num_aborted, num_rejected, num_arrived)``).

    ``max_iters`` bounds the bisection probes (the endpoint probes come on top);
    ``max_expansions`` bounds the bracketing probes on each side (0: the range is taken as given).
    """
    _validate(lo, hi, target_attainment, rel_tol, max_iters)
    if max_expansions < 0 or not expand_factor > 1:
        raise UserError(f"capacity: max_expansions must be >= 0 and expand_factor > 1, got {max_expansions!r} "
                        f"and {expand_factor!r}")
    probes: list[CapacityProbe] = []
    notes: list[str] = []

    def probe(rate: float) -> bool:
        returned = run_at_rate(rate)
        returned, aborted, rejected, arrived = (tuple(returned) + (0, 0))[:4] if isinstance(returned, tuple) \
            else (returned, 0, 0, 0)
        try:
            attainment = float(returned)
        except (TypeError, ValueError):
            attainment = math.nan
        if not 0.0 <= attainment <= 1.0:
            raise ValueError(f"run_at_rate({rate}) returned {returned!r}; expected an attainment in [0, 1]")
        passed = attainment >= target_attainment
        probes.append(CapacityProbe(rate, attainment, passed, int(aborted), int(rejected), int(arrived)))
        return passed

    def result(status: str, good: float | None, bad: float | None) -> CapacityResult:
        return CapacityResult(status, good, bad, target_attainment, tuple(probes), tuple(notes))

    if not probe(lo):
        bad = lo
        for _ in range(max_expansions):
            lower = bad / expand_factor
            notes.append(f"{bad:g} req/s missed the target: tried {lower:g}")
            if probe(lower):
                return _bisect(probe, lower, bad, rel_tol, max_iters, result)
            bad = lower
            if _plateau(probes):
                a, b = probes[-2], probes[-1]
                notes.append(f"attainment stopped rising as the load fell ({a.attainment:.3f} at {a.rate:g}, "
                             f"{b.attainment:.3f} at {b.rate:g} req/s): the target is out of reach at any rate "
                             f"(requests miss the SLO even on an idle instance)")
                break
        return result("lo_fails", None, bad)
    if probe(hi):
        good = hi
        for _ in range(max_expansions):
            higher = good * expand_factor
            notes.append(f"{good:g} req/s still met the target: tried {higher:g}")
            if not probe(higher):
                return _bisect(probe, good, higher, rel_tol, max_iters, result)
            good = higher
        return result("hi_passes", good, None)
    return _bisect(probe, lo, hi, rel_tol, max_iters, result)


def _plateau(probes: list[CapacityProbe], tol: float = 0.005) -> bool:
    """Two downward expansions in a row that did not raise attainment: lower rates will not either."""
    if len(probes) < 3:
        return False
    a, b, c = probes[-3:]
    return b.attainment <= a.attainment + tol and c.attainment <= b.attainment + tol


def _bisect(probe: Callable[[float], bool], good: float, bad: float, rel_tol: float, max_iters: int,
            result: Callable[[str, float | None, float | None], CapacityResult]) -> CapacityResult:
    """Geometric bisection between a passing ``good`` and a failing ``bad`` rate."""
    for _ in range(max_iters):
        if bad / good <= 1.0 + rel_tol:
            break
        mid = math.sqrt(good * bad)
        if probe(mid):
            good = mid
        else:
            bad = mid
    return result("found", good, bad)


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


class _Unknown(Exception):
    """A what-if search reached a rate whose outcome is not known yet."""

    def __init__(self, rate: float) -> None:
        self.rate = rate


def capacity_search_ahead(run_rates: Callable[[list[float]], list[float | tuple[float, int]]], width: int,
                          **search: object) -> CapacityResult:
    """``capacity_search`` with up to ``width`` probes run at once, and the same result.

    The search is sequential: the next rate depends on whether this one passed. So it runs
    ahead: the probes of the next levels of the search's decision tree (every pass/fail
    outcome of the rates not yet known, ``2**depth - 1 <= width`` of them) go to
    ``run_rates`` together; then the search is replayed on the known outcomes, which are the
    same numbers a serial search would have measured, until it needs a rate it does not know.
    The probes it never needed are not in the result. ``search`` holds ``capacity_search``'s
    keyword arguments.
    """
    known: dict[float, float | tuple[float, int]] = {}
    depth = max(1, (width + 1).bit_length() - 1)

    def replay(assumed: dict[float, float]):
        def lookup(rate: float):
            if rate in known:
                return known[rate]
            if rate in assumed:
                return assumed[rate]
            raise _Unknown(rate)

        return capacity_search(lookup, **search)

    def frontier(assumed: dict[float, float], levels: int, out: list[float]) -> None:
        try:
            replay(assumed)
        except _Unknown as need:
            if need.rate not in out:
                out.append(need.rate)
            if levels > 1:
                for outcome in (1.0, 0.0):  # passes any target / misses any target above 0
                    frontier({**assumed, need.rate: outcome}, levels - 1, out)

    while True:
        rates: list[float] = []
        frontier({}, depth, rates)
        if not rates:
            return replay({})
        for rate, outcome in zip(rates, run_rates(rates)):
            known[rate] = outcome
