"""The machine's load while something runs: the 1-minute load average sampled every second
on a thread (``LoadSampler``), and whether two runs saw the same conditions (``same_load``).

On a machine shared with other work the server's speed follows the load, so a measured time
means little without the load it was measured at, and two replays are a fair measure of the
noise only when they ran at about the same load: a load that moved between them makes their
difference (the "noise") larger and an error look inside it. The 1-minute average lags by tens
of seconds; sampled through the whole run its mean is the run's level.
"""

from __future__ import annotations

import os
import threading

SAME_LOAD_TOLERANCE = 0.25  # two runs' mean loads within 25% of the larger: the same conditions


def load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class LoadSampler:
    """``with LoadSampler() as s: ...``; then ``s.summary()``: start, end, mean, min, max of the
    1-minute load average sampled every ``period_s`` (None where the system has no load average)."""

    def __init__(self, period_s: float = 1.0):
        self.period_s = period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            x = load1()
            if x is not None:
                self.samples.append(x)
            if self._stop.wait(self.period_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        x = load1()
        if x is not None:
            self.samples.append(x)

    def summary(self) -> dict | None:
        s = self.samples
        if not s:
            return None
        return {"start": s[0], "end": s[-1], "mean": sum(s) / len(s), "min": min(s), "max": max(s), "n": len(s)}


def same_load(a: dict | None, b: dict | None, tolerance: float = SAME_LOAD_TOLERANCE) -> bool | None:
    """Did two runs see the same load (mean 1-minute load averages within ``tolerance`` of the
    larger)? None when either is unknown."""
    if not a or not b or max(a["mean"], b["mean"]) <= 0:
        return None
    return abs(a["mean"] - b["mean"]) <= tolerance * max(a["mean"], b["mean"])
