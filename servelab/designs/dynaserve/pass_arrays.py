"""A timeline's pass storage: per-pass arrays over ``[head, size)``, kept through the clock.

``PassArrays`` is the storage half of ``timeline.Timeline`` (whose docstring says what a pass
holds and why): numpy arrays of each pass's decode rows, context, prefill, idle gap, duration,
free prefill budget, end time and work, plus prefix sums of the free budget and the work;
``advance`` drops the passes the clock has passed, ``_compact`` moves the live ones to the
front and ``_grow`` doubles the arrays. Arrays past the high-water mark ``_hw`` are zero, so
an emptied timeline zeroes only what it used (``_reset`` defers even that to the next write).
"""

from __future__ import annotations

import numpy as np

from servelab.designs.dynaserve.search import gallop_right


class PassArrays:
    def __init__(self, *, now_s: float = 0.0, capacity: int = 1024) -> None:
        self._alloc(capacity)
        self._hw = 0  # high-water mark: passes at and past it are zero in every array (so are the sums past it + 1)
        self._stale = False  # emptied by ``_reset``: passes below the mark not zeroed yet (see ``_reset``)
        self._reset(now_s)

    # ---- state ----
    def _alloc(self, capacity: int) -> None:
        self.rows = np.zeros(capacity, np.float64)
        self.ctx = np.zeros(capacity, np.float64)
        self.pre = np.zeros(capacity, np.float64)
        self.gap = np.zeros(capacity, np.float64)  # idle time before the pass (work not ready)
        self.dur = np.zeros(capacity, np.float64)
        self.free = np.zeros(capacity, np.float64)
        self.end = np.zeros(capacity, np.float64)
        self.work = np.zeros(capacity, np.float64)
        self.cumfree = np.zeros(capacity + 1, np.float64)
        self.cumwork = np.zeros(capacity + 1, np.float64)

    def _reset(self, now_s: float) -> None:
        """Empty the timeline. The arrays are zeroed later, before the next pass is written
        (``_append``, ``_lay``): an empty timeline reads none of them, and zeroing thousands of
        passes here cost the decision whose clock passed the last pass 10-20 us."""
        self._stale = True
        self.cumfree[0] = self.cumwork[0] = 0.0
        self.t0 = now_s  # start of pass 0
        self.now_s = now_s
        self.head = 0
        self.size = 0
        self.prefill_tail = 0  # the last pass holding assigned prefill (FCFS: new prefill goes after)

    def _clear(self, n: int) -> None:
        """Zero every array from pass ``n`` up to the high-water mark (what lies past it is
        zero already: a timeline that once grew to thousands of passes does not zero them all
        each time; ``tests/designs/dynaserve/test_fast_paths.py`` pins it against doing so)."""
        hw = self._hw + 2
        arrays = self._arrays()
        for a in arrays[:-2]:
            a[n:hw] = 0.0
        for a in arrays[-2:]:  # the sums: [k] covers passes [0, k)
            a[n + 1:hw] = 0.0
        self._hw = n
        self._stale = False

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return (self.rows, self.ctx, self.pre, self.gap, self.dur, self.free, self.end, self.work, self.cumfree,
                self.cumwork)

    @property
    def num_passes(self) -> int:
        return self.size - self.head


    @property
    def drain_s(self) -> float:
        """When the instance runs out of predicted work."""
        return self.end.item(self.size - 1) if self.size > self.head else self.now_s

    def _start(self, k: int) -> float:
        return self.end.item(k - 1) if k > 0 else self.t0

    def advance(self, now_s: float) -> None:
        """Drop the passes the clock has passed; an empty timeline restarts at ``now_s``."""
        if now_s > self.now_s:
            self.now_s = now_s
        head, size = self.head, self.size
        if size > head and self.end.item(head) <= self.now_s:  # else no pass has ended
            self.head = gallop_right(self.end, self.now_s, head + 1, size)
        if self.head >= self.size:
            self._reset(self.now_s)
            return
        self.prefill_tail = max(self.prefill_tail, self.head)
        if self.head > len(self.rows) // 2:
            self._compact()

    def _compact(self) -> None:
        h, n = self.head, self.size - self.head
        self.t0 = self._start(h)
        for a in self._arrays()[:-2]:
            a[:n] = a[h:self.size]
        for a in (self.cumfree, self.cumwork):
            a[:n + 1] = a[h:self.size + 1] - a[h]
        self._clear(n)
        self.prefill_tail = max(0, self.prefill_tail - h)
        self.head, self.size = 0, n

    def _grow(self, size: int) -> None:
        if size <= len(self.rows):
            return
        old = {name: getattr(self, name) for name in ("rows", "ctx", "pre", "gap", "dur", "free", "end", "work",
                                                      "cumfree", "cumwork")}
        self._alloc(max(size, 2 * len(self.rows)))
        for name, a in old.items():
            getattr(self, name)[:len(a)] = a
