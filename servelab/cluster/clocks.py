"""The two clocks the cluster driver runs on: simulated time that jumps to each event, and
wall-clock time that sleeps until it (the engine's; ``engine.ray_backend.clock`` extends it
for asynchronous steps). Both give ``now()`` and ``advance(t)``; the loop is the same.
"""

from __future__ import annotations

import time


class SimClock:
    """Simulated time: jumps to each event."""

    realtime = False

    def __init__(self) -> None:
        self.now_s = 0.0

    def advance(self, t: float) -> float:
        self.now_s = t
        return t

    def now(self) -> float:
        return self.now_s


class WallClock:
    """Wall-clock time since ``start``: sleeps until each event (late events run at once)."""

    realtime = True

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def advance(self, t: float) -> float:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
        return max(t, self.now())
