"""Event heap keyed on (time, priority, sequence): ties break the same way on every run."""

from __future__ import annotations

import enum
import heapq
from typing import Any


class EventKind(enum.IntEnum):
    """Lower values run first at equal times: finish steps before admitting new work."""

    STEP_DONE = 0
    TRANSFER_DONE = 1
    ARRIVAL = 2
    WAKEUP = 3
    ROUTER_TIMER = 4
    CALLBACK = 5  # a timed function (reconfiguration steps)


class EventQueue:
    """Entries hold the ``EventKind`` member itself (an int, so the order is the same): turning
    a stored int back into a member, ``EventKind(kind)``, cost about a microsecond per event,
    a few percent of a simulated token's CPU time (issue 29)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, EventKind, int, Any]] = []
        self._seq = 0

    def push(self, time_s: float, kind: EventKind, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, kind if type(kind) is EventKind else EventKind(kind), self._seq, payload))

    def pop(self) -> tuple[float, EventKind, Any]:
        time_s, kind, _, payload = heapq.heappop(self._heap)
        return time_s, kind, payload

    def peek_key(self) -> tuple[float, int]:
        """(time, kind) of the next event, for merging with an outside stream of arrivals."""
        return (self._heap[0][0], self._heap[0][1]) if self._heap else (float("inf"), 0)

    def __len__(self) -> int:
        return len(self._heap)
