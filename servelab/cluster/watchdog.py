"""Progress watchdog: a run that stops making progress ends, with a reason, instead of spinning.

A run ends when its event heap empties. A policy or router that re-arms a timer whose check
can never succeed (InferCept polling to swap a request back into an instance that can take
no step, issue 22), or moves that undo each other, keep the heap non-empty forever while
no request gets anywhere. The watchdog watches progress, not time: a run progresses when a
request arrives or ends, or when the work left on the instances (prompt + expected output -
computed tokens, summed over every queued request) falls below its lowest level since the
last arrival or end; that is what every step and every decode run in flight does. Churn
(preempting and recomputing the same tokens, shipping a request back and forth) never
reaches a new low, so it does not count.

The run is *stuck* when some request is live and there was no progress for ``max_events``
events or ``max_idle_s`` seconds on the run's clock. Every live request is then aborted with
a reason that says so (``reason``), and the run ends as a finished run does. The defaults are
far beyond what a working run reaches: a single step would have to outlast 50,000 timer
events or a simulated day. The cost is one comparison per event; the instances' work left is
summed once every ``CHECK_EVERY`` events, times one per 32 instances beyond the first 32 (so the
sum costs at most one instance's read per 8 events, whatever the cluster's size; below 64
instances the check runs exactly as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.core.errors import UserError

if TYPE_CHECKING:
    from servelab.cluster.context import ClusterContext

CHECK_EVERY = 256  # events between two sums of the instances' work left


@dataclass(frozen=True)
class WatchdogConfig:
    """``max_events``: events without progress before a run is stuck; ``max_idle_s``: seconds
    of the run's clock without progress (simulated seconds in the simulator); 0 turns a limit
    off, and ``enabled=False`` both."""

    max_events: int = 50_000
    max_idle_s: float = 86_400.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_events, bool) or not isinstance(self.max_events, int) or self.max_events < 0:
            raise UserError(f"watchdog max_events must be an integer >= 0 (0: off), got {self.max_events!r}")
        if not (isinstance(self.max_idle_s, (int, float)) and math.isfinite(self.max_idle_s) and self.max_idle_s >= 0):
            raise UserError(f"watchdog max_idle_s must be a finite number of seconds >= 0 (0: off), "
                            f"got {self.max_idle_s!r}")


def parse_watchdog(text: str, what: str = "--watchdog") -> WatchdogConfig:
    """``on`` (the defaults), ``off``, or ``events=N,idle_s=S`` (a key left out keeps its default;
    0 turns that limit off)."""
    text = text.strip()
    if text.lower() in ("off", "false"):
        return WatchdogConfig(enabled=False)
    if text.lower() in ("on", "true"):
        return WatchdogConfig()
    values: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("events", "idle_s") or key in values:
            raise UserError(f"{what} {text!r}: expected on, off or events=N,idle_s=SECONDS (each once), got {item!r}")
        values[key] = value.strip()
    default = WatchdogConfig()
    try:
        events = int(values["events"]) if "events" in values else default.max_events
        idle_s = float(values["idle_s"]) if "idle_s" in values else default.max_idle_s
    except ValueError:
        raise UserError(f"{what} {text!r}: events must be an integer and idle_s a number") from None
    try:
        return WatchdogConfig(events, idle_s)
    except UserError as err:
        raise UserError(f"{what} {text!r}: {err}") from None


class Watchdog:
    """Watches one run of a cluster driver (seen through ``ClusterContext``); ``stalled(now_s)`` after each event."""

    __slots__ = ("cluster", "config", "reason", "_events", "_since_events", "_since_s", "_counts", "_low", "_every")

    def __init__(self, cluster: ClusterContext, config: WatchdogConfig | None = None) -> None:
        self.cluster = cluster
        self.config = config if config is not None else WatchdogConfig()
        self.reason: str | None = None  # why the run was stopped, once it was
        self._events = 0
        self._since_events = 0  # events since the last progress, counted at each check
        self._since_s = cluster.now_s
        self._counts = (-1, -1)
        self._low = math.inf
        self._every = CHECK_EVERY * max(1, len(cluster.active) // 32)

    def stalled(self, now_s: float) -> bool:
        """Count one event; True (and ``reason`` set) when the run is stuck."""
        cfg = self.config
        if not cfg.enabled:
            return False
        self._events += 1
        if self._events % self._every and not (cfg.max_idle_s and now_s - self._since_s > cfg.max_idle_s):
            return False
        return self._check(now_s)

    def _check(self, now_s: float) -> bool:
        c, cfg = self.cluster, self.config
        counts = (len(c.requests), len(c.collector.ended_requests))
        events, self._events = self._events, 0
        left = sum(c.drivers[i].outstanding_tokens_at(now_s) for i in c.active)
        if counts[0] == counts[1] or counts != self._counts or left < self._low:
            self._counts, self._low = counts, left
            self._since_events, self._since_s = 0, now_s
            return False
        self._since_events += events
        idle_s = now_s - self._since_s
        if not ((cfg.max_events and self._since_events >= cfg.max_events)
                or (cfg.max_idle_s and idle_s > cfg.max_idle_s)):
            return False
        self.reason = (f"stuck: no request arrived, ended or got closer to its end for {self._since_events:,} "
                       f"events ({idle_s:,.6g} s on the run's clock), so the progress watchdog ended the run "
                       f"(a livelock in the policy or router; --watchdog sets its limits)")
        return True
