"""Bins and batches of Multi-Bin Batching: the one rule shared by the policy, the router and the queue simulator.

A request goes to bin ``i`` when its estimate ``l`` satisfies ``l_{i-1} <= l < l_i`` (Algorithm 1);
values below the first boundary land in bin 0, values at or above the last in bin ``k-1``.
Inside each bin requests form batches of ``batch_size`` in arrival order; a batch is *formed*
(enters the central queue) when its ``batch_size``-th member arrives, or, with ``max_wait_s``,
when its oldest member has waited ``max_wait_s`` (a request arriving exactly at that
deadline still joins). The rule exists twice: ``BinBatcher`` (online, one request at a time,
for the policy and router) and ``form_batches`` (offline, vectorised over a whole trace, for
the queue simulator); ``tests/multibin/test_binning.py`` checks they give identical batches.

Boundaries: ``uniform_edges`` (Eq. 3), ``quantile_edges`` (equal probability mass, Lemma 4.1,
from samples or a quantile function), ``exponential_edges`` (Lemma A.1's L_m recursion) and
``OnlineQuantileEdges`` (re-estimated from observed lengths).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class BinEdges:
    """The k-1 inner decision boundaries l_1..l_{k-1} (non-decreasing; ties make empty bins)."""

    inner: tuple[float, ...]

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.inner)
        if any(not math.isfinite(v) for v in values):
            raise ValueError(f"bin boundaries must be finite, got {values}")
        if any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"bin boundaries must be non-decreasing, got {values}")
        object.__setattr__(self, "inner", values)

    @property
    def num_bins(self) -> int:
        return len(self.inner) + 1

    def bin_of(self, value: float) -> int:
        return bisect.bisect_right(self.inner, value)

    def bins_of(self, values: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.inner, dtype=np.float64), values, side="right").astype(np.int64)


def single_bin() -> BinEdges:
    """k = 1: standard batching."""
    return BinEdges(())


def uniform_edges(lmin: float, lmax: float, num_bins: int) -> BinEdges:
    """Evenly spaced boundaries on [lmin, lmax] (Eq. 3): optimal for U(lmin, lmax)."""
    _check_bins(num_bins)
    if not lmax > lmin:
        raise ValueError(f"uniform bins need lmax > lmin, got lmin={lmin}, lmax={lmax}")
    return BinEdges(tuple(lmin + i / num_bins * (lmax - lmin) for i in range(1, num_bins)))


def quantile_edges(samples: Sequence[float] | np.ndarray, num_bins: int) -> BinEdges:
    """Equal-probability-mass boundaries estimated from observed lengths (Lemma 4.1)."""
    _check_bins(num_bins)
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("quantile bins need at least one observed length")
    return BinEdges(tuple(np.quantile(values, np.arange(1, num_bins) / num_bins)))


def ppf_edges(ppf: Callable[[float], float], num_bins: int) -> BinEdges:
    """Equal-probability-mass boundaries from a distribution's quantile function."""
    _check_bins(num_bins)
    return BinEdges(tuple(float(ppf(i / num_bins)) for i in range(1, num_bins)))


def harmonic(n: int) -> float:
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def exponential_L(num_bins: int, batch_size: int) -> list[float]:
    """L_1..L_{k-1} of Lemma A.1: L_1 = H_B, L_m = 1 + log L_{m-1}."""
    values = [harmonic(batch_size)]
    for _ in range(2, num_bins):
        values.append(1.0 + math.log(values[-1]))
    return values


def exponential_edges(mu: float, batch_size: int, num_bins: int) -> BinEdges:
    """Lemma A.1: l_i = (1/mu) * sum_{j=1..i} log L_{k-j}, the minimiser of the service-time bound."""
    _check_bins(num_bins)
    if not mu > 0:
        raise ValueError(f"exponential bins need mu > 0, got {mu}")
    L = exponential_L(num_bins, batch_size)  # L[m-1] is L_m
    edges, total = [], 0.0
    for i in range(1, num_bins):
        total += math.log(L[num_bins - i - 1])
        edges.append(total / mu)
    return BinEdges(tuple(edges))


def _check_bins(num_bins: int) -> None:
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")


class OnlineQuantileEdges:
    """Boundaries re-estimated from the last ``window`` observed lengths every ``refit_every`` observations.

    Until ``warmup`` lengths have been observed the ``initial`` boundaries are used, so a cold
    start behaves like a configured policy rather than like one bin.
    """

    def __init__(self, num_bins: int, initial: BinEdges, *, warmup: int = 64, refit_every: int = 64,
                 window: int = 4096) -> None:
        if initial.num_bins != num_bins:
            raise ValueError(f"initial boundaries have {initial.num_bins} bins, expected {num_bins}")
        if warmup < 1 or refit_every < 1 or window < 1:
            raise ValueError(f"warmup, refit_every and window must be >= 1, got {warmup}, {refit_every}, {window}")
        self.num_bins = num_bins
        self.edges = initial
        self._warmup = warmup
        self._refit_every = refit_every
        self._observed: deque[float] = deque(maxlen=window)
        self._since_fit = 0
        self.num_refits = 0

    def observe(self, value: float) -> None:
        self._observed.append(float(value))
        self._since_fit += 1
        if len(self._observed) >= self._warmup and self._since_fit >= self._refit_every:
            self.edges = quantile_edges(np.fromiter(self._observed, dtype=np.float64), self.num_bins)
            self._since_fit = 0
            self.num_refits += 1


@dataclass(frozen=True, slots=True)
class FormedBatch:
    """A batch that entered the central queue at ``ready_s``; ``full`` unless released by max-wait or flush."""

    bin_index: int
    member_ids: tuple[int, ...]
    ready_s: float
    full: bool


class BinBatcher:
    """Online bins: per-bin open batches, released when full or when the oldest member hits max-wait."""

    def __init__(self, num_bins: int, batch_size: int, max_wait_s: float | None = None) -> None:
        _check_bins(num_bins)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_wait_s is not None and not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 or None, got {max_wait_s}")
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self._open: list[list[int]] = [[] for _ in range(num_bins)]
        self._opened_s: list[float] = [0.0] * num_bins

    @property
    def num_bins(self) -> int:
        return len(self._open)

    @property
    def num_waiting(self) -> int:
        return sum(len(members) for members in self._open)

    def add(self, item_id: int, bin_index: int, now_s: float) -> list[FormedBatch]:
        """Put ``item_id`` in its bin; returns the batches this arrival releases (overdue first)."""
        if not 0 <= bin_index < self.num_bins:
            raise ValueError(f"bin {bin_index} out of range for {self.num_bins} bins")
        released = self.release_due(now_s, strict=True)
        members = self._open[bin_index]
        if not members:
            self._opened_s[bin_index] = now_s
        members.append(item_id)
        if len(members) == self.batch_size:
            released.append(self._close(bin_index, now_s, full=True))
        return released

    def release_due(self, now_s: float, *, strict: bool = False) -> list[FormedBatch]:
        """Partial batches whose max-wait deadline has passed (``strict``: passed, not reached)."""
        if self.max_wait_s is None:
            return []
        due = []
        for b, members in enumerate(self._open):
            deadline = self._opened_s[b] + self.max_wait_s
            if members and (deadline < now_s or (not strict and deadline <= now_s)):
                due.append((deadline, b))
        return [self._close(b, deadline, full=False) for deadline, b in sorted(due)]

    def next_deadline_s(self) -> float | None:
        if self.max_wait_s is None:
            return None
        deadlines = [self._opened_s[b] + self.max_wait_s for b, m in enumerate(self._open) if m]
        return min(deadlines) if deadlines else None

    def flush(self, now_s: float) -> list[FormedBatch]:
        """Release every partial batch now (end of a trace)."""
        return [self._close(b, now_s, full=False) for b, m in enumerate(self._open) if m]

    def _close(self, bin_index: int, ready_s: float, *, full: bool) -> FormedBatch:
        batch = FormedBatch(bin_index, tuple(self._open[bin_index]), ready_s, full)
        self._open[bin_index] = []
        return batch


@dataclass(frozen=True, slots=True)
class BatchArrays:
    """``form_batches`` output: batch j holds ``members[offsets[j]:offsets[j+1]]`` (indices into the trace)."""

    members: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [num_batches + 1]
    ready_s: np.ndarray  # float64 [num_batches], non-decreasing (central-queue order)
    bin_index: np.ndarray  # int64 [num_batches]

    @property
    def num_batches(self) -> int:
        return len(self.ready_s)

    def batch_ids(self) -> np.ndarray:
        """Batch index of every trace position (inverse of ``members``)."""
        out = np.empty(len(self.members), dtype=np.int64)
        out[self.members] = np.repeat(np.arange(self.num_batches), np.diff(self.offsets))
        return out


def form_batches(bin_ids: np.ndarray, arrival_s: np.ndarray, batch_size: int, *, max_wait_s: float | None = None,
                 flush_s: float | None = None) -> BatchArrays:
    """Offline ``BinBatcher`` over a whole trace sorted by arrival time.

    Partial batches are released at their max-wait deadline or at ``flush_s`` (default: the
    last arrival: the trace is known to have ended), whichever comes first, as the online
    policies do when they hear that the arrivals are done.
    Batches are ordered as the central queue sees them: by ready time, then bin.
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    bin_ids = np.asarray(bin_ids, dtype=np.int64)
    if len(arrival_s) != len(bin_ids):
        raise ValueError(f"{len(bin_ids)} bin ids but {len(arrival_s)} arrival times")
    if np.any(np.diff(arrival_s) < 0):
        raise ValueError("form_batches needs arrival times sorted ascending")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    flush = float(arrival_s[-1]) if flush_s is None and len(arrival_s) else flush_s
    chunks: list[tuple[float, int, np.ndarray]] = []
    for b in np.unique(bin_ids):
        idx = np.flatnonzero(bin_ids == b)
        times = arrival_s[idx]
        for start, end, ready in _bin_chunks(times, batch_size, max_wait_s, flush):
            chunks.append((ready, int(b), idx[start:end]))
    chunks.sort(key=lambda c: (c[0], c[1], c[2][0]))
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return BatchArrays(empty, np.zeros(1, dtype=np.int64), np.zeros(0), empty)
    sizes = np.fromiter((len(c[2]) for c in chunks), dtype=np.int64, count=len(chunks))
    return BatchArrays(np.concatenate([c[2] for c in chunks]), np.concatenate(([0], np.cumsum(sizes))),
                       np.fromiter((c[0] for c in chunks), dtype=np.float64, count=len(chunks)),
                       np.fromiter((c[1] for c in chunks), dtype=np.int64, count=len(chunks)))


def _bin_chunks(times: np.ndarray, batch_size: int, max_wait_s: float | None, flush_s: float | None):
    """(start, end, ready_s) of each batch of one bin's arrival times."""
    n = len(times)
    if max_wait_s is None:
        starts = np.arange(0, n, batch_size)
        for start in starts:
            end = min(start + batch_size, n)
            full = end - start == batch_size
            yield int(start), int(end), float(times[end - 1]) if full else float(flush_s)
        return
    start = 0
    while start < n:
        deadline = times[start] + max_wait_s
        end = min(start + batch_size, int(np.searchsorted(times, deadline, side="right")))
        full = end - start == batch_size
        if full:
            yield start, end, float(times[end - 1])
        else:  # released at its deadline, or when the trace ends if that comes first
            yield start, end, float(deadline if flush_s is None else min(deadline, flush_s))
        start = end
